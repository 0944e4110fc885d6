"""A small HTTP proxy for the tests, on a free 127.0.0.1 port in a thread of the test process: HTTP CONNECT
(as corporate proxies serve HTTPS, `wss://`) and absolute-URI requests (`GET ws://host:port/path`, how
aiohttp sends a plain `ws://` upgrade through a proxy), optional Basic credentials (407 without them), and a
record of each tunnel (where it went, the first bytes the client sent inside it), so a test sees what
crossed the proxy. `hosts` resolves names only the proxy knows (a namespace the test process cannot reach
but through it). With `forward_to` it is a plain relay to one address instead, recording the same (what a
client sends directly)."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Tunnel:
    target: str  # host:port the client asked for
    first_bytes: bytes = b""  # what the client sent first through the tunnel
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass
class ConnectProxy:
    credentials: tuple[str, str] | None = None
    forward_to: tuple[str, int] | None = None
    hosts: dict[str, str] = field(default_factory=dict)
    port: int = 0
    tunnels: list[Tunnel] = field(default_factory=list)
    refused: int = 0  # CONNECTs refused for want of the right credentials
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_with_credentials(self) -> str:
        assert self.credentials is not None
        user, password = self.credentials
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def start(self) -> ConnectProxy:
        ready = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            async with server:
                await self._stopped.wait()

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), name="connect-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the test proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.forward_to is not None:
                host, port = self.forward_to
                await self._relay(reader, writer, host, port, Tunnel(f"{host}:{port}"))
                return
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            method, _, rest = lines[0].partition(" ")
            target, _, version = rest.partition(" ")
            absolute = urlsplit(target) if target.startswith(("http://", "ws://")) else None
            if not (method == "CONNECT" and ":" in target) and absolute is None:
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            if self.credentials is not None and not self._authorized(lines[1:]):
                self.refused += 1
                writer.write(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                    b'Proxy-Authenticate: Basic realm="tests"\r\nContent-Length: 0\r\n\r\n'
                )
                return
            if absolute is not None:
                # forwarded as the origin-form request, without the proxy's own header
                kept = [line for line in lines[1:] if not line.lower().startswith("proxy-authorization:")]
                origin = f"{method} {absolute.path or '/'}{'?' + absolute.query if absolute.query else ''}"
                request = "\r\n".join([f"{origin} {version}", *kept]).encode("latin-1")
                tunnel = Tunnel(absolute.netloc, first_bytes=request[:512])
                await self._relay(
                    reader, writer, absolute.hostname or "", absolute.port or 80, tunnel, request
                )
                return
            host, _, port = target.rpartition(":")
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await self._relay(reader, writer, host.strip("[]"), int(port), Tunnel(target))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()

    def _authorized(self, headers: list[str]) -> bool:
        assert self.credentials is not None
        expected = base64.b64encode(":".join(self.credentials).encode()).decode()
        for line in headers:
            name, _, value = line.partition(":")
            if name.strip().lower() == "proxy-authorization":
                scheme, _, token = value.strip().partition(" ")
                return scheme.lower() == "basic" and token.strip() == expected
        return False

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        host: str,
        port: int,
        tunnel: Tunnel,
        first: bytes = b"",
    ) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(self.hosts.get(host, host), port)
        self.tunnels.append(tunnel)
        upstream_writer.write(first)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            try:
                while data := await src.read(65536):
                    if up:
                        if len(tunnel.first_bytes) < 512:
                            tunnel.first_bytes += data[: 512 - len(tunnel.first_bytes)]
                        tunnel.bytes_up += len(data)
                    else:
                        tunnel.bytes_down += len(data)
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, upstream_writer, True), pipe(upstream_reader, writer, False))


@contextmanager
def running_proxy(
    credentials: tuple[str, str] | None = None,
    forward_to: tuple[str, int] | None = None,
    hosts: dict[str, str] | None = None,
) -> Iterator[ConnectProxy]:
    proxy = ConnectProxy(credentials=credentials, forward_to=forward_to, hosts=dict(hosts or {})).start()
    try:
        yield proxy
    finally:
        proxy.stop()
