"""`hubshift emulator`: start the local Event Hubs and print its connection string."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from hubshift.emulator.broker import HubSpec
from hubshift.emulator.config import EmulatorSettings, build_hubs
from hubshift.emulator.context import ConnectionLimits
from hubshift.emulator.server import run_emulator


@click.command("emulator")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=5672, show_default=True, help="0 picks a free port."
)
@click.option("--hub", "hubs", multiple=True, metavar="NAME:PARTITIONS", help="An event hub (repeatable).")
@click.option(
    "--consumer-group", "consumer_groups", multiple=True, metavar="NAME", help="Added to every hub."
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Microsoft's emulator Config.json (UserConfig.NamespaceConfig[].Entities[]); read again on SIGHUP "
    "(new hubs, more partitions, as the service allows while running).",
)
@click.option(
    "--data-dir", type=click.Path(path_type=Path, file_okay=False), help="Keep events here across restarts."
)
@click.option(
    "--retention-minutes", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True
)
@click.option(
    "--partition-size-mb",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Retained bytes per partition before the oldest events go.",
)
@click.option(
    "--key",
    default=None,
    envvar="HUBSHIFT_EMULATOR_KEY",
    help="Verify SAS tokens against this key (default: accept any token); also $HUBSHIFT_EMULATOR_KEY, "
    "which keeps it out of the process list.",
)
@click.option(
    "--tls-cert",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also serve AMQP over TLS, as the service does, with this certificate (PEM, the chain); token "
    "credentials need TLS.",
)
@click.option(
    "--tls-key", type=click.Path(path_type=Path, dir_okay=False), help="The certificate's key (PEM)."
)
@click.option(
    "--tls-port",
    type=click.IntRange(0, 65535),
    default=5671,
    show_default=True,
    help="With --tls-cert: its port (0 picks a free one).",
)
@click.option(
    "--jwt-key",
    "jwt_keys",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Verify Microsoft Entra ID tokens (put-token type jwt) against these keys: PEM public keys or "
    "certificates, or a JSON Web Key Set; a token's `roles` (the Event Hubs Data Owner, Sender and Receiver "
    "roles) say what it allows. Without --key, SAS tokens are then refused. Without --jwt-key every bearer "
    "token is treated as the SAS rules say.",
)
@click.option(
    "--jwt-audience",
    "jwt_audiences",
    multiple=True,
    help="An accepted token audience (repeatable; default: https://eventhubs.azure.net and Service Bus's).",
)
@click.option(
    "--jwt-issuer",
    "jwt_issuers",
    multiple=True,
    help="An accepted token issuer, the tokens' `iss` exactly (a trailing slash aside; repeatable; needed "
    "with --jwt-key), e.g. https://sts.windows.net/<tenant id>/.",
)
@click.option(
    "--geo-offsets",
    is_flag=True,
    help="Offsets as a geo-replicated namespace gives them, strings that are not numbers (here "
    "SEGMENT:POSITION; clients must treat offsets as opaque strings).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=ConnectionLimits().max_connections,
    show_default=True,
    help="Sockets open at once, every listener's together (a consumer holds one per partition it reads).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
)
def emulator(
    host: str,
    port: int,
    hubs: tuple[str, ...],
    consumer_groups: tuple[str, ...],
    config_file: Path | None,
    data_dir: Path | None,
    retention_minutes: float,
    partition_size_mb: int,
    key: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_port: int,
    jwt_keys: Path | None,
    jwt_audiences: tuple[str, ...],
    jwt_issuers: tuple[str, ...],
    geo_offsets: bool,
    max_connections: int,
    log_level: str,
) -> None:
    """Start a local Event Hubs that the azure-eventhub SDK talks to; prints its connection string (and,
    with --tls-cert, the namespace token credentials use)."""

    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = EmulatorSettings(
        host=host,
        port=port,
        hubs=build_hubs(list(hubs), list(consumer_groups), config_file),
        data_dir=data_dir,
        retention_minutes=retention_minutes,
        partition_max_bytes=partition_size_mb << 20,
        key=key,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_port=tls_port,
        jwt_keys=jwt_keys,
        jwt_audiences=jwt_audiences,
        jwt_issuers=jwt_issuers,
        geo_offsets=geo_offsets,
        limits=ConnectionLimits(max_connections=max_connections),
    )

    def announce(line: str) -> None:
        click.echo(line)
        sys.stdout.flush()

    def reload() -> tuple[HubSpec, ...]:
        return build_hubs(list(hubs), list(consumer_groups), config_file)

    run_emulator(settings, announce, reload)
