"""Consumer throughput and latency, end to end (emulator → `hubshift consume` → sink), beside a plain
`azure-eventhub` receive loop on the same emulator and partitions, in the same run.

1. Throughput: one Spark consumer owning 4 partitions, warmed up, is parked (the test plays the operator:
   an assignment gives the partitions to nobody, the consumer hands them off); N events are loaded into the
   hub; a plain `EventHubConsumerClient.receive_batch` loop reads exactly those N events (its own consumer
   group); then the partitions are given back to the consumer, which reads the same N events from its
   checkpoints through Spark and the `aggregate` pipeline into a folder sink (`--pipeline events`: the
   `events` pipeline, a DataFrame job's path, whose rows Spark reads and writes as JSON lines). Rate = N /
   (time from the assignment to the commit record that completes the N events in the sink).
2. Latency: a steady `--rate-per-partition` events/s to each partition for `--latency-seconds`; each
   event's enqueue-to-sink latency is the sink commit record's write time minus its enqueued time (per
   batch and partition the records give the first and last enqueued time and the count: events in between
   are taken as evenly spread).

Targets (issue 4): consumer rate at least 0.7 of the raw loop's; p99 latency at most two trigger
intervals + 1 s.

    .venv/bin/python bench/throughput.py [--events 400000] [--latency-seconds 30] [--rate-per-partition 1000]
                                         [--trigger-seconds 1] [--pipeline aggregate|events] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = (
    Path(__file__).resolve().parent / "results" / "throughput.json"
)  # --pipeline events: throughput-events.json
HUB = "bench"
PARTITIONS = ["0", "1", "2", "3"]
CONSUMER = "bench-0"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


# --- the load ---------------------------------------------------------------------------------------------


def load_partitions(connection_string: str, per_partition: int, size: int = 200, hub: str = HUB) -> float:
    """Send `per_partition` events to every partition as fast as the SDK goes; seconds taken."""
    from azure.eventhub import EventData, EventHubProducerClient

    from hubshift.pipelines.sensor_events import SensorEvent

    started = time.monotonic()

    def send(partition: str) -> None:
        client = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub)
        with client:
            sent = 0
            while sent < per_partition:
                batch = client.create_batch(partition_id=partition)
                while sent < per_partition:
                    body = SensorEvent(
                        f"h{partition}{sent % 97:03d}", "s", "motion", "detected", datetime.now(UTC)
                    ).to_json()
                    try:
                        batch.add(EventData(body.ljust(size)))
                    except ValueError:
                        break
                    sent += 1
                client.send_batch(batch)

    threads = [threading.Thread(target=send, args=(p,)) for p in PARTITIONS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def steady_load(connection_string: str, rate_per_partition: float, seconds: float) -> dict[str, int]:
    """`rate_per_partition` events/s into each partition, in rounds every 0.1 s; events sent."""
    from azure.eventhub import EventData, EventHubProducerClient

    from hubshift.pipelines.sensor_events import SensorEvent

    sent: dict[str, int] = {}

    def send(partition: str) -> None:
        client = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=HUB)
        count = 0
        with client:
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < seconds:
                due = int(elapsed * rate_per_partition) + 1 - count
                if due > 0:
                    batch = client.create_batch(partition_id=partition)
                    now = datetime.now(UTC)
                    for i in range(due):
                        event = SensorEvent(f"h{partition}{(count + i) % 97:03d}", "s", "motion", "open", now)
                        batch.add(EventData(event.to_json()))
                    client.send_batch(batch)
                    count += due
                time.sleep(max(0.0, 0.1 - (time.monotonic() - started - elapsed)))
        sent[partition] = count

    threads = [threading.Thread(target=send, args=(p,)) for p in PARTITIONS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sent


def tails(connection_string: str, hub: str = HUB) -> dict[str, int]:
    """Each partition's next sequence number."""
    from azure.eventhub import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group="$Default", eventhub_name=hub
    )
    with client:
        found = {}
        for partition in PARTITIONS:
            properties = client.get_partition_properties(partition)
            found[partition] = -1 if properties["is_empty"] else properties["last_enqueued_sequence_number"]
    return {p: last + 1 for p, last in found.items()}


# --- the raw SDK loop -------------------------------------------------------------------------------------


def receive_loop(
    connection_string: str,
    start: dict[str, int],
    events: int,
    handle: Callable[[Any, list[Any]], None] | None = None,
    hub: str = HUB,
    timeout: float = 900,
) -> dict[str, float]:
    """A plain receive loop over all four partitions (one client, `receive_batch`, consumer group `raw`)
    from `start`, each batch given to `handle` (the callbacks of the partitions take turns), until `events`
    were handled: events, seconds, rate, CPU seconds of this process."""
    from azure.eventhub import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group="raw", eventhub_name=hub
    )
    received = [0]
    done = threading.Event()
    turn = threading.Lock()

    def on_batch(context: Any, batch: list[Any]) -> None:
        if not batch:
            return
        with turn:
            if handle is not None:
                handle(context, batch)
            received[0] += len(batch)
            if received[0] >= events:
                done.set()

    positions = {p: s - 1 if s > 0 else "-1" for p, s in start.items()}
    worker = threading.Thread(
        target=client.receive_batch,
        kwargs={"on_event_batch": on_batch, "starting_position": positions, "max_batch_size": 300},
        daemon=True,
    )
    cpu, started = time.process_time(), time.monotonic()
    worker.start()
    done.wait(timeout)
    elapsed = time.monotonic() - started
    cpu = time.process_time() - cpu
    client.close()
    worker.join(10)
    return {"events": received[0], "seconds": elapsed, "rate": received[0] / elapsed, "cpuSeconds": cpu}


def raw_loop(connection_string: str, start: dict[str, int], events: int) -> dict[str, float]:
    """A plain receive loop over all four partitions (one client, `receive_batch`) from `start`."""
    return receive_loop(connection_string, start, events, timeout=600)


# --- the consumer -----------------------------------------------------------------------------------------


class Consumer:
    """One `hubshift consume` (`pipeline`: the manifest's `consumer.pipeline`, default the aggregate) with its
    own sink and store under `workdir`; `environ` adds connection strings (a pipeline's targets), `consumer`
    replaces blocks of the manifest's `spec.consumer` (another sink, code, Spark settings)."""

    def __init__(
        self,
        workdir: Path,
        connection_string: str,
        trigger_seconds: float,
        *,
        pipeline: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
        hub: str = HUB,
        name: str = "consumer",
        consumer: dict[str, Any] | None = None,
    ) -> None:
        self.workdir = workdir
        self.sink = workdir / f"{name}-sink"
        self.database = workdir / f"{name}-store.db"
        manifest = workdir / f"{name}.yaml"
        import yaml

        manifest.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "hubshift.dev/v1alpha1",
                    "kind": "PartitionedConsumer",
                    "metadata": {"name": "bench"},
                    "spec": {
                        "eventHubs": {"hub": hub},
                        "checkpointStore": {"sqlite": {"path": str(self.database)}},
                        "consumer": {
                            "spark": {
                                "master": "local[2]",
                                "triggerIntervalSeconds": trigger_seconds,
                                "maxEventsPerTrigger": 100_000,
                            },
                            "checkpoint": {"everySeconds": 5, "everyEvents": 50_000},
                            "sink": {"type": "folder", "folder": {"path": str(self.sink)}},
                            **({"pipeline": pipeline} if pipeline else {}),
                            **(consumer or {}),  # the sink, the code, the Spark settings of another bench
                        },
                        "rebalance": {"maxHandoffSeconds": 15, "leaseDurationSeconds": 30},
                    },
                }
            )
        )
        from hubshift.spec import DEFAULT_EVENTHUBS_ENV

        self._records: dict[Path, dict[str, Any]] = {}
        self.log_path = workdir / f"{name}.log"
        command = [sys.executable, "-m", "hubshift.cli", "consume", "-f", str(manifest), "--id", CONSUMER]
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [
                    *command,
                    "--http-port",
                    "0",
                    "--list-interval",
                    "5",
                    "--scratch",
                    str(workdir / f"{name}-scratch"),
                ],
                env={**os.environ, DEFAULT_EVENTHUBS_ENV: connection_string, **(environ or {})},
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"the consumer did not start: {self.log_path.read_text()[-2000:]}")
        self.url = line.strip().rsplit(" ", 1)[1]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def nudge(self) -> None:
        request = urllib.request.Request(self.url + "/assignment", data=b"", method="POST")
        urllib.request.urlopen(request, timeout=5).close()

    def records(self) -> list[dict[str, Any]]:
        """The sink's commit records, each read once (again only if rewritten): the bench polls them while
        it measures the consumer's rate and CPU."""
        folder = self.sink / "_batches"
        found = []
        for path in sorted(folder.glob("*.json")) if folder.exists() else []:
            written = path.stat().st_mtime
            known = self._records.get(path)
            if known is None or known["writtenAt"] != written:
                known = self._records[path] = {**json.loads(path.read_text()), "writtenAt": written}
            found.append(known)
        return found

    def committed_next(self) -> dict[str, int]:
        """Per partition, one past the highest sequence number in the sink."""
        top = dict.fromkeys(PARTITIONS, 0)
        for record in self.records():
            for part in record["partitions"]:
                top[part["partition"]] = max(top[part["partition"]], part["lastSequenceNumber"] + 1)
        return top

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far of the consumer's processes: its main process (agent, receivers,
        foreachBatch), the Spark JVM, and Spark's Python workers and source runner."""
        import psutil

        split = {"main": 0.0, "jvm": 0.0, "pythonWorkers": 0.0}
        try:
            process = psutil.Process(self.process.pid)
            tree = [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            return split
        for member in tree:
            try:
                times = member.cpu_times()
                kind = (
                    "main"
                    if member.pid == process.pid
                    else "jvm"
                    if "java" in member.name()
                    else "pythonWorkers"
                )
                split[kind] += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return split

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return -9


class Parking:
    """The bench plays the operator: it publishes assignments of every partition to one owner in the
    consumer's store, the consumer or nobody (`park`: the consumer hands its partitions off)."""

    def __init__(self, consumer: Consumer, connection_string: str, hub: str = HUB) -> None:
        from azure.eventhub import parse_connection_string

        from hubshift.ownership.scope import Scope
        from hubshift.ownership.stores.locations import open_store, sqlite_url

        host = parse_connection_string(connection_string).fully_qualified_namespace
        self.scope = Scope(host, hub, "$Default")
        self.consumer = consumer
        self.store = open_store(sqlite_url(consumer.database), create=True)
        self.generation = 0

    def assign(self, owner: str) -> None:
        from hubshift.ownership.assignment import publish_assignment, read_assignment
        from hubshift.ownership.model import Assignment, Phase

        self.generation += 1
        record = read_assignment(self.store, self.scope)
        assignment = Assignment(
            self.generation, dict.fromkeys(PARTITIONS, owner), Phase.REBALANCING, 1, datetime.now(UTC)
        )
        publish_assignment(self.store, self.scope, assignment, etag=record.etag if record else None)
        self.consumer.nudge()

    def owners(self) -> dict[str, str | None]:
        from hubshift.ownership.snapshot import take_snapshot

        return {row.partition: row.owner for row in take_snapshot(self.store, self.scope).partitions}

    def park(self) -> None:
        self.assign("parked")
        wait_until(lambda: all(o is None for o in self.owners().values()), 120, "the consumer to hand off")

    def close(self) -> None:
        self.store.close()


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


# --- the run ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=400_000, help="events for the throughput phase")
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument("--rate-per-partition", type=float, default=1000.0)
    parser.add_argument("--warmup-seconds", type=float, default=20.0)
    parser.add_argument("--trigger-seconds", type=float, default=1.0, help="the consumer's trigger interval")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, sink)")
    parser.add_argument(
        "--pipeline",
        choices=["aggregate", "events"],
        default="aggregate",
        help="the consumer's pipeline: the aggregate (a task pipeline: its task reads the spool) or events "
        "(a DataFrame job's path: Spark reads the events and writes them as JSON lines)",
    )
    args = parser.parse_args()

    from hubshift.emulator.launch import running_emulator

    workdir = Path(tempfile.mkdtemp(prefix="hubshift-bench-throughput-"))
    results: dict[str, Any] = {
        "events": args.events,
        "triggerIntervalSeconds": args.trigger_seconds,
        "pipeline": args.pipeline,
    }
    with running_emulator([f"{HUB}:4"], consumer_groups=["raw"]) as emulator:
        cs = emulator.connection_string
        pipeline = None if args.pipeline == "aggregate" else {"type": args.pipeline}
        consumer = Consumer(workdir, cs, args.trigger_seconds, pipeline=pipeline)
        parking = Parking(consumer, cs)
        assign, owners = parking.assign, parking.owners
        try:
            wait_until(consumer.ready, 300, "the consumer to start")
            assign(CONSUMER)
            wait_until(lambda: owners() == dict.fromkeys(PARTITIONS, CONSUMER), 60, "the consumer to own")
            print(
                "warming up (the JVM compiles Spark's code over the first few dozen batches) ...", flush=True
            )
            steady_load(cs, 500, args.warmup_seconds)
            wait_until(lambda: consumer.committed_next() == tails(cs), 300, "the warm-up in the sink")

            assign("parked")
            wait_until(lambda: all(o is None for o in owners().values()), 60, "the consumer to hand off")
            start = tails(cs)
            per_partition = args.events // len(PARTITIONS)
            load_seconds = load_partitions(cs, per_partition)
            target = tails(cs)
            total = sum(target[p] - start[p] for p in PARTITIONS)
            print(
                f"loaded {total} events in {load_seconds:.1f} s; the raw SDK loop reads them ...", flush=True
            )
            raw = raw_loop(cs, start, total)
            print(f"raw loop: {raw['rate']:.0f} events/s; the consumer reads them ...", flush=True)

            cpu_before = consumer.cpu_seconds()
            began = time.time()
            assign(CONSUMER)
            wait_until(lambda: consumer.committed_next() == target, 900, "the consumer to finish")
            after = consumer.cpu_seconds()
            cpu = {kind: round(after[kind] - cpu_before[kind], 2) for kind in after}
            records = [r for r in consumer.records() if r["writtenAt"] > began]
            finished = max(r["writtenAt"] for r in records)
            seconds = finished - began
            # Steady state: between the first and the last batch (without start-up and the last trigger).
            records.sort(key=lambda r: r["writtenAt"])
            steady_events = sum(p["events"] for r in records[1:] for p in r["partitions"])
            steady_seconds = records[-1]["writtenAt"] - records[0]["writtenAt"]
            ours = {
                "events": total,
                "seconds": seconds,
                "rate": total / seconds,
                "cpuSeconds": sum(cpu.values()),
                "cpuSecondsByProcess": cpu,
                "batches": len(records),
                "steadyRate": steady_events / steady_seconds if steady_seconds > 0 else float("nan"),
            }
            results["throughput"] = {
                "rawSdkLoop": raw,
                "consumer": ours,
                "ratio": ours["rate"] / raw["rate"],
                "target": 0.7,
                "loadSeconds": load_seconds,
            }
            print(
                f"consumer: {ours['rate']:.0f} events/s ({ours['rate'] / raw['rate']:.2f} of raw)", flush=True
            )

            print(
                f"latency: {args.rate_per_partition:.0f} events/s per partition for "
                f"{args.latency_seconds:.0f} s ...",
                flush=True,
            )
            before = tails(cs)
            sent = steady_load(cs, args.rate_per_partition, args.latency_seconds)
            after = tails(cs)
            wait_until(lambda: consumer.committed_next() == after, 300, "the steady load in the sink")
            latencies: list[float] = []
            for record in consumer.records():
                for part in record["partitions"]:
                    p = part["partition"]
                    if part["firstSequenceNumber"] < before[p]:
                        continue
                    first = datetime.fromisoformat(part["firstEnqueuedTime"]).timestamp()
                    last = datetime.fromisoformat(part["lastEnqueuedTime"]).timestamp()
                    n = part["events"]
                    for i in range(n):
                        enqueued = first + (last - first) * ((i + 0.5) / n)
                        latencies.append(record["writtenAt"] - enqueued)
            produced = sum(sent.values())
            results["latency"] = {
                "ratePerPartition": args.rate_per_partition,
                "seconds": args.latency_seconds,
                "events": produced,
                "achievedRate": produced / args.latency_seconds,
                "p50": percentile(latencies, 0.50),
                "p99": percentile(latencies, 0.99),
                "max": max(latencies) if latencies else float("nan"),
                "target_p99": 2 * args.trigger_seconds + 1,
            }
        finally:
            results["consumerExit"] = consumer.stop()
            parking.close()
    path = RESULTS.with_name("throughput.json" if args.pipeline == "aggregate" else "throughput-events.json")
    finish(path, results, print_table, workdir, keep=args.keep)


def finish(
    path: Path, results: dict[str, Any], table: Callable[[dict[str, Any]], None], workdir: Path, *, keep: bool
) -> None:
    """Write the results as JSON, print the table, remove the work folder unless kept."""
    results["when"] = datetime.now(UTC).isoformat()
    results["cpus"] = os.cpu_count()
    results["loadAverage"] = os.getloadavg()[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    table(results)
    if keep:
        print(f"work folder: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def print_table(results: dict[str, Any]) -> None:
    t, lat = results.get("throughput"), results.get("latency")
    print()
    print(f"{'':38} {'events/s':>10} {'seconds':>8} {'CPU s':>7}")
    if t:
        for name, row in (
            ("plain azure-eventhub receive loop", t["rawSdkLoop"]),
            ("hubshift consume (Spark)", t["consumer"]),
        ):
            print(f"{name:38} {row['rate']:10.0f} {row['seconds']:8.1f} {row['cpuSeconds']:7.1f}")
        verdict = "ok" if t["ratio"] >= t["target"] else "BELOW TARGET"
        print(f"{'consumer / raw':38} {t['ratio']:10.2f}   (target >= {t['target']}: {verdict})")
        steady = t["consumer"]["steadyRate"]
        print(
            f"{'consumer, steady state':38} {steady:10.0f}   ({steady / t['rawSdkLoop']['rate']:.2f} of raw; "
            f"between its first and last of {t['consumer']['batches']} batches)"
        )
        split = ", ".join(f"{k} {v:.1f}" for k, v in t["consumer"]["cpuSecondsByProcess"].items())
        print(f"{'consumer CPU seconds by process':38} {split}")
    if lat:
        verdict = "ok" if lat["p99"] <= lat["target_p99"] else "ABOVE TARGET"
        print(
            f"enqueue-to-sink at {lat['achievedRate']:.0f} events/s: p50 {lat['p50']:.2f} s, "
            f"p99 {lat['p99']:.2f} s, max {lat['max']:.2f} s "
            f"(target p99 <= {lat['target_p99']:.0f} s: {verdict})"
        )
    name = (
        "throughput.json" if results.get("pipeline", "aggregate") == "aggregate" else "throughput-events.json"
    )
    print(f"\nwritten to {RESULTS.with_name(name)}")


if __name__ == "__main__":
    main()
