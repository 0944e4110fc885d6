"""A stateful streaming job two ways, in one run on one machine: hubshift's (`pipeline.type: stream`: a
query per partition, each with its own checkpoint and RocksDB state, the state moving with the partition)
and Spark's own (the same job as one query over every partition with one durable checkpoint; to rescale,
the query is stopped and started again elsewhere from that checkpoint).

The job keeps state that grows with the events: every event's id is kept for an hour of event time
(`dropDuplicatesWithinWatermark`) and the readings are counted per key in one-minute windows. Both sides
read the same hub through hubshift's receivers and spool (the emulator; its consumer groups `$Default` and
`plain`), and write with the same idempotent Delta writes.

Figures, per side, written to bench/results/stateful.json:
- `eventsPerSecond`: the events of the load over the time to commit them all (one consumer for hubshift,
  one query for Spark's way: the same single process's work);
- hubshift: each planned handoff of a partition from consumer c0 to c1 (the assignment published as the
  operator would), the seconds from the publication to c1's first committed batch of the partition (its
  state restored from the checkpoint) with the partition's state rows and bytes, and the other partitions
  reading meanwhile;
- Spark's way: the seconds from the decision to restart (SIGTERM to the query's process, which lets its
  batch in flight commit) to the new process's first committed batch, during which every partition stops.

    .venv/bin/python bench/stateful.py [--partitions 4] [--events 200000] [--handoffs 4] [--runs 1]
        [--batch 20000] [--pad 0]

`--batch` is each of hubshift's queries' `maxEventsPerTrigger` (a query per partition); Spark's way's one
query takes `--batch` times the partitions, so both plan as many events of a partition per batch. `--pad`
makes every event's id that many random characters longer: the dedupe keeps each id for an hour of event
time, so a partition's state grows by about that many bytes per event, on disk too (100 MB a partition:
`--pad 3400` with 30,000 events a partition, `--events 60000` over 2 partitions).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hubshift.emulator.launch import RunningEmulator, start_emulator
from hubshift.manifest import load_manifest
from hubshift.ownership.assignment import publish_assignment, read_assignment
from hubshift.ownership.model import Assignment, Phase
from hubshift.ownership.scope import Scope
from hubshift.ownership.stores.locations import open_store, sqlite_url
from hubshift.spec import DEFAULT_EVENTHUBS_ENV
from tests.harness.ranges import percentile
from tests.harness.spark_jars import spark_jars_folder

RESULTS = Path(__file__).resolve().parent / "results" / "stateful.json"
HUB = "stateful"
JOB = '''
from pyspark.sql import functions as F

def job(events):
    """Every event's id kept an hour of event time (repeats dropped), readings counted per key and minute."""
    readings = events.select(
        F.get_json_object(F.col("body").cast("string"), "$.id").alias("id"),
        F.get_json_object(F.col("body").cast("string"), "$.key").alias("key"),
        F.to_timestamp(F.get_json_object(F.col("body").cast("string"), "$.t")).alias("t"),
    )
    unique = readings.withWatermark("t", "1 hour").dropDuplicatesWithinWatermark(["id"])
    counts = unique.groupBy(F.window("t", "1 minute"), "key").count()
    return counts.select(F.col("window.start").alias("minute"), "key", "count")
'''
T0 = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)


def send(emulator: RunningEmulator, partitions: int, events: int, first: int = 0, pad: int = 0) -> None:
    """`events` events with ids from `first`, spread evenly over the partitions, event time a second apart
    per partition; each id `pad` characters longer (the dedupe keeps every id: the state grows with it)."""
    from azure.eventhub import EventData, EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name=HUB)
    with producer:
        for partition in range(partitions):
            numbers = range(first + partition, first + events, partitions)
            batch = producer.create_batch(partition_id=str(partition))
            for n in numbers:
                moment = T0 + timedelta(seconds=n // partitions)
                # random characters: RocksDB compresses its files, and a repeated pad would shrink to nothing
                body = {
                    "id": f"e{n}-{secrets.token_hex((pad + 1) // 2)[:pad]}",
                    "key": f"k{n % 97}",
                    "t": moment.isoformat(),
                }
                event = EventData(json.dumps(body))
                try:
                    batch.add(event)
                except ValueError:
                    producer.send_batch(batch)
                    batch = producer.create_batch(partition_id=str(partition))
                    batch.add(event)
            producer.send_batch(batch)


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(value for (sample, _), value in samples.items() if sample == name)


def by_partition(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, float]:
    return {dict(labels)["partition"]: value for (sample, labels), value in samples.items() if sample == name}


class Consumer:
    def __init__(self, manifest: Path, identity: str, workdir: Path, environ: dict[str, str]) -> None:
        self.log = workdir / f"{identity}.log"
        command = [sys.executable, "-m", "hubshift.cli", "consume", "-f", str(manifest), "--id", identity]
        command += [
            "--http-port",
            "0",
            "--scratch",
            str(workdir / f"scratch-{identity}"),
            "--list-interval",
            "1",
        ]
        self.process = subprocess.Popen(
            command, env=environ, stdout=subprocess.PIPE, stderr=self.log.open("w"), text=True
        )
        line = self.process.stdout.readline() if self.process.stdout else ""
        self.url = line.strip().rsplit(" ", 1)[-1]

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return metrics(self.url)

    def ready(self) -> bool:
        try:
            return bool(urllib.request.urlopen(f"{self.url}/readyz", timeout=5).status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait(condition: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.2)
    return time.monotonic() - started


def publish(
    store: Any, scope: Scope, owners: dict[str, str], generation: int, phase: Phase = Phase.REBALANCING
) -> None:
    """A generation of the assignment, as the operator publishes it."""
    record = read_assignment(store, scope)
    replicas = len(set(owners.values()))
    assignment = Assignment(generation, owners, phase, replicas, datetime.now(UTC), max_handoff_seconds=120.0)
    publish_assignment(store, scope, assignment, etag=record.etag if record else None)


def hubshift_side(args: argparse.Namespace, emulator: RunningEmulator, workdir: Path) -> dict[str, Any]:
    code = workdir / "job"
    store_file = workdir / "store.db"
    manifest = workdir / "hubshift.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "hubshift.dev/v1alpha1",
                "kind": "PartitionedConsumer",
                "metadata": {"name": "stateful"},
                "spec": {
                    "eventHubs": {"hub": HUB},
                    "checkpointStore": {"sqlite": {"path": str(store_file)}},
                    "consumer": {
                        "spark": spark_block(args),
                        "code": {"path": str(code)},
                        "pipeline": {"type": "stream", "stream": {"function": "stateful_job:job"}},
                        "sink": {"type": "delta", "delta": {"path": str(workdir / "table")}},
                    },
                    "rebalance": {"maxHandoffSeconds": 120},
                },
            }
        )
    )
    environ = {
        **os.environ,
        DEFAULT_EVENTHUBS_ENV: emulator.connection_string,
        "HUBSHIFT_SPARK_JARS": spark_jars_folder(),
    }
    load_manifest(manifest)  # a manifest the consumers refuse would fail each of them alone
    store = open_store(sqlite_url(store_file), create=True)  # the consumers' container: the default
    scope = Scope(f"127.0.0.1:{emulator.port}", HUB, "$Default")
    partitions = [str(p) for p in range(args.partitions)]
    publish(store, scope, dict.fromkeys(partitions, "c0"), 1, Phase.READY)
    first = Consumer(manifest, "c0", workdir, environ)
    second: Consumer | None = None
    try:
        # timed from the first committed batch, as Spark's way is (its session's and queries' start left out)
        wait(lambda: total(first.samples(), "hubshift_consumer_events_total") > 0, 600, "a first batch")
        started = time.monotonic()
        wait(
            lambda: total(first.samples(), "hubshift_consumer_events_total") >= args.events,
            1800,
            "hubshift's consumer to commit every event",
        )
        seconds = time.monotonic() - started
        # The second consumer joins once the first has read everything: named in no generation yet, it
        # waits for one (a consumer that joins while the first is starting could balance on its own).
        second = Consumer(manifest, "c1", workdir, environ)
        # As the operator does, partitions move to it once it is ready (its Spark session started, its
        # membership written), so a move times the partition's own handoff, not a consumer's start.
        wait(lambda c=second: c.ready(), 600, "c1 to be ready")
        handoffs = []
        owners = dict.fromkeys(partitions, "c0")
        for generation, partition in enumerate(partitions[: args.handoffs], start=2):
            before = first.samples()
            rows = by_partition(before, "hubshift_consumer_state_rows").get(partition, 0.0)
            size = by_partition(before, "hubshift_consumer_state_bytes").get(partition, 0.0)
            owners[partition] = "c1"
            decided = time.monotonic()
            publish(store, scope, owners, generation)
            took = wait(
                lambda p=partition, c=second: (
                    p in by_partition(c.samples(), "hubshift_consumer_state_restore_seconds")
                ),
                600,
                f"partition {partition}'s first batch on c1",
            )
            restore = by_partition(second.samples(), "hubshift_consumer_state_restore_seconds")[partition]
            handoffs.append(
                {
                    "partition": partition,
                    "seconds": round(took, 2),
                    "restoreSeconds": round(restore, 2),
                    "stateRows": rows,
                    "stateBytes": size,
                    "decidedAt": decided,
                }
            )
        return {
            "eventsPerSecond": round(args.events / seconds, 1),
            "seconds": round(seconds, 1),
            "handoffs": handoffs,
        }
    finally:
        first.stop()
        if second is not None:
            second.stop()
        store.close()


def spark_block(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "master": "local[2]",
        "triggerIntervalSeconds": 1,
        "maxEventsPerTrigger": args.batch,
        "driverMemory": "1g",
        "shufflePartitions": 2,
    }


# --- Spark's own way: one query over every partition, restarted to rescale ---------------------------------


def plain_worker(workdir: Path, connection_string: str, port: int, partitions: int, batch: int) -> None:
    """One process: hubshift's receivers and spool for every partition (consumer group `plain`, no
    ownership: it is the only reader), and one streaming query over them all with the job, its checkpoint in
    `workdir/checkpoint`; prints one line per committed batch (`batch <id> <events> <monotonic>`); SIGTERM
    lets the batch in flight commit, then stops."""
    sys.path.insert(0, str(workdir / "job"))
    import stateful_job  # type: ignore[import-not-found]

    from hubshift.consumer.spark.session import build_session
    from hubshift.consumer.spark.source import (
        FORMAT,
        OPTION_MAX_EVENTS,
        OPTION_SCRATCH,
        OPTION_SPOOL,
        EventHubsDataSource,
    )
    from hubshift.consumer.spark.spooling import Reading, SpooledPartitions
    from hubshift.consumer.spark.streams import STATE_CONF, committed_next
    from hubshift.eventhubs.receiver import StartAt
    from hubshift.eventhubs.target import EventHubsTarget
    from hubshift.manifest import ConsumerSpec
    from hubshift.sinks import SinkSpec, build_sink
    from hubshift.sinks.base import StreamBatch

    spec = ConsumerSpec.model_validate({"spark": {**spark_block(argparse.Namespace(batch=batch))}})
    target = EventHubsTarget(connection_string, f"127.0.0.1:{port}", HUB, "plain")
    scratch = workdir / "plain-scratch"
    reader = SpooledPartitions(Reading(target, "plain", spec, scratch))
    reader.notify = lambda event: None
    # Nothing here tells the reader what the query committed (hubshift's engines do, and trim the spool), so
    # its back-pressure would stop it `max_ahead` events in: it spools the whole load instead.
    reader.max_ahead = 10**9
    sink = build_sink(
        SinkSpec.model_validate({"type": "delta", "delta": {"path": str(workdir / "plain-table")}})
    )
    scratch.mkdir(parents=True, exist_ok=True)
    reader.spool_root.mkdir(parents=True, exist_ok=True)
    spark = build_session(spec.spark, scratch, "plain", sink, STATE_CONF)
    spark.dataSource.register(EventHubsDataSource)
    checkpoint = str(workdir / "checkpoint")
    for p in range(partitions):
        resumed = committed_next(spark, checkpoint, str(p))
        start = StartAt(sequence_number=resumed - 1) if resumed is not None else StartAt(sequence_number=-1)
        reader.start_partition(str(p), 1, start, resumed if resumed is not None else 0)
    events = (
        spark.readStream.format(FORMAT)
        .option(OPTION_SCRATCH, str(scratch))
        .option(OPTION_SPOOL, str(reader.spool_root))
        .option(OPTION_MAX_EVENTS, str(batch))
        .load()
    )

    def write(frame: Any, batch_id: int) -> None:
        frame = frame.persist()
        try:
            sink.write_stream_batch(frame, StreamBatch("plain", batch_id, "*", "plain", datetime.now(UTC)))
        finally:
            frame.unpersist()

    query = (
        stateful_job.job(events)
        .writeStream.outputMode("append")
        .foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    seen = -1
    while not stopping:
        for progress in query.recentProgress:
            if progress["batchId"] > seen:
                seen = progress["batchId"]
                print(f"batch {seen} {progress['numInputRows']} {time.monotonic()}", flush=True)
        time.sleep(0.1)
    # a graceful stop: nothing more planned (the receivers stop), the batch in flight committed
    for p in range(partitions):
        reader.drain_partition(str(p))
    query.processAllAvailable()
    query.stop()
    spark.stop()


def plain_side(args: argparse.Namespace, emulator: RunningEmulator, workdir: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--plain-worker",
        str(workdir),
        emulator.connection_string,
        str(emulator.port),
        str(args.partitions),
        str(args.batch * args.partitions),
    ]

    environ = {**os.environ, "HUBSHIFT_SPARK_JARS": spark_jars_folder()}

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            command, env=environ, stdout=subprocess.PIPE, stderr=(workdir / "plain.log").open("a"), text=True
        )

    worker = start()
    try:
        assert worker.stdout is not None
        events = 0
        started: float | None = None
        finished = time.monotonic()
        for line in worker.stdout:
            _, _, rows, moment = line.split()
            events += int(rows)
            if started is None and int(rows):
                started = float(moment)
            if events >= args.events:
                finished = float(moment)
                break
        else:
            stopped = f"Spark's query stopped after {events} of {args.events} events (see plain.log)"
            raise RuntimeError(stopped)
        seconds = finished - (started or finished)
        restarts: list[dict[str, Any]] = []
        for _ in range(args.handoffs):
            decided = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            worker.wait(300)
            worker = start()
            assert worker.stdout is not None
            first = 10**9 + len(restarts) * 1000
            send(emulator, args.partitions, args.partitions * 10, first=first, pad=args.pad)
            for line in worker.stdout:
                if int(line.split()[2]) > 0:
                    restarts.append(
                        {
                            "seconds": round(float(line.split()[3]) - decided, 2),
                            "partitionsStopped": args.partitions,
                        }
                    )
                    break
        worker.send_signal(signal.SIGTERM)
        worker.wait(300)
    finally:
        if worker.poll() is None:  # a failed or interrupted run leaves no query process behind
            worker.kill()
            worker.wait()
    return {
        "eventsPerSecond": round(args.events / max(seconds, 1e-9), 1),
        "seconds": round(seconds, 1),
        "restarts": restarts,
    }


def run_once(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    (workdir / "job").mkdir()
    (workdir / "job" / "stateful_job.py").write_text(JOB)
    emulator = start_emulator([f"{HUB}:{args.partitions}"], consumer_groups=["plain"], partition_size_mb=1024)
    try:
        send(emulator, args.partitions, args.events, pad=args.pad)
        plain = plain_side(args, emulator, workdir)
        hubshift = hubshift_side(args, emulator, workdir)
    finally:
        emulator.stop()
    ratio = hubshift["eventsPerSecond"] / plain["eventsPerSecond"] if plain["eventsPerSecond"] else None
    return {
        "hubshift": hubshift,
        "sparkRestart": plain,
        "throughputRatio": None if ratio is None else round(ratio, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000, help="maxEventsPerTrigger")
    parser.add_argument("--handoffs", type=int, default=4)
    parser.add_argument("--pad", type=int, default=0, help="characters added to every event's id")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--plain-worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_worker:
        folder, connection, port, partitions, batch = args.plain_worker
        plain_worker(Path(folder), connection, int(port), int(partitions), int(batch))
        return
    runs = []
    for number in range(args.runs):
        workdir = Path(tempfile.mkdtemp(prefix=f"hubshift-stateful-{number}-"))
        runs.append(run_once(args, workdir))
        Console(stderr=True).print(f"run {number}: {json.dumps(runs[-1])} (work folder {workdir})")
    handoffs = [h["seconds"] for r in runs for h in r["hubshift"]["handoffs"]]
    restarts = [h["seconds"] for r in runs for h in r["sparkRestart"]["restarts"]]
    figures = {
        "partitions": args.partitions,
        "events": args.events,
        "batch": args.batch,
        "pad": args.pad,
        "runs": runs,
        "handoffP50": statistics.median(handoffs) if handoffs else None,
        "handoffP99": percentile(handoffs, 0.99),
        "restartP50": statistics.median(restarts) if restarts else None,
        "throughputRatios": [r["throughputRatio"] for r in runs],
    }
    table = Table(
        title=f"stateful job: {args.partitions} partitions, {args.events} events, {args.runs} run(s)"
    )
    table.add_column("figure")
    table.add_column("hubshift (a query per partition)", justify="right")
    table.add_column("Spark's way (one query, restarted)", justify="right")
    for r in runs:
        table.add_row(
            "events/s", str(r["hubshift"]["eventsPerSecond"]), str(r["sparkRestart"]["eventsPerSecond"])
        )
    table.add_row("handoff / restart p50 (s)", str(figures["handoffP50"]), str(figures["restartP50"]))
    table.add_row("partitions stopped", "1 per handoff", f"{args.partitions} per restart")
    Console().print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
