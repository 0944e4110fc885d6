"""The consumer's HTTP server: `/metrics`, the Kubernetes probes, and the operator's nudge.

    GET  /metrics     Prometheus exposition (OpenMetrics when asked for)
    GET  /healthz     200 while the process is alive (and `live()` says so)
    GET  /readyz      200 when `ready()` says so (the ownership agent: registered, reading), else 503
    POST /assignment  202: the assignment changed, re-read it now (body optional: {"generation": N})

aiohttp's low-level server on an event loop of its own, in one daemon thread: a slow or hostile client
costs a socket, never a thread, and never holds up Spark or the ownership agent (the callbacks run on that
loop and must be quick: read a flag, set an event). Bind to `0.0.0.0` in a pod and `127.0.0.1` on a
machine; port 0 picks a free port (`server.port` tells which).

Nothing sent to this port can change what a consumer owns: the nudge only makes it read the assignment
record from the store (the agent does so at most twice a second). What a client can hold is bounded:
- at most `MAX_CONNECTIONS` connections at once; one more is answered 503 and closed before it is read;
- a request's line and headers must be complete within `REQUEST_DEADLINE_SECONDS` of the connection
  opening (or of the previous answer on a kept-alive connection: aiohttp's keep-alive timer, which bytes
  trickling in do not extend), else the connection is closed;
- its body (at most `MAX_BODY_BYTES`, with an exact `Content-Length`, never chunked) must arrive, and the
  answer must be taken by the client, within `REQUEST_DEADLINE_SECONDS` more, else the connection is
  closed (a body never arriving is answered 408 first).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.errors import UserError

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"
ASSIGNMENT_PATH = "/assignment"
MAX_BODY_BYTES = 4096
REQUEST_DEADLINE_SECONDS = 5.0
# Far more than the kubelet, the operator and a few scrapers need; each costs a socket and at most the
# 128 KiB of headers allowed below.
MAX_CONNECTIONS = 512
LISTEN_BACKLOG = 128
# Header limits well below aiohttp's defaults (128 fields of 8 KiB): our clients send a handful.
MAX_HEADERS = 32
MAX_FIELD_BYTES = 4096
START_TIMEOUT_SECONDS = 10.0


class _MalformedAtDebug(logging.Filter):
    """aiohttp logs a malformed request at ERROR, with a traceback and the start of the offending line: a
    client's mistake (or a probe of the port), so one line at DEBUG instead; our own failures stay ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        record.msg, record.args = "refused a malformed request: %s", (type(error).__name__,)
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info = record.exc_text = None
        return requests_log.isEnabledFor(logging.DEBUG)


requests_log = log.getChild("requests")
requests_log.addFilter(_MalformedAtDebug())

Probe = Callable[[], bool]
AssignmentNudge = Callable[[int | None], None]


class ConsumerHTTPServer:
    def __init__(
        self,
        metrics: ConsumerMetrics,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ready: Probe = lambda: False,
        live: Probe = lambda: True,
        on_assignment: AssignmentNudge | None = None,
        max_connections: int = MAX_CONNECTIONS,
        deadline: float = REQUEST_DEADLINE_SECONDS,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.requested_port = port
        self.ready = ready
        self.live = live
        self.on_assignment = on_assignment
        self.max_connections = max_connections
        self.deadline = deadline
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.BaseRunner | None = None
        self._port: int | None = None
        self._routes: dict[
            str, tuple[tuple[str, ...], Callable[[web.BaseRequest], Awaitable[web.Response]]]
        ] = {
            METRICS_PATH: (("GET", "HEAD"), self._metrics),
            LIVENESS_PATH: (("GET", "HEAD"), self._liveness),
            READINESS_PATH: (("GET", "HEAD"), self._readiness),
            ASSIGNMENT_PATH: (("POST",), self._nudge),
        }

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the server is not started")
        return self._port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ConsumerHTTPServer:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="hubshift-http", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            asyncio.run_coroutine_threadsafe(self._open(), loop).result(START_TIMEOUT_SECONDS)
        except OSError as exc:
            self.stop()
            raise UserError(
                f"metrics port {self.requested_port} on {self.host or '0.0.0.0'}: {exc.strerror} "
                "(set consumer.metricsPort to a free port)"
            ) from None
        except BaseException:
            self.stop()
            raise
        return self

    async def _open(self) -> None:
        server = _CappedServer(
            self._serve,
            max_connections=self.max_connections,
            keepalive_timeout=self.deadline,
            lingering_time=0,  # a body left unread is not drained: the connection is closed
            max_headers=MAX_HEADERS,
            max_field_size=MAX_FIELD_BYTES,
            logger=requests_log,
        )
        runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, self.host, self.requested_port, backlog=LISTEN_BACKLOG)
        await site.start()
        self._port = site.port

    def stop(self) -> None:
        loop, thread, runner = self._loop, self._thread, self._runner
        if loop is not None and runner is not None:
            try:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(START_TIMEOUT_SECONDS)
            except Exception:
                log.exception("the HTTP server did not stop cleanly")
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)
        if loop is not None and not loop.is_running():
            loop.close()
        self._loop = self._thread = self._runner = None
        self._port = None

    def __enter__(self) -> ConsumerHTTPServer:
        return self.start() if self._port is None else self

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request within the deadline: its body read, our answer written and taken."""
        deadline = asyncio.get_running_loop().time() + self.deadline
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._answer(request)
        except TimeoutError:  # the body never arrived in full
            return _text(HTTPStatus.REQUEST_TIMEOUT, "the request's body took too long\n", close=True)
        try:
            async with asyncio.timeout_at(deadline):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:  # a client that does not read what it asked for
            if request.transport is not None:
                request.transport.abort()
        except ConnectionResetError:  # a client that gave up waiting (a probe's timeout): nothing to tell
            log.debug("%s %s: the client left before the answer", request.method, request.path)
        return response

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        route = self._routes.get(request.path)
        if route is None:
            return _text(HTTPStatus.NOT_FOUND, "not found\n", close=request.method == "POST")
        methods, handler = route
        if request.method not in methods:
            response = _text(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed\n", close=True)
            response.headers["Allow"] = ", ".join(methods)
            return response
        return await handler(request)

    async def _metrics(self, request: web.BaseRequest) -> web.Response:
        body, content_type = self.metrics.render(request.headers.get("Accept"))
        return web.Response(status=HTTPStatus.OK, body=body, headers={"Content-Type": content_type})

    async def _liveness(self, request: web.BaseRequest) -> web.Response:
        return _probe(self.live, "alive", "not alive")

    async def _readiness(self, request: web.BaseRequest) -> web.Response:
        return _probe(self.ready, "ready", "not ready")

    async def _nudge(self, request: web.BaseRequest) -> web.Response:
        if self.on_assignment is None:
            return _text(HTTPStatus.NOT_IMPLEMENTED, "this consumer takes no nudges\n", close=True)
        try:
            length = body_length(request.headers.get("Transfer-Encoding"), request.content_length)
            generation = parse_generation(await request.read()) if length else None
        except BadBody as exc:
            return _text(exc.status, f"{exc}\n", close=True)  # what the client may still send is not read
        try:
            self.on_assignment(generation)
        except Exception:
            log.exception("the assignment nudge failed")
            return _text(HTTPStatus.INTERNAL_SERVER_ERROR, "nudge failed\n")
        self.metrics.nudges.inc()
        return web.Response(
            status=HTTPStatus.ACCEPTED, body=b'{"accepted":true}\n', content_type="application/json"
        )


class _CappedServer(web.Server):
    """aiohttp's low-level server, holding at most `max_connections` connections: one more is answered 503
    and closed before anything is read from it (aiohttp itself sets no limit)."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        *,
        max_connections: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.max_connections = max_connections

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        # Writes pause the handler until the kernel took them, so a client that does not read is caught by
        # the request deadline instead of growing a buffer here.
        transport.set_write_buffer_limits(high=0)
        if len(self.connections) >= self.max_connections:
            transport.write(_TOO_MANY)
            transport.close()
            return
        super().connection_made(handler, transport)


_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n"
    b"Connection: close\r\n\r\ntoo many connections\n"
)


class BadBody(ValueError):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def body_length(transfer_encoding: str | None, content_length: int | None) -> int:
    """The length of a nudge's body, refused unless it is exact and at most `MAX_BODY_BYTES` (aiohttp has
    answered a negative or malformed `Content-Length` with 400 already)."""
    if transfer_encoding:
        raise BadBody(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length, not chunked")
    if not content_length:
        return 0
    if content_length > MAX_BODY_BYTES:
        raise BadBody(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body larger than {MAX_BODY_BYTES} bytes")
    return content_length


def parse_generation(raw: bytes) -> int | None:
    """The generation a nudge names: None for an empty body or one without it."""
    if not raw.strip():
        return None
    try:
        document: Any = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadBody(HTTPStatus.BAD_REQUEST, 'body must be JSON: {"generation": N}') from None
    generation = document.get("generation") if isinstance(document, dict) else None
    if generation is None:
        return None
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise BadBody(HTTPStatus.BAD_REQUEST, "generation must be an integer")
    return generation


def _probe(probe: Probe, good: str, bad: str) -> web.Response:
    try:
        ok = bool(probe())
    except Exception:
        log.exception("a probe failed")
        ok = False
    return _text(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, f"{good if ok else bad}\n")


def _text(status: HTTPStatus, text: str, *, close: bool = False) -> web.Response:
    response = web.Response(status=status, text=text, content_type="text/plain")
    if close:
        response.force_close()
    return response
