"""Skewed load over 32 partitions: load-aware assignment against count-balanced assignment, and the
autoscaler on its two targets, beside the Azure SDK's own processor, in one run.

The load (the same schedule on every side's hub): `--rate` events/s over 1,000 partition keys with Zipf
weights (exponent `--zipf`), each key on the partition its seeded hash names, plus a hot spot of
`--hot-rate` events/s on one partition that moves to another (seeded) every `--hot-every` seconds; with
`--uniform` every partition gets the same share and there is no hot spot. Consumers do a fixed amount of
work per event (`--event-cost` seconds, one event at a time, so one consumer processes at most
1 / cost events/s: the consumer is the bottleneck, not the machine), with the SDK engine (no Spark).

Sides, each on its own hub, all at once (so every side sees the same machine at the same moment):
- `sdk`: one `EventHubConsumerClient` + `BlobCheckpointStore` process per consumer, tuned as in
  bench/rebalance.py (balanced strategy, 0.1 s load-balancing interval, 2 s ownership expiry), the same
  work per event behind one lock per process (the SDK's sync processor reads its partitions on one
  thread, as hubshift's consumer does);
- `balanced`: hubshift's local runtime, `strategy: balanced` (count-balanced, +-1 partition);
- `loadAware`: the same with `strategy: loadAware` (`windowSeconds` `--window`);
- `events` and `lag` (the autoscaler rounds): `loadAware` with 1 to 8 replicas on the events target
  (`unprocessedEventsPerReplica`, its default) and on the lag target (`lagSeconds` `--lag-target`).
Every side checkpoints every 2 s. hubshift's control loop polls the hub every 2 s.

Rounds (a full run; `--quick` does the first, the uniform one and the autoscaler's):
- equal consumers: 4 consumers a side, seeds 1, 2, 3;
- consumers needed: 6 consumers a side, seed 1 (with the 4 of seed 1: whether each side held p99 under
  `--p99-target` seconds with 4, else with 6);
- uniform: 4 consumers a side, seed 1, no skew;
- autoscaler: `events` and `lag`, seed 1, a longer warm-up (scale-out and the capacity measurement).

Per side and round: enqueue-to-processed latency p50 / p99 / max of every event enqueued in the measured
window (`--window-seconds` after `--warmup` seconds; each event's enqueue time from the batch's first and
last, its processing time when its batch's handler returned; an event still unprocessed `--tail` seconds
after the window counts as at least that late), events still unprocessed, moves in the window (a
partition's reader changing), events processed twice over the whole round, storage requests in the window
(real HTTP requests to Azurite through a counting proxy per side), and for the autoscaler the replicas.

    .venv/bin/python bench/skew.py [--quick] [--output bench/results/skew.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

# The shared harness (Azurite, range logs) lives in the repository's tests/harness; the counting proxy and
# the SDK's tuning in bench/rebalance.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rebalance import SDK_TUNED, CountingProxy
from tests.harness.azurite import connection_string as azurite_connection_string
from tests.harness.ranges import count_replays, read_range_logs

RESULTS = Path(__file__).resolve().parent / "results" / "skew.json"
PARTITIONS = 32
KEYS = 1000
CHECKPOINT_SECONDS = 2.0
POLL_SECONDS = 2.0
TICK = 0.5  # the load is sent in bursts this far apart
SIDES = ("sdk", "balanced", "loadAware")
AUTOSCALER_SIDES = ("events", "lag")


@dataclass(frozen=True)
class Round:
    name: str
    consumers: int  # per side; the autoscaler's maximum
    seed: int
    uniform: bool = False
    autoscaler: bool = False

    @property
    def sides(self) -> tuple[str, ...]:
        return AUTOSCALER_SIDES if self.autoscaler else SIDES


# --- the load -----------------------------------------------------------------------------------------------


def partition_rates(args: argparse.Namespace, seed: int, uniform: bool) -> list[float]:
    """Events/s per partition from the Zipf keys (or evenly), without the hot spot."""
    if uniform:
        return [args.rate / PARTITIONS] * PARTITIONS
    weights = [1 / (k + 1) ** args.zipf for k in range(KEYS)]
    total = sum(weights)
    rates = [0.0] * PARTITIONS
    for key, weight in enumerate(weights):
        digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
        rates[int.from_bytes(digest[:4], "big") % PARTITIONS] += args.rate * weight / total
    return rates


def hot_schedule(
    args: argparse.Namespace, seed: int, uniform: bool, seconds: float
) -> list[tuple[float, int]]:
    """(from when, which partition) of the hot spot over the round; empty without one."""
    if uniform or args.hot_rate <= 0:
        return []
    chooser = random.Random(seed)
    return [
        (t * args.hot_every, chooser.randrange(PARTITIONS))
        for t in range(math.ceil(seconds / args.hot_every))
    ]


class Producer(threading.Thread):
    """The round's load to one hub: every `TICK`, each partition's events (carrying fractions over). It opens
    its 32 partition links first (one event each; opening one takes about half a second here), says so
    with `ready`, and starts its schedule at `go`. When it falls more than `TICK` behind (the machine is
    busy), it sends the scheduled events at once, never more."""

    def __init__(
        self,
        connection_string: str,
        hub: str,
        rates: list[float],
        hot: list[tuple[float, int]],
        hot_rate: float,
        go: threading.Event,
    ) -> None:
        super().__init__(daemon=True, name=f"load-{hub}")
        self.connection_string, self.hub, self.rates = connection_string, hub, rates
        self.hot, self.hot_rate, self.go = hot, hot_rate, go
        self.halt = threading.Event()
        self.ready = threading.Event()
        self.sent = 0
        self.late = 0.0  # the most the producer fell behind its schedule, seconds
        self.error: str | None = None

    def hot_partition(self, elapsed: float) -> int | None:
        current = None
        for since, partition in self.hot:
            if elapsed >= since:
                current = partition
        return current

    def run(self) -> None:
        from azure.eventhub import EventData, EventHubProducerClient

        producer = EventHubProducerClient.from_connection_string(
            self.connection_string, eventhub_name=self.hub
        )
        body = b"x" * 100
        try:
            with producer:
                for partition in range(PARTITIONS):
                    producer.send_batch([EventData(body)], partition_id=str(partition))
                self.ready.set()
                self.go.wait()
                self._schedule(producer, body)
        except Exception as exc:  # the round reports it
            self.error = repr(exc)
            self.ready.set()

    def _schedule(self, producer: Any, body: bytes) -> None:
        from azure.eventhub import EventData

        carry = [0.0] * PARTITIONS
        started = time.time()
        ticks = 0
        while not self.halt.is_set():
            ticks += 1
            hot = self.hot_partition(ticks * TICK)
            for partition in range(PARTITIONS):
                rate = self.rates[partition] + (self.hot_rate if partition == hot else 0.0)
                carry[partition] += rate * TICK
                count = int(carry[partition])
                carry[partition] -= count
                if count:
                    producer.send_batch([EventData(body) for _ in range(count)], partition_id=str(partition))
                    self.sent += count
            delay = started + ticks * TICK - time.time()
            self.late = max(self.late, -delay)
            if delay > 0:
                self.halt.wait(delay)


def hub_probe(connection_string: str, hub: str) -> Any:
    """hubshift's own probe of the hub (one management link kept open: the SDK client's per-call link takes
    about half a second per partition here)."""
    from hubshift.eventhubs.management import EventHubsProbe
    from hubshift.eventhubs.target import resolve_target
    from hubshift.spec import DEFAULT_EVENTHUBS_ENV, EventHubsSpec

    return EventHubsProbe(resolve_target(EventHubsSpec(hub=hub), {DEFAULT_EVENTHUBS_ENV: connection_string}))


async def last_sequences(probes: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each side's hub: each partition's last enqueued sequence number now, read at once for every side."""
    answers = await asyncio.gather(*(probe.partitions() for probe in probes.values()))
    return {
        side: {p: info.last_enqueued for p, info in answer.items()}
        for side, answer in zip(probes, answers, strict=True)
    }


# --- the SDK side -------------------------------------------------------------------------------------------


def sdk_worker(config: dict[str, Any]) -> None:
    """One EventHubConsumerClient + BlobCheckpointStore, tuned, with the per-event work (its own process)."""
    from azure.eventhub import EventHubConsumerClient
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore

    name, cost = config["name"], float(config["cost"])
    log = Path(config["log"]).open("a")  # noqa: SIM115  # the process's lifetime
    lock = threading.Lock()

    def write(document: dict[str, Any]) -> None:
        log.write(json.dumps({"consumer": name, "at": time.time(), **document}) + "\n")
        log.flush()

    store = BlobCheckpointStore.from_connection_string(config["storage"], config["container"])
    client = EventHubConsumerClient.from_connection_string(
        config["eventhubs"],
        consumer_group="$Default",
        eventhub_name=config["hub"],
        checkpoint_store=store,
        **config["options"],
    )
    last_checkpoint: dict[str, float] = {}

    def on_batch(context: Any, events: list[Any]) -> None:
        if not events:
            return
        with lock:  # one event at a time in this process, as a hubshift consumer works
            time.sleep(cost * len(events))
            write(
                {
                    "kind": "batch",
                    "partition": context.partition_id,
                    "first": events[0].sequence_number,
                    "last": events[-1].sequence_number,
                    "events": len(events),
                    "firstEnqueued": events[0].enqueued_time.timestamp(),
                    "lastEnqueued": events[-1].enqueued_time.timestamp(),
                }
            )
        if time.monotonic() - last_checkpoint.get(context.partition_id, 0.0) >= CHECKPOINT_SECONDS:
            context.update_checkpoint(events[-1])
            last_checkpoint[context.partition_id] = time.monotonic()

    def on_open(context: Any) -> None:
        with lock:
            write({"kind": "open", "partition": context.partition_id})

    def on_close(context: Any, reason: Any) -> None:
        with lock:
            write({"kind": "close", "partition": context.partition_id, "reason": str(reason)})

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=client.close, daemon=True).start())
    with contextlib.suppress(Exception):
        client.receive_batch(
            on_event_batch=on_batch,
            on_partition_initialize=on_open,
            on_partition_close=on_close,
            starting_position="-1",
            max_wait_time=1,
        )


@dataclass
class SdkSide:
    """`consumers` SDK processes over one hub and container."""

    hub: str
    folder: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, consumers: int, eventhubs: str, storage: str, container: str, cost: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for ordinal in range(consumers):
            config = {
                "name": f"sdk-{ordinal}",
                "hub": self.hub,
                "container": container,
                "eventhubs": eventhubs,
                "storage": storage,
                "log": str(self.folder / f"sdk-{ordinal}.jsonl"),
                "options": SDK_TUNED.client_options(),
                "cost": cost,
            }
            self.workers.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--sdk-worker", json.dumps(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=(self.folder / f"sdk-{ordinal}.err").open("ab"),
                    start_new_session=True,
                )
            )

    def stop(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for worker in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=max(0.1, deadline - time.monotonic()))
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=10)

    def lines(self) -> list[dict[str, Any]]:
        return read_range_logs(self.folder)

    def settled(self) -> bool:
        """Every partition open in exactly one live consumer, every consumer reading +-1 as many."""
        readers: dict[str, set[str]] = {str(p): set() for p in range(PARTITIONS)}
        for line in self.lines():
            if line.get("kind") == "open":
                readers[line["partition"]].add(line["consumer"])
            elif line.get("kind") == "close":
                readers[line["partition"]].discard(line["consumer"])
        if any(len(names) != 1 for names in readers.values()):
            return False
        counts = Counter(next(iter(names)) for names in readers.values())
        return len(counts) == len(self.workers) and max(counts.values()) - min(counts.values()) <= 1

    def moves(self, since: float, until: float) -> int:
        """Partitions opened by a consumer other than the last one that had them, within [since, until]."""
        reader: dict[str, str] = {}
        moves = 0
        for line in sorted((x for x in self.lines() if x.get("kind") == "open"), key=lambda x: x["at"]):
            before = reader.get(line["partition"])
            if before is not None and before != line["consumer"] and since <= line["at"] <= until:
                moves += 1
            reader[line["partition"]] = line["consumer"]
        return moves


# --- hubshift's sides ---------------------------------------------------------------------------------------


def hubshift_manifest(
    side: str, hub: str, container: str, output: Path, args: argparse.Namespace, consumers: int
) -> dict[str, Any]:
    strategy = "balanced" if side == "balanced" else "loadAware"
    scaling: dict[str, Any] = {"minReplicas": consumers, "maxReplicas": consumers}
    if side in AUTOSCALER_SIDES:
        scaling = {"minReplicas": 1, "maxReplicas": consumers}
        if side == "lag":
            scaling["target"] = {"lagSeconds": args.lag_target}
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "bench"},
        "spec": {
            "eventHubs": {"hub": hub},
            "checkpointStore": {"blob": {"container": container}},
            "consumer": {
                "checkpoint": {"everySeconds": CHECKPOINT_SECONDS},
                "sink": {"type": "folder", "folder": {"path": str(output)}},
            },
            "scaling": {**scaling, "pollingIntervalSeconds": POLL_SECONDS},
            "rebalance": {
                "strategy": strategy,
                "loadAware": {"windowSeconds": args.window},
                "delaySeconds": 5,
                "maxHandoffSeconds": 15,
            },
        },
    }


@dataclass
class HubshiftSide:
    """A `LocalOperator` over `hubshift consume --engine sdk --event-cost` processes."""

    side: str
    hub: str
    folder: Path
    operator: Any = None
    task: asyncio.Task[None] | None = None
    stop_flag: asyncio.Event = field(default_factory=asyncio.Event)
    publications: list[tuple[float, int]] = field(default_factory=list)  # (when, moves)
    replicas: list[tuple[float, int]] = field(default_factory=list)  # (when, ready consumers)
    capacity: float | None = None  # events/s a consumer processed per second of work, as the loop measured
    status: dict[str, Any] = field(default_factory=dict)  # the last status the control loop reported

    async def start(
        self, env: dict[str, str], container: str, args: argparse.Namespace, consumers: int
    ) -> None:
        from hubshift.manifest import parse_manifest
        from hubshift.operator.local.runner import LocalOperator

        document = hubshift_manifest(self.side, self.hub, container, self.folder / "out", args, consumers)
        path = self.folder / "manifest.yaml"
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(document))
        self.operator = LocalOperator(
            path,
            parse_manifest(document),
            self.folder / "work",
            engine="sdk",
            environ=env,
            extra_args=("--event-cost", str(args.event_cost)),
            on_report=self.on_report,
        )
        await self.operator.open()
        self.task = asyncio.get_running_loop().create_task(self.operator.run(self.stop_flag))

    def on_report(self, report: Any) -> None:
        now = time.time()
        for action in report.actions:
            if type(action).__name__ == "PublishAssignment":
                self.publications.append((now, len(action.moves)))
        self.replicas.append((now, int(report.status.ready_replicas or 0)))
        self.capacity = report.capacity or self.capacity
        self.status = report.status.to_body()

    async def stop(self) -> None:
        self.stop_flag.set()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 30)
        if self.operator is not None:
            await self.operator.shutdown(grace=20)

    def lines(self) -> list[dict[str, Any]]:
        return read_range_logs(self.folder / "out" / "ranges")

    def settled(self) -> bool:
        """The control loop Ready with every consumer it wants ready and every partition assigned."""
        report = self.operator.report if self.operator is not None else None
        if report is None:
            return False
        status = report.status
        assigned = sum(len(entry.partitions) for entry in status.assignment)
        return (
            status.phase == "Ready"
            and status.ready_replicas == status.desired_replicas
            and assigned == PARTITIONS
            and not status.pending_handoffs
        )

    def moves(self, since: float, until: float) -> int:
        return sum(moves for at, moves in self.publications if since <= at <= until)


# --- measuring ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    round: str
    side: str
    consumers: int
    seed: int
    p50: float | None
    p99: float | None
    max: float | None
    events: int  # enqueued in the window
    unprocessed: int  # of those, not processed by the end of the tail
    moves: int  # in the window
    replayed: int  # over the round
    storage_requests: int  # in the window
    replicas_mean: float | None = None  # the autoscaler's ready consumers over the window
    replicas_max: int | None = None
    notes: list[str] = field(default_factory=list)

    def p99_text(self) -> str:
        if self.p99 is None:
            return "-"
        return f"{'>= ' if self.unprocessed > self.events / 100 else ''}{self.p99:.2f}"


def latencies(
    lines: Sequence[dict[str, Any]], start: dict[str, int], end: dict[str, int]
) -> tuple[list[float], int]:
    """The latency of every event whose sequence number is in (start[p], end[p]] (its first processing),
    and how many of those were never processed."""
    done: dict[str, dict[int, float]] = {}
    for line in lines:
        if line.get("kind", "batch") != "batch" or line.get("firstEnqueued") is None:
            continue
        partition, first, last = str(line["partition"]), int(line["first"]), int(line["last"])
        low, high = start.get(partition, 0), end.get(partition, -1)
        if last <= low or first > high:
            continue
        span = max(last - first, 1)
        seen = done.setdefault(partition, {})
        for sequence in range(max(first, low + 1), min(last, high) + 1):
            enqueued = (
                line["firstEnqueued"]
                + (line["lastEnqueued"] - line["firstEnqueued"]) * (sequence - first) / span
            )
            latency = max(0.0, line["at"] - enqueued)
            if sequence not in seen or latency < seen[sequence]:
                seen[sequence] = latency
    values = [v for seen in done.values() for v in seen.values()]
    expected = sum(max(0, end[p] - start.get(p, 0)) for p in end)
    return values, expected - len(values)


def percentile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def outcome(
    round_: Round,
    side: str,
    lines: list[dict[str, Any]],
    start: dict[str, int],
    end: dict[str, int],
    tail: float,
    stopped: float,
) -> Outcome:
    values, unprocessed = latencies(lines, start, end)
    values = sorted(values + [tail] * unprocessed)  # an event still waiting is at least the tail late
    # Replays until the sides are stopped (what the shutdown hands over is not the assignment's doing).
    _, replayed = count_replays(
        [x for x in lines if x.get("kind", "batch") == "batch" and x["at"] <= stopped]
    )
    return Outcome(
        round_.name,
        side,
        round_.consumers,
        round_.seed,
        round(percentile(values, 0.5), 3) if values else None,
        round(percentile(values, 0.99), 3) if values else None,
        round(values[-1], 3) if values else None,
        len(values),
        unprocessed,
        moves=0,
        replayed=replayed,
        storage_requests=0,
    )


# --- a round ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def emulator_with(hubs: list[str]) -> Iterator[Any]:
    from hubshift.emulator.launch import start_emulator

    server = start_emulator(hubs)
    try:
        yield server
    finally:
        server.stop()


async def run_round(
    round_: Round,
    args: argparse.Namespace,
    emulator: Any,
    azurite: Any,
    workdir: Path,
    console: Console,
    index: int,
) -> list[Outcome]:
    from azure.storage.blob import BlobServiceClient

    from hubshift.spec import DEFAULT_EVENTHUBS_ENV, DEFAULT_STORAGE_ENV

    rates = partition_rates(args, round_.seed, round_.uniform)
    warmup = args.warmup * (2 if round_.autoscaler else 1)
    total = warmup + args.window_seconds + args.tail
    hot = hot_schedule(args, round_.seed, round_.uniform, total + 30)
    proxies = {side: CountingProxy(azurite.port).start_and_wait() for side in round_.sides}
    sides: dict[str, Any] = {}
    producers: list[Producer] = []
    probes: dict[str, Any] = {}
    go = threading.Event()
    try:
        for side in round_.sides:
            hub = f"r{index}{side.lower()}"
            container = f"r{index}-{side.lower()}"
            with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
                service.create_container(container)
            storage = azurite_connection_string(proxies[side].port)
            folder = workdir / round_.name / side
            if side == "sdk":
                sdk = SdkSide(hub, folder)
                sdk.start(round_.consumers, emulator.connection_string, storage, container, args.event_cost)
                sides[side] = sdk
            else:
                env = dict(
                    os.environ,
                    **{DEFAULT_EVENTHUBS_ENV: emulator.connection_string, DEFAULT_STORAGE_ENV: storage},
                )
                hubshift = HubshiftSide(side, hub, folder)
                await hubshift.start(env, container, args, round_.consumers)
                sides[side] = hubshift
            hot_rate = 0.0 if round_.uniform else args.hot_rate
            producers.append(Producer(emulator.connection_string, hub, rates, hot, hot_rate, go))
        for producer in producers:
            producer.start()  # opens its links while the consumers settle
        await settle(sides, console)
        for producer in producers:
            await asyncio.to_thread(producer.ready.wait, 120)
        probes = {side: hub_probe(emulator.connection_string, runner.hub) for side, runner in sides.items()}
        await last_sequences(probes)  # the management links open before the window starts
        go.set()
        await asyncio.sleep(warmup)
        window_start = time.time()
        start = await last_sequences(probes)
        requests = {side: proxies[side].count for side in sides}
        await asyncio.sleep(args.window_seconds)
        window_end = time.time()
        end = await last_sequences(probes)
        requests = {side: proxies[side].count - requests[side] for side in sides}
        await asyncio.sleep(args.tail)
        stopped = time.time()
    finally:
        for producer in producers:
            producer.halt.set()
        for probe in probes.values():
            await probe.close()
        await asyncio.gather(
            *(
                asyncio.to_thread(runner.stop) if isinstance(runner, SdkSide) else runner.stop()
                for runner in sides.values()
            )
        )
    outcomes = []
    for side, runner in sides.items():
        result = outcome(round_, side, runner.lines(), start[side], end[side], args.tail, stopped)
        result.moves = runner.moves(window_start, window_end)
        result.storage_requests = requests[side]
        if isinstance(runner, HubshiftSide) and runner.capacity is not None:
            result.notes.append(f"capacity measured by the control loop: {runner.capacity:.0f} events/s")
        if isinstance(runner, HubshiftSide) and round_.autoscaler:
            counts = [n for at, n in runner.replicas if window_start <= at <= window_end]
            result.replicas_mean = round(sum(counts) / len(counts), 2) if counts else None
            result.replicas_max = max(counts, default=None)
        late = max(p.late for p in producers)
        if late > 1.0:
            result.notes.append(f"the producers fell {late:.1f} s behind their schedule")
        result.notes += [f"producer failed: {p.error}" for p in producers if p.error]
        outcomes.append(result)
        console.print(
            f"  {round_.name} {side}: p50 {result.p50} s, p99 {result.p99_text()} s, max {result.max} s, "
            f"{result.events} events ({result.unprocessed} unprocessed), {result.moves} moves, "
            f"{result.replayed} replayed, {result.storage_requests} storage requests"
            + (
                f", replicas mean {result.replicas_mean} max {result.replicas_max}"
                if round_.autoscaler
                else ""
            )
        )
    return outcomes


async def settle(sides: dict[str, Any], console: Console, timeout: float = 180) -> None:
    """Until every side's consumers read every partition, before any load: a cold start's backlog is not
    what the round measures."""
    started = time.monotonic()
    while not all(runner.settled() for runner in sides.values()):
        if time.monotonic() - started > timeout:
            waiting = [side for side, runner in sides.items() if not runner.settled()]
            raise RuntimeError(f"not settled within {timeout:g} s: {waiting}")
        await asyncio.sleep(0.5)
    console.print(f"  settled in {time.monotonic() - started:.1f} s")


def rounds(args: argparse.Namespace) -> list[Round]:
    chosen = [Round("equal-s1", 4, 1)]
    if not args.quick:
        chosen += [Round("equal-s2", 4, 2), Round("equal-s3", 4, 3)]
        chosen += [Round("needed-6", 6, 1)]
    chosen += [Round("uniform", 4, 1, uniform=True), Round("autoscaler", 8, 1, autoscaler=True)]
    return [r for r in chosen if not args.rounds or r.name in args.rounds.split(",")]


async def bench(args: argparse.Namespace, console: Console) -> list[Outcome]:
    from tests.harness.azurite import running_azurite

    chosen = rounds(args)
    workdir = Path(tempfile.mkdtemp(prefix="hubshift-bench-skew-"))
    hubs = [f"r{i}{side.lower()}:{PARTITIONS}" for i, r in enumerate(chosen) for side in r.sides]
    outcomes: list[Outcome] = []
    with emulator_with(hubs) as emulator, running_azurite(workdir / "azurite") as azurite:
        for index, round_ in enumerate(chosen):
            console.print(
                f"[bold]{round_.name}[/bold]: {round_.consumers} consumers a side, seed {round_.seed}"
            )
            outcomes += await run_round(round_, args, emulator, azurite, workdir, console, index)
    return outcomes


# --- the report ---------------------------------------------------------------------------------------------


def needed(outcomes: list[Outcome], target: float) -> dict[str, int | None]:
    """Per side: the fewest consumers (seed 1, the equal and needed rounds) that held p99 under `target`."""
    fewest: dict[str, int | None] = {}
    for side in SIDES:
        held = [
            o.consumers
            for o in outcomes
            if o.side == side
            and o.seed == 1
            and not o.round.startswith(("uniform", "autoscaler"))
            and o.p99 is not None
            and o.p99 <= target
            and o.unprocessed <= o.events / 100
        ]
        fewest[side] = min(held, default=None)
    return fewest


def report(outcomes: list[Outcome], args: argparse.Namespace, console: Console) -> dict[str, Any]:
    title = (
        f"skew: {PARTITIONS} partitions, {args.rate:g} events/s Zipf {args.zipf:g} + hot spot "
        f"{args.hot_rate:g}/s, {1 / args.event_cost:.0f} events/s per consumer"
    )
    table = Table(title=title)
    for column in (
        "round",
        "side",
        "consumers",
        "p50 (s)",
        "p99 (s)",
        "max (s)",
        "events",
        "unprocessed",
        "moves",
        "replayed",
        "storage requests",
        "replicas",
    ):
        table.add_column(column)
    for o in outcomes:
        replicas = "" if o.replicas_mean is None else f"{o.replicas_mean:g} (max {o.replicas_max})"
        table.add_row(
            o.round,
            o.side,
            str(o.consumers),
            str(o.p50),
            o.p99_text(),
            str(o.max),
            str(o.events),
            str(o.unprocessed),
            str(o.moves),
            str(o.replayed),
            str(o.storage_requests),
            replicas,
        )
    console.print(table)
    fewest = needed(outcomes, args.p99_target)
    console.print(f"fewest consumers holding p99 <= {args.p99_target:g} s (seed 1): {fewest}")
    ratios = []
    for seed in sorted({o.seed for o in outcomes if o.round.startswith("equal")}):
        pair = {o.side: o for o in outcomes if o.round == f"equal-s{seed}"}
        if "balanced" in pair and "loadAware" in pair and pair["loadAware"].p99 and pair["balanced"].p99:
            ratio = pair["balanced"].p99 / max(pair["loadAware"].p99, 1e-3)
            ratios.append({"seed": seed, "balancedOverLoadAware": round(ratio, 2)})
            console.print(f"seed {seed}: count-balanced p99 / load-aware p99 = {ratio:.1f}")
    return {
        "partitions": PARTITIONS,
        "rate": args.rate,
        "zipf": args.zipf,
        "hotRate": args.hot_rate,
        "hotEverySeconds": args.hot_every,
        "eventCostSeconds": args.event_cost,
        "windowSeconds": args.window_seconds,
        "warmupSeconds": args.warmup,
        "loadWindowSeconds": args.window,
        "lagTargetSeconds": args.lag_target,
        "p99TargetSeconds": args.p99_target,
        "sdkTuned": asdict(SDK_TUNED),
        "outcomes": [asdict(o) for o in outcomes],
        "fewestConsumersForP99Target": fewest,
        "p99Ratios": ratios,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seed 1 at 4 consumers, uniform, autoscaler")
    parser.add_argument("--rounds", default="", help="only these rounds (comma-separated names)")
    parser.add_argument("--rate", type=float, default=110.0, help="Zipf events/s over the keys")
    parser.add_argument("--zipf", type=float, default=1.0, help="the keys' Zipf exponent")
    parser.add_argument("--hot-rate", type=float, default=20.0, help="the moving hot spot's events/s")
    parser.add_argument("--hot-every", type=float, default=60.0, help="seconds between hot-spot moves")
    parser.add_argument("--event-cost", type=float, default=0.02, help="seconds of work per event")
    parser.add_argument("--warmup", type=float, default=40.0, help="seconds of load before the window")
    parser.add_argument("--window-seconds", type=float, default=50.0, help="the measured window")
    parser.add_argument("--tail", type=float, default=10.0, help="seconds after it for the last events")
    parser.add_argument("--window", type=float, default=10.0, help="loadAware.windowSeconds")
    parser.add_argument("--lag-target", type=float, default=5.0, help="the lag target's lagSeconds")
    parser.add_argument("--p99-target", type=float, default=5.0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--sdk-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sdk_worker:
        sdk_worker(json.loads(args.sdk_worker))
        return 0
    console = Console()
    # The control loop's own reads of unowned partitions lose their link when an owner's epoch receiver
    # opens: the SDK logs each as an error, which says nothing about the benchmark.
    logging.getLogger("azure").setLevel(logging.CRITICAL)
    started = time.monotonic()
    outcomes = asyncio.run(bench(args, console))
    result = report(outcomes, args, console)
    result["seconds"] = round(time.monotonic() - started)
    result["quick"] = args.quick
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    console.print(f"wrote {args.output} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
