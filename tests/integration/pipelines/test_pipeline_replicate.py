"""The replicate pipeline on real PySpark against the emulator: every event reaches the target hub with its
body, properties and the source's metadata, a stream's events stay in one target partition in order, a
keyless event can keep its partition, an event too large for the target is a dead letter (and its
neighbours still go), and the merge pattern forwards nothing twice."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hubshift.consumer.spark.batch import process_batch
from hubshift.emulator.launch import RunningEmulator
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.pipelines.replicate import DEFAULT_REPLICATE_ENV, ReplicatePipeline
from hubshift.sinks import FileSink, FolderStore
from tests.fixtures.consumer import (
    ConsumerPool,
    consume_to_exit,
    consumer_environ,
    consumer_manifest,
    error_line,
)
from tests.fixtures.hubs import read_hub
from tests.fixtures.spark import event_row

pytestmark = pytest.mark.timeout(300)

TARGET = "target"


@pytest.fixture
def target_hub(emulator_factory: Callable[..., RunningEmulator]) -> RunningEmulator:
    return emulator_factory([f"{TARGET}:4"])


def pipeline(emulator: RunningEmulator, **options: bool) -> ReplicatePipeline:
    return ReplicatePipeline(
        EventHubsTarget(emulator.connection_string, f"127.0.0.1:{emulator.port}", TARGET, "$Default"),
        **options,
    )


def read_target(emulator: RunningEmulator, expected: int, timeout: float = 30) -> list[dict[str, Any]]:
    return read_hub(emulator, TARGET, expected, timeout)


def test_every_event_reaches_the_target_with_its_stream_together_and_in_order(
    event_frame: Callable[..., Any], target_hub: RunningEmulator, tmp_path: Path
) -> None:
    rows = [
        event_row("0", n, f"zero-{n}".encode(), partition_key=f"h{n % 3}", properties={"kind": "motion"})
        for n in range(30)
    ] + [event_row("1", n, f"one-{n}".encode(), partition_key=f"h{n % 3}") for n in range(100, 110)]
    sink = FileSink(FolderStore(tmp_path), FolderStore(tmp_path / "dead-letter"))
    summary = process_batch(event_frame(rows), 0, "mirror-0", pipeline(target_hub), sink)

    assert summary.events == 40 and summary.dead_letters == 0
    assert summary.partitions["0"].last_sequence_number == 29
    received = read_target(target_hub, 40)
    assert len(received) == 40
    by_body = {e["body"]: e for e in received}
    first = by_body[b"zero-4"]
    assert first["key"] == "h1"
    assert first["properties"]["kind"] == "motion"
    assert first["properties"]["repl-sequence"] == "4"
    assert first["properties"]["repl-offset"] == "400"
    assert first["properties"]["repl-enqueue-time"] == "2026-11-21T10:00:00.000000Z"
    # One stream, one target partition, in the source's order.
    for key in ("h0", "h1", "h2"):
        for source in ("zero", "one"):
            stream = sorted(
                (e for e in received if e["key"] == key and e["body"].startswith(source.encode())),
                key=lambda e: e["sequence"],
            )
            assert len({e["partition"] for e in stream}) == 1
            sequences = [int(e["properties"]["repl-sequence"]) for e in stream]
            assert sequences == sorted(sequences)


def test_keyless_events_keep_their_partition_and_too_large_ones_are_dead_letters(
    event_frame: Callable[..., Any], emulator_factory: Callable[..., RunningEmulator], tmp_path: Path
) -> None:
    emulator = emulator_factory([f"{TARGET}:4"])
    huge = b"x" * (1024 * 1024)
    rows = [
        event_row("2", 1, b"before"),
        event_row("2", 2, huge),
        event_row("2", 3, b"after"),
        event_row("3", 7, b"three"),
    ]
    sink = FileSink(FolderStore(tmp_path), FolderStore(tmp_path / "dead-letter"))
    summary = process_batch(event_frame(rows), 0, "mirror-0", pipeline(emulator, keep_partition=True), sink)

    assert summary.events == 4 and summary.dead_letters == 1
    received = read_target(emulator, 3)
    assert sorted((e["partition"], e["body"]) for e in received) == [
        ("2", b"after"),
        ("2", b"before"),
        ("3", b"three"),
    ]
    (dead,) = [
        json.loads(line)
        for path in sorted((tmp_path / "dead-letter").rglob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert dead["reason"] == "larger than the target Event Hub accepts"
    assert dead["sequenceNumber"] == 2


def test_the_merge_pattern_forwards_nothing_that_was_replicated_before(
    event_frame: Callable[..., Any], emulator_factory: Callable[..., RunningEmulator], tmp_path: Path
) -> None:
    emulator = emulator_factory([f"{TARGET}:4"])
    rows = [
        event_row("0", 1, b"local", partition_key="h1"),
        event_row("0", 2, b"mirrored", partition_key="h1", properties={"repl-sequence": "17"}),
    ]
    sink = FileSink(FolderStore(tmp_path), FolderStore(tmp_path / "dead-letter"))
    summary = process_batch(event_frame(rows), 0, "mirror-0", pipeline(emulator, skip_replicated=True), sink)

    assert summary.events == 2  # both are covered by the commit and the checkpoint
    assert [e["body"] for e in read_target(emulator, 1)] == [b"local"]


def mirror_manifest(tmp_path: Path, target_hub: str = TARGET) -> Path:
    return consumer_manifest(
        tmp_path / "mirror.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=tmp_path / "sink",
        consumer={"pipeline": {"type": "replicate", "replicate": {"hub": target_hub, "keepPartition": True}}},
    )


def test_a_consumer_mirrors_a_hub_end_to_end(
    emulator_factory: Callable[..., RunningEmulator], consumer_pool: ConsumerPool, tmp_path: Path
) -> None:
    from azure.eventhub import EventData, EventHubProducerClient

    emulator = emulator_factory(["hub:2", f"{TARGET}:2"])
    consumer_pool.environ = {
        **consumer_environ(emulator.connection_string),
        DEFAULT_REPLICATE_ENV: emulator.connection_string,
    }
    consumer = consumer_pool.start(mirror_manifest(tmp_path), "mirror-0")
    producer = EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name="hub")
    with producer:
        for home in range(10):
            batch = producer.create_batch(partition_key=f"h{home}")
            for n in range(20):
                batch.add(EventData(f"h{home}-{n}"))
            producer.send_batch(batch)
        keyless = producer.create_batch(partition_id="1")
        keyless.add(EventData("keyless"))
        producer.send_batch(keyless)

    received = read_target(emulator, 201, timeout=150)
    assert sorted(e["body"] for e in received) == sorted(
        [f"h{home}-{n}".encode() for home in range(10) for n in range(20)] + [b"keyless"]
    ), consumer.log()[-3000:]
    for home in range(10):
        stream = sorted((e for e in received if e["key"] == f"h{home}"), key=lambda e: e["sequence"])
        assert [e["body"] for e in stream] == [f"h{home}-{n}".encode() for n in range(20)]
    assert [e["partition"] for e in received if e["body"] == b"keyless"] == ["1"]


def test_a_missing_target_hub_stops_the_consumer_at_start_up_in_one_line(
    emulator_factory: Callable[..., RunningEmulator], tmp_path: Path
) -> None:
    emulator = emulator_factory(["hub:2"])
    environ = {
        **consumer_environ(emulator.connection_string),
        DEFAULT_REPLICATE_ENV: emulator.connection_string,
    }
    code, stderr = consume_to_exit(mirror_manifest(tmp_path, "nowhere"), environ, tmp_path)
    line = error_line(stderr)
    assert code != 0
    assert "nowhere" in line and "does not exist" in line
