"""The consumer process, put together: `hubshift consume` builds one `ConsumerApp` and runs it.

Building checks everything a person could have got wrong before anything is claimed, each failure one
line (`UserError`): the manifest's hub (reachable, credentials, the hub exists), a replicate or route
pipeline's target hubs, a projection's database and tables, after a failover the old hub's checkpoint
store, the checkpoint store. Then the parts, in the order they depend on each other:

    metrics ─► engine (Spark or plain SDK receivers) ─► ownership agent ─► HTTP server
                       ▲ reports (agent.notify)            │ start / drain / stop partitions
                       └───────────────────────────────────┘

`run` starts the engine (reporting to the agent), the HTTP server (metrics, probes, the operator's nudge)
and the agent until SIGTERM, which hands every partition off before the process exits 0; everything is
closed in reverse order, the scratch folder emptied.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import shutil
import signal
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

from hubshift.connections import event_hubs_target, open_checkpoint_store, ownership_scope
from hubshift.consumer import leftovers
from hubshift.consumer.agent import AgentSettings, OwnershipAgent
from hubshift.consumer.engine import Engine
from hubshift.consumer.http import ConsumerHTTPServer
from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.consumer.ranges import BatchHandler, Costly, RangeLog
from hubshift.consumer.sdk_engine import SdkEngine
from hubshift.errors import UserError, require_extra
from hubshift.eventhubs.management import EventHubsManagement
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.manifest import CodeSpec, PartitionedConsumer
from hubshift.ownership.checkpoints import list_checkpoints
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseStore
from hubshift.pipelines import check_pipeline
from hubshift.pipelines.stream import state_root
from hubshift.sinks.folder import FolderSinkSpec
from hubshift.spec import FailoverSpec

log = logging.getLogger("hubshift.consume")

EngineName = Literal["spark", "sdk"]


@dataclass(frozen=True)
class ConsumerOptions:
    """What the command line adds to the manifest for one consumer."""

    identity: str  # stable across restarts: the StatefulSet pod name
    engine: EngineName = "spark"
    scratch: Path | None = None  # default: a folder of its own under the temp directory
    http_host: str | None = None  # default: 0.0.0.0 in a pod, 127.0.0.1 elsewhere
    http_port: int | None = None  # default: consumer.metricsPort; 0 picks a free port
    grace_seconds: float | None = None  # default: rebalance.stop_budget_seconds
    stop_follow_seconds: float = 0.0  # SIGTERM: follow the operator's assignment this long first
    list_interval_seconds: float | None = None  # default: the protocol's 20 s
    ranges: Path | None = None  # --engine sdk: where the batch ranges go
    event_cost_seconds: float = 0.0  # --engine sdk: work per event before it is logged (benchmarks)

    def scratch_folder(self) -> Path:
        return self.scratch or Path(tempfile.gettempdir()) / f"hubshift-consume-{self.identity}"

    def host(self) -> str:
        # In a pod the kubelet's probes and the operator connect from outside; elsewhere stay on loopback.
        if self.http_host:
            return self.http_host
        return "0.0.0.0" if os.environ.get("KUBERNETES_SERVICE_HOST") else "127.0.0.1"


class ConsumerApp:
    """One consumer: its store, hub, engine, agent and HTTP server. `build`, then `run` once."""

    def __init__(
        self,
        manifest: PartitionedConsumer,
        options: ConsumerOptions,
        *,
        target: EventHubsTarget,
        management: EventHubsManagement,
        store: LeaseStore,
        metrics: ConsumerMetrics,
        engine: Engine,
        agent: OwnershipAgent,
        scratch: Path,
    ) -> None:
        self.manifest = manifest
        self.options = options
        self.target = target
        self.management = management
        self.store = store
        self.metrics = metrics
        self.engine = engine
        self.agent = agent
        self.scratch = scratch

    @classmethod
    def build(
        cls, manifest: PartitionedConsumer, options: ConsumerOptions, environ: Mapping[str, str]
    ) -> ConsumerApp:
        """Check the manifest's services (one line for the first problem) and put the parts together."""
        spec = manifest.spec
        me = options.identity
        settings = AgentSettings.from_spec(
            spec,
            list_interval_seconds=options.list_interval_seconds,
            grace_seconds=options.grace_seconds,
            stop_follow_seconds=options.stop_follow_seconds,
        )
        use_code(spec.consumer.code)
        if options.engine == "spark":
            require_extra("pyspark", "spark", "the Spark engine (consumer.engine: spark)")
        target = event_hubs_target(spec.event_hubs, environ)
        management = EventHubsManagement(target, retry_total=1)
        management.probe()
        check_pipeline(spec.consumer.pipeline, environ)
        handled = handled_before_failover(spec.consumer.failover, environ)
        store = open_checkpoint_store(spec.checkpoint_store, environ, timing=settings.timing)
        metrics = ConsumerMetrics(me, hub=target.hub, consumer_group=target.consumer_group)
        scratch = options.scratch_folder()
        engine = cls._engine(manifest, options, target, scratch, metrics, handled)
        agent = OwnershipAgent(
            store, ownership_scope(target), me, engine, management, settings, metrics=metrics
        )
        return cls(
            manifest,
            options,
            target=target,
            management=management,
            store=store,
            metrics=metrics,
            engine=engine,
            agent=agent,
            scratch=scratch,
        )

    @staticmethod
    def _engine(
        manifest: PartitionedConsumer,
        options: ConsumerOptions,
        target: EventHubsTarget,
        scratch: Path,
        metrics: ConsumerMetrics,
        handled: Mapping[str, int] | None = None,
    ) -> Engine:
        if options.engine == "sdk":
            sink = manifest.spec.consumer.sink.block
            folder = Path(sink.path if isinstance(sink, FolderSinkSpec) else FolderSinkSpec().path)
            ranges = options.ranges or folder / "ranges" / f"{options.identity}.jsonl"
            handler: BatchHandler = RangeLog(ranges, options.identity)
            if options.event_cost_seconds > 0:
                handler = Costly(handler, options.event_cost_seconds)
            return SdkEngine(target, handler, metrics=metrics)
        from hubshift.consumer.spark.spooling import Reading  # lazy: as the Spark engines below

        consumer = manifest.spec.consumer
        reading = Reading(target, options.identity, consumer, scratch, metrics)
        if consumer.pipeline.kind.shape == "stream":
            from hubshift.consumer.spark.streams import StreamEngine  # lazy: PySpark, as SparkEngine below

            state = state_root(
                consumer.pipeline.block,
                manifest.spec.checkpoint_store,
                os.environ,
                ("spec", "consumer", "pipeline", "stream"),
            )
            drain = manifest.spec.rebalance.max_handoff_seconds
            return StreamEngine(reading, state, drain_seconds=drain)
        from hubshift.consumer.spark.engine import SparkEngine  # lazy: the SDK engine runs without PySpark

        return SparkEngine(reading, handled=handled)

    def run(self) -> int:
        """Until SIGTERM (or the engine fails): the exit code."""
        me, agent = self.options.identity, self.agent
        port = self.options.http_port
        server = ConsumerHTTPServer(
            self.metrics,
            host=self.options.host(),
            port=self.manifest.spec.consumer.metrics_port if port is None else port,
            ready=lambda: agent.ready,
            on_assignment=lambda generation: agent.reread_assignment(),
        )
        self._stop_on_signals()
        scratch = Scratch.claim(self.scratch)
        code = 1
        try:
            server.start()
            # One line on stdout: where this consumer answers (tests and the local runtime read it).
            print(f"hubshift consume {me}: listening on {server.url}", flush=True)
            scope = agent.scope
            log.info("consumer %s: %s engine starting for %s", me, self.engine.name, scope)
            self.engine.start(agent.notify)
            log.info("consumer %s: reading as partitions are claimed", me)
            code = agent.run()
        finally:
            self.engine.close()
            server.stop()
            self.store.close()
            self.management.close()
            scratch.release()
        if code and agent.failure:
            log.error("consumer %s stopped: %s", me, agent.failure)
        log.info("consumer %s: stopped (exit %d)", me, code)
        return code

    def _stop_on_signals(self) -> None:
        agent = self.agent

        def stop(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: handing off and stopping", signum)
            agent.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)


def use_code(code: CodeSpec) -> None:
    """The job's files (`spec.consumer.code`) on this process's import path and its Spark workers'
    (`PYTHONPATH`): the folder, and each `.zip` package in it. A module of it named as one the consumer
    or Python already has (`pyspark.py`, `json.py`, `sitecustomize.py`) is refused: Spark's workers put
    `PYTHONPATH` before everything installed, so it would replace that module in them."""
    folder = code.folder()
    if folder is None:
        return
    root = Path(folder)
    where = "configMap" if code.config_map else "path"
    if not root.is_dir():
        mounted = " (is it mounted?)" if code.config_map else ""
        raise UserError(f"spec.consumer.code.{where}: {folder} is not a folder{mounted}")
    entries = [str(root.absolute()), *sorted(str(package.absolute()) for package in root.glob("*.zip"))]
    taken = sorted(top_level_modules(root) & importable_elsewhere(entries))
    if taken:
        plural = "s" if len(taken) > 1 else ""
        raise UserError(
            f"spec.consumer.code.{where}: {', '.join(taken)} would replace the module{plural} of that name "
            "the consumer and Spark's workers import: rename it in the job's files"
        )
    for entry in entries:
        if entry not in sys.path:
            sys.path.append(entry)
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*([inherited] if inherited else []), *entries])


def top_level_modules(root: Path) -> set[str]:
    """The top-level module names a code folder provides: its `.py` files and packages, and those inside
    its `.zip` packages."""
    names = set()
    for path in root.iterdir():
        if path.suffix == ".py":
            names.add(path.stem)
        elif path.is_dir() and not path.name.startswith("."):
            names.add(path.name)
        elif path.suffix == ".zip":
            try:
                with zipfile.ZipFile(path) as package:
                    for member in package.namelist():
                        first = member.split("/", 1)[0]
                        names.add(first.removesuffix(".py") if "/" not in member else first)
            except zipfile.BadZipFile:
                raise UserError(f"spec.consumer.code: {path.name} is not a zip package") from None
    return {name for name in names if name.isidentifier()}


def importable_elsewhere(excluded: Sequence[str]) -> set[str]:
    """Every top-level module this interpreter can import without the code folder: the standard library,
    the built-ins, what is installed, and Python's start-up hooks."""
    paths = [p for p in sys.path if p not in excluded]
    found = {module.name for module in pkgutil.iter_modules(paths)}
    return (
        found
        | set(sys.stdlib_module_names)
        | set(sys.builtin_module_names)
        | {"sitecustomize", "usercustomize"}
    )


def handled_before_failover(spec: FailoverSpec | None, environ: Mapping[str, str]) -> dict[str, int]:
    """After a failover: per partition, the sequence number the old hub's consumers checkpointed (from
    its checkpoint store, read once at start-up; `pipelines/failover.py`)."""
    if spec is None:
        return {}
    old = open_checkpoint_store(
        spec.checkpoint_store,
        environ,
        create=False,
        location=("spec", "consumer", "failover", "checkpointStore"),
    )
    try:
        checkpoints = list_checkpoints(old, Scope(spec.namespace.lower(), spec.hub, spec.consumer_group))
    except Exception as exc:
        raise UserError(f"spec.consumer.failover: reading the old hub's checkpoints failed: {exc}") from None
    finally:
        old.close()
    handled = {partition: c.sequence_number for partition, c in checkpoints.items() if not c.consumed_nothing}
    if not handled:
        # Nothing will be skipped: most likely the namespace, hub or consumer group does not match the
        # scope the old consumers checkpointed under.
        log.warning(
            "failover from %s/%s (consumer group %s): the old checkpoint store holds no checkpoint of it, so "
            "no event will be skipped; check spec.consumer.failover's namespace, hub and consumerGroup",
            spec.namespace,
            spec.hub,
            spec.consumer_group,
        )
    else:
        log.info(
            "failover from %s/%s: skipping what its consumers handled in its partitions %s (each event "
            "compared with the checkpoint of the partition it came from, repl-partition)",
            spec.namespace,
            spec.hub,
            ", ".join(sorted(handled, key=lambda p: (len(p), p))),
        )
    return handled


class Scratch:
    """The consumer's pod-local scratch folder (the spool, Spark's checkpoints): never a source of truth, so
    a consumer starts and ends with an empty one, but it only ever empties a folder it made itself (marked
    with `MARKER`): `--scratch` pointing at a folder with anything else in it is refused."""

    MARKER = ".hubshift-scratch"

    def __init__(self, path: Path, created: bool) -> None:
        self.path = path
        self.created = created

    @classmethod
    def claim(cls, path: Path) -> Scratch:
        marker = path / cls.MARKER
        created = not path.exists()
        if not created:
            if not path.is_dir():
                raise UserError(f"--scratch {path}: not a folder")
            if any(path.iterdir()) and not marker.exists():
                raise UserError(
                    f"--scratch {path} holds files hubshift did not write: give an empty or a new folder"
                )
        try:
            path.mkdir(parents=True, exist_ok=True)
            scratch = cls(path, created)
            if not created:
                leftovers.end_previous(path)  # a JVM still running on what is about to be emptied
            scratch.empty()
            marker.touch()
        except OSError as exc:
            raise UserError(f"--scratch {path}: {exc.strerror or exc}") from None
        return scratch

    def empty(self) -> None:
        """Remove what a previous run of this consumer left (everything but the marker)."""
        for entry in self.path.iterdir():
            if entry.name == self.MARKER:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def release(self) -> None:
        self.empty()
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
