"""The emulator server: listens on a TCP port, serves AMQP connections (and AMQP over WebSockets on the same
port, `websocket.py`) on one asyncio loop, expires events on a timer. `run_emulator` is the command line's
entry; `EmulatorThread` runs it inside another process (tests that want no subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import threading
import time
from collections.abc import Callable, Iterable

from hubshift.emulator.broker import Broker, Clock, HubSpec
from hubshift.emulator.cbs import Authorizer, JwtChecker, SasAuthorizer
from hubshift.emulator.config import EmulatorSettings
from hubshift.emulator.context import ServerContext
from hubshift.emulator.persistence import EventStore
from hubshift.emulator.websocket import HttpServer, listener
from hubshift.errors import UserError

LOG = logging.getLogger(__name__)

RETENTION_CHECK_SECONDS = 1.0
TLS_NAMESPACE_PREFIX = "TLS namespace (token credentials): "


class EmulatorServer:
    def __init__(self, settings: EmulatorSettings, clock: Clock = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.port = 0
        self.tls_port: int | None = None
        self.broker: Broker | None = None
        self.context: ServerContext | None = None
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None
        self._retention: asyncio.Task[None] | None = None
        self._http: HttpServer | None = None

    @property
    def connection_string(self) -> str:
        return self.settings.connection_string(self.port)

    @property
    def tls_namespace(self) -> str | None:
        """`host:port` of the TLS listener, the namespace for token credentials; None without TLS."""
        return None if self.tls_port is None else self.settings.tls_namespace(self.tls_port)

    def announcement(self) -> list[str]:
        """What the command line prints once serving: the connection string, then the TLS namespace."""
        lines = [self.connection_string]
        if self.tls_namespace is not None:
            lines.append(f"{TLS_NAMESPACE_PREFIX}{self.tls_namespace}")
        return lines

    async def start(self) -> None:
        settings = self.settings
        try:
            store = EventStore(settings.data_dir) if settings.data_dir else None
        except Exception as exc:
            raise UserError(f"--data-dir {settings.data_dir}: cannot open the event store: {exc}") from None
        self.broker = Broker(
            settings.hubs,
            clock=self.clock,
            retention_seconds=settings.retention_minutes * 60,
            partition_max_bytes=settings.partition_max_bytes,
            store=store,
            geo_offsets=settings.geo_offsets,
        )
        try:
            authorizer = Authorizer(
                SasAuthorizer(settings.key, self.clock, settings.key_name), self._jwt_checker()
            )
            tls_context = self._tls_context()
        except UserError:
            self.broker.close()
            raise
        context = ServerContext(broker=self.broker, authorizer=authorizer, limits=settings.limits)
        self.context = context
        loop = asyncio.get_running_loop()
        self._http = HttpServer(context, loop)
        serve_both = listener(context, loop, self._http)
        try:
            self._server = await loop.create_server(serve_both, settings.host, settings.port, backlog=1024)
            if tls_context is not None:
                self._tls_server = await loop.create_server(
                    serve_both,
                    settings.host,
                    settings.tls_port,
                    ssl=tls_context,
                    ssl_handshake_timeout=settings.limits.handshake_timeout,
                    backlog=1024,
                )
        except OSError as exc:
            if self._server is not None:
                self._server.close()
            self.broker.close()
            raise UserError(
                f"cannot listen on {settings.host}: {exc.strerror or exc} "
                "(pick another --port or --tls-port, or 0 for a free one)"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        if self._tls_server is not None:
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
        self._retention = asyncio.create_task(self._expire_forever())

    def _jwt_checker(self) -> JwtChecker | None:
        settings = self.settings
        if settings.jwt_keys is None:
            return None
        if not settings.jwt_issuers:
            raise UserError(
                "--jwt-key needs --jwt-issuer: the issuer of the tokens to accept, as their `iss` claim says "
                "(e.g. https://sts.windows.net/<tenant id>/)"
            )
        from hubshift.emulator.tokens import EVENTHUBS_AUDIENCES, JwtVerifier, load_keys  # lazy: cryptography

        return JwtVerifier(
            load_keys(settings.jwt_keys),
            issuers=settings.jwt_issuers,
            audiences=settings.jwt_audiences or EVENTHUBS_AUDIENCES,
            clock=self.clock,
        )

    def _tls_context(self) -> ssl.SSLContext | None:
        settings = self.settings
        if settings.tls_cert is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(settings.tls_cert, settings.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise UserError(
                f"--tls-cert {settings.tls_cert}: cannot load the certificate and its key: {exc}"
            ) from None
        return context

    async def _expire_forever(self) -> None:
        assert self.broker is not None
        while True:
            await asyncio.sleep(RETENTION_CHECK_SECONDS)
            try:
                self.broker.expire()
            except Exception:
                LOG.exception("retention check failed")

    def reconfigure(self, hubs: Callable[[], Iterable[HubSpec]] | Iterable[HubSpec]) -> list[str]:
        """A changed configuration, applied while serving (see `Broker.reconfigure`); one that cannot be
        read is logged and changes nothing."""
        assert self.broker is not None
        try:
            specs = list(hubs() if callable(hubs) else hubs)
        except UserError as exc:
            LOG.error("the configuration was not reloaded: %s", exc)
            return []
        changes = self.broker.reconfigure(specs)
        for change in changes:
            LOG.warning("%s", change)
        return changes

    async def stop(self) -> None:
        if self._retention is not None:
            self._retention.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention
        servers = [server for server in (self._server, self._tls_server) if server is not None]
        for server in servers:
            server.close()
        if self.context is not None:
            for connection in list(self.context.connections):
                connection.abort()
            for accepted in list(self.context.sockets):  # those still in their HTTP request, too
                accepted.abort()
        if self._http is not None:
            await self._http.shutdown()
        for server in servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)
        if self.broker is not None:
            self.broker.close()


async def serve(
    settings: EmulatorSettings,
    on_ready: Callable[[str], None],
    reload: Callable[[], Iterable[HubSpec]] | None = None,
) -> None:
    """Run until SIGINT or SIGTERM; `on_ready` gets each line of the announcement (the connection string,
    then the TLS namespace) once connections are accepted. SIGHUP applies `reload()`'s hubs (the
    configuration read again): new hubs, more partitions."""
    server = EmulatorServer(settings)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if reload is not None:
        loop.add_signal_handler(signal.SIGHUP, lambda: server.reconfigure(reload))
    try:
        for line in server.announcement():
            on_ready(line)
        await stop.wait()
    finally:
        await server.stop()


def run_emulator(
    settings: EmulatorSettings,
    on_ready: Callable[[str], None],
    reload: Callable[[], Iterable[HubSpec]] | None = None,
) -> None:
    asyncio.run(serve(settings, on_ready, reload))


class EmulatorThread:
    """The emulator on its own event loop in a background thread of this process."""

    def __init__(self, settings: EmulatorSettings, clock: Clock = time.time) -> None:
        self.server = EmulatorServer(settings, clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def connection_string(self) -> str:
        return self.server.connection_string

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def tls_namespace(self) -> str | None:
        return self.server.tls_namespace

    def start(self, timeout: float = 30) -> None:
        self._thread = threading.Thread(target=self._run, name="hubshift-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the in-process emulator did not start")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            try:
                await self.server.start()
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stopped.wait()
            finally:
                await self.server.stop()

        asyncio.run(main())

    def stop(self, timeout: float = 10) -> None:
        if self._loop is not None and self._stopped is not None and self._thread is not None:
            if self._thread.is_alive():
                self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout)
