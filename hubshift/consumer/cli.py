"""`hubshift consume -f MANIFEST --id CONSUMER_ID`: one consumer (a pod's entry point).

Start-up checks everything a person could have got wrong before anything is claimed: the manifest, the
connection strings (from the environment variables the manifest names), the store, the hub. Each failure
is one line and a non-zero exit. Then: the engine (Spark, or `--engine sdk`), the HTTP server (metrics,
probes, the operator's nudge on `POST /assignment`), and the ownership agent until SIGTERM, which hands
every partition off gracefully before the process exits 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import click

from hubshift.errors import UserError
from hubshift.manifest import load_manifest
from hubshift.ownership.scope import Scope, consumer_id
from hubshift.ownership.store import LeaseStore
from hubshift.ownership.timing import Timing
from hubshift.spec import CheckpointStoreSpec, PartitionedConsumer

log = logging.getLogger("hubshift.consume")


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    logging.getLogger("hubshift").setLevel(level.upper())
    # The SDKs log every retry and reconnect at WARNING; their outcome reaches us as exceptions.
    for noisy in ("azure", "py4j", "uamqp"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def open_checkpoint_store(
    spec: CheckpointStoreSpec, environ: Mapping[str, str], timing: Timing
) -> LeaseStore:
    """The store the manifest names; its connection string comes from the environment."""
    from hubshift.ownership.stores.connect import open_store, sqlite_url

    if spec.sqlite is not None:
        return open_store(sqlite_url(spec.sqlite.path), create=True, timing=timing)
    assert spec.blob is not None  # the model requires exactly one
    variable = spec.blob.connection_string_env
    connection_string = environ.get(variable, "").strip()
    if not connection_string:
        raise UserError(
            f"environment variable {variable} is not set: it must hold the Azure Storage connection string "
            "of the checkpoint store (in a cluster, set spec.checkpointStore.blob.connectionStringSecretRef)"
        )
    return open_store(connection_string, spec.blob.container, create=True, timing=timing)


def default_http_host() -> str:
    # In a pod the kubelet's probes and the operator connect from outside; elsewhere stay on loopback.
    return "0.0.0.0" if os.environ.get("KUBERNETES_SERVICE_HOST") else "127.0.0.1"


@click.command(name="consume")
@click.option("-f", "--file", "manifest_path", required=True, help="The PartitionedConsumer manifest (YAML).")
@click.option("--id", "identity", required=True, help="This consumer's identity, stable across restarts.")
@click.option(
    "--engine",
    type=click.Choice(["spark", "sdk"]),
    default="spark",
    show_default=True,
    help="spark: the pipeline on a Spark streaming query; sdk: plain SDK receivers logging ranges.",
)
@click.option("--scratch", type=click.Path(file_okay=False), help="Pod-local scratch folder (emptied).")
@click.option(
    "--http-host", help="Address of /metrics, /healthz, /readyz (default: loopback off Kubernetes)."
)
@click.option("--http-port", type=int, help="Port (default: consumer.metricsPort; 0 picks a free one).")
@click.option("--grace-seconds", type=float, help="SIGTERM: hand off within this long (maxHandoff + 10).")
@click.option("--list-interval", type=float, help="Seconds between listings of the ownership table (20).")
@click.option("--ranges", type=click.Path(dir_okay=False), help="--engine sdk: where to log batch ranges.")
@click.option("--log-level", default="info", show_default=True, help="hubshift's log level.")
def consume(
    manifest_path: str,
    identity: str,
    engine: str,
    scratch: str | None,
    http_host: str | None,
    http_port: int | None,
    grace_seconds: float | None,
    list_interval: float | None,
    ranges: str | None,
    log_level: str,
) -> None:
    """Run one consumer: own partitions, read them, hand them off on SIGTERM."""
    configure_logging(log_level)
    manifest = load_manifest(manifest_path)
    try:
        me = consumer_id(identity)
    except ValueError as exc:
        raise UserError(f"--id: {exc}") from None
    code = run_consumer(
        manifest,
        me,
        engine=engine,
        scratch=Path(scratch) if scratch else Path(tempfile.gettempdir()) / f"hubshift-consume-{me}",
        http_host=http_host or default_http_host(),
        http_port=manifest.spec.consumer.metrics_port if http_port is None else http_port,
        grace_seconds=grace_seconds,
        list_interval=list_interval,
        ranges=Path(ranges) if ranges else None,
    )
    if code:
        raise SystemExit(code)


def run_consumer(
    manifest: PartitionedConsumer,
    me: str,
    *,
    engine: str,
    scratch: Path,
    http_host: str,
    http_port: int,
    grace_seconds: float | None,
    list_interval: float | None,
    ranges: Path | None,
    environ: Mapping[str, str] | None = None,
) -> int:
    from hubshift.consumer.agent import AgentSettings, OwnershipAgent
    from hubshift.consumer.http import ConsumerHTTPServer
    from hubshift.consumer.metrics import ConsumerMetrics
    from hubshift.eventhubs.management import EventHubsManagement
    from hubshift.eventhubs.target import resolve_target

    env = environ if environ is not None else os.environ
    spec = manifest.spec
    lease = spec.rebalance.lease_duration_seconds
    timing = Timing(
        membership_lease_seconds=lease,
        renew_interval_seconds=lease / 2,
        safety_margin_seconds=min(5.0, lease / 2 - 1),
        list_interval_seconds=list_interval or Timing().list_interval_seconds,
    )
    target = resolve_target(spec.event_hubs, env)
    management = EventHubsManagement(target, retry_total=1)
    management.probe()
    replicate = spec.consumer.pipeline.replicate
    if spec.consumer.pipeline.type == "replicate" and replicate is not None:
        from hubshift.consumer.pipelines.replicate import replicate_target

        EventHubsManagement(replicate_target(replicate, env), retry_total=1).probe()
    store = open_checkpoint_store(spec.checkpoint_store, env, timing)
    scope = Scope(target.fqns, target.hub, target.consumer_group)
    start = spec.consumer.start_position
    settings = AgentSettings(
        start=start.type,
        start_time=start.enqueued_time,
        checkpoint_every_events=spec.consumer.checkpoint.every_events,
        checkpoint_every_seconds=spec.consumer.checkpoint.every_seconds,
        max_handoff_seconds=spec.rebalance.max_handoff_seconds,
        timing=timing,
        grace_seconds=grace_seconds if grace_seconds is not None else spec.rebalance.max_handoff_seconds + 10,
    )
    metrics = ConsumerMetrics(me)
    agent: OwnershipAgent | None = None

    def notify(event: Any) -> None:
        assert agent is not None
        agent.notify(event)

    from hubshift.consumer.spark.engine import clean_scratch

    clean_scratch(scratch)
    scratch.mkdir(parents=True)
    reader: Any
    if engine == "sdk":
        from hubshift.consumer.sdk_engine import RangeLog, SdkEngine

        log_path = ranges or Path(spec.consumer.sink.folder.path) / "ranges" / f"{me}.jsonl"
        reader = SdkEngine(target, notify, RangeLog(log_path, me))
    else:
        from hubshift.consumer.spark.engine import SparkEngine

        reader = SparkEngine(target, notify, me, spec.consumer, scratch, metrics=metrics)
    agent = OwnershipAgent(store, scope, me, reader, management, settings, metrics=metrics)
    running = agent

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: handing off and stopping", signum)
        running.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = ConsumerHTTPServer(
        metrics,
        host=http_host,
        port=http_port,
        ready=lambda: running.ready,
        on_assignment=lambda generation: running.nudge(),
    ).start()
    # One line on stdout: where this consumer answers (tests and the local runtime read it).
    print(f"hubshift consume {me}: listening on {server.url}", flush=True)
    code = 1
    try:
        log.info("consumer %s: %s engine starting for %s", me, reader.name, scope)
        reader.start()
        log.info("consumer %s: reading as partitions are claimed", me)
        code = agent.run()
    finally:
        reader.close()
        server.stop()
        store.close()
        management.close()
        clean_scratch(scratch)
    log.info("consumer %s: stopped (exit %d)", me, code)
    return code
