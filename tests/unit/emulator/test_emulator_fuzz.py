"""The decoder under hostile bytes: whatever a peer sends, decoding returns a value or raises the codec's
DecodeError, quickly and within a memory bound; what the encoder writes decodes back. Also the exact bytes
of each decoder bug found, as regressions."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubshift.emulator import codec, frames, performatives
from hubshift.emulator.broker import Broker, HubSpec
from hubshift.emulator.cbs import Authorizer, SasAuthorizer
from hubshift.emulator.codec import DecodeError
from hubshift.emulator.connection import AmqpConnection
from hubshift.emulator.context import ServerContext
from hubshift.emulator.messages import BATCH_MESSAGE_FORMAT, parse_request, unpack_publication

# A few seconds of examples in all; each example must finish well inside its deadline.
FUZZ = settings(
    max_examples=400, deadline=200, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
# Decoding a few hundred bytes may allocate this much at most (the largest legal expansion is about 64
# bytes of Python objects per input byte: a list of empty lists).
MEMORY_BOUND = 1 << 20

# An array32 declaring 2**32-1 elements of the zero-width constructor null (0x40): the decoder looped four
# billion times appending None. As the 28 bytes that froze the server: SASL header, then a SASL frame whose
# performative descriptor is that array.
ZERO_WIDTH_ARRAY = b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40"
FROZE_THE_SERVER = (
    b"AMQP\x03\x01\x00\x00" + b"\x00\x00\x00\x14\x02\x01\x00\x00" + b"\x00" + ZERO_WIDTH_ARRAY + b"\x45"
)


def bounded(decode: Callable[[], object]) -> None:
    """Run `decode`: it must return or raise DecodeError, and allocate at most MEMORY_BOUND."""
    tracemalloc.start()
    try:
        try:
            decode()
        except DecodeError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"decoding allocated {peak} bytes"


# --- the exact bytes of each bug ------------------------------------------------------------------------


def test_the_28_bytes_that_froze_the_server_are_a_decode_error_at_once() -> None:
    assert len(FROZE_THE_SERVER) == 28
    body = memoryview(FROZE_THE_SERVER)[16:]
    started = time.monotonic()
    with pytest.raises(DecodeError):
        performatives.parse_body(body)
    assert time.monotonic() - started < 0.1


@pytest.mark.timeout(10)
@pytest.mark.parametrize("element", [0x40, 0x41, 0x42, 0x43, 0x44, 0x45])
@pytest.mark.parametrize("count", [2**32 - 1, 2**20, 65])
def test_an_array_of_zero_width_elements_is_bounded(element: int, count: int) -> None:
    encoded = b"\xf0\x00\x00\x00\x05" + count.to_bytes(4, "big") + bytes((element,))
    bounded(lambda: codec.decode(encoded))
    with pytest.raises(DecodeError):
        codec.decode(encoded)


def test_a_few_zero_width_elements_still_decode() -> None:
    assert codec.decode(b"\xe0\x02\x03\x40") == codec.Array("null", (None, None, None))
    assert codec.decode(b"\xe0\x02\x02\x41").items == (True, True)
    assert codec.decode(b"\xe0\x02\x02\x43").items == (0, 0)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "encoded",
    [
        # counts far beyond the bytes that follow: list32, map32, array32 of ubyte, array32 of list8
        b"\xd0\x00\x00\x00\x05\xff\xff\xff\xff\x40",
        b"\xd1\x00\x00\x00\x05\xff\xff\xff\xff\x40",
        b"\xf0\x00\x00\x00\x06\xff\xff\xff\xff\x50\x01",
        b"\xf0\x00\x00\x00\x07\x00\x01\x00\x00\xc0\x01\x00",
        b"\xe0\x03\xff\x50\x01",
    ],
)
def test_a_count_larger_than_the_bytes_left_is_refused(encoded: bytes) -> None:
    with pytest.raises(DecodeError, match="count"):
        codec.decode(encoded)


def nested_lists(depth: int) -> bytes:
    encoded = b"\x40"
    for _ in range(depth):
        encoded = b"\xd0" + (len(encoded) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + encoded
    return encoded


def nested_arrays(depth: int) -> bytes:
    """Arrays of one list holding an array of one list ..."""
    encoded = b"\x40"
    for _ in range(depth):
        element = (len(encoded) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + encoded
        encoded = b"\xf0" + (len(element) + 5).to_bytes(4, "big") + b"\x00\x00\x00\x01\xd0" + element
    return encoded


@pytest.mark.parametrize(
    "deep",
    [nested_lists(5000), nested_arrays(2000), b"\x00" * 5000 + b"\x40\x40", b"\x00\x40" * 5000 + b"\x40"],
    ids=["lists", "arrays", "descriptors", "described values"],
)
def test_nesting_is_bounded(deep: bytes) -> None:
    with pytest.raises(DecodeError, match="nested too deeply"):
        codec.decode(deep)
    if deep[0] == 0x00:
        with pytest.raises(DecodeError, match="nested too deeply"):
            codec.skip_value(deep, 0)
    assert codec.decode(nested_lists(20)) == codec.decode(nested_lists(20))
    shallow = b"\x00\x53\x01" * 10 + b"\x40"
    assert codec.skip_value(shallow, 0) == len(shallow)


# --- the fuzzer ------------------------------------------------------------------------------------------

# Bytes that look like AMQP: mostly constructors and small lengths, so the decoder gets past the first byte.
CONSTRUCTORS = sorted({0x00, *range(0x40, 0x46), 0x50, 0x53, 0x56, 0x70, 0x83, 0x98, 0xA0, 0xA1, 0xA3})
CONSTRUCTORS += [0xB0, 0xB1, 0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0]
amqp_like = st.lists(
    st.one_of(
        st.sampled_from(CONSTRUCTORS),
        st.integers(0, 8),
        st.sampled_from([0xFF, 0x7F, 0x80]),
        st.integers(0, 255),
    ),
    max_size=400,
).map(bytes)
hostile = st.one_of(amqp_like, st.binary(max_size=400))


@given(hostile)
@FUZZ
def test_the_value_decoder_returns_or_raises_decode_error_within_bounds(data: bytes) -> None:
    bounded(lambda: codec.decode(data))
    bounded(lambda: codec.skip_value(data, 0))


@given(hostile)
@FUZZ
def test_the_performative_decoder_returns_or_raises_decode_error_within_bounds(data: bytes) -> None:
    body = memoryview(b"\x00\x53\x12" + data)
    bounded(lambda: performatives.parse_body(body))
    bounded(lambda: performatives.parse_body(memoryview(data)))


@given(hostile, st.sampled_from([0, BATCH_MESSAGE_FORMAT]))
@FUZZ
def test_message_parsing_returns_or_raises_decode_error_within_bounds(
    data: bytes, message_format: int
) -> None:
    bounded(lambda: unpack_publication(message_format, data))
    bounded(lambda: parse_request(data))


# Well-formed frames of every performative the server reads, with fuzzed field values.
field_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(0, 2**32 - 1).map(codec.UInt),
    st.integers(0, 2**16 - 1).map(codec.UShort),
    st.binary(max_size=20),
    st.text(max_size=20),
    st.text(max_size=20).map(codec.Symbol),
    st.dictionaries(st.text(max_size=5).map(codec.Symbol), st.integers(-5, 5), max_size=3),
)


KINDS: list[Any] = [
    performatives.Open,
    performatives.Begin,
    performatives.Attach,
    performatives.Flow,
    performatives.Transfer,
    performatives.Disposition,
    performatives.Detach,
    performatives.End,
    performatives.Close,
    performatives.SaslMechanisms,
    performatives.SaslInit,
    performatives.SaslChallenge,
    performatives.SaslResponse,
    performatives.SaslOutcome,
]


@given(st.sampled_from(KINDS), st.lists(field_values, max_size=16), st.binary(max_size=50))
@FUZZ
def test_frames_with_any_field_values_decode_to_their_performative(
    kind: Any, fields: list[Any], payload: bytes
) -> None:
    sent = kind(*fields[: len(kind._fields)])
    frame = performatives.frame_of(0, sent, payload)
    decoded, payload_start = performatives.parse_body(memoryview(frame)[8:])
    assert type(decoded) is kind
    assert decoded == sent
    assert bytes(memoryview(frame)[8:][payload_start:]) == payload
    assert len(kind._fields) == len(decoded)


@given(st.binary(min_size=1, max_size=300))
@FUZZ
def test_every_cut_and_flipped_byte_of_a_real_frame_is_handled(noise: bytes) -> None:
    """Real frames (an attach with a source filter, a transfer) with bytes replaced by noise."""
    attach = performatives.Attach(
        name="r",
        handle=codec.UInt(0),
        role=True,
        source=performatives.SourceTerminus(
            address="amqps://h/hub/ConsumerGroups/$Default/Partitions/0",
            filter={
                codec.Symbol("f"): codec.Described(codec.Symbol("apache.org:selector-filter:string"), "x")
            },
        ).encode(),
        properties={codec.Symbol("com.microsoft:epoch"): 3},
    )
    for original in (
        performatives.frame_of(0, attach)[8:],
        performatives.frame_of(0, performatives.Transfer(handle=codec.UInt(1)), b"\x00\x53\x75\xa0\x01x")[8:],
    ):
        position = noise[0] % len(original)
        mangled = original[:position] + noise[1:] + original[position + len(noise) - 1 :]
        bounded(lambda data=mangled: performatives.parse_body(memoryview(data)))  # type: ignore[misc]
        bounded(lambda data=original[:position]: performatives.parse_body(memoryview(data)))  # type: ignore[misc]


# --- the frame parser and dispatch of a connection -------------------------------------------------------


class RecordingTransport(asyncio.Transport):
    """What the connection writes, kept; closing it only marks it closed (no socket: the unit tier)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def handshake() -> bytes:
    return b"".join(
        (
            frames.SASL_HEADER,
            performatives.frame_of(0, performatives.SaslInit(codec.Symbol("ANONYMOUS"))),
            frames.AMQP_HEADER,
            performatives.frame_of(0, performatives.Open("fuzz", "127.0.0.1", codec.UInt(65536))),
            performatives.frame_of(0, performatives.Begin(None, codec.UInt(0), codec.UInt(9), codec.UInt(9))),
        )
    )


def fuzzed_frame(channel: int, body: bytes) -> bytes:
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x00" + channel.to_bytes(2, "big") + body


frame_bodies = st.one_of(
    hostile,
    hostile.map(lambda data: b"\x00\x53" + data),
    st.tuples(st.sampled_from(KINDS), st.lists(field_values, max_size=14)).map(
        lambda kind_fields: performatives.frame_of(
            0, kind_fields[0](*kind_fields[1][: len(kind_fields[0]._fields)])
        )[8:]
    ),
)


@given(
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 3), frame_bodies), max_size=12),
    st.integers(1, 64),
)
@FUZZ
def test_a_connection_fed_any_frames_closes_or_carries_on_never_raises(
    opened: bool, bodies: list[tuple[int, bytes]], chunk: int
) -> None:
    """Frames with hostile bodies (after a real handshake, or before one), fed in chunks of any size:
    the connection answers, or closes itself, and never raises to the event loop."""
    loop = asyncio.new_event_loop()
    broker = Broker(
        [HubSpec("hub", 2)], clock=lambda: 1_000.0, retention_seconds=60, partition_max_bytes=1 << 20
    )
    context = ServerContext(broker, Authorizer(SasAuthorizer(None, clock=lambda: 1_000.0)))
    connection = AmqpConnection(context, loop)
    transport = RecordingTransport()
    stream = (handshake() if opened else b"") + b"".join(fuzzed_frame(c, body) for c, body in bodies)
    try:
        connection.connection_made(transport)

        def feed() -> None:
            for start in range(0, len(stream), chunk):
                connection.data_received(stream[start : start + chunk])

        bounded(feed)
        connection.connection_lost(None)
    finally:
        loop.close()
    if opened:
        assert transport.written.startswith(frames.SASL_HEADER)
        assert b"\x00\x53\x10" in transport.written  # the server's open
        if transport.closed:
            assert b"\x00\x53\x18" in transport.written  # an AMQP close says why
    elif stream:
        assert transport.closed and transport.written == frames.AMQP_HEADER  # not AMQP: our header, closed
