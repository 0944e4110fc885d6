"""AMQP over WebSockets, as Event Hubs serves it on port 443: path `/$servicebus/websocket`, subprotocol
`AMQPWSB10`, each binary message carrying AMQP bytes (the SDK's `TransportType.AmqpOverWebsocket`).

One listener serves both transports, as one namespace does: a connection's first bytes decide
(`FirstBytes`). An HTTP request (`GET `) goes to aiohttp's server, which upgrades it to a WebSocket whose
messages feed an `AmqpConnection` through `WebSocketTransport`; anything else is AMQP itself, unchanged
(bytes that are not AMQP are answered as before). aiohttp is imported only when a WebSocket client comes.

Both paths have the same pre-open bounds, held by `FirstBytes` for the socket rather than by either
protocol: the connection cap, the handshake deadline from the accept (the HTTP request and the upgrade
included) and the bytes a peer may send before its AMQP open; inside the WebSocket, frames before open are
as small as on plain AMQP (the connection checks them) and no message is compressed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hubshift.emulator.connection import AmqpConnection, Handshake
from hubshift.emulator.context import ServerContext

if TYPE_CHECKING:
    from aiohttp import web

LOG = logging.getLogger(__name__)

WEBSOCKET_PATH = "/$servicebus/websocket"
SUBPROTOCOL = "AMQPWSB10"
# A message carries at most one AMQP frame as the SDK writes them (the frame size it negotiates, 1 MiB);
# more is refused (aiohttp closes the WebSocket) so one peer cannot make the server buffer without bound.
# Before the AMQP open the socket's handshake budget (64 KiB) bounds it first.
MAX_MESSAGE_BYTES = 4 << 20
# A message is handed to the AMQP connection in slices of at most what one read of a socket hands plain
# AMQP (asyncio's 256 KiB), the loop turning between them: a 4 MiB message of empty frames holds the loop
# no longer than a read of plain AMQP does.
READ_BYTES = 256 << 10
# The request line and each header field, and how many fields (aiohttp's defaults: 8 KiB, 128); the SDK
# sends 7 fields (9 from its asyncio client), none over 100 bytes.
MAX_LINE_BYTES = 4096
MAX_HEADERS = 32
_HTTP = b"GET "
CLOSE_SECONDS = 2.0


class FirstBytes(asyncio.Protocol):
    """Every accepted socket, for its whole life: counted against the connection cap (one more is closed
    before it is read), held to its handshake (`Handshake`: the deadline from the accept to the AMQP open,
    and the bytes it may send until then) whatever it speaks, and handed by its first bytes to AMQP or to
    aiohttp's HTTP server (an upgrade to a WebSocket), the protocol that then gets what this one does."""

    def __init__(self, context: ServerContext, loop: asyncio.AbstractEventLoop, http: HttpServer) -> None:
        self.context = context
        self.loop = loop
        self.http = http
        self.transport: asyncio.Transport | None = None
        self.handshake: Handshake | None = None
        self.peer = "?"
        self._buffer = b""
        self._inner: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = str(transport.get_extra_info("peername"))
        context = self.context
        cap = context.limits.max_connections
        if len(context.sockets) >= cap:
            if not context.refusing:
                LOG.warning("%d connections open: new ones are closed until one of them closes", cap)
                context.refusing = True
            transport.close()
            return
        context.sockets.add(self)
        self.handshake = Handshake(self.loop, context.limits, self._expired)

    def data_received(self, data: bytes) -> None:
        handshake = self.handshake
        if handshake is None or self.transport is None:
            return  # refused at the cap
        if not handshake.received(len(data)):
            LOG.info(
                "connection %s: more than %d bytes before its AMQP open, dropped", self.peer, handshake.budget
            )
            self.transport.abort()
            return
        if self._inner is not None:
            self._inner.data_received(data)
            return
        self._buffer += data
        if _HTTP.startswith(self._buffer):
            return  # too few bytes to tell yet
        if self._buffer.startswith(_HTTP):
            self._hand_over(self.http.protocol())
        else:
            self._hand_over(AmqpConnection(self.context, self.loop, handshake))

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handshake is None:
            return  # refused at the cap: never counted
        self.handshake.cancel()
        context = self.context
        context.sockets.discard(self)
        if context.refusing and len(context.sockets) < context.limits.max_connections:
            context.refusing = False
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _expired(self) -> None:
        assert self.handshake is not None
        LOG.info("connection %s: no AMQP open within %ss, dropped", self.peer, self.handshake.timeout)
        self.abort()

    def _hand_over(self, protocol: asyncio.Protocol) -> None:
        assert self.transport is not None
        self._inner = protocol
        buffered, self._buffer = self._buffer, b""
        protocol.connection_made(self.transport)
        protocol.data_received(buffered)


class _MalformedAtDebug(logging.Filter):
    """aiohttp logs a malformed request (past the header limits, say) at ERROR with a traceback: a peer's
    mistake, so one line at DEBUG instead, without the bytes it sent; our own failures stay ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError  # lazy: aiohttp is what logs here

        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        record.msg, record.args = "refused a malformed HTTP request: %s", (type(error).__name__,)
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info = record.exc_text = None
        return HTTP_LOG.isEnabledFor(logging.DEBUG)


HTTP_LOG = LOG.getChild("http")
HTTP_LOG.addFilter(_MalformedAtDebug())


class HttpServer:
    """aiohttp's low-level server for the WebSocket upgrades of one emulator, made on first use. A request
    is read within the header limits below and answered once: the upgrade, or a refusal and the socket
    closed (no keep-alive); the socket's handshake (`FirstBytes`) bounds its time and bytes until the AMQP
    open inside the WebSocket."""

    def __init__(self, context: ServerContext, loop: asyncio.AbstractEventLoop) -> None:
        self.context = context
        self.loop = loop
        self._server: web.Server | None = None

    def protocol(self) -> asyncio.Protocol:
        if self._server is None:
            from aiohttp import web  # lazy: aiohttp only once a WebSocket client comes

            self._server = web.Server(
                self._handle,
                loop=self.loop,
                access_log=None,
                logger=HTTP_LOG,
                # aiohttp's timer for a request's line and headers (3,630 s by default) no longer than
                # the handshake deadline, which, counted from the accept, closes such a socket first
                keepalive_timeout=self.context.limits.handshake_timeout,
                lingering_time=0,  # a body left unread is not drained: the socket is closed
                max_line_size=MAX_LINE_BYTES,
                max_field_size=MAX_LINE_BYTES,
                max_headers=MAX_HEADERS,
            )
        protocol: asyncio.Protocol = self._server()
        return protocol

    async def shutdown(self) -> None:
        if self._server is not None:
            await self._server.shutdown(1.0)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        from aiohttp import web  # lazy: see `protocol`

        if request.path != WEBSOCKET_PATH:
            return _refusal(
                web.Response(status=404, text=f"AMQP over WebSockets is served at {WEBSOCKET_PATH}\n")
            )
        # compress=False: permessage-deflate is never agreed, and a compressed frame fails the WebSocket
        # (inflating a few kB into megabytes of frames would cost the loop seconds)
        socket = web.WebSocketResponse(
            protocols=(SUBPROTOCOL,), max_msg_size=MAX_MESSAGE_BYTES, compress=False
        )
        if socket.can_prepare(request).protocol != SUBPROTOCOL:
            refusal = f"a WebSocket for AMQP needs the subprotocol {SUBPROTOCOL}\n"
            return _refusal(web.Response(status=400, text=refusal))
        await socket.prepare(request)
        connection = AmqpConnection(self.context, self.loop, _handshake_of(request))
        transport = WebSocketTransport(socket, connection, request.transport, request.remote)
        connection.connection_made(transport)
        try:
            await transport.pump_in()
        finally:
            await transport.finish()
            connection.connection_lost(None)
        return socket


def _refusal(response: web.Response) -> web.Response:
    response.force_close()
    return response


def _handshake_of(request: web.BaseRequest) -> Handshake | None:
    """The handshake of the socket under `request` (its deadline and byte budget run on through the
    WebSocket until the AMQP open)."""
    owner = request.transport.get_protocol() if request.transport is not None else None
    return owner.handshake if isinstance(owner, FirstBytes) else None


class WebSocketTransport(asyncio.Transport):
    """The transport an `AmqpConnection` writes to over one WebSocket: each write goes out as one binary
    message, in order, with the write-buffer limits and reading pauses of a socket's transport."""

    def __init__(
        self,
        socket: web.WebSocketResponse,
        protocol: AmqpConnection,
        raw: asyncio.Transport | None,
        peer: str | None,
    ) -> None:
        super().__init__()
        self._socket = socket
        self._protocol = protocol
        self._raw = raw  # the TCP connection under the WebSocket, for abort()
        self._peer = peer
        self._out: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._high, self._low = 64 << 10, 16 << 10
        self._writing_paused = False
        self._reading = asyncio.Event()
        self._reading.set()
        self._queued = asyncio.Event()
        self._closing = False
        self._writer: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._pump_out())

    # --- what AmqpConnection calls -----------------------------------------------------------------------

    def write(self, data: Any) -> None:
        if self._closing:
            return
        chunk = bytes(data)
        self._out.append(chunk)
        self._buffered += len(chunk)
        self._queued.set()
        if not self._writing_paused and self._buffered > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()

    def close(self) -> None:
        """Send what is queued, then close the WebSocket."""
        self._closing = True
        self._queued.set()

    def abort(self) -> None:
        self._closing = True
        self._out.clear()
        self._writer.cancel()
        if self._raw is not None:
            self._raw.abort()

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = high if high is not None else self._high
        self._low = low if low is not None else self._high // 4

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    # --- the two directions ------------------------------------------------------------------------------

    async def pump_in(self) -> None:
        """Hand each binary message to the connection until the WebSocket closes (a text message is not
        AMQP: the connection fails as on any bytes it cannot read)."""
        from aiohttp import WSMsgType  # lazy: see HttpServer.protocol

        while not self._socket.closed:
            await self._reading.wait()
            message = await self._socket.receive()
            if message.type is WSMsgType.BINARY:
                await self._hand_in(message.data)
            elif message.type is WSMsgType.TEXT:
                self._protocol.fail("amqp:connection:framing-error", "AMQP over WebSockets is binary")
            else:
                return  # closed, closing or failed

    async def _hand_in(self, data: bytes) -> None:
        """One message to the connection, `READ_BYTES` at a time, the loop turning (and reading paused, if
        the connection asks) between them."""
        if len(data) <= READ_BYTES:
            self._protocol.data_received(data)
            return
        for start in range(0, len(data), READ_BYTES):
            if start:
                await asyncio.sleep(0)
                await self._reading.wait()
            if self._protocol.closing:
                return
            self._protocol.data_received(data[start : start + READ_BYTES])

    async def _pump_out(self) -> None:
        socket = self._socket
        try:
            while True:
                await self._queued.wait()
                self._queued.clear()
                while self._out:
                    chunk = self._out.popleft()
                    await socket.send_bytes(chunk)
                    self._buffered -= len(chunk)
                    if self._writing_paused and self._buffered <= self._low:
                        self._writing_paused = False
                        self._protocol.resume_writing()
                if self._closing:
                    await socket.close()
                    return
        except (ConnectionError, RuntimeError) as exc:  # the peer went away mid-write
            LOG.debug("WebSocket %s: %s", self._peer, exc)
            self._closing = True

    async def finish(self) -> None:
        """The peer is done: a close already under way completes (briefly), anything else is dropped."""
        if self._closing and not self._writer.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), CLOSE_SECONDS)
            except (TimeoutError, ConnectionError, RuntimeError):
                pass
        self._closing = True
        self._out.clear()
        if not self._writer.done():
            self._writer.cancel()


ProtocolFactory = Callable[[], asyncio.Protocol]


def listener(context: ServerContext, loop: asyncio.AbstractEventLoop, http: HttpServer) -> ProtocolFactory:
    """The protocol factory of a listener serving AMQP and AMQP over WebSockets on one port."""
    return lambda: FirstBytes(context, loop, http)
