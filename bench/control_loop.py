"""The cost of one control-loop cycle at 1,024 partitions and 100 consumers (target: under 2 s, and O(1)
storage requests per cycle, not per partition).

Real servers on 127.0.0.1: the hubshift emulator with one 1,024-partition hub (events in every partition),
and a store holding 1,024 checkpoints leased by 100 registered consumers (SQLite by default, Azurite with
`--store azurite`). The cycle is `hubshift.operator.loop.ControlLoop.cycle` as the operator runs
it, with a stand-in runtime that reports the 100 consumers ready (so no pods or processes are measured).
Every storage request is counted by kind; Event Hubs management requests are counted by the probe.

Measured: steady cycles (a backlog read of all 1,024 partitions, one listing, the autoscaler, the
rebalance machine, lag in seconds, status); cycles between polls (no Event Hubs read); and the cycle that
publishes a new assignment after a consumer left (the planner over 1,024 partitions and the compare-and-swap
write). Each checkpoint carries the next event's enqueued time, as the consumers write it; the lag decision
over all partitions is also timed on its own (`lagDecision`), and the events the loop read itself counted.

    .venv/bin/python bench/control_loop.py [--store sqlite|azurite] [--cycles 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

# The shared harness (Azurite, the emulator's helpers) lives in the repository's tests/harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hubshift.emulator.launch import running_emulator
from hubshift.eventhubs.management import EventHubsProbe
from hubshift.eventhubs.model import PartitionInfo
from hubshift.eventhubs.target import resolve_target
from hubshift.manifest import parse_manifest
from hubshift.operator.loop import ControlLoop, CycleReport
from hubshift.operator.observe import backlog_per_partition, lease_owners
from hubshift.operator.partition_lag import lag_per_partition, lag_reads, worst_lag
from hubshift.operator.runtime import ConsumerInstance
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition
from hubshift.ownership.membership import join_pool
from hubshift.ownership.model import Checkpoint
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseStore
from hubshift.ownership.stores.locations import open_store, sqlite_url

RESULTS = Path(__file__).resolve().parent / "results" / "control_loop.json"
HUB = "big"
NAME = "homes"
TARGET_SECONDS = 2.0


@dataclass
class StandInRuntime:
    """100 ready consumers, as the kopf pod index would report them; nothing is started."""

    count: int
    replica_count: int = 0
    events: list[str] = field(default_factory=list)
    gone: set[int] = field(default_factory=set)

    async def consumers(self) -> list[ConsumerInstance]:
        return [
            ConsumerInstance(f"{NAME}-{i}", i, True, f"127.0.0.1:{20000 + i}")
            for i in range(self.count)
            if i not in self.gone
        ]

    async def replicas(self) -> int:
        return self.replica_count

    async def set_replicas(self, count: int) -> None:
        self.replica_count = count

    async def revision(self) -> str | None:
        return None

    async def replace_consumer(self, name: str) -> bool:
        return True

    async def record_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(reason)

    async def publish_status(self, status: dict[str, object]) -> None:
        json.dumps(status)  # what serialising it for the API server costs


class TimedProbe:
    """The real probe, timed."""

    def __init__(self, probe: EventHubsProbe) -> None:
        self.probe = probe
        self.seconds = 0.0
        self.partition_requests = 0  # the probe's requests for partition properties (the rest read events)

    async def partitions(self) -> dict[str, PartitionInfo]:
        started = time.perf_counter()
        try:
            return await self.probe.partitions()
        finally:
            self.seconds = time.perf_counter() - started
            self.partition_requests = self.probe.requests

    async def enqueued_time(self, partition: str, sequence_number: int) -> float | None:
        return await self.probe.enqueued_time(partition, sequence_number)

    async def close(self) -> None:
        await self.probe.close()


def manifest(consumers: int) -> Any:
    return parse_manifest(
        {
            "apiVersion": "hubshift.dev/v1alpha1",
            "kind": "PartitionedConsumer",
            "metadata": {"name": NAME},
            "spec": {
                "eventHubs": {"hub": HUB},
                "checkpointStore": {"sqlite": {"path": "unused.db"}},
                "scaling": {"minReplicas": consumers, "maxReplicas": consumers, "pollingIntervalSeconds": 15},
                "rebalance": {"delaySeconds": 5, "maxHandoffSeconds": 15},
            },
        }
    )


def seed_store(store: LeaseStore, scope: Scope, partitions: int, consumers: int, console: Console) -> float:
    """1,024 checkpoint blobs, each leased by one of 100 live consumers, with a position."""
    started = time.perf_counter()
    names = [f"{NAME}-{i}" for i in range(consumers)]
    for name in names:
        join_pool(store, scope, name, clock=time.monotonic)
    for p in range(partitions):
        owner = names[p * consumers // partitions]
        lease = claim_partition(store, scope, str(p), owner)
        # as a consumer writes it: the position, and when the event after it was enqueued
        next_enqueued = datetime.now(UTC) - timedelta(seconds=p % 30)
        write_checkpoint(store, lease, Checkpoint(str(p * 100), p % 3), next_enqueued=next_enqueued)
    seconds = time.perf_counter() - started
    console.print(f"seeded {partitions} checkpoints for {consumers} consumers in {seconds:.1f}s")
    return seconds


def send_events(connection_string: str, partitions: int) -> None:
    """Events spread over the partitions by the service (one link; a link per partition takes minutes)."""
    from azure.eventhub import EventData, EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=HUB)
    with producer:
        remaining = partitions * 4
        while remaining > 0:
            batch = producer.create_batch()
            for i in range(min(500, remaining)):
                batch.add(EventData(f"event {i}"))
            remaining -= len(batch)
            producer.send_batch(batch)


def cycle_row(
    kind: str, report: CycleReport, probe_seconds: float | None, counts: dict[str, int]
) -> dict[str, Any]:
    return {
        "kind": kind,
        "seconds": round(report.duration, 4),
        "eventHubsSeconds": None if probe_seconds is None else round(probe_seconds, 4),
        "storeRequests": report.store_requests,
        "storeRequestsByKind": counts,
        "phase": report.state.phase.value,
        "generation": report.state.generation,
        "backlog": report.status.total_backlog,
        "lagSeconds": report.status.lag_seconds,
        "lagKnown": None
        if report.lag is None
        else sum(1 for x in report.lag.values() if x.seconds is not None),
        "lagUnknown": None
        if report.lag is None
        else sum(1 for x in report.lag.values() if x.seconds is None),
    }


async def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    partitions, consumers = args.partitions, args.consumers
    with running_emulator([f"{HUB}:{partitions}"]) as emulator:
        console.print(f"emulator up with {partitions} partitions; sending events to each")
        await asyncio.to_thread(send_events, emulator.connection_string, partitions)
        azurite = None
        if args.store == "azurite":
            from tests.harness.azurite import start_azurite

            azurite = start_azurite()
            store = open_store(azurite.connection_string, "bench-control-loop", create=True)
        else:
            folder = Path(tempfile.mkdtemp(prefix="hubshift-bench-"))
            store = open_store(sqlite_url(folder / "store.db"), create=True)
        try:
            consumer = manifest(consumers)
            target = resolve_target(
                consumer.spec.event_hubs,
                {consumer.spec.event_hubs.connection_string_variable: emulator.connection_string},
            )
            scope = Scope(target.fqns, target.hub, target.consumer_group)
            seed_seconds = await asyncio.to_thread(seed_store, store, scope, partitions, consumers, console)
            probe = TimedProbe(EventHubsProbe(target))
            runtime = StandInRuntime(consumers, replica_count=consumers)

            async def nudge(address: str, generation: int) -> bool:
                return True

            loop = ControlLoop(consumer, scope, store, probe, runtime, nudge=nudge)
            rows: list[dict[str, Any]] = []

            async def run(kind: str, *, poll: bool) -> CycleReport:
                if poll:
                    loop.observer.probed_at = None  # the polling interval has passed
                before = dict(loop.store.counts)
                report = await loop.cycle()
                counts = {
                    k: v - before.get(k, 0) for k, v in loop.store.counts.items() if v - before.get(k, 0)
                }
                rows.append(cycle_row(kind, report, probe.seconds if poll else None, counts))
                return report

            await run("first (no record yet: publishes)", poll=True)
            await run("warm-up", poll=True)
            for _ in range(args.cycles):
                await run("steady, with backlog read", poll=True)
            for _ in range(args.cycles):
                await run("steady, between polls", poll=False)
            lag_decision = time_lag_decision(loop)
            runtime.gone.add(consumers - 1)  # a consumer left: holddown, then a publication
            await run("consumer left: holddown starts", poll=False)
            loop.clock = lambda: time.time() + 10  # past the 5 s delay
            await run("holddown over: plan + CAS publish", poll=False)
            await loop.close()
        finally:
            store.close()
            if azurite is not None:
                azurite.stop()
    return {
        "partitions": partitions,
        "consumers": consumers,
        "store": args.store,
        "seedSeconds": round(seed_seconds, 2),
        "targetSeconds": TARGET_SECONDS,
        "cycles": rows,
        "lagDecision": lag_decision,
        "lagEventReads": probe.probe.requests - probe.partition_requests,
    }


def time_lag_decision(loop: ControlLoop, rounds: int = 20) -> dict[str, Any]:
    """The lag decision alone over the last observation (every partition): its cost per cycle."""
    observed = loop.observer
    assert observed.partitions is not None and observed.snapshot is not None
    backlog = backlog_per_partition(
        observed.partitions, observed.snapshot, loop.consumer.spec.consumer.start_position
    )
    owners = lease_owners(observed.snapshot, observed.partition_ids)
    started = time.perf_counter()
    for _ in range(rounds):
        lags = lag_per_partition(
            observed.partitions, observed.snapshot, backlog, observed.lag_read, time.time()
        )
        lag_reads(lags, backlog, owners, observed.snapshot.live_members, observed.lag_tried, time.time())
        worst_lag(lags)
    seconds = (time.perf_counter() - started) / rounds
    return {"partitions": len(observed.partitions), "secondsPerCycle": round(seconds, 5)}


def report(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"one control-loop cycle, {result['partitions']} partitions, {result['consumers']} consumers, "
        f"{result['store']} store"
    )
    columns = (
        "cycle",
        "seconds",
        "Event Hubs read (s)",
        "store requests",
        "by kind",
        "phase / gen",
        "lag known",
    )
    for column in columns:
        table.add_column(column)
    for row in result["cycles"]:
        table.add_row(
            row["kind"],
            f"{row['seconds']:.3f}",
            "-" if row["eventHubsSeconds"] is None else f"{row['eventHubsSeconds']:.3f}",
            str(row["storeRequests"]),
            ", ".join(f"{k} {v}" for k, v in sorted(row["storeRequestsByKind"].items())),
            f"{row['phase']} / {row['generation']}",
            "-" if row["lagKnown"] is None else f"{row['lagKnown']} ({row['lagUnknown']} unknown)",
        )
    console.print(table)
    decision = result["lagDecision"]
    console.print(
        f"lag in seconds: the decision over {decision['partitions']} partitions takes "
        f"{decision['secondsPerCycle'] * 1000:.1f} ms per cycle; events read by the loop itself: "
        f"{result['lagEventReads']} (no extra storage or Event Hubs request: the times come with the listing)"
    )
    steady = [r["seconds"] for r in result["cycles"] if r["kind"].startswith("steady, with")]
    worst = max(r["seconds"] for r in result["cycles"][1:])
    requests = max(r["storeRequests"] for r in result["cycles"][1:])
    summary = {
        "steadyMedianSeconds": round(statistics.median(steady), 4),
        "worstSeconds": worst,
        "maxStoreRequestsPerCycle": requests,
        "storeRequestsPerPartition": round(requests / result["partitions"], 5),
        "withinTarget": worst < TARGET_SECONDS,
    }
    result["summary"] = summary
    console.print(
        f"steady cycle median {summary['steadyMedianSeconds']:.3f}s, worst {worst:.3f}s "
        f"(target < {TARGET_SECONDS:g}s: {'met' if summary['withinTarget'] else 'MISSED'}); "
        f"at most {requests} storage requests per cycle = {summary['storeRequestsPerPartition']} per "
        "partition (O(1): one listing, plus a read or write when a record changes)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["sqlite", "azurite"], default="sqlite")
    parser.add_argument("--partitions", type=int, default=1024)
    parser.add_argument("--consumers", type=int, default=100)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 steady cycles of each kind")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.cycles = 2
    console = Console(width=max(Console().width, 150))
    result = asyncio.run(measure(args, console))
    report(result, console)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    console.print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
