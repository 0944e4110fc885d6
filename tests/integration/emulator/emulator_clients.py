"""Small, bounded helpers over the real azure-eventhub SDK for the emulator's integration tests."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub._pyamqp import _decode as pyamqp_decode
from azure.eventhub.aio import EventHubConsumerClient as AsyncConsumerClient

from hubshift.emulator import performatives
from hubshift.emulator.broker import HubSpec
from hubshift.emulator.codec import Symbol, UInt
from hubshift.emulator.config import EmulatorSettings
from hubshift.emulator.server import EmulatorThread

HUB = "hub"


@dataclass
class Received:
    partition_id: str
    sequence_number: int
    offset: str
    enqueued_time: Any
    partition_key: bytes | None
    body: bytes
    properties: dict[Any, Any]
    delivery_annotations: dict[Any, Any] = field(default_factory=dict)


@dataclass
class Collector:
    """Events received by an EventHubConsumerClient, with the callbacks' other findings."""

    events: list[Received] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    closed: list[tuple[str, Any]] = field(default_factory=list)
    last_enqueued: list[dict[str, Any] | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_event(self, context: Any, event: EventData | None) -> None:
        if event is None:
            return
        with self.lock:
            self.events.append(
                Received(
                    context.partition_id,
                    event.sequence_number,
                    event.offset,
                    event.enqueued_time,
                    event.partition_key,
                    b"".join(event.body),
                    dict(event.properties or {}),
                    dict(event.raw_amqp_message.delivery_annotations or {}),
                )
            )
            self.last_enqueued.append(context.last_enqueued_event_properties)

    def on_error(self, context: Any, error: BaseException) -> None:
        with self.lock:
            self.errors.append(error)

    def on_partition_close(self, context: Any, reason: Any) -> None:
        with self.lock:
            self.closed.append((context.partition_id, reason))

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [event.body for event in self.events]


def wait_until(condition: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


class BackgroundConsumer:
    """`EventHubConsumerClient.receive` on a thread, closed on exit."""

    def __init__(
        self, connection_string: str, hub: str = HUB, consumer_group: str = "$Default", **receive: Any
    ):
        self.client = EventHubConsumerClient.from_connection_string(
            connection_string, consumer_group=consumer_group, eventhub_name=hub, retry_total=1
        )
        self.collector = Collector()
        options: dict[str, Any] = {
            "on_event": self.collector.on_event,
            "on_error": self.collector.on_error,
            "on_partition_close": self.collector.on_partition_close,
            "max_wait_time": None,
        }
        options.update(receive)
        self._thread = threading.Thread(target=self.client.receive, kwargs=options, daemon=True)

    def __enter__(self) -> Collector:
        self._thread.start()
        return self.collector

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self._thread.join(timeout=15)


def receive(
    connection_string: str,
    count: int,
    *,
    hub: str = HUB,
    timeout: float = 20,
    **receive_options: Any,
) -> Collector:
    """Receive until `count` events arrived (or the timeout passed)."""
    receive_options.setdefault("starting_position", "-1")
    with BackgroundConsumer(connection_string, hub, **receive_options) as collector:
        wait_until(lambda: len(collector.events) >= count, timeout)
    return collector


def receive_async(
    connection_string: str, count: int, *, hub: str = HUB, timeout: float = 20, **options: Any
) -> Collector:
    """The same with the asyncio client."""
    collector = Collector()

    async def on_event(context: Any, event: EventData | None) -> None:
        collector.on_event(context, event)

    async def main() -> None:
        client = AsyncConsumerClient.from_connection_string(
            connection_string, consumer_group="$Default", eventhub_name=hub, retry_total=1
        )
        options.setdefault("starting_position", "-1")
        task = asyncio.create_task(client.receive(on_event=on_event, **options))
        deadline = time.monotonic() + timeout
        while len(collector.events) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await client.close()
        # the async EventProcessor sleeps out its load-balancing interval after close
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return collector


def producer(connection_string: str, hub: str = HUB, **options: Any) -> EventHubProducerClient:
    options.setdefault("retry_total", 1)
    return EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub, **options)


# --- a hand-written AMQP peer --------------------------------------------------------------------------


@dataclass
class Frame:
    """A frame the server sent, as the SDK's own decoder (pyamqp) reads it."""

    channel: int
    code: int  # the performative's descriptor code (0x10 open ... 0x18 close); -1: an empty frame
    fields: list[Any]

    @property
    def error_condition(self) -> str | None:
        """The condition of a close, end or detach error (None without one)."""
        error = self.fields[-1] if self.code in (0x16, 0x17, 0x18) and self.fields else None
        return error[0].decode() if error else None


class RawPeer:
    """An AMQP peer written frame by frame (what a hostile client can send), over a plain socket."""

    def __init__(self, port: int, timeout: float = 10) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._received = b""
        self._headers = 0

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, channel: int, performative: Any, payload: bytes = b"") -> None:
        self.sock.sendall(performatives.frame_of(channel, performative, payload))

    def frame_bytes(self, channel: int, performative: Any, payload: bytes = b"") -> bytes:
        return performatives.frame_of(channel, performative, payload)

    def open(self, hostname: str = "127.0.0.1") -> tuple[Frame, Frame]:
        """SASL ANONYMOUS, the AMQP header, open and a session on channel 0; the server's open and begin."""
        self.sock.sendall(b"AMQP\x03\x01\x00\x00")
        self.send(0, performatives.SaslInit(Symbol("ANONYMOUS"), b"", hostname))
        self.sock.sendall(b"AMQP\x00\x01\x00\x00")
        self.send(0, performatives.Open("raw-peer", hostname, UInt(65536)))
        self.send(0, performatives.Begin(None, UInt(0), UInt(5000), UInt(5000)))
        return self.expect(0x10), self.expect(0x11)

    def attach(self, handle: int, address: str, *, sender: bool = True, channel: int = 0) -> None:
        """Attach a link to `address`: we send to it (`sender`) or receive from it."""
        terminus = (performatives.TargetTerminus if sender else performatives.SourceTerminus)(
            address
        ).encode()
        self.send(
            channel,
            performatives.Attach(
                f"link-{handle}",
                UInt(handle),
                not sender,
                source=None if sender else terminus,
                target=terminus if sender else None,
                initial_delivery_count=UInt(0) if sender else None,
            ),
        )

    def frames(self, timeout: float) -> Iterator[Frame]:
        """The frames the server sends, until it closes the connection or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self._next_frame()
            if frame is not None:
                yield frame
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                return
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise EOFError("the server closed the connection")
            self._received += chunk

    def expect(self, code: int, timeout: float = 10) -> Frame:
        for frame in self.frames(timeout):
            if frame.code == code:
                return frame
        raise AssertionError(f"no frame 0x{code:02x} within {timeout}s")

    def closed_with(self, timeout: float) -> str | None:
        """The error condition of the server's close (None: closed without one), waiting for the server to
        close the connection; fails if it did not within `timeout`."""
        condition = None
        try:
            for frame in self.frames(timeout):
                if frame.code == 0x18:
                    condition = frame.error_condition
        except EOFError:
            return condition
        raise AssertionError(f"the server kept the connection open for {timeout}s")

    def _next_frame(self) -> Frame | None:
        data = self._received
        while data.startswith(b"AMQP") and len(data) >= 8:
            data = data[8:]
        if len(data) < 8:
            self._received = data
            return None
        size, doff = int.from_bytes(data[:4], "big"), data[4]
        if len(data) < size:
            self._received = data
            return None
        channel = int.from_bytes(data[6:8], "big")
        body, self._received = data[doff * 4 : size], data[size:]
        if not body:
            return Frame(channel, -1, [])
        code, fields = pyamqp_decode.decode_frame(memoryview(body))
        return Frame(channel, code, fields)


# --- a hand-written WebSocket peer ------------------------------------------------------------------------

WEBSOCKET_PATH = "/$servicebus/websocket"


def upgrade_request(port: int, *extra_headers: str) -> bytes:
    """The HTTP request of an AMQP WebSocket upgrade as the SDK sends it, with `extra_headers` added."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {WEBSOCKET_PATH} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Protocol: AMQPWSB10",
        *extra_headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def ws_frame(
    payload: bytes, *, opcode: int = 2, fin: bool = True, rsv1: bool = False, length: int | None = None
) -> bytes:
    """One masked client frame (RFC 6455) carrying `payload`, binary by default; `rsv1` marks it
    compressed (permessage-deflate); `length` declares another length than the payload's."""
    size = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode])
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    mask = os.urandom(4)
    keystream = (mask * (len(payload) // 4 + 1))[: len(payload)]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(keystream, "big")).to_bytes(len(payload), "big")
    return head + mask + masked


def deflated(payload: bytes, compressor: Any = None) -> bytes:
    """`payload` as a permessage-deflate message body (RFC 7692: raw deflate, the flush's tail dropped)."""
    compressor = compressor or zlib.compressobj(9, zlib.DEFLATED, -15)
    data = bytes(compressor.compress(payload) + compressor.flush(zlib.Z_SYNC_FLUSH))
    return data[:-4]


class RawWebSocket:
    """A WebSocket client written byte by byte (what a hostile client can send), over a plain socket."""

    def __init__(self, port: int, *extra_headers: str, timeout: float = 10) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.sendall(upgrade_request(port, *extra_headers))
        self.answer = b""
        while b"\r\n\r\n" not in self.answer:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.answer += chunk

    def __enter__(self) -> RawWebSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    @property
    def status(self) -> int:
        """The status of the server's answer (0 without one)."""
        parts = self.answer.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else 0

    @property
    def upgraded(self) -> bool:
        return self.status == 101

    def header(self, name: str) -> str | None:
        """A header of the server's answer (None without it)."""
        for line in self.answer.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
            key, _, value = line.decode("latin-1").partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None

    def send_quietly(self, data: bytes) -> bool:
        """Send `data`; False if the server closed the socket first."""
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        return True


def closed_within(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes `sock` within `timeout` (what it sends meanwhile is read and dropped)."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False


@contextlib.contextmanager
def in_process_emulator(**settings: Any) -> Iterator[EmulatorThread]:
    """An emulator in this process (hub `hub`, 2 partitions, a free port) with `settings` (its limits, a
    key...), stopped on the way out."""
    server = EmulatorThread(EmulatorSettings(port=0, hubs=(HubSpec("hub", 2),), **settings))
    server.start()
    try:
        yield server
    finally:
        server.stop()
