"""One AMQP 1.0 connection, server side, as an asyncio protocol: protocol headers, SASL (every mechanism
accepted: authorization is per entity, through `$cbs`), open and close, the heartbeat, the handshake
deadline, frames read and handed to their session and link, and the expiry of the tokens put on `$cbs`.

Robustness rules: a connection never takes the server or another connection down. Bytes that are not
AMQP close this connection only; a peer that goes silent during the handshake is dropped; frames for
channels or handles that no longer exist (the SDK sends detaches after `end`) are ignored; every
producer delivery is settled with `accepted` or `rejected`.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import socket
import time
from collections.abc import Callable

from hubshift.emulator import frames, performatives
from hubshift.emulator.attach import on_attach
from hubshift.emulator.codec import Array, Buffer, DecodeError, Symbol, UByte, UInt, UShort
from hubshift.emulator.context import ConnectionLimits, ProtocolViolation, ServerContext
from hubshift.emulator.performatives import (
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
    amqp_error,
)
from hubshift.emulator.session import SESSION_WINDOW, Session
from hubshift.emulator.wire import Wire

LOG = logging.getLogger(__name__)

# Grants expiring later than this (a SAS token without a key: never) are not watched.
WATCHED_EXPIRY_MS = 10 * 24 * 3600 * 1000
# Past this many bytes waiting to be sent, consumers stop pumping and the peer's frames are not read
# (every frame it sends may be answered: a peer that never reads must not grow our buffer).
WRITE_BUFFER_HIGH = 4 << 20
WRITE_BUFFER_LOW = 1 << 20


class Handshake:
    """One socket from its accept to the peer's AMQP open: the deadline for that open, whatever comes before
    it (protocol headers and SASL, or an HTTP upgrade to a WebSocket first), and the bytes the peer may send
    until then. Met once, at the open; the socket's owner counts the bytes (`received`)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits, on_expiry: Callable[[], None]
    ) -> None:
        self.timeout = limits.handshake_timeout
        self.budget = limits.handshake_bytes
        self.met = False
        self._sent = 0
        self._timer: asyncio.TimerHandle | None = loop.call_later(self.timeout, on_expiry)

    def received(self, size: int) -> bool:
        """Count `size` bytes from the peer: False once the peer sent more than its budget before open."""
        if self.met:
            return True
        self._sent += size
        return self._sent <= self.budget

    def meet(self) -> None:
        self.met = True
        self.cancel()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class AmqpConnection(Wire, asyncio.Protocol):
    """One peer's AMQP connection: the Wire its sessions and links write to, and the protocol that reads
    its bytes into frames and hands them on. `handshake` is its socket's (the deadline kept from the accept,
    across an HTTP upgrade); without one, the deadline runs from `connection_made`."""

    def __init__(
        self, context: ServerContext, loop: asyncio.AbstractEventLoop, handshake: Handshake | None = None
    ) -> None:
        super().__init__(context, loop)
        self.handshake = handshake
        self._buffer = bytearray()
        self._needed = 0
        self._expect_header = True
        self._phase = "header"  # header -> sasl -> amqp-header -> open-wait -> open
        self._sessions: dict[int, Session] = {}  # by the peer's channel
        self._free_channels: list[int] = []  # a heap: the lowest released local channel is reused first
        self._next_channel = 0
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_due_ms = 0
        # the heartbeat (when the peer asked for one)
        self._timer: asyncio.TimerHandle | None = None
        # with keys: the deadline for a first accepted token
        self._authentication: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = str(transport.get_extra_info("peername"))
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _enable_keepalive(sock)
        self.context.connections.add(self)
        if self.handshake is None:
            self.handshake = Handshake(self.loop, self.context.limits, self._check_handshake)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.context.connections.discard(self)
        for timer in (self._timer, self._expiry, self._authentication):
            if timer is not None:
                timer.cancel()
        if self.handshake is not None:
            self.handshake.cancel()
        for session in self._sessions.values():
            session.close_links()
        self._sessions.clear()
        self.discard_output()

    def pause_writing(self) -> None:
        self.paused = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        for consumer in list(self.consumers):
            consumer.wake()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._needed:
                return
            data = bytes(self._buffer)
            self._buffer = bytearray()
        try:
            consumed = self._process(data)
            if consumed < len(data) and not self.closing:
                self._buffer = bytearray(data[consumed:])
        except ProtocolViolation as exc:
            self.fail(exc.condition, exc.description)
        except DecodeError as exc:
            self.fail("amqp:decode-error", str(exc))
        except Exception as exc:
            LOG.exception("connection %s: unexpected error", self.peer)
            self.fail("amqp:internal-error", f"{type(exc).__name__}: {exc}")
        self.flush()

    def eof_received(self) -> bool | None:
        return False

    def fail(self, condition: str, description: str) -> None:
        """Close this connection because of the peer's bytes, telling it why when it speaks AMQP."""
        if self.closing:
            return
        LOG.info("connection %s closed: %s %s", self.peer, condition, description)
        if self._phase == "open":
            self.send(0, Close(error=amqp_error(condition, description)))
        self.close_transport()

    # --- framing ---------------------------------------------------------------------------------------

    def _process(self, data: bytes) -> int:
        pos = 0
        end = len(data)
        view = memoryview(data)
        unpack = frames.FRAME_HEADER.unpack_from
        while pos < end and not self.closing:
            if self._expect_header:
                if end - pos < 8:
                    if not b"AMQP".startswith(data[pos : pos + 4]):
                        self._bad_header(data[pos:end])
                        return end
                    self._needed = 8
                    return pos
                self._on_header(data[pos : pos + 8])
                pos += 8
                continue
            if end - pos < 8:
                self._needed = 8
                return pos
            size, doff, frame_type, channel = unpack(data, pos)
            limits = self.context.limits
            limit = limits.max_frame_size if self._phase == "open" else limits.handshake_frame_size
            if size < 8 or size > limit or doff < 2 or doff * 4 > size:
                raise ProtocolViolation(
                    "amqp:connection:framing-error", f"bad frame header (size {size}, data offset {doff})"
                )
            if end - pos < size:
                self._needed = size
                return pos
            body = view[pos + doff * 4 : pos + size]
            pos += size
            if frame_type == frames.FRAME_TYPE_AMQP:
                if self._phase not in ("open-wait", "open"):
                    raise ProtocolViolation(
                        "amqp:connection:framing-error", "AMQP frame before the handshake"
                    )
                if len(body):
                    self._on_performative(channel, body)
            elif frame_type == frames.FRAME_TYPE_SASL and self._phase == "sasl":
                self._on_sasl(body)
            else:
                raise ProtocolViolation(
                    "amqp:connection:framing-error", f"unexpected frame type {frame_type}"
                )
        return pos

    def _bad_header(self, received: Buffer) -> None:
        LOG.info("connection %s: not an AMQP 1.0 header: %r", self.peer, bytes(received[:8]))
        if self.transport is not None:
            self.transport.write(frames.AMQP_HEADER)
        self.close_transport()

    def _on_header(self, header: bytes) -> None:
        self._expect_header = False
        if self._phase == "header" and header == frames.SASL_HEADER:
            self._phase = "sasl"
            self.write(frames.SASL_HEADER)
            mechanisms = Array("symbol", (Symbol("ANONYMOUS"), Symbol("PLAIN"), Symbol("EXTERNAL")))
            self.send(0, SaslMechanisms(sasl_server_mechanisms=mechanisms))
        elif self._phase in ("header", "amqp-header") and header == frames.AMQP_HEADER:
            self._phase = "open-wait"
            self.write(frames.AMQP_HEADER)
        else:
            self._bad_header(header)

    def _on_sasl(self, body: memoryview) -> None:
        init, _ = performatives.parse_body(body)
        if not isinstance(init, SaslInit):
            raise ProtocolViolation("amqp:connection:framing-error", "expected sasl-init")
        # Authorization happens per entity through $cbs, so every mechanism is accepted here.
        self.send(0, SaslOutcome(outcome_code=UByte(0)))
        self._phase = "amqp-header"
        self._expect_header = True

    def _check_handshake(self) -> None:
        if self._phase != "open" and not self.closing:
            timeout = self.context.limits.handshake_timeout
            LOG.info("connection %s: no AMQP open within %ss, dropped", self.peer, timeout)
            self.abort()

    def _check_authenticated(self) -> None:
        self._authentication = None
        if not self.grants.accepted_any and not self.closing:
            timeout = self.context.limits.authentication_timeout
            self.fail("amqp:unauthorized-access", f"No token was put on $cbs within {timeout}s of open.")
            self.flush()

    # --- performatives -----------------------------------------------------------------------------------

    def _on_performative(self, channel: int, body: memoryview) -> None:
        performative, payload_start = performatives.parse_body(body)
        if isinstance(performative, Transfer):
            session = self._sessions.get(channel)
            if session is None:
                return
            session.next_incoming_id += 1
            link = session.links.get(_handle(performative.handle))
            if link is None or link.detached:
                return
            link.on_transfer(performative, body[payload_start:])
        elif isinstance(performative, Flow):
            self._on_flow(channel, performative)
        elif isinstance(performative, Disposition):
            return  # we only send pre-settled deliveries
        elif isinstance(performative, Attach):
            session = self._sessions.get(channel)
            if session is not None:
                on_attach(session, performative)
        elif isinstance(performative, Detach):
            session = self._sessions.get(channel)
            detached = session.pop_link(_handle(performative.handle)) if session is not None else None
            if detached is not None:
                detached.on_peer_detach(bool(performative.closed))
        elif isinstance(performative, Begin):
            self._on_begin(channel, performative)
        elif isinstance(performative, End):
            self._on_end(channel)
        elif isinstance(performative, Open):
            self._on_open(performative)
        elif isinstance(performative, Close):
            self.send(0, Close())
            self.close_transport()
        else:
            raise ProtocolViolation(
                "amqp:not-implemented", f"unexpected performative 0x{performatives.code_of(performative):02x}"
            )

    def _on_open(self, open_: Open) -> None:
        if self._phase == "open":
            raise ProtocolViolation("amqp:illegal-state", "second open on one connection")
        self._phase = "open"
        if self.handshake is not None:
            self.handshake.meet()
        if isinstance(open_.hostname, str) and open_.hostname:
            self.hostname = open_.hostname.lower()
        max_frame = open_.max_frame_size
        if isinstance(max_frame, int) and max_frame >= 512:
            self.remote_max_frame_size = min(int(max_frame), 1 << 24)
        limits = self.context.limits
        idle = limits.advertised_idle_timeout_ms
        self.send(
            0,
            Open(
                container_id=self.context.container_id,
                max_frame_size=UInt(limits.max_frame_size),
                channel_max=UShort(limits.channel_max),
                idle_time_out=UInt(idle) if idle else None,
                properties={Symbol("product"): "hubshift-emulator"},
            ),
        )
        peer_idle = open_.idle_time_out
        if isinstance(peer_idle, int) and peer_idle > 0:
            self._schedule_heartbeat(peer_idle / 2000)
        if self.context.authorizer.enforcing:
            self._authentication = self.loop.call_later(
                limits.authentication_timeout, self._check_authenticated
            )

    def _schedule_heartbeat(self, interval: float) -> None:
        """Empty frames at half the peer's idle timeout, so it never closes an idle connection."""

        def beat() -> None:
            if self.closing:
                return
            if time.monotonic() - self.last_write >= interval / 2:
                self.write(frames.EMPTY_FRAME)
            self._timer = self.loop.call_later(interval, beat)

        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(interval, beat)

    def _on_begin(self, channel: int, begin: Begin) -> None:
        limits = self.context.limits
        if channel > limits.channel_max:
            # the spec: a channel outside the range the partner advertised is a framing error
            raise ProtocolViolation(
                "amqp:connection:framing-error", f"channel {channel} is past channel-max {limits.channel_max}"
            )
        if channel in self._sessions:
            raise ProtocolViolation("amqp:illegal-state", f"begin on channel {channel} which is in use")
        if self._free_channels:
            local = heapq.heappop(self._free_channels)
        else:
            local = self._next_channel
            self._next_channel += 1
        session = Session(self, local, channel)
        if isinstance(begin.next_outgoing_id, int):
            session.next_incoming_id = int(begin.next_outgoing_id)
        self._sessions[channel] = session
        self.send(
            local,
            Begin(
                remote_channel=UShort(channel),
                next_outgoing_id=UInt(0),
                incoming_window=UInt(SESSION_WINDOW),
                outgoing_window=UInt(SESSION_WINDOW),
                handle_max=UInt(limits.handle_max),
            ),
        )

    def _on_end(self, channel: int) -> None:
        ended = self._sessions.pop(channel, None)
        if ended is not None:
            ended.close_links()
            self.send(ended.local_channel, End())
            heapq.heappush(self._free_channels, ended.local_channel)

    def _on_flow(self, channel: int, flow: Flow) -> None:
        session = self._sessions.get(channel)
        if session is None:
            return
        if flow.handle is None:
            if flow.echo:
                session.send(session.flow())
            return
        link = session.links.get(_handle(flow.handle))
        if link is not None and not link.detached:
            link.on_flow(flow)

    # --- tokens ------------------------------------------------------------------------------------------

    def grants_changed(self, expires_at_ms: int) -> None:
        # the check already due first stays (a renewed grant is found unexpired when it comes)
        if self._expiry is None or expires_at_ms < self._expiry_due_ms:
            self._watch_expiry()

    def _watch_expiry(self) -> None:
        """Detach, when its token expires unrenewed, every event link the token allowed, as the service
        does; checked at the earliest expiry of the grants held (far-off ones are not watched)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if not self.context.authorizer.enforcing or self.closing:
            return
        now_ms = self.context.broker.now_ms()
        expiry = self.grants.next_expiry(now_ms, WATCHED_EXPIRY_MS)
        if expiry is not None:
            self._expiry_due_ms = expiry
            self._expiry = self.loop.call_later((expiry - now_ms) / 1000 + 0.01, self._expire_links)

    def _expire_links(self) -> None:
        self._expiry = None
        if self.closing:
            return
        now_ms = self.context.broker.now_ms()
        for session in list(self._sessions.values()):
            for link in list(session.links.values()):
                if (
                    link.entity is None
                    or link.detached
                    or self.grants.allows(link.entity, link.right, now_ms)
                ):
                    continue
                LOG.info("connection %s: the token for %s expired: link detached", self.peer, link.address)
                link.detach(
                    amqp_error(
                        "amqp:unauthorized-access",
                        "The token has expired; put a new one on $cbs before its expiration time.",
                    )
                )
        self.flush()
        self._watch_expiry()


def _handle(value: object) -> int:
    if not isinstance(value, int):
        raise ProtocolViolation("amqp:invalid-field", f"a link handle that is not a number: {value!r}")
    return value


def _enable_keepalive(sock: socket.socket) -> None:
    """Find peers that vanished without a FIN (half-open connections) within about a minute."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:
        pass
