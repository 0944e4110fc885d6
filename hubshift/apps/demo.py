"""`hubshift demo`: the whole system on this machine with embedded defaults.

The emulator (a subprocess), a SQLite store and the generated manifest in a work folder, the local
runtime with the control loop, a home-security load that rises and falls over the run (the producer's
`rise-fall` profile, one wave per run), a live view, and the aggregate pipeline's output in a folder.
Everything it starts it stops again, by process: the consumers with SIGTERM (graceful handoff), then the
emulator. Ctrl-C ends it early the same way.

Defaults sized for two cores: 8 partitions, at most 3 consumers, each a Spark driver with `local[1]`
and 512 MB (a JVM per consumer is the heavy part; `--engine sdk` reads without Spark, but writes no
aggregates, only the batch ranges).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.live import Live

from hubshift.apps.demo_view import DemoFigures, render
from hubshift.apps.produce import HubSender, LoadSpec, RateProfile, produce_load
from hubshift.apps.views_page import ViewsServer
from hubshift.emulator.launch import start_emulator
from hubshift.errors import UserError, require_extra
from hubshift.log import configure_logging
from hubshift.manifest import PartitionedConsumer, load_manifest
from hubshift.operator.local.processes import TARGETS_FILE, free_port
from hubshift.operator.local.runner import LocalOperator, install_stop_signals
from hubshift.operator.loop import CycleReport
from hubshift.operator.metrics import OperatorMetrics
from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks.folder import FolderStore
from hubshift.spec.hub import DEFAULT_EVENTHUBS_ENV

HUB = "homes"
NAME = "homes"
WINDOW_SECONDS = 10
# The run's clock starts when the first consumer reads; a machine that cannot start one by then fails.
STARTUP_LIMIT_SECONDS = 300.0


@dataclass(frozen=True)
class DemoSettings:
    duration: float = 120.0
    engine: str = "spark"
    output: Path = Path("demo-output")
    workdir: Path | None = None
    rate: float = 200.0
    max_consumers: int = 3
    partitions: int = 8
    live: bool = True
    homes: int = 500


def demo_manifest(settings: DemoSettings, store: Path, output: Path) -> dict[str, Any]:
    """The PartitionedConsumer the demo runs (written to the work folder, so it can be read and reused)."""
    # The backlog is counted from checkpoints, so it is about rate x (checkpoint interval + batch time):
    # at the peak rate that asks for every consumer allowed, at the trough for one.
    per_replica = max(50, int(settings.rate * 4 / max(settings.max_consumers, 1)))
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": NAME},
        "spec": {
            "eventHubs": {"hub": HUB, "connectionStringEnv": DEFAULT_EVENTHUBS_ENV},
            "checkpointStore": {"sqlite": {"path": str(store)}},
            "consumer": {
                "spark": {
                    "master": "local[1]",
                    "triggerIntervalSeconds": 2,
                    "shufflePartitions": 1,
                    "driverMemory": "512m",
                },
                "checkpoint": {"everySeconds": 2},
                "pipeline": {"type": "aggregate", "aggregate": {"windowSeconds": WINDOW_SECONDS}},
                "sink": {"type": "folder", "folder": {"path": str(output)}},
            },
            "scaling": {
                "minReplicas": 1,
                "maxReplicas": settings.max_consumers,
                "pollingIntervalSeconds": 2,
                "target": {"unprocessedEventsPerReplica": per_replica},
                "behavior": {
                    "scaleUp": {
                        "stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}],
                    },
                    "scaleDown": {
                        "stabilizationWindowSeconds": 15,
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 10}],
                    },
                },
            },
            "rebalance": {"delaySeconds": 3, "maxHandoffSeconds": 10, "leaseDurationSeconds": 15},
        },
    }


@contextlib.contextmanager
def _ignoring_sigint() -> Iterator[None]:
    """Children started inside inherit an ignored SIGINT: a terminal's Ctrl-C reaches the demo only,
    which then stops them in order (consumers first, the emulator last)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_demo(settings: DemoSettings) -> int:

    if settings.engine == "spark" and shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise UserError(
            "the Spark consumers need Java 17 (no java found): install a JRE 17, or run "
            "`hubshift demo --engine sdk` (no Spark, no aggregates)"
        )
    if settings.engine == "spark":
        require_extra("pyspark", "spark", "the Spark consumers (or `hubshift demo --engine sdk`)")

    console = Console(stderr=False)
    temporary = settings.workdir is None
    workdir = settings.workdir or Path(tempfile.mkdtemp(prefix="hubshift-demo-"))
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    output = settings.output.resolve()
    _fresh_output(output)
    configure_logging("warning", stream=(workdir / "demo.log").open("a"))
    console.print(
        f"[bold]hubshift demo[/bold]: {settings.duration:g} s, {settings.partitions} partitions, up to "
        f"{settings.max_consumers} {settings.engine} consumers\n"
        f"  aggregates: {output}\n  work folder: {workdir}"
    )
    with _ignoring_sigint():
        emulator = start_emulator([f"{HUB}:{settings.partitions}"], data_dir=None)
    code = 1
    try:
        manifest_path = workdir / "demo.yaml"
        manifest_path.write_text(yaml.safe_dump(demo_manifest(settings, workdir / "store.db", output)))
        consumer = load_manifest(manifest_path)
        environ = dict(os.environ, **{DEFAULT_EVENTHUBS_ENV: emulator.connection_string})
        code = asyncio.run(_demo(settings, consumer, manifest_path, workdir, output, environ, console))
    finally:
        emulator.stop()
        logging_shutdown()
    if code == 0 and temporary:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


def _fresh_output(output: Path) -> None:
    """Empty the output folder of a previous demo; never touch a folder the demo did not write."""
    if output.exists() and any(output.iterdir()):
        if not ((output / "_batches").exists() or (output / "ranges").exists()):
            raise UserError(
                f"--output {output} is not empty and not a previous demo's output: choose another"
            )
        shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)


def logging_shutdown() -> None:

    for handler in logging.getLogger().handlers:
        handler.close()


class _Load(threading.Thread):
    """The home-security load on a thread: rises from a tenth of the peak to the peak and back."""

    def __init__(self, connection_string: str, settings: DemoSettings) -> None:
        super().__init__(name="demo-load", daemon=True)

        self.connection_string = connection_string
        self.profile = RateProfile("rise-fall", settings.rate, period=settings.duration)
        self.spec = LoadSpec(
            homes=settings.homes,
            rate=settings.rate,
            duration=settings.duration,
            profile=self.profile,
            seed=7,
        )
        self.stop = threading.Event()
        self.sent = 0
        self.error: str | None = None
        self.started_at: float | None = None
        self.done = False

    def begin(self) -> None:
        self.started_at = time.monotonic()
        self.start()

    def run(self) -> None:

        try:
            sender = HubSender.connect(self.connection_string, HUB)
        except UserError as exc:
            self.error = str(exc)
            return
        try:

            def counted(summary: Any) -> None:
                self.sent = summary.events

            produce_load(self.spec, sender, hub=HUB, stop=self.stop, on_round=counted)
        except Exception as exc:  # the emulator went away: the demo is ending anyway
            self.error = type(exc).__name__
        finally:
            self.done = True
            sender.close()

    def rate_now(self) -> float:
        if self.started_at is None or self.done:
            return 0.0
        return self.profile.rate_at(time.monotonic() - self.started_at)


class DemoRun:
    """One run of the demo inside its event loop: the local operator, the load, the live view and the
    aggregates, and what went wrong at start-up if anything did."""

    def __init__(
        self,
        settings: DemoSettings,
        operator: LocalOperator,
        load: _Load,
        output: Path,
        console: Console,
    ) -> None:

        self.settings = settings
        self.operator = operator
        self.load = load
        self.output = output
        self.console = console
        self.view = AggregateView(FolderStore(output)) if settings.engine == "spark" else None
        self.stop = asyncio.Event()
        self.began = time.monotonic()
        self.aggregated: int | None = None
        self.startup_expired = False
        self.startup_failed: str | None = None  # the consumer whose log tells why
        self._last_line = ""

    def figures(self) -> DemoFigures:
        load = self.load
        return DemoFigures(
            elapsed=0.0 if load.started_at is None else time.monotonic() - load.started_at,
            duration=self.settings.duration,
            events_sent=load.sent,
            rate_now=load.rate_now(),
            aggregated_events=self.aggregated,
            output=str(self.output),
        )

    def frame(self) -> Any:
        runtime = self.operator.runtime
        return render(
            self.operator.report, list(runtime.processes.values()), list(runtime.events), self.figures()
        )

    def give_up_waiting(self) -> None:
        """No consumer became ready in time: end the run."""
        if self.load.started_at is None:
            self.startup_expired = True
            self.stop.set()

    async def refresh_aggregates(self) -> None:
        while self.view is not None:
            with contextlib.suppress(Exception):  # a file being written: read it next time
                await asyncio.to_thread(self.view.refresh)
                self.aggregated = self.view.total()
                await asyncio.to_thread(self.view.write_views)  # the residents' page reads them
            await asyncio.sleep(2)

    def print_line(self, report: CycleReport) -> None:
        status = report.status
        line = (
            f"{self.figures().elapsed:5.0f}s phase {status.phase} gen {report.state.generation} "
            f"replicas {status.desired_replicas}/{status.current_replicas}/{status.ready_replicas} "
            f"backlog {status.total_backlog} lag {_seconds(status.lag_seconds)} sent {self.load.sent}"
        )
        if line.split(" ", 1)[1] != self._last_line.split(" ", 1)[-1]:
            self.console.print(line)
        self._last_line = line

    def on_report(self, report: CycleReport) -> None:
        load = self.load
        failures = [name for name, code in self.operator.runtime.exits if code != 0]
        if load.started_at is None and len(failures) >= 3:
            self.startup_failed = failures[-1]  # consumers crash at start: no use waiting
            self.stop.set()
        # The run's clock and the load start once the first consumer reads (a Spark driver takes a while).
        if load.started_at is None and (report.status.ready_replicas or 0) > 0:
            load.begin()
            asyncio.get_running_loop().call_later(self.settings.duration, self.stop.set)
            if not self.settings.live:
                self.console.print(
                    f"the first consumer reads after {time.monotonic() - self.began:.0f} s: load starts"
                )
        if not self.settings.live:
            self.print_line(report)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        operator = self.operator
        await operator.open()
        install_stop_signals(self.stop)
        loop.call_later(STARTUP_LIMIT_SECONDS, self.give_up_waiting)
        operator.on_report = self.on_report
        aggregates = loop.create_task(self.refresh_aggregates())
        try:
            if self.settings.live:
                with Live(self.frame(), console=self.console, refresh_per_second=2, transient=False) as live:
                    running = loop.create_task(operator.run(self.stop))
                    while not running.done():
                        live.update(self.frame())
                        await asyncio.wait({running}, timeout=0.5)
                    live.update(self.frame())
                    running.result()
            else:
                await operator.run(self.stop)
        finally:
            self.load.stop.set()
            self.console.print("stopping: the consumers hand their partitions off, then the emulator stops")
            await operator.shutdown()
            aggregates.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await aggregates
            if self.load.is_alive():
                await asyncio.to_thread(self.load.join, 10)
        return self.outcome()

    def outcome(self) -> int:
        console = self.console
        if self.startup_failed is not None:
            log_path = self.operator.workdir / "logs" / f"{self.startup_failed}.log"
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:] if log_path.exists() else []
            console.print(f"[red]the consumers keep failing at start; the end of {log_path}:[/red]")
            for line in tail:
                console.print(f"  {line}", markup=False)
            return 1
        if self.startup_expired:
            console.print(
                f"[red]no consumer became ready within {STARTUP_LIMIT_SECONDS:g} s: see the logs in "
                f"{self.operator.workdir / 'logs'}[/red]"
            )
            return 1
        return _summary(console, self.view, self.output, self.load)


async def _demo(
    settings: DemoSettings,
    consumer: PartitionedConsumer,
    manifest_path: Path,
    workdir: Path,
    output: Path,
    environ: dict[str, str],
    console: Console,
) -> int:

    metrics = OperatorMetrics()
    metrics_port = free_port()
    metrics.serve(metrics_port, address="127.0.0.1")
    console.print(
        f"  metrics: the operator's at http://127.0.0.1:{metrics_port}/metrics, each consumer's listed in "
        f"{workdir / TARGETS_FILE} (Prometheus file_sd; docs/dashboards.md)"
    )
    page = None
    if settings.engine == "spark":
        page = ViewsServer(FolderStore(output)).start()
        console.print(f"  residents' page: {page.url}?refresh=2")
    operator = LocalOperator(
        manifest_path, consumer, workdir, engine=settings.engine, environ=environ, metrics=metrics
    )
    load = _Load(environ[DEFAULT_EVENTHUBS_ENV], settings)
    try:
        return await DemoRun(settings, operator, load, output, console).run()
    finally:
        if page is not None:
            page.close()


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}s"


def _summary(console: Console, view: Any, output: Path, load: _Load) -> int:
    if load.error and load.sent == 0:
        console.print(f"[red]the load could not be sent: {load.error}[/red]")
        return 1
    console.print(f"sent {load.sent} home-security events")
    if view is None:
        ranges = sorted((output / "ranges").glob("*.jsonl"))
        console.print(f"sdk engine: batch ranges of {len(ranges)} consumers in {output / 'ranges'}")
        return 0
    view.refresh()
    files = view.write_views()
    behind = load.sent - view.total()
    if behind > 0:
        console.print(f"{behind} of them were still unread or in flight when the run ended (the backlog)")
    console.print(
        f"aggregated {view.total()} events into {len(view.windows())} windows of "
        f"{WINDOW_SECONDS} s per home and sensor type: {output} ({len(files)} view files in "
        f"{output / 'views'})"
    )
    return 0


@click.command(name="demo")
@click.option("--duration", type=float, default=120.0, show_default=True, help="Seconds to run.")
@click.option(
    "--engine",
    type=click.Choice(["spark", "sdk"]),
    default="spark",
    show_default=True,
    help="spark runs the aggregate pipeline; sdk reads without Spark (no aggregates, lighter).",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False),
    default="demo-output",
    show_default=True,
    help="Where the aggregates are written.",
)
@click.option(
    "--workdir", type=click.Path(file_okay=False), help="Store, logs, manifest (default: a temp folder)."
)
@click.option("--rate", type=float, default=400.0, show_default=True, help="Peak events per second.")
@click.option("--max-consumers", type=int, default=3, show_default=True, help="The pool's maxReplicas.")
@click.option("--partitions", type=int, default=8, show_default=True, help="Partitions of the demo hub.")
@click.option("--no-live", is_flag=True, help="Print a line per change instead of the live view.")
def demo(
    duration: float,
    engine: str,
    output: str,
    workdir: str | None,
    rate: float,
    max_consumers: int,
    partitions: int,
    no_live: bool,
) -> None:
    """The whole system on this machine: the emulator, a SQLite store, the local runtime, a home-security
    load that rises and falls, a live view, and aggregates in a folder."""
    if duration <= 0:
        raise UserError("--duration must be positive")
    if not 1 <= max_consumers <= partitions:
        raise UserError("--max-consumers must be between 1 and --partitions")
    settings = DemoSettings(
        duration=duration,
        engine=engine,
        output=Path(output),
        workdir=Path(workdir) if workdir else None,
        rate=rate,
        max_consumers=max_consumers,
        partitions=partitions,
        live=not no_live,
    )
    code = run_demo(settings)
    if code:
        raise SystemExit(code)
