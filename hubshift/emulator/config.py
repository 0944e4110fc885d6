"""The emulator's settings: command-line flags and Microsoft's emulator Config.json, in one typed model."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from hubshift.emulator.broker import MAX_PARTITIONS, HubSpec
from hubshift.emulator.cbs import DEFAULT_KEY_NAME, PLACEHOLDER_KEY
from hubshift.emulator.context import ConnectionLimits
from hubshift.errors import UserError

DEFAULT_HUB = HubSpec("eh1", 2)
_HUB_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,254}[A-Za-z0-9])?$")
_CONSUMER_GROUP_NAME = re.compile(
    r"^(?:\$default|[A-Za-z0-9](?:[A-Za-z0-9._-]{0,48}[A-Za-z0-9])?)$", re.IGNORECASE
)


@dataclass(frozen=True)
class EmulatorSettings:
    host: str = "127.0.0.1"
    port: int = 5672
    hubs: tuple[HubSpec, ...] = (DEFAULT_HUB,)
    data_dir: Path | None = None
    retention_minutes: float = 60.0
    partition_max_bytes: int = 256 << 20
    key: str | None = None
    key_name: str = DEFAULT_KEY_NAME
    # what one connection may hold and how long its handshake may take (no flags: tests lower them)
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    # AMQP over TLS, as the service speaks it (5671): the certificate chain and its key, PEM files
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_port: int = 5671
    # Microsoft Entra ID tokens (put-token type jwt): the trusted signing keys, the accepted audiences
    # (empty: Event Hubs'), the accepted issuers (exactly, but for a trailing slash; needed with keys)
    jwt_keys: Path | None = None
    jwt_audiences: tuple[str, ...] = field(default=())
    jwt_issuers: tuple[str, ...] = field(default=())
    # offsets as a geo-replicated namespace gives them: strings that are not numbers
    geo_offsets: bool = False

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def tls_namespace(self, port: int) -> str:
        """The fully qualified namespace a token credential uses to reach the TLS port (host:port)."""
        return f"{self._client_host()}:{port}"

    def _client_host(self) -> str:
        host = self.host
        if host in ("", "0.0.0.0", "::"):
            return "127.0.0.1"
        return f"[{host}]" if ":" in host else host

    def connection_string(self, port: int) -> str:
        host = self._client_host()
        return (
            f"Endpoint=sb://{host}:{port};SharedAccessKeyName={self.key_name};"
            f"SharedAccessKey={self.key or PLACEHOLDER_KEY};UseDevelopmentEmulator=true"
        )


def check_hub_name(name: str, where: str) -> str:
    if not _HUB_NAME.match(name):
        raise UserError(
            f"{where}: invalid event hub name {name!r}: use 1-256 letters, digits, '.', '-' or '_', "
            "starting and ending with a letter or digit"
        )
    return name


def check_partition_count(count: int, where: str) -> int:
    if not 1 <= count <= MAX_PARTITIONS:
        raise UserError(f"{where}: partition count {count} is out of range: use 1 to {MAX_PARTITIONS}")
    return count


def check_consumer_group(name: str, where: str) -> str:
    if not _CONSUMER_GROUP_NAME.match(name):
        raise UserError(
            f"{where}: invalid consumer group name {name!r}: use 1-50 letters, digits, '.', '-' or '_', "
            "starting and ending with a letter or digit"
        )
    return name


def parse_hub_spec(text: str) -> HubSpec:
    """`NAME:PARTITIONS`, e.g. `telemetry:32`."""
    name, separator, count = text.rpartition(":")
    if not separator or not name or not count.strip().isdigit():
        raise UserError(f"--hub {text!r}: expected NAME:PARTITIONS, for example --hub telemetry:32")
    return HubSpec(check_hub_name(name, "--hub"), check_partition_count(int(count), f"--hub {text}"))


def load_config_file(path: Path) -> list[HubSpec]:
    """The hubs of Microsoft's emulator configuration (`UserConfig.NamespaceConfig[].Entities[]`)."""

    class ConsumerGroup(BaseModel):
        model_config = ConfigDict(extra="ignore")
        Name: str

    class Entity(BaseModel):
        model_config = ConfigDict(extra="ignore")
        Name: str
        PartitionCount: int
        ConsumerGroups: list[ConsumerGroup] = []

    class Namespace(BaseModel):
        model_config = ConfigDict(extra="ignore")
        Entities: list[Entity]

    class UserConfig(BaseModel):
        model_config = ConfigDict(extra="ignore")
        NamespaceConfig: list[Namespace]

    class ConfigFile(BaseModel):
        model_config = ConfigDict(extra="ignore")
        UserConfig: UserConfig

    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read the file: {exc.strerror or exc}") from None
    try:
        parsed = ConfigFile.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise UserError(f"--config {path}: not valid JSON: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise UserError(
            f"--config {path}: {location}: {first['msg']} (expected Microsoft's emulator format "
            "UserConfig.NamespaceConfig[].Entities[] with Name and PartitionCount)"
        ) from None
    hubs = []
    for namespace in parsed.UserConfig.NamespaceConfig:
        for entity in namespace.Entities:
            where = f"--config {path}: entity {entity.Name!r}"
            groups = tuple(check_consumer_group(group.Name, where) for group in entity.ConsumerGroups)
            hubs.append(
                HubSpec(
                    check_hub_name(entity.Name, where),
                    check_partition_count(entity.PartitionCount, where),
                    groups,
                )
            )
    return hubs


def build_hubs(
    hub_specs: list[str], consumer_groups: list[str], config_file: Path | None
) -> tuple[HubSpec, ...]:
    """Hubs from `--config` and `--hub`; `--consumer-group` adds groups to every hub."""
    hubs = load_config_file(config_file) if config_file else []
    hubs.extend(parse_hub_spec(spec) for spec in hub_specs)
    if not hubs:
        hubs = [DEFAULT_HUB]
    groups = tuple(check_consumer_group(group, "--consumer-group") for group in consumer_groups)
    seen: set[str] = set()
    result = []
    for hub in hubs:
        if hub.name.lower() in seen:
            raise UserError(f"event hub {hub.name!r} is defined twice (names are case-insensitive)")
        seen.add(hub.name.lower())
        result.append(HubSpec(hub.name, hub.partition_count, hub.consumer_groups + groups))
    return tuple(result)
