"""AMQP 1.0 frames and performatives, written with every field present.

The azure-eventhub SDK (pyamqp) reads performative fields by fixed index and takes a transfer's payload
from index 11, so each performative here is always encoded with its full arity, trailing nulls included,
as a list8/list32 (never list0), and its descriptor as a smallulong (`00 53 xx`).
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from hubshift.emulator.codec import (
    Buffer,
    DecodeError,
    Described,
    Symbol,
    ULong,
    decode_value,
    encode_full_list,
)

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"

FRAME_HEADER = struct.Struct(">IBBH")
FRAME_TYPE_AMQP = 0
FRAME_TYPE_SASL = 1

OPEN = 0x10
BEGIN = 0x11
ATTACH = 0x12
FLOW = 0x13
TRANSFER = 0x14
DISPOSITION = 0x15
DETACH = 0x16
END = 0x17
CLOSE = 0x18

SASL_MECHANISMS = 0x40
SASL_INIT = 0x41
SASL_CHALLENGE = 0x42
SASL_RESPONSE = 0x43
SASL_OUTCOME = 0x44

ERROR = 0x1D
SOURCE = 0x28
TARGET = 0x29

RECEIVED = 0x23
ACCEPTED = 0x24
REJECTED = 0x25
RELEASED = 0x26
MODIFIED = 0x27

# message sections
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

ARITY: dict[int, int] = {
    OPEN: 10,
    BEGIN: 8,
    ATTACH: 14,
    FLOW: 11,
    TRANSFER: 11,
    DISPOSITION: 6,
    DETACH: 3,
    END: 1,
    CLOSE: 1,
    SASL_MECHANISMS: 1,
    SASL_INIT: 3,
    SASL_CHALLENGE: 1,
    SASL_RESPONSE: 1,
    SASL_OUTCOME: 2,
}

NAMES: dict[int, str] = {
    OPEN: "open",
    BEGIN: "begin",
    ATTACH: "attach",
    FLOW: "flow",
    TRANSFER: "transfer",
    DISPOSITION: "disposition",
    DETACH: "detach",
    END: "end",
    CLOSE: "close",
    SASL_MECHANISMS: "sasl-mechanisms",
    SASL_INIT: "sasl-init",
    SASL_CHALLENGE: "sasl-challenge",
    SASL_RESPONSE: "sasl-response",
    SASL_OUTCOME: "sasl-outcome",
}

# Peers may name a descriptor by symbol instead of code.
_CODE_BY_SYMBOL: dict[str, int] = {f"amqp:{name}:list": code for code, name in NAMES.items()}
_CODE_BY_SYMBOL.update(
    {
        "amqp:header:list": HEADER,
        "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
        "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
        "amqp:properties:list": PROPERTIES,
        "amqp:application-properties:map": APPLICATION_PROPERTIES,
        "amqp:data:binary": DATA,
        "amqp:amqp-sequence:list": AMQP_SEQUENCE,
        "amqp:amqp-value:*": AMQP_VALUE,
        "amqp:footer:map": FOOTER,
        "amqp:error:list": ERROR,
        "amqp:source:list": SOURCE,
        "amqp:target:list": TARGET,
        "amqp:received:list": RECEIVED,
        "amqp:accepted:list": ACCEPTED,
        "amqp:rejected:list": REJECTED,
        "amqp:released:list": RELEASED,
        "amqp:modified:list": MODIFIED,
    }
)

TRACKING_ID = Symbol("com.microsoft:tracking-id")


def descriptor_code(descriptor: object) -> int | None:
    """The numeric code of a descriptor given as ulong or as its symbolic name."""
    if isinstance(descriptor, int):
        return int(descriptor)
    if isinstance(descriptor, str):
        return _CODE_BY_SYMBOL.get(descriptor)
    return None


def encode_performative(code: int, fields: list[Any]) -> bytearray:
    """`00 53 code` and the field list, padded with nulls to the performative's full arity."""
    arity = ARITY.get(code, len(fields))
    if len(fields) < arity:
        fields = fields + [None] * (arity - len(fields))
    body = bytearray(b"\x00\x53")
    body.append(code)
    encode_full_list(body, fields)
    return body


def encode_frame(
    channel: int, code: int, fields: list[Any], payload: Buffer = b"", frame_type: int = FRAME_TYPE_AMQP
) -> bytes:
    body = encode_performative(code, fields)
    return b"".join((FRAME_HEADER.pack(8 + len(body) + len(payload), 2, frame_type, channel), body, payload))


def decode_performative(body: Buffer) -> tuple[int, list[Any], int]:
    """The performative code, its fields (padded to full arity) and where a transfer's payload starts."""
    if len(body) < 3 or body[0] != 0x00:
        raise DecodeError("frame body is not a described performative")
    descriptor, pos = decode_value(body, 1)
    code = descriptor_code(descriptor)
    if code is None:
        raise DecodeError(f"unknown performative descriptor {descriptor!r}")
    fields, pos = decode_value(body, pos)
    if fields is None:
        fields = []
    if not isinstance(fields, list):
        raise DecodeError(f"performative {NAMES.get(code, hex(code))} is not a list")
    arity = ARITY.get(code)
    if arity is not None and len(fields) < arity:
        fields.extend([None] * (arity - len(fields)))
    return code, fields, pos


def amqp_error(condition: str, description: str, info: dict[Any, Any] | None = None) -> Described:
    """An error with all three fields: pyamqp indexes condition, description and info unconditionally."""
    if not info:
        info = {TRACKING_ID: str(uuid.uuid4())}
    return Described(ULong(ERROR), [Symbol(condition), description, info])


def outcome(code: int, fields: list[Any] | None = None) -> Described:
    return Described(ULong(code), fields or [])


def rejected_outcome(condition: str, description: str) -> Described:
    return outcome(REJECTED, [amqp_error(condition, description)])
