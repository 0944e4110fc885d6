"""The emulator's limits under a hostile peer: bytes that would make the decoder loop, deliveries and
attaches that would hold memory or the event loop, a peer that never authenticates. Each case closes that
one connection (with the AMQP error the spec names) while the SDK keeps being served, within bounded time
and memory."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from azure.eventhub import EventData
from azure.eventhub._pyamqp import _decode as pyamqp_decode
from azure.eventhub._pyamqp.utils import generate_sas_token
from emulator_clients import RawPeer, in_process_emulator, producer, receive

from hubshift.emulator import performatives
from hubshift.emulator.codec import UInt
from hubshift.emulator.context import ConnectionLimits
from hubshift.emulator.launch import RunningEmulator
from hubshift.emulator.server import EmulatorThread

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


# --- one connection's memory and the event loop ----------------------------------------------------------


def event_payload(body: bytes) -> bytes:
    """An event as the SDK encodes it (format 0)."""
    from azure.eventhub._pyamqp import _encode as pyamqp_encode
    from azure.eventhub._transport._pyamqp_transport import PyamqpTransport

    message = PyamqpTransport.to_outgoing_amqp_message(EventData(body).raw_amqp_message)
    output = bytearray()
    pyamqp_encode.encode_payload(output, message)
    return bytes(output)


def put_token_request(message_id: int, token: str = "SharedAccessSignature sr=x&sig=y&se=1&skn=z") -> bytes:
    from azure.eventhub._pyamqp import _encode as pyamqp_encode
    from azure.eventhub._pyamqp.message import Message, Properties

    message = Message(
        value=token,
        properties=Properties(message_id=message_id),
        application_properties={
            "name": "sb://127.0.0.1/hub",
            "operation": "put-token",
            "type": "servicebus.windows.net:sastoken",
        },
    )
    output = bytearray()
    pyamqp_encode.encode_payload(output, message)
    return bytes(output)


def transfer(handle: int, delivery_id: int | None, more: bool) -> performatives.Transfer:
    return performatives.Transfer(
        UInt(handle), None if delivery_id is None else UInt(delivery_id), b"t", UInt(0), False, more
    )


def test_a_delivery_in_one_byte_transfers_holds_its_bytes_not_the_receive_buffers(
    emulator: RunningEmulator,
) -> None:
    """Each one-byte transfer arrives with 64 KiB of other frames: the delivery must keep its 2,000 bytes,
    not 2,000 receive buffers (it kept 125 MiB)."""
    payload = event_payload(b"x" * 1900)
    padding = performatives.frame_of(0, transfer(99, 0, False), b"p" * 64_000)  # a handle not attached
    before = rss(emulator)
    with RawPeer(emulator.port) as peer:
        peer.open()
        peer.attach(0, "hub/partitions/0")
        peer.expect(0x13)  # credit
        for index, byte in enumerate(payload):
            last = index == len(payload) - 1
            frame = peer.frame_bytes(0, transfer(0, 0 if index == 0 else None, not last), bytes((byte,)))
            peer.sock.sendall(frame if last else frame + padding)
            if index == len(payload) // 2:
                time.sleep(0.5)  # the emulator has read what was sent so far
                held = rss(emulator) - before
        disposition = peer.expect(0x15)
    assert held < 40 * MIB, f"the emulator grew by {held / MIB:.0f} MiB"
    assert disposition.fields[4] == {"accepted": []}  # settled accepted: stored whole
    assert receive(emulator.connection_string, 1, partition_id="0").bodies() == [b"x" * 1900]


def test_unfinished_deliveries_on_one_connection_are_bounded(emulator: RunningEmulator) -> None:
    """Twenty links each holding most of a 1 MiB delivery: the connection is closed once it holds more than
    its budget (16 MiB), with the error the spec names."""
    chunk = b"c" * 60_000
    with RawPeer(emulator.port) as peer:
        peer.open()
        for handle in range(20):
            peer.attach(handle, "hub/partitions/1")
        try:
            for handle in range(20):
                for index in range(15):  # 900 kB, within the message size limit
                    peer.send(0, transfer(handle, handle if index == 0 else None, True), chunk)
        except OSError:
            pass  # closed while we were still sending
        assert peer.closed_with(10) == "amqp:resource-limit-exceeded"
    served_within(emulator, 10)


def test_replies_waiting_for_their_reply_link_are_bounded(emulator: RunningEmulator) -> None:
    """Requests to $cbs while no reply link is attached: their replies wait, but not without bound."""
    with RawPeer(emulator.port) as peer:
        peer.open()
        peer.attach(0, "$cbs")
        peer.expect(0x13)
        try:
            for message_id in range(500):
                peer.send(0, transfer(0, message_id, False), put_token_request(message_id))
        except OSError:
            pass
        assert peer.closed_with(10) == "amqp:resource-limit-exceeded"


def test_a_handle_or_channel_past_the_advertised_maximum_closes_the_connection(
    emulator: RunningEmulator,
) -> None:
    with RawPeer(emulator.port) as peer:
        opened, begun = peer.open()
        channel_max, handle_max = opened.fields[3], begun.fields[4]
        assert channel_max < 65535 and handle_max < 65535  # maxima that bound what one peer holds
        peer.attach(handle_max + 1, "$cbs")
        assert peer.closed_with(10) == "amqp:connection:framing-error"
    with RawPeer(emulator.port) as peer:
        peer.open()
        peer.send(channel_max + 1, performatives.Begin(None, UInt(0), UInt(5000), UInt(5000)))
        assert peer.closed_with(10) == "amqp:connection:framing-error"


def test_many_attaches_do_not_stall_other_connections(emulator: RunningEmulator) -> None:
    """40,000 attaches to $cbs in one burst, on one session: answered (or the connection closed) at once,
    while a new SDK connection is served as usual."""
    with RawPeer(emulator.port) as peer:
        peer.open()
        burst = b"".join(
            peer.frame_bytes(
                0,
                performatives.Attach(
                    f"l{handle}", UInt(handle), False, target=performatives.TargetTerminus("$cbs").encode()
                ),
            )
            for handle in range(40_000)
        )
        sender = threading.Thread(target=lambda: _send_quietly(peer.sock, burst), daemon=True)
        sender.start()
        time.sleep(0.2)
        served_within(emulator, 5)
        sender.join(10)


def test_links_on_one_connection_are_bounded_across_sessions(emulator: RunningEmulator) -> None:
    """Past the per-connection link limit an attach is refused (the link, not the connection); a link
    detached makes room for another."""
    with RawPeer(emulator.port) as peer:
        _, begun = peer.open()
        handles = int(begun.fields[4]) + 1
        burst = []
        for channel in range(1, 25):
            burst.append(
                peer.frame_bytes(channel, performatives.Begin(None, UInt(0), UInt(5000), UInt(5000)))
            )
            for handle in range(min(handles, 250)):
                target = performatives.TargetTerminus("$cbs").encode()
                burst.append(
                    peer.frame_bytes(channel, performatives.Attach("l", UInt(handle), False, target=target))
                )
        peer.sock.sendall(b"".join(burst))
        refused = 0
        for frame in peer.frames(10):
            if frame.code == 0x16 and frame.error_condition == "amqp:resource-limit-exceeded":
                refused += 1
            if refused == 24 * 250 - 4096:
                break
        assert refused == 24 * 250 - 4096
        peer.send(1, performatives.Detach(UInt(0), True))
        peer.expect(0x16)
        peer.send(
            1,
            performatives.Attach(
                "again", UInt(0), False, target=performatives.TargetTerminus("$cbs").encode()
            ),
        )
        again = peer.expect(0x12)
        assert again.fields[0] == b"again" and again.fields[6] is not None  # attached, not refused
    served_within(emulator, 5)


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # the server closed the connection


# --- the handshake ---------------------------------------------------------------------------------------


def test_a_large_frame_before_open_is_refused_before_it_is_buffered(emulator: RunningEmulator) -> None:
    """Before open, frames are small (the spec's 512 bytes; the SDK's open is about 340): a frame header
    announcing 60 kB is refused at once instead of waiting for, and buffering, its body."""
    with RawPeer(emulator.port) as peer:
        peer.sock.sendall(b"AMQP\x03\x01\x00\x00" + (60_000).to_bytes(4, "big") + b"\x02\x01\x00\x00")
        assert peer.closed_with(5) is None  # no AMQP close before open: the socket is closed


@pytest.fixture
def strict_emulator() -> Iterator[EmulatorThread]:
    """An emulator in this process with a key and short handshake and authentication deadlines."""
    with in_process_emulator(
        key="the-key", limits=ConnectionLimits(handshake_timeout=1.0, authentication_timeout=2.0)
    ) as server:
        yield server


def test_a_peer_that_never_opens_or_never_authenticates_is_closed(strict_emulator: EmulatorThread) -> None:
    started = time.monotonic()
    with RawPeer(strict_emulator.port) as silent:
        assert silent.closed_with(5) is None
    assert time.monotonic() - started < 3
    with RawPeer(strict_emulator.port) as unauthenticated:
        unauthenticated.open()
        assert unauthenticated.closed_with(6) == "amqp:unauthorized-access"
    with RawPeer(strict_emulator.port) as authenticated:
        authenticated.open()
        authenticated.attach(0, "$cbs")
        authenticated.attach(1, "$cbs", sender=False)
        token = generate_sas_token(
            "sb://127.0.0.1/hub", "RootManageSharedAccessKey", "the-key", int(time.time()) + 60
        )
        authenticated.send(0, transfer(0, 0, False), put_token_request(1, token))
        reply = pyamqp_decode.decode_payload(authenticated.expect(0x14).fields[-1])
        assert reply.application_properties[b"status-code"] == 202
        for _ in authenticated.frames(3):  # past the deadline: still open (EOFError had it been closed)
            pass


def read_request(message_id: int) -> bytes:
    from azure.eventhub._pyamqp import _encode as pyamqp_encode
    from azure.eventhub._pyamqp.message import Message, Properties

    message = Message(
        value=b"",
        properties=Properties(message_id=message_id),
        application_properties={"operation": "READ", "name": "wide", "type": "com.microsoft:eventhub"},
    )
    output = bytearray()
    pyamqp_encode.encode_payload(output, message)
    return bytes(output)


def test_a_peer_that_never_reads_does_not_grow_the_server(emulator_factory: Any) -> None:
    """Each READ of a hub with 1,024 partitions is answered with about 5 kB: a peer that sends them and
    never reads would have the server buffer every reply (20,000 of them: about 100 MB). Past its write
    buffer, the server stops reading that peer."""
    server = emulator_factory(["wide:1024", "hub:1"])
    before = rss(server)
    with RawPeer(server.port) as peer:
        peer.open()
        peer.attach(0, "$management")
        peer.attach(1, "$management", sender=False)
        requests = b"".join(
            peer.frame_bytes(0, transfer(0, index, False), read_request(index)) for index in range(20_000)
        )
        sender = threading.Thread(target=lambda: _send_quietly(peer.sock, requests), daemon=True)
        sender.start()
        time.sleep(8)
        grown = rss(server) - before
        served_within(server, 10)
    sender.join(10)
    assert grown < 40 * MIB, f"the emulator grew by {grown / MIB:.0f} MiB"
