"""Which partition a partition key lands in.

Bob Jenkins' lookup3 (`hashlittle2`), folded to a signed 16-bit value and taken modulo the partition
count: the hash the Event Hubs service and the SDKs' buffered producers use, so an event sent with a key
lands where the Python SDK's own `PartitionResolver` would put it. Like that resolver, the key is hashed
one character (code point) at a time.
"""

from __future__ import annotations

from functools import lru_cache

_MASK = 0xFFFFFFFF


def _rot(value: int, shift: int) -> int:
    return ((value << shift) | (value >> (32 - shift))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = ((a - c) & _MASK) ^ _rot(c, 4)
    c = (c + b) & _MASK
    b = ((b - a) & _MASK) ^ _rot(a, 6)
    a = (a + c) & _MASK
    c = ((c - b) & _MASK) ^ _rot(b, 8)
    b = (b + a) & _MASK
    a = ((a - c) & _MASK) ^ _rot(c, 16)
    c = (c + b) & _MASK
    b = ((b - a) & _MASK) ^ _rot(a, 19)
    a = (a + c) & _MASK
    c = ((c - b) & _MASK) ^ _rot(b, 4)
    b = (b + a) & _MASK
    return a, b, c


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    c = ((c ^ b) - _rot(b, 14)) & _MASK
    a = ((a ^ c) - _rot(c, 11)) & _MASK
    b = ((b ^ a) - _rot(a, 25)) & _MASK
    c = ((c ^ b) - _rot(b, 16)) & _MASK
    a = ((a ^ c) - _rot(c, 4)) & _MASK
    b = ((b ^ a) - _rot(a, 14)) & _MASK
    c = ((c ^ b) - _rot(b, 24)) & _MASK
    return a, b, c


def _word(units: list[int], start: int, count: int) -> int:
    value = 0
    for index in range(count):
        value += units[start + index] << (8 * index)
    return value


def lookup3(units: list[int], seed1: int = 0, seed2: int = 0) -> tuple[int, int]:
    """`hashlittle2` over a sequence of units (bytes, or code points as the Python SDK does)."""
    remaining = len(units)
    a = b = c = (0xDEADBEEF + remaining + seed1) & _MASK
    c = (c + seed2) & _MASK
    position = 0
    while remaining > 12:
        a = (a + _word(units, position, 4)) & _MASK
        b = (b + _word(units, position + 4, 4)) & _MASK
        c = (c + _word(units, position + 8, 4)) & _MASK
        a, b, c = _mix(a, b, c)
        position += 12
        remaining -= 12
    if remaining == 0:
        return c, b
    a = (a + _word(units, position, min(remaining, 4))) & _MASK
    if remaining > 4:
        b = (b + _word(units, position + 4, min(remaining - 4, 4))) & _MASK
    if remaining > 8:
        c = (c + _word(units, position + 8, remaining - 8)) & _MASK
    a, b, c = _final(a, b, c)
    return c, b


def hash_code(partition_key: str) -> int:
    """The signed 16-bit hash of a partition key (0 for an empty key)."""
    if not partition_key:
        return 0
    first, second = lookup3([ord(character) for character in partition_key])
    folded = (first ^ second) & 0xFFFF
    return folded - 0x10000 if folded & 0x8000 else folded


@lru_cache(maxsize=65536)
def partition_for_key(partition_key: str, partition_count: int) -> int:
    return abs(hash_code(partition_key) % partition_count)
