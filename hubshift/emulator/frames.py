"""AMQP 1.0 framing: protocol headers, the frame header, and the descriptor codes of performatives,
message sections, delivery states and composite types (by code and by symbolic name).

The azure-eventhub SDK (pyamqp) reads performative fields by fixed index and takes a transfer's payload
from index 11, so a performative is always encoded with its full arity (`performatives.py` declares the
fields), trailing nulls included, as a list8/list32 (never list0), and its descriptor as a smallulong
(`00 53 xx`).
"""

from __future__ import annotations

import struct
from typing import Any

from hubshift.emulator.codec import Buffer, encode_full_list

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


def descriptor_code(descriptor: object) -> int | None:
    """The numeric code of a descriptor given as ulong or as its symbolic name."""
    if isinstance(descriptor, int):
        return int(descriptor)
    if isinstance(descriptor, str):
        return _CODE_BY_SYMBOL.get(descriptor)
    return None


def encode_frame(
    channel: int,
    code: int,
    fields: list[Any] | tuple[Any, ...],
    payload: Buffer = b"",
    frame_type: int = FRAME_TYPE_AMQP,
) -> bytes:
    """A frame of the described list `00 53 code` with `fields` (all of them: see the module's docstring)
    and a transfer's payload."""
    body = bytearray(b"\x00\x53")
    body.append(code)
    encode_full_list(body, fields)
    return b"".join((FRAME_HEADER.pack(8 + len(body) + len(payload), 2, frame_type, channel), body, payload))
