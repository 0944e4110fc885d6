"""Chaos: the home-security load through the local runtime (what `hubshift run` runs) while faults land at
random: consumers killed (SIGKILL) and stopped (SIGTERM), the store (Azurite) and Event Hubs (the emulator)
restarted, the pool scaled. At the end the aggregate's exact window totals are compared with the events
sent, and what was sampled all along is reported.

    .venv/bin/python bench/chaos.py                        # ten minutes, Spark consumers
    .venv/bin/python bench/chaos.py --minutes 3 --engine sdk
    .venv/bin/python bench/chaos.py --job delta            # your own job: a function into a Delta table
    .venv/bin/python bench/chaos.py --job parquet          # the same function into Parquet files

`--job delta|parquet` runs a Spark team's job instead of the aggregate: `examples/delta/homes_job.py`
(`transform`: parse, enrich, keep each event's partition and sequence number) as the `function` pipeline,
into a Delta table (Delta Lake's jars from `tools/spark-jars`) or Parquet files. The output is read back
without Spark (delta-rs; pyarrow for the Parquet folder, which skips `_hubshift/`), with the dead letters
(`_dead_letters/`), and compared with every event the hub holds at the end (read from Event Hubs itself,
whatever the load thought it sent): lost (held by the hub, in neither), written twice (one event in two
rows), and rows of events the hub does not hold (never).

Figures (printed and written to bench/results/chaos.json):
- faults injected, by kind;
- events sent (acknowledged by Event Hubs), lost (sent but never committed to the sink), counted twice
  (committed by two batches: a replay after a crash);
- max replay: the most events of one partition committed twice around one fault;
- time unowned: partition-seconds without a live lease holder, sampled every second;
- two readers: every second each running consumer's `/metrics` says which partitions it reads (a
  partition's backlog gauge exists exactly while its consumer owns it); a partition two consumers claim
  at the same sample counts once (never), and checkpoints that went back (never).

With `--engine sdk` there are no aggregates: events are counted from the consumers' range logs instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

# The shared harness (Azurite) lives in the repository's tests/harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hubshift.apps.produce import EventGenerator, HubSender, LoadSpec
from hubshift.consumer.metrics import PREFIX as METRICS_PREFIX
from hubshift.consumer.spark.session import JARS_ENV
from hubshift.emulator.launch import start_emulator
from hubshift.eventhubs.management import read_partitions
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.manifest import load_manifest
from hubshift.operator.local.runner import LocalOperator
from hubshift.ownership.checkpoints import list_checkpoints
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import StoreError
from hubshift.ownership.stores.locations import open_store
from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks import FolderStore
from hubshift.spec import DEFAULT_EVENTHUBS_ENV, DEFAULT_STORAGE_ENV
from tests.harness.azurite import start_azurite
from tests.harness.ranges import count_replays, read_range_logs
from tests.harness.spark_jars import spark_jars_folder

RESULTS = Path(__file__).resolve().parent / "results" / "chaos.json"
HUB = "homes"
CONTAINER = "chaos"
PARTITIONS = 8
WINDOW_SECONDS = 10
FAULTS = ("kill", "terminate", "store-restart", "eventhubs-restart", "scale")
JOBS = ("aggregate", "delta", "parquet")
EXAMPLE_CODE = Path(__file__).resolve().parents[1] / "examples" / "delta"


def pipeline_and_sink(job: str, output: Path) -> dict[str, Any]:
    """The consumer's pipeline and sink blocks for a job: the aggregate, or the example's function into a
    table or files (batches of up to 500 events, as the run that lost events had)."""
    if job == "aggregate":
        return {
            "pipeline": {"type": "aggregate", "aggregate": {"windowSeconds": WINDOW_SECONDS}},
            "sink": {"type": "folder", "folder": {"path": str(output)}},
        }
    return {
        "code": {"path": str(EXAMPLE_CODE)},
        "pipeline": {"type": "function", "function": "homes_job:transform"},
        "sink": {"type": job, job: {"path": str(output), "partitionBy": ["date"]}},
    }


def manifest(store_container: str, output: Path, engine: str, job: str = "aggregate") -> dict[str, Any]:
    spark = {
        "master": "local[1]",
        "triggerIntervalSeconds": 2,
        "shufflePartitions": 1,
        "driverMemory": "512m",
        **({} if job == "aggregate" else {"maxEventsPerTrigger": 500}),
    }
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "chaos"},
        "spec": {
            "eventHubs": {"hub": HUB},
            "checkpointStore": {"blob": {"container": store_container}},
            "consumer": {
                **({"spark": spark} if engine == "spark" else {}),
                "checkpoint": {"everySeconds": 3},
                **pipeline_and_sink(job, output),
            },
            "scaling": {"minReplicas": 2, "maxReplicas": 3, "pollingIntervalSeconds": 2},
            "rebalance": {"delaySeconds": 5, "maxHandoffSeconds": 15, "leaseDurationSeconds": 20},
        },
    }


@dataclass
class Sent:
    """What Event Hubs acknowledged: per partition, and per aggregate window (the reference totals)."""

    partitions: Counter[str] = field(default_factory=Counter)
    windows: Counter[tuple[datetime, str, str]] = field(default_factory=Counter)

    @property
    def events(self) -> int:
        return sum(self.partitions.values())


class Load(threading.Thread):
    """A steady home-security load; paused while Event Hubs is being restarted, so that every send is
    either acknowledged (and counted) or refused (and sent again), never in doubt."""

    def __init__(self, connection_string: str, rate: float, seed: int) -> None:
        super().__init__(daemon=True, name="chaos-load")
        self.connection_string = connection_string
        self.rate = rate
        self.generator = EventGenerator(LoadSpec(homes=300, seed=seed))
        self.sent = Sent()
        self.running = threading.Event()
        self.running.set()
        self.halt = threading.Event()
        self.errors = 0

    def run(self) -> None:
        sender: HubSender | None = None
        while not self.halt.is_set():
            if not self.running.wait(0.2):
                if sender is not None:
                    sender.close()
                    sender = None
                continue
            try:
                sender = sender or HubSender.connect(self.connection_string, HUB)
                now = datetime.now(UTC)
                events = [self.generator.next(now) for _ in range(max(1, int(self.rate / 10)))]
                by_partition: dict[str, list[Any]] = {}
                for generated in events:
                    by_partition.setdefault(sender.partition_for(generated.partition_key), []).append(
                        generated
                    )
                for partition, group in by_partition.items():
                    sender.send(partition, group)
                    self.sent.partitions[partition] += len(group)
                    for generated in group:
                        if generated.event is not None:
                            start = _window(generated.event.event_time)
                            self.sent.windows[
                                (start, generated.event.home_id, generated.event.sensor_type)
                            ] += 1
            except Exception:
                self.errors += 1
                if sender is not None:
                    sender.close()
                sender = None
            self.halt.wait(0.1)
        if sender is not None:
            sender.close()


def _window(moment: datetime) -> datetime:
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % WINDOW_SECONDS, tz=UTC)


@dataclass
class Samples:
    unowned_partition_seconds: float = 0.0
    checkpoints_back: int = 0
    samples: int = 0
    unreadable: int = 0
    last: dict[str, int] = field(default_factory=dict)
    two_readers: int = 0  # (sample, partition) pairs two live consumers said they read
    seen_read: int = 0  # (sample, partition) pairs some consumer said it read: the check is not vacuous


# A consumer exports a partition's backlog gauge exactly while it owns it (the gauge goes when it releases or
# loses the partition), so its /metrics says which partitions it believes it reads.
OWNED_GAUGE = f"{METRICS_PREFIX}_backlog_events"


async def believed_owned(session: aiohttp.ClientSession, address: str) -> set[str]:
    """The partitions one consumer says it reads now; none when it does not answer (gone, stopping)."""
    try:
        async with session.get(f"http://{address}/metrics") as answer:
            text = await answer.text()
    except (TimeoutError, aiohttp.ClientError):
        return set()
    return {
        sample.labels["partition"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == OWNED_GAUGE
    }


async def readers(addresses: list[str]) -> Counter[str]:
    """How many consumers say they read each partition at this moment."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        answers = await asyncio.gather(*(believed_owned(session, a) for a in addresses))
    return Counter(partition for owned in answers for partition in owned)


async def sample(
    store: Any,
    scope: Scope,
    samples: Samples,
    stop: asyncio.Event,
    consumers: Callable[[], list[str]],
    period: float = 1.0,
) -> None:
    """Every `period`: partitions without a live lease holder, partitions two consumers say they read,
    checkpoints never going back."""
    while not stop.is_set():
        seen = await readers(consumers())
        samples.seen_read += len(seen)
        samples.two_readers += sum(1 for count in seen.values() if count > 1)
        try:
            snapshot = await asyncio.to_thread(take_snapshot, store, scope)
            checkpoints = await asyncio.to_thread(list_checkpoints, store, scope)
        except StoreError:
            samples.unreadable += 1
        else:
            samples.samples += 1
            live = set(snapshot.live_members)
            owned = {row.partition for row in snapshot.partitions if not row.free and row.owner in live}
            samples.unowned_partition_seconds += (PARTITIONS - len(owned)) * period
            for partition, checkpoint in checkpoints.items():
                if checkpoint.sequence_number < samples.last.get(partition, -1):
                    samples.checkpoints_back += 1
                samples.last[partition] = max(checkpoint.sequence_number, samples.last.get(partition, -1))
        try:
            await asyncio.wait_for(stop.wait(), period)
        except TimeoutError:
            pass


class Chaos:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.random = random.Random(args.seed)
        self.faults: Counter[str] = Counter()
        self.log: list[tuple[float, str]] = []
        self.held: set[Key] = set()  # a job's: every event the hub holds at the end

    async def run(self) -> dict[str, Any]:
        args, workdir = self.args, self.workdir
        azurite = start_azurite(workdir / "azurite")
        emulator = start_emulator([f"{HUB}:{PARTITIONS}"], data_dir=workdir / "eventhubs")
        self.azurite, self.emulator = azurite, emulator
        output = workdir / "output"
        manifest_path = workdir / "chaos.yaml"
        manifest_path.write_text(yaml.safe_dump(manifest(CONTAINER, output, args.engine, args.job)))
        environ = dict(
            os.environ,
            **{
                DEFAULT_EVENTHUBS_ENV: emulator.connection_string,
                DEFAULT_STORAGE_ENV: azurite.connection_string,
            },
        )
        if args.job != "aggregate":
            environ[JARS_ENV] = spark_jars_folder()
        consumer = load_manifest(manifest_path)
        operator = LocalOperator(
            manifest_path, consumer, workdir / "run", engine=args.engine, environ=environ
        )
        self.operator = operator
        store = open_store(azurite.connection_string, CONTAINER, create=True)
        scope = Scope(f"127.0.0.1:{emulator.port}", HUB, "$Default")
        load = Load(emulator.connection_string, args.rate, args.seed)
        self.load = load
        samples = Samples()
        stop, done = asyncio.Event(), asyncio.Event()
        try:
            await operator.open()
            running = asyncio.get_running_loop().create_task(operator.run(stop))
            await self._until_reading()
            load.start()
            sampler = asyncio.get_running_loop().create_task(
                sample(store, scope, samples, done, self._addresses)
            )
            started = time.monotonic()
            while time.monotonic() - started < args.minutes * 60:
                await asyncio.sleep(self.random.uniform(args.every * 0.5, args.every * 1.5))
                if time.monotonic() - started < args.minutes * 60:
                    await self._fault(self.random.choice(FAULTS))
            load.halt.set()
            load.join(timeout=30)
            if args.job != "aggregate":
                self.held = await hub_holds(self.emulator.connection_string, self.emulator.port)
            await self._until_drained(output, load.sent)
            done.set()
            await sampler
            stop.set()
            await running
        finally:
            load.halt.set()
            await operator.shutdown(grace=40)
            store.close()
            self.emulator.stop()
            self.azurite.stop()
        return self._figures(output, load, samples)

    def _addresses(self) -> list[str]:
        """The consumer processes running now (the local runtime's), by their HTTP address."""
        processes = self.operator.runtime.processes.values()
        return [p.address for p in processes if p.process.poll() is None]

    async def _until_reading(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            report = self.operator.report
            if (
                report is not None
                and (report.status.ready_replicas or 0) >= 2
                and report.status.phase == "Ready"
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the pool did not become ready")
            await asyncio.sleep(1)

    async def _fault(self, kind: str) -> None:
        runtime = self.operator.runtime
        self.faults[kind] += 1
        self.log.append((time.time(), kind))
        Console(stderr=True).print(f"fault: {kind}")
        if kind in ("kill", "terminate"):
            running = [p for p in runtime.processes.values() if not p.terminating]
            if running:
                target = self.random.choice(running)
                if kind == "kill":
                    target.process.send_signal(signal.SIGKILL)
                else:
                    target.process.send_signal(signal.SIGTERM)  # handed off, then started again
        elif kind == "store-restart":
            await asyncio.to_thread(self._restart_azurite, self.random.uniform(5, 20))
        elif kind == "eventhubs-restart":
            self.load.running.clear()
            await asyncio.sleep(1)
            old = self.emulator
            old.stop()
            await asyncio.sleep(self.random.uniform(5, 20))
            self.emulator = start_emulator(
                [f"{HUB}:{PARTITIONS}"], data_dir=old.data_dir, extra_args=("--port", str(old.port))
            )
            self.load.running.set()
        elif kind == "scale":
            manifest = self.operator.consumer
            count = self.random.choice([2, 3])
            scaling = manifest.spec.scaling.model_copy(update={"min_replicas": count, "max_replicas": count})
            self.operator.apply(
                manifest.model_copy(update={"spec": manifest.spec.model_copy(update={"scaling": scaling})})
            )

    def _restart_azurite(self, down_seconds: float) -> None:
        old = self.azurite
        old.stop()
        time.sleep(down_seconds)
        self.azurite = start_azurite(old.data_dir, port=old.port)

    async def _until_drained(self, output: Path, sent: Sent, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        wanted = sent.events if self.args.job == "aggregate" else len(self.held)
        while time.monotonic() < deadline:
            if self._committed(output)[0] >= wanted:
                return
            await asyncio.sleep(3)

    def _committed(self, output: Path) -> tuple[int, int, int]:
        """(distinct events committed, committed twice, the most twice-committed events of one partition)."""
        if self.args.job != "aggregate":
            written = read_job_output(self.args.job, output)
            found = set(written.rows) | set(written.dead_letters)
            doubled = written.rows_twice()
            return len(found & self.held), sum(doubled.values()), max(doubled.values(), default=0)
        if self.args.engine == "sdk":
            lines = read_range_logs(output / "ranges")
            distinct, replays = count_replays(lines)
            per_partition = [
                count_replays([x for x in lines if x["partition"] == p])[1]
                for p in map(str, range(PARTITIONS))
            ]
            return distinct, replays, max(per_partition, default=0)
        view = AggregateView(FolderStore(output))
        view.refresh()
        covered: dict[str, set[int]] = {}
        twice: Counter[str] = Counter()
        for record in view.records:
            for part in record.partitions:
                numbers = set(range(part.first_sequence_number, part.last_sequence_number + 1))
                seen = covered.setdefault(part.partition, set())
                twice[part.partition] += len(seen & numbers)
                seen |= numbers
        return sum(len(s) for s in covered.values()), sum(twice.values()), max(twice.values(), default=0)

    def _figures(self, output: Path, load: Load, samples: Samples) -> dict[str, Any]:
        if self.args.job != "aggregate":
            return {**self._job_figures(output, load), **self._sampled(samples)}
        distinct, replayed, max_replay = self._committed(output)
        figures: dict[str, Any] = {
            "engine": self.args.engine,
            "minutes": self.args.minutes,
            "rate": self.args.rate,
            "faults": dict(self.faults),
            "faultsInjected": sum(self.faults.values()),
            "eventsSent": load.sent.events,
            "lost": load.sent.events - distinct,
            # Read and processed again after a crash (before its checkpoint): the output still counts each
            # event once for the aggregate (the view takes one commit per range); the SDK engine's output is
            # its range log, where a replay is a count twice.
            "replayed": replayed,
            "countedTwice": replayed if self.args.engine == "sdk" else 0,
            "maxReplayOnePartition": max_replay,
            **self._sampled(samples),
            "loadSendErrors": load.errors,
        }
        if self.args.engine == "spark":
            view = AggregateView(FolderStore(output))
            view.refresh()
            counts = {key: value.count for key, value in view.counts().items()}
            expected = dict(load.sent.windows)
            keys = set(counts) | set(expected)
            figures["countedTwice"] = sum(max(0, counts.get(k, 0) - expected.get(k, 0)) for k in keys)
            figures["lostFromWindows"] = sum(max(0, expected.get(k, 0) - counts.get(k, 0)) for k in keys)
            figures["windows"] = len(expected)
            figures["windowsWrong"] = sum(1 for k in keys if counts.get(k, 0) != expected.get(k, 0))
            figures["exactTotals"] = figures["windowsWrong"] == 0
        return figures

    @staticmethod
    def _sampled(samples: Samples) -> dict[str, Any]:
        return {
            "unownedPartitionSeconds": round(samples.unowned_partition_seconds, 1),
            "checkpointsWentBack": samples.checkpoints_back,
            "twoReaders": samples.two_readers,
            "partitionsSeenReadPerSample": round(samples.seen_read / max(samples.samples, 1), 1),
            "samples": samples.samples,
            "samplesWhileTheStoreWasAway": samples.unreadable,
        }

    def _job_figures(self, output: Path, load: Load) -> dict[str, Any]:
        """A table's or folder's rows and dead letters against every event the hub holds."""
        written = read_job_output(self.args.job, output)
        found = set(written.rows) | set(written.dead_letters)
        lost = sorted(self.held - found)
        twice = written.rows_twice()
        return {
            "engine": self.args.engine,
            "job": self.args.job,
            "minutes": self.args.minutes,
            "rate": self.args.rate,
            "seed": self.args.seed,
            "faults": dict(self.faults),
            "faultsInjected": sum(self.faults.values()),
            "eventsSent": load.sent.events,
            "eventsInTheHub": len(self.held),
            "rows": sum(written.rows.values()),
            "deadLetters": len(written.dead_letters),
            "lost": len(lost),
            "lostExamples": [f"{p}#{s}" for p, s in lost[:10]],
            "writtenTwice": sum(twice.values()),
            "rowsTheHubDoesNotHold": len(set(written.rows) - self.held),
            "deadLettersAlsoInRows": len(set(written.rows) & set(written.dead_letters)),
            "loadSendErrors": load.errors,
        }


Key = tuple[str, int]


@dataclass
class JobOutput:
    """What a job wrote: rows per (partition, sequence number), and the dead letters' keys."""

    rows: Counter[Key] = field(default_factory=Counter)
    dead_letters: set[Key] = field(default_factory=set)

    def rows_twice(self) -> Counter[str]:
        """Per partition, how many events have more than one row."""
        return Counter(p for (p, _), count in self.rows.items() for _ in range(count - 1))


def read_job_output(job: str, output: Path) -> JobOutput:
    """The table's or folder's rows and the dead letters, read without Spark (delta-rs, pyarrow)."""
    import pyarrow.dataset as ds

    written = JobOutput()
    columns = ["partition", "sequence_number"]
    if job == "delta":
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(str(output)).to_pyarrow_table(columns=columns)
        except TableNotFoundError:
            table = None
    else:
        files = [
            str(path)
            for path in output.rglob("*.parquet")
            if not any(part.startswith("_") for part in path.relative_to(output).parts)
        ]
        table = (
            ds.dataset(files, format="parquet", partitioning="hive").to_table(columns=columns)
            if files
            else None
        )
    if table is not None:
        written.rows.update(
            zip(
                table.column("partition").to_pylist(),
                table.column("sequence_number").to_pylist(),
                strict=True,
            )
        )
    for path in (output / "_dead_letters").rglob("*"):
        if path.is_file() and not path.name.startswith((".", "_")):
            for line in path.read_text().splitlines():
                letter = json.loads(line)
                written.dead_letters.add((str(letter["partition"]), int(letter["sequence_number"])))
    return written


async def hub_holds(connection_string: str, port: int) -> set[Key]:
    """Every event the hub holds now: (partition, sequence number), from its partitions' properties."""
    target = EventHubsTarget(connection_string, f"127.0.0.1:{port}", HUB, "$Default")
    partitions = await read_partitions(target)
    return {(p, s) for p, info in partitions.items() for s in range(info.beginning, info.last_enqueued + 1)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--engine", choices=["spark", "sdk"], default="spark")
    parser.add_argument("--job", choices=JOBS, default="aggregate", help="what the consumers run (above)")
    parser.add_argument("--rate", type=float, default=100.0, help="events per second")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between faults, on average")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--workdir", type=Path, help="default: a temporary folder, kept on failure")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hubshift-chaos-"))
    figures = asyncio.run(Chaos(args, workdir).run())
    if args.job != "aggregate" and args.engine != "spark":
        parser.error("--job delta and parquet run Spark consumers")
    table = Table(
        title=f"chaos: {args.minutes:g} min, {args.job}, {args.engine} consumers, {args.rate:g} events/s"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    Console().print(table)
    results = RESULTS if args.job == "aggregate" else RESULTS.with_name(f"chaos-{args.job}.json")
    results.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(results.read_text()) if args.job != "aggregate" and results.exists() else []
    results.write_text(json.dumps([*runs, figures] if args.job != "aggregate" else figures, indent=1))
    print(f"wrote {results} (work folder: {workdir})")
    healthy = (
        figures["lost"] == 0
        and figures["checkpointsWentBack"] == 0
        and figures["twoReaders"] == 0
        and figures.get("exactTotals", True)
        and figures.get("writtenTwice", 0) == 0
        and figures.get("rowsTheHubDoesNotHold", 0) == 0
    )
    raise SystemExit(0 if healthy else 1)


if __name__ == "__main__":
    main()
