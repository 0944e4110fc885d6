"""Which Event Hub to read, and with what: the connection string from the environment variable the manifest
names, or a token credential for the namespace it names; SDK clients made from either (`sdk_client`); and
SDK errors turned into lines a person can act on.

A connection string is never part of a message, a log line or a metric (it holds a key); nor is a token.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from azure.eventhub import parse_connection_string

from hubshift.errors import UserError
from hubshift.identity import AsyncCredential, describe_credential_error, token_credential
from hubshift.spec import EventHubsSpec, HubConnectionSpec, TokenCredentialSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventHubsTarget:
    """A hub and its consumer group, reached with a connection string or a token credential (`identity`)."""

    connection_string: str | None = field(repr=False)
    fqns: str  # fully qualified namespace, as the SDK names it (host[:port]), lower case
    hub: str
    consumer_group: str
    identity: TokenCredentialSpec | None = None

    @property
    def auth(self) -> str:
        """How it authenticates, for messages: `its connection string` or `credential TYPE`."""
        if self.identity is None:
            return "its connection string"
        return f"credential {self.identity.describe()}"


def resolve_target(
    hub: HubConnectionSpec,
    environ: Mapping[str, str],
    path: str = "spec.eventHubs",
    *,
    consumer_group: str | None = None,
    identity: TokenCredentialSpec | None = None,
) -> EventHubsTarget:
    """The hub a block names (`path`: where the block is, for messages): with its token credential (or
    `identity` in its place), or with the connection string from the environment variable it names, checked
    for shape (the SDK's parser) and for the hub it is for. The consumer group: the source's, or
    `consumer_group`."""
    if consumer_group is None:
        consumer_group = hub.consumer_group if isinstance(hub, EventHubsSpec) else "$Default"
    resolved = hub.resolve(environ, path, identity=identity)
    if resolved.identity is not None:
        assert hub.namespace is not None  # the model requires it with a credential
        return EventHubsTarget(
            None, hub.namespace.strip().lower(), hub.hub, consumer_group, resolved.identity
        )
    connection_string, variable = resolved.connection_string or "", resolved.variable
    try:
        properties = parse_connection_string(connection_string)
    except ValueError:
        raise UserError(
            f"{variable}: not an Event Hubs connection string (expected Endpoint=sb://NAMESPACE/;"
            "SharedAccessKeyName=...;SharedAccessKey=... or SharedAccessSignature=...)"
        ) from None
    host = (properties.fully_qualified_namespace or "").strip().lower()
    if not host:
        raise UserError(f"{variable}: the Event Hubs connection string has no Endpoint=sb://NAMESPACE/")
    entity = properties.eventhub_name
    if entity and entity != hub.hub:
        raise UserError(
            f"{variable}: the connection string is for hub {entity!r}, the manifest names {hub.hub!r}"
        )
    fqns = (hub.namespace or host).strip().lower()
    return EventHubsTarget(connection_string, fqns, hub.hub, consumer_group)


def sdk_client(client_class: Any, target: EventHubsTarget, **kwargs: Any) -> Any:
    """An azure-eventhub client of `client_class` (a consumer or producer client, synchronous or from
    `azure.eventhub.aio`) for the target: from its connection string, or from its namespace and token
    credential. A namespace with a port (`host:port`, a proxy or a local emulator) is connected to there,
    over TLS as the service is. The SDK trusts certifi's authorities only; the process's own bundle
    (`SSL_CERT_FILE`, else `REQUESTS_CA_BUNDLE`, the one azure-identity and the Storage SDK use), when
    set, replaces them (a proxy that inspects TLS, a private certificate authority)."""
    bundle = os.environ.get("SSL_CERT_FILE") or os.environ.get("REQUESTS_CA_BUNDLE")
    if bundle:
        kwargs.setdefault("connection_verify", bundle)
    if target.connection_string is not None:
        return client_class.from_connection_string(
            target.connection_string, eventhub_name=target.hub, **kwargs
        )
    assert target.identity is not None
    asynchronous = client_class.__module__.startswith("azure.eventhub.aio")
    credential: Any = AsyncCredential(target.identity) if asynchronous else token_credential(target.identity)
    if urlparse(f"sb://{target.fqns}").port is not None:
        from azure.eventhub import TransportType

        # AMQP over TLS to that port (with a custom endpoint the SDK would default to WebSockets)
        kwargs.setdefault("custom_endpoint_address", f"sb://{target.fqns}")
        kwargs.setdefault("transport_type", TransportType.Amqp)
    return client_class(
        fully_qualified_namespace=target.fqns, eventhub_name=target.hub, credential=credential, **kwargs
    )


def describe_error(error: BaseException, target: EventHubsTarget) -> str:
    """One line for a failed request, saying what to fix (never the connection string or a token)."""
    where = f"Event Hubs namespace {target.fqns}, hub {target.hub!r}"
    text = str(error)
    kind = type(error).__name__
    if target.identity is not None:
        from_identity = describe_credential_error(_cause(error), target.identity)
        if from_identity is not None:
            return f"{where}: {from_identity}"
    if "could not be found" in text or "404" in text.split("Description", 1)[0]:
        return f"{where}: the hub (or consumer group {target.consumer_group!r}) does not exist"
    if kind == "AuthenticationError" or "401" in text or "Unauthorized" in text:
        if target.identity is None:
            return f"{where}: the credentials were refused (check the connection string's key)"
        reason = _service_reason(text)
        return (
            f"{where}: the token of {target.auth} was refused{reason} (check that the identity has a data "
            "role on the hub, Azure Event Hubs Data Receiver or Sender, and the credential's client id)"
        )
    if kind in ("ConnectError", "ConnectionLostError") or "socket" in text.lower() or "refused" in text:
        return f"{where}: cannot connect (is the namespace reachable from here?)"
    first_line = text.splitlines()[0] if text else kind
    return f"{where}: {first_line[:200]}"


def _cause(error: BaseException) -> BaseException:
    """The error azure-identity raised, when the SDK wrapped it in one of its own."""
    seen: BaseException | None = error
    for _ in range(5):
        if seen is None:
            break
        if type(seen).__module__.startswith(("azure.identity", "azure.core")):
            return seen
        seen = seen.__cause__ or seen.__context__
    return error


def _service_reason(text: str) -> str:
    """`: ExpiredToken: The token is expired...`: the service's own description of a refused token."""
    for line in text.splitlines():
        _, found, description = line.partition("Description:")
        if found and description.strip():
            return f": {description.strip()[:200]}"
    return ""
