"""Which Event Hub to read, and with what: the connection string from the environment variable the manifest
names, or a token credential for the namespace it names; over AMQP or AMQP over WebSockets, directly or
through an HTTP proxy (`Network`); SDK clients made from these (`sdk_client`); and SDK errors turned into
lines a person can act on.

A connection string is never part of a message, a log line or a metric (it holds a key); nor is a token, nor
a proxy's password.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from azure.eventhub import TransportType, parse_connection_string

from hubshift.errors import UserError
from hubshift.identity import AsyncCredential, describe_credential_error, token_credential
from hubshift.spec.connections import TokenCredentialSpec
from hubshift.spec.hub import EventHubsSpec, HubConnectionSpec, Transport

log = logging.getLogger(__name__)

TRANSPORTS: tuple[Transport, ...] = ("amqp", "amqpWebSockets")
# `://user:password@` in a URL an error quotes: never printed
_USERINFO = re.compile(r"://[^/@\s]*@")


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy (HTTP CONNECT), with the user name and password it asks for, if any."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        """`proxy HOST:PORT`, for messages: never its password."""
        return f"proxy {self.host}:{self.port}"

    def sdk_settings(self, *, asynchronous: bool) -> dict[str, Any]:
        """The SDK's `http_proxy`: websocket-client (the synchronous clients) takes a bare host, aiohttp (the
        asynchronous ones) a URL."""
        settings: dict[str, Any] = {
            "proxy_hostname": f"http://{self.host}" if asynchronous else self.host,
            "proxy_port": self.port,
        }
        if self.username is not None:
            settings.update(username=self.username, password=self.password or "")
        return settings


@dataclass(frozen=True)
class Network:
    """How a hub is reached: AMQP (TLS, port 5671) or AMQP over WebSockets (port 443), and an HTTP proxy on
    the way (the SDK speaks WebSockets through one)."""

    transport: Transport = "amqp"
    proxy: Proxy | None = None

    @property
    def websockets(self) -> bool:
        return self.transport == "amqpWebSockets" or self.proxy is not None

    def describe(self) -> str:
        """` over WebSockets through proxy HOST:PORT`, for messages; empty for plain AMQP."""
        over = " over WebSockets" if self.websockets else ""
        return over + ("" if self.proxy is None else f" through {self.proxy.describe()}")


DIRECT = Network()


def parse_proxy(url: str, credentials: str | None = None, *, where: str = "--proxy") -> Proxy:
    """A proxy from `http://[USER:PASSWORD@]HOST:PORT` (`credentials`, USER:PASSWORD, in place of the URL's);
    `UserError` naming `where`, never the URL (it may hold a password)."""
    parsed = urlparse(url.strip())
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme.lower() != "http" or not parsed.hostname or port is None or parsed.path not in ("", "/"):
        raise UserError(f"{where}: expected an HTTP proxy as http://[USER:PASSWORD@]HOST:PORT")
    username = unquote(parsed.username) if parsed.username is not None else None
    password = unquote(parsed.password) if parsed.password is not None else None
    if credentials is not None:
        username, separator, password = credentials.strip().partition(":")
        if not separator or not username:
            raise UserError(f"{where}: the proxy's credentials must be USER:PASSWORD")
    return Proxy(parsed.hostname, port, username, password)


def hub_network(hub: HubConnectionSpec, environ: Mapping[str, str], path: str) -> Network:
    """The transport and proxy a hub block names, with the proxy's credentials from the environment."""
    if hub.proxy is None:
        return Network(hub.transport or "amqp")
    credentials = hub.proxy.resolve(environ, f"{path}.proxy").connection_string
    return Network("amqpWebSockets", parse_proxy(hub.proxy.url, credentials, where=f"{path}.proxy"))


@dataclass(frozen=True)
class EventHubsTarget:
    """A hub and its consumer group, reached with a connection string or a token credential (`identity`)."""

    connection_string: str | None = field(repr=False)
    fqns: str  # fully qualified namespace, as the SDK names it (host[:port]), lower case
    hub: str
    consumer_group: str
    identity: TokenCredentialSpec | None = None
    network: Network = DIRECT

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
    `identity` in its place), or with the connection string from the environment variable it names; over
    the transport and proxy it names. The consumer group: the source's, or `consumer_group`."""
    if consumer_group is None:
        consumer_group = hub.consumer_group if isinstance(hub, EventHubsSpec) else "$Default"
    network = hub_network(hub, environ, path)
    resolved = hub.resolve(environ, path, identity=identity)
    return hub_target(
        hub.hub,
        consumer_group,
        connection_string=resolved.connection_string,
        identity=resolved.identity,
        namespace=hub.namespace,
        network=network,
        source=resolved.variable or "the connection string",
        namespace_from=f"{path}.namespace",
    )


def hub_target(
    hub: str,
    consumer_group: str = "$Default",
    *,
    connection_string: str | None = None,
    identity: TokenCredentialSpec | None = None,
    namespace: str | None = None,
    network: Network = DIRECT,
    source: str = "the connection string",
    namespace_from: str = "namespace",
    advice: str = "leave namespace out, or name the same one",
) -> EventHubsTarget:
    """The one way to a target, from a manifest's block or a command line's options: with a token
    credential (`identity`) for `namespace`, or with a connection string, checked for shape (the SDK's
    parser), for the hub it is for and for the namespace it is for (a `namespace` given beside it must be
    its Endpoint: else a SAS token signed with its key would be sent to a host the caller chose). `source`
    and `namespace_from` say where the connection string and the namespace came from, for messages;
    `advice`, what to do about a namespace that is not the Endpoint."""
    named = None if namespace is None else namespace.strip().lower()
    if identity is not None:
        if named is None:
            raise UserError(f"{namespace_from}: a token credential needs the namespace it is for")
        return EventHubsTarget(None, named, hub, consumer_group, identity, network)
    connection_string = (connection_string or "").strip()
    try:
        properties = parse_connection_string(connection_string)
    except ValueError:
        raise UserError(
            f"{source}: not an Event Hubs connection string (expected Endpoint=sb://NAMESPACE/;"
            "SharedAccessKeyName=...;SharedAccessKey=... or SharedAccessSignature=...)"
        ) from None
    host = (properties.fully_qualified_namespace or "").strip().lower()
    if not host:
        raise UserError(f"{source}: the Event Hubs connection string has no Endpoint=sb://NAMESPACE/")
    entity = properties.eventhub_name
    if entity and entity != hub:
        raise UserError(f"{source}: the connection string is for hub {entity!r}, not {hub!r}")
    if named is not None and named != host:
        raise UserError(
            f"{namespace_from}: {named} is not the namespace of the connection string in {source} (its "
            f"Endpoint); {advice}"
        )
    return EventHubsTarget(connection_string, host, hub, consumer_group, network=network)


def sdk_client(client_class: Any, target: EventHubsTarget, **kwargs: Any) -> Any:
    """An azure-eventhub client of `client_class` (a consumer or producer client, synchronous or from
    `azure.eventhub.aio`) for the target: from its connection string, or from its namespace and token
    credential; over AMQP or AMQP over WebSockets, through its proxy if it has one. A namespace with a port
    (`host:port`, a proxy or a local emulator) is connected to there, over TLS as the service is (but for
    the emulator's connection string). The SDK trusts certifi's authorities only; the process's own bundle
    (`SSL_CERT_FILE`, else `REQUESTS_CA_BUNDLE`, the one azure-identity and the Storage SDK use), when
    set, replaces them (a proxy that inspects TLS, a private certificate authority)."""
    bundle = os.environ.get("SSL_CERT_FILE") or os.environ.get("REQUESTS_CA_BUNDLE")
    if bundle:
        kwargs.setdefault("connection_verify", bundle)
    asynchronous = client_class.__module__.startswith("azure.eventhub.aio")
    network = target.network
    with_port = urlparse(f"sb://{target.fqns}").port is not None
    if network.websockets:
        kwargs.setdefault("transport_type", TransportType.AmqpOverWebsocket)
        if with_port:
            # the SDK's WebSocket URL drops the namespace's port; a custom endpoint keeps it
            kwargs.setdefault("custom_endpoint_address", f"sb://{target.fqns}")
    if network.proxy is not None:
        kwargs.setdefault("http_proxy", network.proxy.sdk_settings(asynchronous=asynchronous))
    if target.connection_string is not None:
        return client_class.from_connection_string(
            target.connection_string, eventhub_name=target.hub, **kwargs
        )
    assert target.identity is not None
    credential: Any = AsyncCredential(target.identity) if asynchronous else token_credential(target.identity)
    if with_port and not network.websockets:
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
    proxy = target.network.proxy
    if proxy is not None and ("407" in text or "Proxy Authentication" in text):
        return f"{where}: the {proxy.describe()} refused its credentials (check the proxy's USER:PASSWORD)"
    if kind in ("ConnectError", "ConnectionLostError") or "socket" in text.lower() or "refused" in text:
        return f"{where}: cannot connect{target.network.describe()} (is the namespace reachable from here?)"
    first_line = text.splitlines()[0] if text else kind
    return f"{where}: {_USERINFO.sub('://', first_line)[:200]}"


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
