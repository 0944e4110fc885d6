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
from pathlib import Path

import click

from hubshift.connections import chosen_identity, credential_options
from hubshift.consumer.app import ConsumerApp, ConsumerOptions
from hubshift.errors import UserError
from hubshift.log import configure_logging
from hubshift.manifest import load_manifest, with_credential
from hubshift.ownership.scope import consumer_id

log = logging.getLogger("hubshift.consume")


@click.command(name="consume")
@click.option("-f", "--file", "manifest_path", required=True, help="The PartitionedConsumer manifest (YAML).")
@click.option("--id", "identity", required=True, help="This consumer's identity, stable across restarts.")
@click.option(
    "--engine",
    type=click.Choice(["spark", "sdk"]),
    help="spark: the pipeline on a Spark streaming query; sdk: plain SDK receivers logging ranges "
    "(default: the manifest's consumer.engine).",
)
@click.option("--scratch", type=click.Path(file_okay=False), help="Pod-local scratch folder (emptied).")
@click.option(
    "--http-host", help="Address of /metrics, /healthz, /readyz (default: loopback off Kubernetes)."
)
@click.option("--http-port", type=int, help="Port (default: consumer.metricsPort; 0 picks a free one).")
@click.option("--grace-seconds", type=float, help="SIGTERM: hand off within this long (maxHandoff + 10).")
@click.option("--list-interval", type=float, help="Seconds between listings of the ownership table (20).")
@click.option(
    "--stop-follow-seconds",
    type=click.FloatRange(0, 60),
    default=0.0,
    help="SIGTERM: keep reading this long at most while the operator moves the partitions to consumers "
    "ready for them, then hand off the rest (a pod's command sets it; 0: hand off at once).",
)
@click.option("--ranges", type=click.Path(dir_okay=False), help="--engine sdk: where to log batch ranges.")
@click.option(
    "--event-cost",
    type=click.FloatRange(min=0),
    default=0.0,
    help="--engine sdk: seconds of work per event, one at a time (a consumer of bounded capacity, for "
    "benchmarks).",
)
@click.option("--log-level", default="info", show_default=True, help="hubshift's log level.")
@credential_options(
    "Authenticate every Azure connection of the manifest with this token credential instead of its "
    "connection string (the manifest names the namespace and account URLs)"
)
def consume(
    manifest_path: str,
    identity: str,
    engine: str | None,
    scratch: str | None,
    http_host: str | None,
    http_port: int | None,
    grace_seconds: float | None,
    list_interval: float | None,
    stop_follow_seconds: float,
    ranges: str | None,
    event_cost: float,
    log_level: str,
    credential: str | None,
    client_id: str | None,
) -> None:
    """Run one consumer: own partitions, read them, hand them off on SIGTERM."""

    configure_logging(log_level)
    manifest = load_manifest(manifest_path)
    chosen = chosen_identity(credential, client_id)
    if chosen is not None:
        manifest = with_credential(manifest, chosen)
    try:
        me = consumer_id(identity)
    except ValueError as exc:
        raise UserError(f"--id: {exc}") from None
    options = ConsumerOptions(
        identity=me,
        engine="sdk" if (engine or manifest.spec.consumer.engine) == "sdk" else "spark",
        scratch=Path(scratch) if scratch else None,
        http_host=http_host,
        http_port=http_port,
        grace_seconds=grace_seconds,
        list_interval_seconds=list_interval,
        stop_follow_seconds=stop_follow_seconds,
        ranges=Path(ranges) if ranges else None,
        event_cost_seconds=event_cost,
    )
    code = ConsumerApp.build(manifest, options, os.environ).run()
    if code:
        raise SystemExit(code)
