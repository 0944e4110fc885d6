"""What every connection of one server shares: the broker, the authorizer, and the protocol limits."""

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


@dataclass
class ServerContext:
    """What every connection of one server shares."""

    broker: Broker
    authorizer: Authorizer
    max_frame_size: int = 65536
    max_message_size: int = 1048576
    advertised_idle_timeout_ms: int | None = 240_000
    handshake_timeout: float = 30.0
    container_id: str = field(default_factory=lambda: f"hubshift-emulator-{uuid.uuid4()}")
    connections: set[Abortable] = field(default_factory=set)
