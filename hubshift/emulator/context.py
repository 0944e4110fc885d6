"""What every connection of one server shares: the broker, the authorizer, and the limits each connection
works within."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

from hubshift.emulator.broker import Broker
from hubshift.emulator.cbs import Authorizer


class ProtocolViolation(Exception):
    """The peer broke the protocol: its connection is closed with this AMQP error condition."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


class Abortable(Protocol):
    def abort(self) -> None:
        """Drop the connection at once (the server is stopping)."""


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may use: what the emulator advertises (frame and message size, channel-max,
    handle-max) and the bounds it enforces beyond them (bytes held, links, replies, tokens, deadlines), and
    how many sockets the server holds."""

    max_frame_size: int = 65536
    # Event Hubs Standard's
    max_message_size: int = 1 << 20
    # the service's (the SDK uses one session per connection; other SDKs one per link)
    channel_max: int = 4999
    handle_max: int = 255
    links_per_connection: int = 4096
    # bytes of unfinished (multi-frame) deliveries one connection holds, every link's together
    delivery_bytes_per_connection: int = 16 << 20
    # a $cbs or $management request (a put-token with an Entra ID token takes a few kB)
    max_request_size: int = 64 << 10
    # replies waiting for their node's reply link to attach, per session and node
    pending_replies: int = 64
    # distinct token scopes one connection holds
    grants_per_connection: int = 4096
    # before open (the spec's minimum maximum is 512 bytes; the SDK's open takes about 340)
    handshake_frame_size: int = 4096
    # from a socket's accept until the peer's open, whatever comes first (SASL, an HTTP upgrade)
    handshake_timeout: float = 30.0
    # bytes a peer may send before its open, an HTTP upgrade request and WebSocket framing included (the
    # SDK sends at most about 1 KiB, over WebSockets; 660 bytes over plain AMQP)
    handshake_bytes: int = 64 << 10
    # sockets open at once, every listener's together (AMQP, TLS, WebSockets); one more is closed unread
    max_connections: int = 1024
    # with keys: until a token put on $cbs is accepted
    authentication_timeout: float = 60.0
    advertised_idle_timeout_ms: int | None = 240_000


@dataclass
class ServerContext:
    """What every connection of one server shares."""

    broker: Broker
    authorizer: Authorizer
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    container_id: str = field(default_factory=lambda: f"hubshift-emulator-{uuid.uuid4()}")
    # AMQP connections (over a socket or a WebSocket)
    connections: set[Abortable] = field(default_factory=set)
    # every socket accepted and not yet closed, whatever it speaks (bounded by `limits.max_connections`)
    sockets: set[Abortable] = field(default_factory=set)
    # at the cap (warned once until a socket closes)
    refusing: bool = False
