"""`hubshift run -f MANIFEST`: a PartitionedConsumer's control loop with local consumer processes."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click

from hubshift.connections import chosen_identity, credential_options
from hubshift.errors import UserError, require_extra
from hubshift.log import configure_logging
from hubshift.manifest import PartitionedConsumer, load_manifest, with_credential
from hubshift.operator.local.processes import TARGETS_FILE
from hubshift.operator.local.runner import LocalOperator, install_stop_signals
from hubshift.operator.metrics import OperatorMetrics
from hubshift.spec import TokenCredentialSpec

log = logging.getLogger("hubshift.run")


@click.command(name="run")
@click.option("-f", "--file", "manifest_path", required=True, help="The PartitionedConsumer manifest (YAML).")
@click.option(
    "--engine",
    type=click.Choice(["spark", "sdk"]),
    help="The consumers' engine: spark (the pipeline) or sdk (plain SDK receivers, no Spark); default: the "
    "manifest's consumer.engine.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Status, events, consumer logs and scratch (default: .hubshift/<name>).",
)
@click.option("--duration", type=float, help="Stop after this many seconds (default: until Ctrl-C).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Serve the operator's /metrics on 127.0.0.1:PORT (0: none).",
)
@click.option("--log-level", default="info", show_default=True, help="hubshift's log level.")
@credential_options(
    "Authenticate every Azure connection of the manifest (the control loop's and the consumers') with this "
    "token credential instead of its connection string (the manifest names the namespace and account URLs)"
)
def run(
    manifest_path: str,
    engine: str | None,
    workdir: str | None,
    duration: float | None,
    metrics_port: int,
    log_level: str,
    credential: str | None,
    client_id: str | None,
) -> None:
    """Run a PartitionedConsumer manifest on this machine: the control loop and one `hubshift consume`
    process per replica. Connection strings come from the environment variables the manifest names; token
    credentials are built here, by each process."""
    configure_logging(log_level)
    identity = chosen_identity(credential, client_id)
    consumer = _manifest_with(Path(manifest_path), identity)
    folder = Path(workdir) if workdir else Path(".hubshift") / consumer.metadata.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "logs").mkdir(exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"--workdir {folder}: {exc.strerror or exc} (choose a folder you can write)"
        ) from None
    engine = engine or consumer.spec.consumer.engine
    if engine == "spark":
        require_extra("pyspark", "spark", "the Spark consumers (or --engine sdk)")
    code = asyncio.run(_run(Path(manifest_path), consumer, folder, engine, duration, metrics_port, identity))
    if code:
        raise SystemExit(code)


def _manifest_with(path: Path, identity: TokenCredentialSpec | None) -> PartitionedConsumer:
    """The manifest, with the command line's credential in place of its connection strings."""
    consumer = load_manifest(path)
    if identity is None:
        return consumer
    return with_credential(consumer, identity)


def _consume_args(identity: TokenCredentialSpec | None) -> tuple[str, ...]:
    """What each `hubshift consume` is told of the command line's credential."""
    if identity is None:
        return ()
    return (
        "--credential",
        identity.type,
        *(("--client-id", identity.client_id) if identity.client_id else ()),
    )


async def _run(
    manifest_path: Path,
    consumer: PartitionedConsumer,
    workdir: Path,
    engine: str,
    duration: float | None,
    metrics_port: int = 0,
    identity: TokenCredentialSpec | None = None,
) -> int:

    metrics = OperatorMetrics()
    if metrics_port:
        try:
            metrics.serve(metrics_port, address="127.0.0.1")
        except OSError as exc:
            raise UserError(f"--metrics-port {metrics_port}: {exc.strerror}") from None
    operator = LocalOperator(
        manifest_path, consumer, workdir, engine=engine, metrics=metrics, extra_args=_consume_args(identity)
    )
    await operator.open()
    stop = asyncio.Event()
    install_stop_signals(stop)
    if duration is not None:
        asyncio.get_running_loop().call_later(duration, stop.set)
    click.echo(
        f"hubshift run {consumer.metadata.name}: {engine} consumers; status in {workdir / 'status.json'}, "
        f"consumer logs in {workdir / 'logs'}; Ctrl-C stops them gracefully",
        err=True,
    )
    if metrics_port:
        click.echo(
            f"metrics: the operator's at http://127.0.0.1:{metrics_port}/metrics, each consumer's listed in "
            f"{workdir / TARGETS_FILE} (Prometheus file_sd)",
            err=True,
        )
    watcher = asyncio.get_running_loop().create_task(_watch_manifest(manifest_path, operator, stop, identity))
    try:
        await operator.run(stop)
    finally:
        watcher.cancel()
        click.echo("stopping the consumers (each hands its partitions off)...", err=True)
        await operator.shutdown()
    return 0


async def _watch_manifest(
    path: Path, operator: LocalOperator, stop: asyncio.Event, identity: TokenCredentialSpec | None = None
) -> None:
    """Apply the manifest again when the file changes, as `kubectl apply` would."""
    seen = path.stat().st_mtime_ns
    while not stop.is_set():
        await asyncio.sleep(1.0)
        try:
            changed = path.stat().st_mtime_ns
        except OSError:
            continue
        if changed == seen:
            continue
        seen = changed
        try:
            operator.apply(_manifest_with(path, identity))
            log.info("%s changed: applied", path)
        except UserError as exc:
            log.warning("%s changed but was not applied: %s", path, "; ".join(str(exc).splitlines()))
