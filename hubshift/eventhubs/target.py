"""Which Event Hub to read, and with what: the connection string from the environment variable the manifest
names, the namespace it points at, and SDK errors turned into lines a person can act on.

A connection string is never part of a message, a log line or a metric (it holds a key).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

from hubshift.errors import UserError
from hubshift.spec import EventHubsSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventHubsTarget:
    connection_string: str = field(repr=False)
    fqns: str  # fully qualified namespace, as the SDK names it (host[:port]), lower case
    hub: str
    consumer_group: str


def resolve_target(
    spec: EventHubsSpec,
    environ: Mapping[str, str],
    *,
    secret_field: str = "spec.eventHubs.connectionStringSecretRef",
) -> EventHubsTarget:
    """The hub to read, with its connection string from the environment variable the manifest names
    (`secret_field`: where the manifest's Secret reference for it goes, for the error message)."""
    variable = spec.connection_string_env
    connection_string = environ.get(variable, "").strip()
    if not connection_string:
        raise UserError(
            f"environment variable {variable} is not set: it must hold the Event Hubs connection string "
            f"(in a cluster, set {secret_field})"
        )
    settings = _parse(connection_string, variable)
    endpoint = settings.get("endpoint", "")
    host = urlparse(endpoint).netloc.strip().lower() if "://" in endpoint else ""
    if not host:
        raise UserError(f"{variable}: the Event Hubs connection string has no Endpoint=sb://NAMESPACE/")
    if not settings.get("sharedaccesssignature") and not (
        settings.get("sharedaccesskeyname") and settings.get("sharedaccesskey")
    ):
        raise UserError(
            f"{variable}: the Event Hubs connection string needs SharedAccessKeyName and SharedAccessKey "
            "(or SharedAccessSignature)"
        )
    entity = settings.get("entitypath")
    if entity and entity != spec.hub:
        raise UserError(
            f"{variable}: the connection string is for hub {entity!r}, the manifest names {spec.hub!r}"
        )
    fqns = (spec.namespace or host).strip().lower()
    return EventHubsTarget(connection_string, fqns, spec.hub, spec.consumer_group)


def _parse(connection_string: str, variable: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for part in connection_string.split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise UserError(f"{variable}: not an Event Hubs connection string (a part has no Key=Value)")
        settings[key.strip().lower()] = value.strip()
    return settings


def describe_error(error: BaseException, target: EventHubsTarget) -> str:
    """One line for a failed management request (never the connection string)."""
    where = f"Event Hubs namespace {target.fqns}, hub {target.hub!r}"
    text = str(error)
    kind = type(error).__name__
    if "could not be found" in text or "404" in text.split("Description", 1)[0]:
        return f"{where}: the hub (or consumer group {target.consumer_group!r}) does not exist"
    if kind == "AuthenticationError" or "401" in text or "Unauthorized" in text:
        return f"{where}: the credentials were refused (check the connection string's key)"
    if kind in ("ConnectError", "ConnectionLostError") or "socket" in text.lower() or "refused" in text:
        return f"{where}: cannot connect (is the namespace reachable from here?)"
    first_line = text.splitlines()[0] if text else kind
    return f"{where}: {first_line[:200]}"
