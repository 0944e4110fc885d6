"""The WebSocket path's bounds, as hostile clients written byte by byte meet them over real sockets: no
compression. The unmodified SDK sends and receives over WebSockets in test_emulator_websockets.py."""

from __future__ import annotations

import socket
import threading
import time
import zlib

import psutil
import pytest
from emulator_clients import RawWebSocket, closed_within, deflated, ws_frame

from hubshift.emulator.launch import RunningEmulator

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"
# 4 MiB of empty AMQP frames but one frame (a WebSocket message is at most 4 MiB)
EMPTY_FRAMES = EMPTY_FRAME * (MIB // 2 - 1)


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def settled_cpu(process: psutil.Process, limit: float = 20) -> float:
    """The process's CPU seconds once it stops spending them (what it was given has been done)."""
    last = cpu_seconds(process)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = cpu_seconds(process)
        if now - last < 0.02:
            return now
        last = now
    return cpu_seconds(process)


class HeaderProbe:
    """Another client, meanwhile: a plain AMQP connection every 20 ms asking for the protocol header; the
    worst wait for the answer is how long the emulator's loop was held."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.waits: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HeaderProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    @property
    def worst(self) -> float:
        return max(self.waits, default=0.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
                sock.sendall(AMQP_HEADER)
                answer = b""
                while len(answer) < 8 and (chunk := sock.recv(8)):
                    answer += chunk
            self.waits.append(time.monotonic() - started)
            self._stop.wait(0.02)


# --- compression ------------------------------------------------------------------------------------------


def test_compression_is_never_agreed_and_a_compressed_message_closes_the_websocket(
    emulator: RunningEmulator,
) -> None:
    """aiohttp agreed to permessage-deflate by default: 24 kB of deflated empty frames inflated to 24 MiB
    the emulator read frame by frame, its loop held while other clients waited. No extension is agreed now,
    and a compressed frame fails its WebSocket before anything is inflated."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = [ws_frame(deflated(AMQP_HEADER, compressor), rsv1=True)]
    while sum(map(len, bomb)) < 24_000:
        bomb.append(ws_frame(deflated(EMPTY_FRAMES, compressor), rsv1=True))
    process = psutil.Process(emulator.pid)
    offer = "Sec-WebSocket-Extensions: permessage-deflate"
    with HeaderProbe(emulator.port) as probe, RawWebSocket(emulator.port, offer) as ws:
        assert ws.upgraded, ws.answer
        agreed = ws.header("Sec-WebSocket-Extensions")
        before = settled_cpu(process)
        ws.send_quietly(b"".join(bomb))
        spent = settled_cpu(process) - before
        closed = closed_within(ws.sock, 2)
    assert spent < 0.3, f"the emulator spent {spent:.2f}s of CPU on {sum(map(len, bomb))} bytes"
    assert probe.worst < 0.5, f"another client waited {probe.worst:.2f}s for the AMQP header"
    assert agreed is None, f"the emulator agreed to {agreed}"
    assert closed, "a compressed frame did not fail its WebSocket"
