"""The chunked socket read under pyamqp's own frame reader (a real `SASLTransport` on a socket pair): the
same frames as pyamqp's read gives, far fewer system calls, and a frame cut by a read timeout is read whole
on the next call."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from azure.eventhub._pyamqp._transport import WebSocketTransport
from azure.eventhub._pyamqp.sasl import SASLTransport

from hubshift.eventhubs.sdk_internals import READ_CHUNK, TurnReads, buffer_socket_reads


def frame(channel: int, payload: bytes) -> bytes:
    """An AMQP frame: size, data offset 2 (8-byte header), type 0, channel, body."""
    return struct.pack(">IBBH", 8 + len(payload), 2, 0, channel) + payload


class CountingSocket:
    """A socket whose reads are counted (a socket's own methods cannot be wrapped)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reads = 0

    def recv(self, n: int) -> bytes:
        self.reads += 1
        return self.sock.recv(n)

    def recv_into(self, view: Any) -> int:
        self.reads += 1
        return self.sock.recv_into(view)

    def fileno(self) -> int:
        return self.sock.fileno()


@pytest.fixture
def pair() -> Iterator[tuple[SASLTransport, CountingSocket, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(1.0)
    transport = SASLTransport("127.0.0.1", credential=None, port=5672, use_tls=False)
    counting = CountingSocket(ours)
    transport.sock = counting
    transport.connected = True
    yield transport, counting, theirs
    ours.close()
    theirs.close()


def chunked(transport: Any, turn: TurnReads | None = None) -> None:
    buffer_socket_reads(
        SimpleNamespace(_handler=SimpleNamespace(_connection=SimpleNamespace(_transport=transport))), turn
    )


def read_all(transport: SASLTransport, count: int) -> list[tuple[int, bytes]]:
    frames = []
    for _ in range(count):
        _header, channel, payload = transport.read()
        frames.append((channel, bytes(payload)))
    return frames


def test_frames_read_in_chunks_are_the_frames_pyamqp_reads(pair: Any) -> None:
    transport, counting, theirs = pair
    sent = [(i % 3, bytes([i % 251]) * (50 + 37 * i)) for i in range(300)]
    wire = b"".join(frame(c, p) for c, p in sent)
    assert len(wire) > 2 * READ_CHUNK  # frames cross chunk boundaries

    writer = threading.Thread(target=theirs.sendall, args=(wire,))
    writer.start()
    plain = read_all(transport, 150)  # pyamqp's own read: two reads a frame
    plain_reads = counting.reads
    chunked(transport)
    chunked(transport)  # idempotent
    counting.reads = 0
    ours = read_all(transport, 150)
    writer.join()

    assert plain + ours == sent
    assert plain_reads >= 300
    assert counting.reads < 150 / 4, counting.reads


def test_a_frame_cut_by_a_timeout_is_read_whole_next_time(pair: Any) -> None:
    transport, _counting, theirs = pair
    transport.sock.sock.settimeout(0.05)
    chunked(transport)
    first, second = frame(1, b"a" * 500), frame(2, b"b" * 700)
    theirs.sendall(first + second[:3])  # the second frame's header is cut
    assert read_all(transport, 1) == [(1, b"a" * 500)]
    with pytest.raises(socket.timeout):
        transport.read()
    theirs.sendall(second[3:20])  # now its body is cut
    with pytest.raises(socket.timeout):
        transport.read()
    theirs.sendall(second[20:] + frame(0, b"c"))
    assert read_all(transport, 2) == [(2, b"b" * 700), (0, b"c")]


def test_a_closed_peer_is_an_error_not_a_wait(pair: Any) -> None:
    transport, _counting, theirs = pair
    chunked(transport)
    theirs.sendall(frame(1, b"x" * 10)[:9])
    theirs.close()
    started = time.monotonic()
    with pytest.raises(OSError, match="closed"):
        transport.read()
    assert time.monotonic() - started < 1.0


def test_a_websocket_transport_keeps_its_own_read() -> None:
    websocket = WebSocketTransport("127.0.0.1", port=5672)  # it already reads whole WebSocket messages
    chunked(websocket)
    assert websocket._read.__func__ is WebSocketTransport._read
    buffer_socket_reads(SimpleNamespace(_handler=None))  # not yet open: nothing to do


def timed_read(transport: SASLTransport) -> tuple[float, tuple[int, bytes] | None]:
    """(seconds taken, the frame) of one read; None when it timed out, as pyamqp's frame reader sees it."""
    started = time.monotonic()
    try:
        _header, channel, payload = transport.read()
    except TimeoutError:
        return time.monotonic() - started, None
    return time.monotonic() - started, (channel, bytes(payload))


def test_a_turn_takes_the_frames_that_are_there_and_does_not_wait_on_a_quiet_link(pair: Any) -> None:
    transport, _counting, theirs = pair  # the socket's own timeout: 1 s
    chunked(transport, TurnReads(follow=0.02, budget=5.0))
    took, got = timed_read(transport)
    assert got is None and took < 0.01  # the turn's first frame is not there: no wait at all

    chunked(transport, TurnReads(follow=0.02, budget=5.0))  # the next turn
    theirs.sendall(frame(1, b"a" * 100) + frame(2, b"b" * 70000))  # the second crosses a chunk
    assert timed_read(transport)[1] == (1, b"a" * 100)
    assert timed_read(transport)[1] == (2, b"b" * 70000)
    late = threading.Timer(0.005, theirs.sendall, args=(frame(3, b"c"),))
    late.start()  # comes within the follow time: the same turn takes it
    took, got = timed_read(transport)
    late.join()
    assert got == (3, b"c")
    took, got = timed_read(transport)
    assert got is None and 0.015 <= took < 0.5  # nothing more: the follow time, not the socket timeout

    theirs.sendall(frame(4, b"d"))  # the turn ended; the frame waits for the next one
    chunked(transport, TurnReads(follow=0.02, budget=5.0))
    assert timed_read(transport)[1] == (4, b"d")


def test_a_frame_cut_after_its_first_bytes_still_waits_for_its_rest(pair: Any) -> None:
    transport, _counting, theirs = pair
    chunked(transport, TurnReads(follow=0.001, budget=5.0))
    whole = frame(5, b"e" * 300)
    theirs.sendall(whole[:5])  # the header's first bytes: the read goes on with the socket's timeout
    rest = threading.Timer(0.05, theirs.sendall, args=(whole[5:],))
    rest.start()
    took, got = timed_read(transport)
    rest.join()
    assert got == (5, b"e" * 300) and took >= 0.04


def test_a_link_whose_frames_never_pause_holds_the_turn_for_its_budget_only(pair: Any) -> None:
    transport, _counting, theirs = pair
    stop = threading.Event()

    def trickle() -> None:  # a frame every 2 ms: never quiet for the follow time
        while not stop.is_set():
            theirs.sendall(frame(1, b"t" * 40))
            time.sleep(0.002)

    writer = threading.Thread(target=trickle)
    writer.start()
    try:
        time.sleep(0.01)
        chunked(transport, TurnReads(follow=0.02, budget=0.1))
        started, frames = time.monotonic(), 0
        while timed_read(transport)[1] is not None:
            frames += 1
            assert time.monotonic() - started < 1.0, "the turn did not end"
        took = time.monotonic() - started
    finally:
        stop.set()
        writer.join()
    assert frames >= 5 and 0.1 <= took < 0.3, (frames, took)
