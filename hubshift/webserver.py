"""A small HTTP server in the background: aiohttp's low-level server on an event loop of its own, in one
daemon thread. Whoever starts it, a synchronous command or another event loop (the operator's kopf loop),
never waits on a request: a slow client costs a socket, not a thread, and answers are made on the server's
own loop (a handler that blocks hands its work to a thread, `asyncio.to_thread`). The operator's `/metrics`
and the residents' page (`hubshift views --serve`) are served with it; a consumer's own server, which also
bounds what a hostile client may hold, is `hubshift.consumer.http`.

Bind to `0.0.0.0` in a pod and `127.0.0.1` on a machine; port 0 picks a free port (`server.port`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# How long starting (binding the port) and stopping (closing the connections) may take.
START_STOP_SECONDS = 10.0
# An idle kept-alive connection is closed after this long.
KEEPALIVE_SECONDS = 5.0


class BackgroundServer:
    """`handler` answers every request on `host`:`port`, once `start` returned, until `close`."""

    def __init__(self, handler: Handler, *, host: str, port: int = 0, name: str = "hubshift-http") -> None:
        self.handler = handler
        self.host = host
        self.requested_port = port
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.ServerRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{self.name} is not serving")
        return self._port

    @property
    def url(self) -> str:
        """The server's root as a client on this machine reaches it."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> BackgroundServer:
        """Bind and serve; an `OSError` with the system's reason (the port taken, the address not ours)
        when it cannot bind."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
        self._thread.start()
        try:
            _run_on(loop, self._bind())
        except OSError as error:  # aiohttp's message repeats the address; the reason is the system's
            self.close()
            if error.errno is None:
                raise
            raise OSError(error.errno, os.strerror(error.errno)) from None
        except BaseException:
            self.close()
            raise
        return self

    async def _bind(self) -> None:
        server = web.Server(self.handler, access_log=None, keepalive_timeout=KEEPALIVE_SECONDS)
        runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, self.host, self.requested_port)
        await site.start()
        self._port = site.port

    def close(self) -> None:
        """Stop serving and end the thread; nothing happens when it is not serving."""
        loop, runner, thread = self._loop, self._runner, self._thread
        self._loop = self._runner = self._thread = None
        self._port = None
        if loop is None:
            return
        try:
            if runner is not None:
                _run_on(loop, runner.cleanup())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(START_STOP_SECONDS)
            if not loop.is_running():
                loop.close()


def _run_on(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]) -> None:
    """`work` on the server's loop, from another thread, waited for (at most `START_STOP_SECONDS`)."""
    asyncio.run_coroutine_threadsafe(work, loop).result(START_STOP_SECONDS)
