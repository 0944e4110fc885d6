"""Where events come from: the hub a block names (`HubConnectionSpec`: the source, `EventHubsSpec`, or a
hub events are sent to), how it is reached (AMQP or AMQP over WebSockets) and through which HTTP proxy
(`ProxySpec`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator

from hubshift.errors import UserError
from hubshift.spec.base import HOST, MAX_HOST_LENGTH, cel
from hubshift.spec.connections import (
    ConnectionSpec,
    NamedConnection,
    Resolved,
    Role,
    SecretConnectionSpec,
    SecretKeyRefSpec,
    TokenCredentialSpec,
)

DEFAULT_EVENTHUBS_ENV = "HUBSHIFT_EVENTHUBS_CONNECTION_STRING"
DEFAULT_PROXY_ENV = "HUBSHIFT_PROXY_CREDENTIALS"

# A fully qualified Event Hubs namespace (myns.servicebus.windows.net, or HOST:PORT for a local emulator).
EVENTHUBS_NAMESPACE = f"^{HOST}$"
# An HTTP proxy's address, without credentials (they come from a Secret): http://HOST:PORT.
PROXY_URL = r"^http://[A-Za-z0-9._-]+:[0-9]{1,5}/?$"

Transport = Literal["amqp", "amqpWebSockets"]

# The messages of the refusals below, shared by the models and their CEL rules.
CREDENTIAL_NEEDS_NAMESPACE = (
    "a credential needs namespace, the fully qualified namespace (myns.servicebus.windows.net)"
)
PROXY_NEEDS_WEBSOCKETS = (
    "a proxy carries AMQP over WebSockets: set transport to amqpWebSockets (or leave it out) with a proxy"
)


class ProxySpec(SecretConnectionSpec):
    """An HTTP proxy that Event Hubs is reached through (HTTP CONNECT to the namespace's port 443, AMQP over
    WebSockets inside), with the user name and password it asks for, if any, kept in a Secret."""

    SERVICE = "HTTP proxy"
    DEFAULT_VARIABLE = DEFAULT_PROXY_ENV

    url: str = Field(
        pattern=PROXY_URL,
        description="The proxy, http://HOST:PORT (no credentials here: credentialsSecretRef holds them).",
    )
    # The connection's two fields under the names a proxy's user and password go by.
    connection_string_secret_ref: SecretKeyRefSpec | None = Field(
        default=None,
        alias="credentialsSecretRef",
        description="Secret key holding the proxy's USER:PASSWORD (in a cluster); none: the proxy asks for "
        "no credentials.",
    )
    connection_string_env: str | None = Field(
        default=None,
        min_length=1,
        alias="credentialsEnv",
        description=f"Environment variable the consumer reads the proxy's USER:PASSWORD from (default "
        f"{DEFAULT_PROXY_ENV} when credentialsSecretRef is set; neither set: no credentials).",
    )

    @property
    def has_credentials(self) -> bool:
        return self.connection_string_secret_ref is not None or self.connection_string_env is not None

    def resolve(
        self, environ: Mapping[str, str], path: str, *, identity: TokenCredentialSpec | None = None
    ) -> Resolved:
        """The proxy's USER:PASSWORD from the environment (`connection_string`); none without credentials.
        `UserError` naming the variable and the field to set when it is not there."""
        if not self.has_credentials:
            return Resolved(None, None, None)
        variable = self.connection_string_variable
        credentials = environ.get(variable, "").strip()
        if not credentials:
            raise UserError(
                f"environment variable {variable} is not set: it must hold the USER:PASSWORD of the proxy "
                f"{path} names (in a cluster, set {path}.credentialsSecretRef)"
            )
        return Resolved(credentials, None, variable)


class HubConnectionSpec(ConnectionSpec):
    """An Event Hub, reached with a connection string or a token credential: the source (`EventHubsSpec`) or
    a hub events are sent to (a pipeline's target); over AMQP (port 5671) or AMQP over WebSockets (443),
    directly or through an HTTP proxy."""

    SERVICE = "Event Hubs"
    DEFAULT_VARIABLE = DEFAULT_EVENTHUBS_ENV
    ADDRESS = "namespace"
    ADDRESS_MESSAGE = CREDENTIAL_NEEDS_NAMESPACE

    namespace: str | None = Field(
        default=None,
        max_length=MAX_HOST_LENGTH,
        pattern=EVENTHUBS_NAMESPACE,
        description="Fully qualified Event Hubs namespace (e.g. myns.servicebus.windows.net: a host name in "
        "lower case, optionally :PORT); taken from the connection string's Endpoint when omitted (with a "
        "connection string it must be that Endpoint); required with a credential.",
    )
    hub: str = Field(min_length=1, description="Event Hub name.")
    transport: Transport | None = Field(
        default=None,
        description="amqp: AMQP over TLS on port 5671; amqpWebSockets: AMQP over WebSockets on port 443 "
        "(path /$servicebus/websocket), for networks that let only HTTPS out. Default: amqp, or "
        "amqpWebSockets with a proxy.",
    )
    proxy: ProxySpec | None = Field(
        default=None, description="An HTTP proxy to reach Event Hubs through (AMQP over WebSockets)."
    )

    CEL = (
        cel(
            "!has(self.proxy) || !has(self.transport) || self.transport == 'amqpWebSockets'",
            PROXY_NEEDS_WEBSOCKETS,
            ".transport",
        ),
    )

    @model_validator(mode="after")
    def _proxy_over_websockets(self) -> HubConnectionSpec:
        """The SDK speaks AMQP over WebSockets through a proxy, whatever the transport says: say so."""
        if self.proxy is not None and self.transport == "amqp":
            raise ValueError(PROXY_NEEDS_WEBSOCKETS)
        return self

    @property
    def websockets(self) -> bool:
        """Whether AMQP goes over WebSockets (asked for, or through a proxy)."""
        return self.transport == "amqpWebSockets" or self.proxy is not None

    def proxy_connection(self, location: tuple[str | int, ...], role: Role) -> list[NamedConnection]:
        """The proxy's credentials as a connection of the resource (a Secret the pods need), when it has
        some."""
        if self.proxy is None or not self.proxy.has_credentials:
            return []
        return [NamedConnection((*location, "proxy"), self.proxy, role)]


class EventHubsSpec(HubConnectionSpec):
    """The Event Hub the consumers read."""

    consumer_group: str = Field(default="$Default", min_length=1, description="Consumer group.")
