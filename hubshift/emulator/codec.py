"""The AMQP 1.0 type system: encoding and decoding of values (AMQP 1.0 core, part 1).

Decoding yields typed wrappers (`UInt`, `Symbol`, `Timestamp`, ...) for every type that a plain Python
value cannot tell apart, so a decoded value encodes back to the same AMQP type. Plain `int` is AMQP
`int` when it fits in 32 bits and `long` otherwise; `str` is `string`; `bytes` is `binary`.

The encoder always picks the compact constructors a conforming peer must accept, except for lists that
carry performatives: those are written by `frames.py` with every field present.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Buffer = bytes | bytearray | memoryview


class DecodeError(ValueError):
    """Bytes that are not a valid AMQP encoding (truncated, unknown constructor, bad UTF-8)."""


class Symbol(str):
    __slots__ = ()


class Char(str):
    __slots__ = ()


class UByte(int):
    __slots__ = ()


class UShort(int):
    __slots__ = ()


class UInt(int):
    __slots__ = ()


class ULong(int):
    __slots__ = ()


class Byte(int):
    __slots__ = ()


class Short(int):
    __slots__ = ()


class Int(int):
    """An AMQP int given explicitly (a plain `int` becomes `long` when it does not fit in 32 bits)."""

    __slots__ = ()


class Long(int):
    __slots__ = ()


class Timestamp(int):
    """Milliseconds since the Unix epoch."""

    __slots__ = ()


class Float(float):
    """A 32-bit IEEE 754 float (a plain `float` is an AMQP double)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Decimal:
    """A decimal32/64/128 kept as its raw bytes (nothing here computes with them)."""

    constructor: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class Described:
    descriptor: object
    value: object


@dataclass(frozen=True, slots=True)
class Array:
    """An AMQP array: every element has the same type, named by `kind` (one of `_KIND_BY_CONSTRUCTOR`)."""

    kind: str
    items: tuple[object, ...]
    descriptor: object = None


# --- fixed encodings --------------------------------------------------------------------------------

_B = struct.Struct(">B")
_b = struct.Struct(">b")
_H = struct.Struct(">H")
_h = struct.Struct(">h")
_I = struct.Struct(">I")
_i = struct.Struct(">i")
_Q = struct.Struct(">Q")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")

NULL = 0x40

# How deep compound values (lists, maps, arrays, described values) may nest: performatives and messages
# need a handful of levels; the bound keeps a hostile peer from exhausting the stack.
MAX_NESTING = 64
# Elements of a zero-width constructor (null, true, false, uint0, ulong0) take no bytes, so only this bound
# keeps an array's declared count (up to 2**32-1) from turning a few bytes into a loop of billions.
MAX_ZERO_WIDTH_ELEMENTS = 64

# width in bytes of the value that follows each fixed-width constructor
_FIXED_WIDTH: dict[int, int] = {
    0x40: 0,
    0x41: 0,
    0x42: 0,
    0x43: 0,
    0x44: 0,
    0x45: 0,
    0x50: 1,
    0x51: 1,
    0x52: 1,
    0x53: 1,
    0x54: 1,
    0x55: 1,
    0x56: 1,
    0x60: 2,
    0x61: 2,
    0x70: 4,
    0x71: 4,
    0x72: 4,
    0x73: 4,
    0x74: 4,
    0x80: 8,
    0x81: 8,
    0x82: 8,
    0x83: 8,
    0x84: 8,
    0x94: 16,
    0x98: 16,
}
_ONE_BYTE_LENGTH = frozenset((0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0))
_FOUR_BYTE_LENGTH = frozenset((0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0))


def _need(data: Buffer, end: int) -> None:
    if end > len(data):
        raise DecodeError("truncated AMQP value")


def skip_value(data: Buffer, pos: int, depth: int = 0) -> int:
    """The position just after the encoded value that starts at `pos`, without decoding it."""
    if depth > MAX_NESTING:
        raise DecodeError("AMQP value nested too deeply")
    try:
        code = data[pos]
    except IndexError:
        raise DecodeError("truncated AMQP value") from None
    pos += 1
    if code == 0x00:
        return skip_value(data, skip_value(data, pos, depth + 1), depth + 1)
    width = _FIXED_WIDTH.get(code)
    if width is not None:
        end = pos + width
    elif code in _ONE_BYTE_LENGTH:
        _need(data, pos + 1)
        end = pos + 1 + data[pos]
    elif code in _FOUR_BYTE_LENGTH:
        _need(data, pos + 4)
        end = pos + 4 + _I.unpack_from(data, pos)[0]
    else:
        raise DecodeError(f"unknown AMQP constructor 0x{code:02x}")
    _need(data, end)
    return end


# --- decoding ----------------------------------------------------------------------------------------

# (data, position after the constructor, nesting depth) -> (value, position after the value)
Decoder = Callable[[Buffer, int, int], tuple[Any, int]]


def _text(data: Buffer, start: int, end: int) -> str:
    _need(data, end)
    try:
        return str(data[start:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid UTF-8 in an AMQP string") from exc


def _fixed(size: int, convert: Callable[[Buffer, int], object]) -> Decoder:
    def decode(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
        end = pos + size
        _need(data, end)
        return convert(data, pos), end

    return decode


def _constant(value: object) -> Decoder:
    def decode(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
        return value, pos

    return decode


def _decode_boolean(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 1)
    return data[pos] != 0, pos + 1


def _decode_vbin8(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 1)
    end = pos + 1 + data[pos]
    _need(data, end)
    return bytes(data[pos + 1 : end]), end


def _decode_vbin32(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 4)
    end = pos + 4 + _I.unpack_from(data, pos)[0]
    _need(data, end)
    return bytes(data[pos + 4 : end]), end


def _decode_str8(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 1)
    end = pos + 1 + data[pos]
    return _text(data, pos + 1, end), end


def _decode_str32(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 4)
    end = pos + 4 + _I.unpack_from(data, pos)[0]
    return _text(data, pos + 4, end), end


def _decode_sym8(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    text, end = _decode_str8(data, pos, depth)
    return Symbol(text), end


def _decode_sym32(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    text, end = _decode_str32(data, pos, depth)
    return Symbol(text), end


def _decode_items(data: Buffer, pos: int, end: int, count: int, depth: int) -> list[Any]:
    # every element takes at least its constructor byte
    if count > end - pos:
        raise DecodeError(f"AMQP compound value with a count ({count}) beyond its size")
    items: list[Any] = []
    append = items.append
    for _ in range(count):
        value, pos = decode_value(data, pos, depth)
        append(value)
    if pos != end:
        raise DecodeError("AMQP compound value size does not match its content")
    return items


def _decode_list8(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 2)
    end = pos + 1 + data[pos]
    _need(data, end)
    return _decode_items(data, pos + 2, end, data[pos + 1], depth + 1), end


def _decode_list32(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 8)
    size, count = struct.unpack_from(">II", data, pos)
    end = pos + 4 + size
    _need(data, end)
    return _decode_items(data, pos + 8, end, count, depth + 1), end


def _pairs(items: list[Any]) -> dict[Any, Any]:
    if len(items) % 2:
        raise DecodeError("AMQP map with an odd number of elements")
    result: dict[Any, Any] = {}
    for index in range(0, len(items), 2):
        key = items[index]
        try:
            result[key] = items[index + 1]
        except TypeError:
            raise DecodeError("AMQP map key that cannot be a dictionary key") from None
    return result


def _decode_map8(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    items, end = _decode_list8(data, pos, depth)
    return _pairs(items), end


def _decode_map32(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    items, end = _decode_list32(data, pos, depth)
    return _pairs(items), end


def _array_elements(data: Buffer, pos: int, end: int, count: int, depth: int) -> tuple[Array, int]:
    if depth > MAX_NESTING:
        raise DecodeError("AMQP value nested too deeply")
    descriptor: object = None
    _need(data, pos + 1)
    if data[pos] == 0x00:
        descriptor, pos = decode_value(data, pos + 1, depth)
        _need(data, pos + 1)
    code = data[pos]
    kind = _KIND_BY_CONSTRUCTOR.get(code)
    if kind is None:
        raise DecodeError(f"unsupported AMQP array element constructor 0x{code:02x}")
    pos += 1
    width = _ELEMENT_MIN_WIDTH[code]
    if width == 0:
        if count > MAX_ZERO_WIDTH_ELEMENTS:
            raise DecodeError(f"AMQP array count ({count}) of zero-width elements is too large")
    elif count * width > end - pos:
        raise DecodeError(f"AMQP array with a count ({count}) beyond its size")
    element = _DECODERS[code]
    assert element is not None
    items: list[Any] = []
    for _ in range(count):
        value, pos = element(data, pos, depth)
        items.append(value)
    if pos != end:
        raise DecodeError("AMQP array size does not match its content")
    return Array(kind, tuple(items), descriptor), end


def _decode_array8(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 2)
    end = pos + 1 + data[pos]
    _need(data, end)
    if end == pos + 2:
        return Array("null", ()), end
    return _array_elements(data, pos + 2, end, data[pos + 1], depth + 1)


def _decode_array32(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    _need(data, pos + 8)
    size, count = struct.unpack_from(">II", data, pos)
    end = pos + 4 + size
    _need(data, end)
    if end == pos + 8:
        return Array("null", ()), end
    return _array_elements(data, pos + 8, end, count, depth + 1)


def _decode_described(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    descriptor, pos = decode_value(data, pos, depth + 1)
    value, pos = decode_value(data, pos, depth + 1)
    return Described(descriptor, value), pos


def _decimal(code: int, size: int) -> Decoder:
    def decode(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
        end = pos + size
        _need(data, end)
        return Decimal(code, bytes(data[pos:end])), end

    return decode


_DECODERS: list[Decoder | None] = [None] * 256
_DECODERS[0x00] = _decode_described
_DECODERS[0x40] = _constant(None)
_DECODERS[0x41] = _constant(True)
_DECODERS[0x42] = _constant(False)
_DECODERS[0x43] = _constant(UInt(0))
_DECODERS[0x44] = _constant(ULong(0))
_DECODERS[0x45] = _constant(None)  # list0: replaced below, a fresh list per decode
_DECODERS[0x50] = _fixed(1, lambda d, p: UByte(d[p]))
_DECODERS[0x51] = _fixed(1, lambda d, p: Byte(_b.unpack_from(d, p)[0]))
_DECODERS[0x52] = _fixed(1, lambda d, p: UInt(d[p]))
_DECODERS[0x53] = _fixed(1, lambda d, p: ULong(d[p]))
_DECODERS[0x54] = _fixed(1, lambda d, p: _b.unpack_from(d, p)[0])
_DECODERS[0x55] = _fixed(1, lambda d, p: Long(_b.unpack_from(d, p)[0]))
_DECODERS[0x56] = _decode_boolean
_DECODERS[0x60] = _fixed(2, lambda d, p: UShort(_H.unpack_from(d, p)[0]))
_DECODERS[0x61] = _fixed(2, lambda d, p: Short(_h.unpack_from(d, p)[0]))
_DECODERS[0x70] = _fixed(4, lambda d, p: UInt(_I.unpack_from(d, p)[0]))
_DECODERS[0x71] = _fixed(4, lambda d, p: _i.unpack_from(d, p)[0])
_DECODERS[0x72] = _fixed(4, lambda d, p: Float(_f.unpack_from(d, p)[0]))
_DECODERS[0x73] = _fixed(4, lambda d, p: Char(chr(_I.unpack_from(d, p)[0] % 0x110000)))
_DECODERS[0x74] = _decimal(0x74, 4)
_DECODERS[0x80] = _fixed(8, lambda d, p: ULong(_Q.unpack_from(d, p)[0]))
_DECODERS[0x81] = _fixed(8, lambda d, p: Long(_q.unpack_from(d, p)[0]))
_DECODERS[0x82] = _fixed(8, lambda d, p: _d.unpack_from(d, p)[0])
_DECODERS[0x83] = _fixed(8, lambda d, p: Timestamp(_q.unpack_from(d, p)[0]))
_DECODERS[0x84] = _decimal(0x84, 8)
_DECODERS[0x94] = _decimal(0x94, 16)
_DECODERS[0x98] = _fixed(16, lambda d, p: uuid.UUID(bytes=bytes(d[p : p + 16])))
_DECODERS[0xA0] = _decode_vbin8
_DECODERS[0xA1] = _decode_str8
_DECODERS[0xA3] = _decode_sym8
_DECODERS[0xB0] = _decode_vbin32
_DECODERS[0xB1] = _decode_str32
_DECODERS[0xB3] = _decode_sym32
_DECODERS[0xC0] = _decode_list8
_DECODERS[0xC1] = _decode_map8
_DECODERS[0xD0] = _decode_list32
_DECODERS[0xD1] = _decode_map32
_DECODERS[0xE0] = _decode_array8
_DECODERS[0xF0] = _decode_array32


def _decode_list0(data: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return [], pos


_DECODERS[0x45] = _decode_list0

# array element type names, by the constructor that encodes the elements
_KIND_BY_CONSTRUCTOR: dict[int, str] = {
    0x40: "null",
    0x56: "boolean",
    0x41: "boolean",
    0x42: "boolean",
    0x50: "ubyte",
    0x51: "byte",
    0x60: "ushort",
    0x61: "short",
    0x70: "uint",
    0x52: "uint",
    0x43: "uint",
    0x80: "ulong",
    0x53: "ulong",
    0x44: "ulong",
    0x71: "int",
    0x54: "int",
    0x81: "long",
    0x55: "long",
    0x72: "float",
    0x82: "double",
    0x83: "timestamp",
    0x98: "uuid",
    0xA0: "binary",
    0xB0: "binary",
    0xA1: "string",
    0xB1: "string",
    0xA3: "symbol",
    0xB3: "symbol",
    0xC0: "list",
    0xD0: "list",
    0xC1: "map",
    0xD1: "map",
}
# the fewest bytes one array element takes after the shared constructor (list0 is refused as an element
# constructor: each element would be a fresh list made from no bytes at all)
_ELEMENT_MIN_WIDTH: dict[int, int] = {
    code: _FIXED_WIDTH.get(code, 1 if code in _ONE_BYTE_LENGTH else 4 if code in (0xB0, 0xB1, 0xB3) else 8)
    for code in _KIND_BY_CONSTRUCTOR
}


def decode_value(data: Buffer, pos: int = 0, depth: int = 0) -> tuple[Any, int]:
    """Decode the value that starts at `pos`; returns it and the position just after it. `depth`: how deep
    inside compound values it is (the decoder refuses more than MAX_NESTING)."""
    if depth > MAX_NESTING:
        raise DecodeError("AMQP value nested too deeply")
    try:
        decoder = _DECODERS[data[pos]]
    except IndexError:
        raise DecodeError("truncated AMQP value") from None
    if decoder is None:
        raise DecodeError(f"unknown AMQP constructor 0x{data[pos]:02x}")
    try:
        return decoder(data, pos + 1, depth)
    except struct.error as exc:
        raise DecodeError(str(exc)) from exc


def decode(data: Buffer) -> Any:
    """Decode exactly one value that fills `data`."""
    value, end = decode_value(data, 0)
    if end != len(data):
        raise DecodeError("trailing bytes after an AMQP value")
    return value


# --- encoding ----------------------------------------------------------------------------------------


def _encode_sized(out: bytearray, small: int, large: int, payload: bytes) -> None:
    size = len(payload)
    if size < 256:
        out.append(small)
        out.append(size)
    else:
        out.append(large)
        out += _I.pack(size)
    out += payload


def _encode_int(out: bytearray, value: int) -> None:
    if -128 <= value <= 127:
        out.append(0x54)
        out += _b.pack(value)
    elif -(2**31) <= value < 2**31:
        out.append(0x71)
        out += _i.pack(value)
    else:
        _encode_long(out, value)


def _encode_long(out: bytearray, value: int) -> None:
    if -128 <= value <= 127:
        out.append(0x55)
        out += _b.pack(value)
    else:
        out.append(0x81)
        out += _q.pack(value)


def _encode_uint(out: bytearray, value: int) -> None:
    if value == 0:
        out.append(0x43)
    elif value < 256:
        out.append(0x52)
        out.append(value)
    else:
        out.append(0x70)
        out += _I.pack(value)


def _encode_ulong(out: bytearray, value: int) -> None:
    if value == 0:
        out.append(0x44)
    elif value < 256:
        out.append(0x53)
        out.append(value)
    else:
        out.append(0x80)
        out += _Q.pack(value)


def _encode_compound(out: bytearray, small: int, large: int, count: int, body: bytes | bytearray) -> None:
    if len(body) + 1 < 256 and count < 256:
        out.append(small)
        out.append(len(body) + 1)
        out.append(count)
    else:
        out.append(large)
        out += _I.pack(len(body) + 4)
        out += _I.pack(count)
    out += body


def encode_list(out: bytearray, items: list[Any] | tuple[Any, ...]) -> None:
    if not items:
        out.append(0x45)
        return
    body = bytearray()
    for item in items:
        encode_value(body, item)
    _encode_compound(out, 0xC0, 0xD0, len(items), body)


def encode_full_list(out: bytearray, items: list[Any] | tuple[Any, ...]) -> None:
    """A list written as list8/list32 even when empty (performatives and message sections)."""
    body = bytearray()
    for item in items:
        encode_value(body, item)
    _encode_compound(out, 0xC0, 0xD0, len(items), body)


def encode_map(out: bytearray, mapping: dict[Any, Any]) -> None:
    body = bytearray()
    for key, item in mapping.items():
        encode_value(body, key)
        encode_value(body, item)
    _encode_compound(out, 0xC1, 0xD1, 2 * len(mapping), body)


def _encode_array(out: bytearray, array: Array) -> None:
    if not array.items:
        # no element constructor, as pyamqp writes (and needs) an empty array
        out += b"\xe0\x01\x00"
        return
    elements, code = _array_body(array)
    body = bytearray()
    if array.descriptor is not None:
        body.append(0x00)
        encode_value(body, array.descriptor)
    body.append(code)
    body += elements
    _encode_compound(out, 0xE0, 0xF0, len(array.items), body)


def _element_bytes(item: object) -> bytes:
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    raise TypeError(f"cannot encode {type(item).__name__} as an AMQP array element")


def _array_body(array: Array) -> tuple[bytes, int]:
    """The elements of an array without their constructors, and the one shared constructor."""
    kind = array.kind
    items = array.items
    if kind == "null":
        return b"", NULL
    if kind in ("symbol", "string", "binary"):
        raw = [_element_bytes(item) for item in items]
        small = all(len(part) < 256 for part in raw)
        small_code, large_code = {"symbol": (0xA3, 0xB3), "string": (0xA1, 0xB1), "binary": (0xA0, 0xB0)}[
            kind
        ]
        if small:
            return b"".join(bytes((len(part),)) + part for part in raw), small_code
        return b"".join(_I.pack(len(part)) + part for part in raw), large_code
    if kind in ("list", "map"):
        parts = []
        for item in items:
            encoded = bytearray()
            encode_value(encoded, item)
            if encoded[0] == 0x45:
                encoded = bytearray(b"\xd0\x00\x00\x00\x04\x00\x00\x00\x00")
            elif encoded[0] in (0xC0, 0xC1):
                size, count = encoded[1], encoded[2]
                encoded = bytearray((encoded[0] + 0x10,)) + _I.pack(size + 3) + _I.pack(count) + encoded[3:]
            parts.append(bytes(encoded[1:]))
        return b"".join(parts), 0xD0 if kind == "list" else 0xD1
    fixed = _FIXED_ARRAY_ELEMENTS.get(kind)
    if fixed is None:
        raise TypeError(f"cannot encode an AMQP array of {kind!r}")
    code, pack = fixed
    return b"".join(pack(item) for item in items), code


def _pack_uuid(item: object) -> bytes:
    assert isinstance(item, uuid.UUID)
    return item.bytes


_FIXED_ARRAY_ELEMENTS: dict[str, tuple[int, Callable[[Any], bytes]]] = {
    "boolean": (0x56, lambda item: b"\x01" if item else b"\x00"),
    "ubyte": (0x50, _B.pack),
    "byte": (0x51, _b.pack),
    "ushort": (0x60, _H.pack),
    "short": (0x61, _h.pack),
    "uint": (0x70, _I.pack),
    "ulong": (0x80, _Q.pack),
    "int": (0x71, _i.pack),
    "long": (0x81, _q.pack),
    "float": (0x72, _f.pack),
    "double": (0x82, _d.pack),
    "timestamp": (0x83, _q.pack),
    "uuid": (0x98, _pack_uuid),
}


def _encode_none(out: bytearray, value: Any) -> None:
    out.append(NULL)


def _encode_bool(out: bytearray, value: Any) -> None:
    out.append(0x41 if value else 0x42)


def _encode_str(out: bytearray, value: Any) -> None:
    _encode_sized(out, 0xA1, 0xB1, value.encode("utf-8"))


def _encode_symbol(out: bytearray, value: Any) -> None:
    _encode_sized(out, 0xA3, 0xB3, value.encode("utf-8"))


def _encode_bytes(out: bytearray, value: Any) -> None:
    _encode_sized(out, 0xA0, 0xB0, bytes(value))


def _encode_ubyte(out: bytearray, value: Any) -> None:
    out.append(0x50)
    out.append(value)


def _encode_byte(out: bytearray, value: Any) -> None:
    out.append(0x51)
    out += _b.pack(value)


def _encode_ushort(out: bytearray, value: Any) -> None:
    out.append(0x60)
    out += _H.pack(value)


def _encode_short(out: bytearray, value: Any) -> None:
    out.append(0x61)
    out += _h.pack(value)


def _encode_explicit_int(out: bytearray, value: Any) -> None:
    if -128 <= value <= 127:
        out.append(0x54)
        out += _b.pack(value)
    else:
        out.append(0x71)
        out += _i.pack(value)


def _encode_timestamp(out: bytearray, value: Any) -> None:
    out.append(0x83)
    out += _q.pack(value)


def _encode_float(out: bytearray, value: Any) -> None:
    out.append(0x72)
    out += _f.pack(value)


def _encode_double(out: bytearray, value: Any) -> None:
    out.append(0x82)
    out += _d.pack(value)


def _encode_char(out: bytearray, value: Any) -> None:
    out.append(0x73)
    out += _I.pack(ord(value))


def _encode_uuid(out: bytearray, value: Any) -> None:
    out.append(0x98)
    out += value.bytes


def _encode_decimal(out: bytearray, value: Any) -> None:
    out.append(value.constructor)
    out += value.raw


def _encode_described(out: bytearray, value: Any) -> None:
    out.append(0x00)
    encode_value(out, value.descriptor)
    encode_value(out, value.value)


_ENCODERS: dict[type, Callable[[bytearray, Any], None]] = {
    type(None): _encode_none,
    bool: _encode_bool,
    int: _encode_int,
    Int: _encode_explicit_int,
    Long: _encode_long,
    UInt: _encode_uint,
    ULong: _encode_ulong,
    UByte: _encode_ubyte,
    Byte: _encode_byte,
    UShort: _encode_ushort,
    Short: _encode_short,
    Timestamp: _encode_timestamp,
    float: _encode_double,
    Float: _encode_float,
    str: _encode_str,
    Symbol: _encode_symbol,
    Char: _encode_char,
    bytes: _encode_bytes,
    bytearray: _encode_bytes,
    memoryview: _encode_bytes,
    uuid.UUID: _encode_uuid,
    list: lambda out, value: encode_list(out, value),
    tuple: lambda out, value: encode_list(out, value),
    dict: lambda out, value: encode_map(out, value),
    Array: _encode_array,
    Described: _encode_described,
    Decimal: _encode_decimal,
}


def encode_value(out: bytearray, value: Any) -> None:
    """Append the AMQP encoding of `value` to `out`."""
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        raise TypeError(f"no AMQP encoding for {type(value).__name__}")
    encoder(out, value)


def encode(value: Any) -> bytes:
    out = bytearray()
    encode_value(out, value)
    return bytes(out)
