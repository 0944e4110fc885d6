"""One connection as its sessions and links see it: the frames going out (batched, flushed once per turn of
the event loop), the peer's limits, the consumer links to wake when the socket drains, and the tokens put
on `$cbs`. `connection.AmqpConnection` is a Wire that also reads frames (the asyncio protocol)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from hubshift.emulator import performatives
from hubshift.emulator.cbs import Grants
from hubshift.emulator.codec import Buffer
from hubshift.emulator.context import ProtocolViolation, ServerContext
from hubshift.emulator.performatives import Performative


class Wakeable(Protocol):
    def wake(self) -> None:
        """Send what is pending, as far as credit goes (the socket drained)."""


class Wire:
    def __init__(self, context: ServerContext, loop: asyncio.AbstractEventLoop) -> None:
        self.context = context
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closing = False
        self.paused = False
        self.remote_max_frame_size = 1 << 20
        # the namespace's host, as the peer's open names it (None: it named none)
        self.hostname: str | None = None
        self.consumers: set[Wakeable] = set()
        self.grants = Grants(context.limits.grants_per_connection)
        # what the connection's links hold: bytes of unfinished deliveries, and how many links there are
        self.delivery_bytes = 0
        self.link_count = 0
        self.last_write = time.monotonic()
        self._out: list[Buffer] = []
        self._flush_scheduled = False

    def write(self, data: Buffer) -> None:
        if self.closing:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def write_many(self, parts: list[Buffer]) -> None:
        """Queue `parts` without scheduling a flush (the caller flushes)."""
        if not self.closing:
            self._out.extend(parts)

    def hold(self, size: int) -> None:
        """Count `size` more bytes of unfinished deliveries; past the connection's budget, the connection
        is closed."""
        limit = self.context.limits.delivery_bytes_per_connection
        if self.delivery_bytes + size > limit:
            raise ProtocolViolation(
                "amqp:resource-limit-exceeded",
                f"The unfinished deliveries on this connection exceed {limit} bytes.",
            )
        self.delivery_bytes += size

    def unhold(self, size: int) -> None:
        self.delivery_bytes -= size

    def send(self, channel: int, performative: Performative, payload: Buffer = b"") -> None:
        self.write(performatives.frame_of(channel, performative, payload))

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None or self.transport.is_closing():
            self._out.clear()
            return
        out = self._out
        self._out = []
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        self.last_write = time.monotonic()

    def discard_output(self) -> None:
        self._out.clear()

    def close_transport(self) -> None:
        self.flush()
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def grants_changed(self, expires_at_ms: int) -> None:
        """A token that expires then was put on `$cbs` (the connection watches the grants' expiry)."""
