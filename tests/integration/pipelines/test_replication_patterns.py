"""The replication task patterns end to end, each a `hubshift consume` on emulator hubs: two sources merged
into one target with every stream in order, two hubs mirrored both ways under load without an event ever
coming back, no event lost when a replicating consumer is killed with SIGKILL, and a failover onto a replica
hub that skips exactly what the old hub's consumers had handled."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hubshift.emulator.launch import RunningEmulator
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.pipelines.replicate import DEFAULT_REPLICATE_ENV, ReplicatePipeline
from tests.fixtures.consumer import (
    ConsumerPool,
    committed_at_least,
    consumer_environ,
    consumer_manifest,
    wait_for,
)
from tests.fixtures.hubs import read_hub, send_events

pytestmark = pytest.mark.timeout(900)


def replicator(tmp_path: Path, name: str, source: str, target: str, **options: Any) -> Path:
    return consumer_manifest(
        tmp_path / f"{name}.yaml",
        hub=source,
        store={"sqlite": {"path": str(tmp_path / f"{name}.db")}},
        sink=tmp_path / f"sink-{name}",
        consumer={"pipeline": {"type": "replicate", "replicate": {"hub": target, **options}}},
    )


def environ(emulator: RunningEmulator) -> dict[str, str]:
    return {**consumer_environ(emulator.connection_string), DEFAULT_REPLICATE_ENV: emulator.connection_string}


class KeyedLoad(threading.Thread):
    """Numbered events (`<origin>:<key>:<n>`) for 8 keys into one hub at `rate` events/s until stopped."""

    def __init__(self, emulator: RunningEmulator, hub: str, origin: str, rate: float) -> None:
        super().__init__(daemon=True, name=f"load-{hub}")
        self.emulator, self.hub, self.origin, self.rate = emulator, hub, origin, rate
        self.halt = threading.Event()
        self.sent: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        started = time.monotonic()
        try:
            while not self.halt.is_set():
                due = int((time.monotonic() - started) * self.rate) - len(self.sent)
                batch = []
                for _ in range(max(0, due)):
                    n = len(self.sent) + len(batch)
                    batch.append((f"{self.origin}-k{n % 8}", f"{self.origin}:k{n % 8}:{n}", None))
                if batch:
                    send_events(self.emulator, self.hub, batch)
                    self.sent.extend(body for _, body, _ in batch)
                self.halt.wait(0.2)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> list[str]:
        self.halt.set()
        self.join(30)
        assert self.error is None, f"the load into {self.hub} failed: {self.error!r}"
        return self.sent


def numbered(event: dict[str, Any]) -> tuple[str, str, int]:
    origin, key, n = event["body"].decode().split(":")
    return origin, key, int(n)


def assert_streams_in_order(events: list[dict[str, Any]]) -> None:
    """At a target, each key's events in their source order (repeats after a replay aside)."""
    by_key: dict[str, list[int]] = {}
    for event in events:  # read_hub: by partition and sequence, i.e. in enqueued order per key
        _, key, n = numbered(event)
        seen = by_key.setdefault(key, [])
        if n not in seen:
            seen.append(n)
    for key, ns in by_key.items():
        assert ns == sorted(ns), f"{key} out of order: {ns[:20]}..."


def test_two_sources_merge_into_one_target_with_every_stream_in_order(
    emulator_factory: Callable[..., RunningEmulator], consumer_pool: ConsumerPool, tmp_path: Path
) -> None:
    emulator = emulator_factory(["west:2", "east:2", "all:4"])
    consumer_pool.environ = environ(emulator)
    for source in ("west", "east"):
        consumer_pool.start(replicator(tmp_path, f"to-all-{source}", source, "all"), f"{source}-0")
    sent = []
    for source in ("west", "east"):
        batch = [(f"{source}-k{n % 5}", f"{source}:k{n % 5}:{n}", None) for n in range(300)]
        send_events(emulator, source, batch)
        sent += [body for _, body, _ in batch]

    merged = read_hub(emulator, "all", len(sent), timeout=300)
    assert sorted(e["body"].decode() for e in merged) == sorted(sent)
    assert_streams_in_order(merged)
    assert {e["properties"]["repl-sequence"].count(";") for e in merged} == {0}


def test_two_hubs_mirrored_both_ways_under_load_never_send_an_event_back(
    emulator_factory: Callable[..., RunningEmulator], consumer_pool: ConsumerPool, tmp_path: Path
) -> None:
    emulator = emulator_factory(["east:2", "west:2"], consumer_groups=["check"])
    consumer_pool.environ = environ(emulator)
    mirrors = [
        consumer_pool.start(replicator(tmp_path, f"{a}-to-{b}", a, b, skipReplicated=True), f"{a}-to-{b}")
        for a, b in (("east", "west"), ("west", "east"))
    ]
    for mirror in mirrors:
        mirror.wait_ready(360)
    loads = [KeyedLoad(emulator, "east", "east", 40), KeyedLoad(emulator, "west", "west", 40)]
    for load in loads:
        load.start()
    time.sleep(40)
    east_sent, west_sent = (load.finish() for load in loads)
    everything = sorted(east_sent + west_sent)

    for hub in ("east", "west"):
        # Both hubs are read by a mirror in $Default: the check reads in a group of its own.
        events = read_hub(emulator, hub, len(everything), timeout=240, settle=10, consumer_group="check")
        assert sorted(e["body"].decode() for e in events) == everything, f"{hub} differs"
        local = hub
        for event in events:
            origin, _, _ = numbered(event)
            sequence = event["properties"].get("repl-sequence")
            assert (sequence is None) == (origin == local)  # mirrored once, never again
            assert sequence is None or ";" not in sequence
        assert_streams_in_order(events)


def test_no_event_is_lost_when_a_replicating_consumer_is_killed(
    emulator_factory: Callable[..., RunningEmulator], consumer_pool: ConsumerPool, tmp_path: Path
) -> None:
    emulator = emulator_factory(["hub:2", "copy:2"])
    consumer_pool.environ = environ(emulator)
    manifest = replicator(tmp_path, "copy", "hub", "copy")
    first = consumer_pool.start(manifest, "copy-0")
    first.wait_ready(360)
    load = KeyedLoad(emulator, "hub", "src", 60)
    load.start()
    wait_for(
        lambda: committed_at_least(tmp_path / "sink-copy", {"0": 50, "1": 50}),
        180,
        "the first batches",
        on_timeout=first.log,
    )
    first.kill()  # SIGKILL, mid-load: no drain, no final checkpoint
    time.sleep(3)
    second = consumer_pool.start(manifest, "copy-0")
    time.sleep(15)
    sent = load.finish()

    copied = read_hub(emulator, "copy", len(sent), timeout=300, settle=5)
    bodies = [e["body"].decode() for e in copied]
    assert set(bodies) == set(sent), second.log()[-3000:]  # every event, at least once
    assert_streams_in_order(copied)


def test_a_failover_skips_exactly_what_the_old_hubs_consumers_handled(
    emulator_factory: Callable[..., RunningEmulator], consumer_pool: ConsumerPool, tmp_path: Path
) -> None:
    """Keyed and keyless events, and a replica with more partitions than the old hub: an event is compared
    with the old checkpoint of the partition it came from (`repl-partition`), wherever it landed."""
    emulator = emulator_factory(["primary:2", "secondary:3"])
    consumer_pool.environ = environ(emulator)
    begun = datetime.now(UTC) - timedelta(minutes=1)
    # The old hub's consumers (the SDK engine: plain receivers, the same ownership and checkpoints).
    old_store = tmp_path / "primary.db"
    old = consumer_pool.start(
        consumer_manifest(
            tmp_path / "primary.yaml",
            hub="primary",
            store={"sqlite": {"path": str(old_store)}},
            sink=tmp_path / "old",
        ),
        "primary-0",
        engine="sdk",
    )
    handled = [(_key(n), f"p:{_key(n)}:{n}", None) for n in range(200)]
    send_events(emulator, "primary", handled)
    ownership = consumer_pool.ownership(tmp_path / "primary.yaml")

    def checkpointed() -> int:
        return sum(
            row.checkpoint.sequence_number + 1 for row in ownership.snapshot().partitions if row.checkpoint
        )

    wait_for(lambda: checkpointed() == 200, 120, "the old consumers' checkpoints", on_timeout=old.log)
    old.terminate()
    old.wait(60)
    # The region fails after 100 more events reached the old hub (replicated, but never handled there).
    unhandled = [(_key(n), f"p:{_key(n)}:{n}", None) for n in range(200, 300)]
    send_events(emulator, "primary", unhandled)
    # The replication task had copied everything to the secondary (the replicate pipeline's own sending).
    target = EventHubsTarget(
        emulator.connection_string, f"127.0.0.1:{emulator.port}", "secondary", "$Default"
    )
    rows = [
        {
            "partition": e["partition"],
            "sequence_number": e["sequence"],
            "offset": e["offset"],
            "enqueued_time": e["enqueued"],
            "partition_key": e["key"],
            "body": e["body"],
            "properties": e["properties"],
        }
        for e in read_hub(emulator, "primary", 300, settle=0.5)
    ]
    assert ReplicatePipeline(target).forward(rows) == []
    # After the failover, producers write to the secondary.
    send_events(emulator, "secondary", [(f"k{n % 6}", f"s:k{n % 6}:{n}", None) for n in range(20)])

    results = tmp_path / "failover-sink"
    manifest = consumer_manifest(
        tmp_path / "failover.yaml",
        hub="secondary",
        store={"sqlite": {"path": str(tmp_path / "secondary.db")}},  # a new checkpoint store
        sink=results,
        consumer={
            "pipeline": {"type": "function", "function": "tests.fixtures.editing:bodies"},
            "startPosition": {"type": "enqueuedTime", "enqueuedTime": begun.isoformat()},
            "failover": {
                "checkpointStore": {"sqlite": {"path": str(old_store)}},
                "namespace": f"127.0.0.1:{emulator.port}",
                "hub": "primary",
            },
        },
    )
    consumer = consumer_pool.start(manifest, "secondary-0")
    wait_for(lambda: _total(results) >= 120, 300, "the failover consumer's results", on_timeout=consumer.log)
    time.sleep(3)
    processed = sorted(_bodies(results))
    expected = sorted([body for _, body, _ in unhandled] + [f"s:k{n % 6}:{n}" for n in range(20)])
    assert processed == expected


def _key(n: int) -> str | None:
    """Every fourth event has no partition key: the service spreads those over the replica's partitions."""
    return None if n % 4 == 3 else f"k{n % 6}"


def _bodies(sink: Path) -> list[str]:
    return [
        json.loads(line)["body"]
        for path in sorted((sink / "results").rglob("*.jsonl"))
        if (sink / "results").exists()
        for line in path.read_text().splitlines()
    ]


def _total(sink: Path) -> int:
    return len(_bodies(sink))
