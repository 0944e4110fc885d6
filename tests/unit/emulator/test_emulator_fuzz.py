"""The decoder under hostile bytes: whatever a peer sends, decoding returns a value or raises the codec's
DecodeError, quickly and within a memory bound; what the encoder writes decodes back. Also the exact bytes
of each decoder bug found, as regressions."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

import pytest

from hubshift.emulator import codec, frames
from hubshift.emulator.codec import DecodeError

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
        frames.decode_performative(body)
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
