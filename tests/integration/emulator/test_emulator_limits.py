"""The emulator's limits under a hostile peer: bytes that would make the decoder loop, deliveries and
attaches that would hold memory or the event loop, a peer that never authenticates. Each case closes that
one connection (with the AMQP error the spec names) while the SDK keeps being served, within bounded time
and memory."""

from __future__ import annotations

import socket
import time

import psutil
import pytest
from azure.eventhub import EventData
from emulator_clients import producer

from hubshift.emulator.launch import RunningEmulator

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
# SASL header, then a SASL frame whose descriptor is an array32 of 2**32-1 nulls (tests/unit/emulator has
# the same bytes against the decoder alone).
FROZE_THE_SERVER = bytes.fromhex("414d515003010000000000140201000000f000000005ffffffff4045")


def rss(server: RunningEmulator) -> int:
    return int(psutil.Process(server.pid).memory_info().rss)


def closed_by_server(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sent until it closed the connection (fails if it did not within `timeout`)."""
    sock.settimeout(timeout)
    received = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the server kept the connection open for {timeout}s")


def served_within(server: RunningEmulator, seconds: float) -> float:
    """How long an SDK producer took to send one event and read the hub (asserted under `seconds`)."""
    started = time.monotonic()
    with producer(server.connection_string, retry_total=0) as client:
        client.send_event(EventData("still served"), partition_id="0", timeout=seconds)
        assert client.get_partition_properties("0")["last_enqueued_sequence_number"] >= 0
    took = time.monotonic() - started
    assert took < seconds, f"an SDK client waited {took:.1f}s"
    return took


def test_the_28_bytes_that_froze_the_server_close_only_their_connection(emulator: RunningEmulator) -> None:
    before = rss(emulator)
    with socket.create_connection(("127.0.0.1", emulator.port), timeout=5) as sock:
        sock.sendall(FROZE_THE_SERVER)
        received = closed_by_server(sock, 5)
    assert received.startswith(b"AMQP\x03\x01\x00\x00")  # the SASL header and mechanisms, then closed
    served_within(emulator, 10)
    assert rss(emulator) - before < 50 * MIB
    assert "Traceback" not in emulator.log()
