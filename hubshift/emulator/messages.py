"""AMQP messages as the emulator sees them: events kept as raw section bytes, service annotations stamped
on once at enqueue time, and the request/reply messages of `$cbs` and `$management`.

An event is stored exactly as it will be delivered: the producer's header, its delivery annotations (the
service round-trips them), one message-annotations section that carries the service's `x-opt-*`
annotations plus the producer's own annotations, then every other section byte for byte. Delivering it is
then a frame header and a copy; a receiver that asked for the last-enqueued event's properties gets them as
delivery annotations, merged with the producer's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hubshift.emulator import frames
from hubshift.emulator.codec import (
    Buffer,
    DecodeError,
    decode_value,
    encode_full_list,
    encode_value,
    skip_value,
)

BATCH_MESSAGE_FORMAT = 0x80013700

SEQUENCE_NUMBER = "x-opt-sequence-number"
OFFSET = "x-opt-offset"
ENQUEUED_TIME = "x-opt-enqueued-time"
PARTITION_KEY = "x-opt-partition-key"
_SERVICE_ANNOTATIONS = frozenset((SEQUENCE_NUMBER, OFFSET, ENQUEUED_TIME))

_q = struct.Struct(">q")
_I = struct.Struct(">I")


def _symbol_key(name: str) -> bytes:
    raw = name.encode()
    return bytes((0xA3, len(raw))) + raw


_SEQUENCE_KEY = _symbol_key(SEQUENCE_NUMBER) + b"\x81"
_OFFSET_KEY = _symbol_key(OFFSET)
_ENQUEUED_KEY = _symbol_key(ENQUEUED_TIME) + b"\x83"
_PARTITION_KEY_KEY = _symbol_key(PARTITION_KEY)


def encode_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) < 256:
        return bytes((0xA1, len(raw))) + raw
    return b"\xb1" + _I.pack(len(raw)) + raw


def _map_section(code: int, entries: bytes, count: int) -> bytes:
    if len(entries) < 255 and count < 256:
        return bytes((0x00, 0x53, code, 0xC1, len(entries) + 1, count)) + entries
    return bytes((0x00, 0x53, code, 0xD1)) + _I.pack(len(entries) + 4) + _I.pack(count) + entries


@dataclass(slots=True)
class IncomingEvent:
    """One event as a producer sent it, split into what the service keeps and what it replaces."""

    header: Buffer
    # the producer's own message annotations, raw encoded key/value pairs, and how many elements
    annotation_entries: bytes
    annotation_count: int
    partition_key: str | None
    # every other section (properties, application properties, body, footer) in the order sent
    sections: list[Buffer] = field(default_factory=list)
    # the producer's delivery annotations, as one `00 53 71` map section (b"": none)
    delivery_annotations: bytes = b""

    @property
    def size(self) -> int:
        return (
            len(self.header)
            + len(self.delivery_annotations)
            + len(self.annotation_entries)
            + sum(len(part) for part in self.sections)
        )


_ONE_BYTE_SIZED = frozenset((0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0))
_FOUR_BYTE_SIZED = frozenset((0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0))


def _section_code(data: Buffer, pos: int) -> tuple[int, int]:
    """The code of the section starting at `pos` and where its value starts."""
    if data[pos] != 0x00:
        raise DecodeError("message section is not a described value")
    if data[pos + 1] == 0x53:
        return data[pos + 2], pos + 3
    descriptor, value_start = decode_value(data, pos + 1)
    code = frames.descriptor_code(descriptor)
    if code is None or not 0x70 <= code <= 0x78:
        raise DecodeError(f"unknown message section {descriptor!r}")
    return code, value_start


def _key_text(data: Buffer, start: int, end: int) -> str | None:
    value, _ = decode_value(data, start)
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None


def _map_entries(data: Buffer, start: int, end: int, drop: frozenset[str] = frozenset()) -> tuple[bytes, int]:
    """The raw key/value pairs of the map encoded at `start` (null: none) without the keys in `drop`, and
    their element count."""
    code = data[start]
    if code == 0x40:
        return b"", 0
    if code == 0xC1:
        count, pos = data[start + 2], start + 3
    elif code == 0xD1:
        count, pos = _I.unpack_from(data, start + 5)[0], start + 9
    else:
        raise DecodeError("annotations are not a map")
    if count > end - pos:
        raise DecodeError("annotations with a count beyond their size")
    kept: list[Buffer] = []
    for _ in range(count // 2):
        key, value_start = decode_value(data, pos)
        value_end = skip_value(data, value_start)
        if not (isinstance(key, str) and key in drop):
            kept.append(data[pos:value_end])
        pos = value_end
    if pos != end:
        raise DecodeError("annotations size does not match their content")
    return b"".join(bytes(part) for part in kept), 2 * len(kept)


def _split_annotations(data: Buffer, start: int, end: int) -> tuple[bytes, int, str | None]:
    """The producer's annotation entries without the service's own, their element count, and the key."""
    code = data[start]
    if code == 0x40:
        return b"", 0, None
    if code == 0xC1:
        count, pos = data[start + 2], start + 3
    elif code == 0xD1:
        count, pos = _I.unpack_from(data, start + 5)[0], start + 9
    else:
        raise DecodeError("message annotations are not a map")
    if count > end - pos:
        raise DecodeError("message annotations with a count beyond their size")
    kept: list[Buffer] = []
    kept_count = 0
    partition_key: str | None = None
    for _ in range(count // 2):
        key, value_start = decode_value(data, pos)
        value_end = skip_value(data, value_start)
        if isinstance(key, str) and key in _SERVICE_ANNOTATIONS:
            pos = value_end
            continue
        if key == PARTITION_KEY:
            partition_key = _key_text(data, value_start, value_end)
        kept.append(data[pos:value_end])
        kept_count += 2
        pos = value_end
    if pos != end:
        raise DecodeError("message annotations size does not match their content")
    return b"".join(kept), kept_count, partition_key


def unpack_event(data: Buffer) -> IncomingEvent:
    """Split one encoded message into its sections: the producer's delivery annotations are kept (as the
    service keeps them), as one normalised section."""
    header: Buffer = b""
    delivery = b""
    entries = b""
    count = 0
    partition_key: str | None = None
    sections: list[Buffer] = []
    run_start = -1
    pos = 0
    end_of_message = len(data)
    if end_of_message == 0:
        raise DecodeError("empty message")
    while pos < end_of_message:
        if data[pos] == 0x00 and data[pos + 1] == 0x53 and pos + 5 <= end_of_message:
            # the usual `00 53 code` sections with a sized value: no decoding needed to skip them
            code, value_start = data[pos + 2], pos + 3
            constructor = data[value_start]
            if constructor in _ONE_BYTE_SIZED:
                end = value_start + 2 + data[value_start + 1]
            elif constructor in _FOUR_BYTE_SIZED:
                end = value_start + 5 + _I.unpack_from(data, value_start + 1)[0]
            else:
                end = skip_value(data, value_start)
            if end > end_of_message:
                raise DecodeError("message section runs past the end of the message")
        else:
            code, value_start = _section_code(data, pos)
            end = skip_value(data, value_start)
        if code == frames.HEADER or code == frames.DELIVERY_ANNOTATIONS or code == frames.MESSAGE_ANNOTATIONS:
            if run_start >= 0:
                sections.append(data[run_start:pos])
                run_start = -1
            if code == frames.HEADER:
                header = data[pos:end]
            elif code == frames.DELIVERY_ANNOTATIONS:
                delivery_entries, delivery_count = _map_entries(data, value_start, end)
                if delivery_count:
                    delivery = _map_section(frames.DELIVERY_ANNOTATIONS, delivery_entries, delivery_count)
            elif code == frames.MESSAGE_ANNOTATIONS:
                entries, count, partition_key = _split_annotations(data, value_start, end)
        elif run_start < 0:
            run_start = pos
        pos = end
    if run_start >= 0:
        sections.append(data[run_start:] if run_start else data)
    return IncomingEvent(header, entries, count, partition_key, sections, delivery)


@dataclass(slots=True)
class Publication:
    """What one producer delivery carries: its events and the partition key that routes them."""

    events: list[IncomingEvent]
    partition_key: str | None
    # the envelope's raw x-opt-partition-key entry, stamped on batch events that lack their own
    envelope_key_entry: bytes


def unpack_publication(message_format: int, payload: Buffer) -> Publication:
    """A single event (format 0) or a batch (format 0x80013700: one data section per event)."""
    try:
        return _unpack_publication(message_format, payload)
    except (IndexError, struct.error) as exc:
        raise DecodeError(f"malformed message: {exc}") from exc


def _unpack_publication(message_format: int, payload: Buffer) -> Publication:
    if message_format != BATCH_MESSAGE_FORMAT:
        event = unpack_event(payload)
        return Publication([event], event.partition_key, b"")
    events: list[IncomingEvent] = []
    envelope_key: str | None = None
    envelope_entry = b""
    pos = 0
    size = len(payload)
    view = memoryview(payload)
    while pos < size:
        # the usual case, an event in a data section, without decoding
        prefix = payload[pos : pos + 4]
        if prefix == b"\x00\x53\x75\xa0" or prefix == b"\x00\x53\x75\xb0":
            if prefix[3] == 0xA0:
                start, end = pos + 5, pos + 5 + payload[pos + 4]
            else:
                start = pos + 8
                end = start + _I.unpack_from(payload, pos + 4)[0]
            if end > size:
                raise DecodeError("batch data section runs past the end of the message")
            events.append(unpack_event(view[start:end]))
            pos = end
            continue
        code, value_start = _section_code(payload, pos)
        end = skip_value(payload, value_start)
        if code == frames.DATA:
            constructor = payload[value_start]
            if constructor == 0xA0:
                inner = view[value_start + 2 : end]
            elif constructor == 0xB0:
                inner = view[value_start + 5 : end]
            else:
                raise DecodeError("batch data section is not binary")
            events.append(unpack_event(inner))
        elif code == frames.MESSAGE_ANNOTATIONS:
            _, _, envelope_key = _split_annotations(payload, value_start, end)
            if envelope_key is not None:
                envelope_entry = _PARTITION_KEY_KEY + encode_string(envelope_key)
        elif code in (frames.AMQP_VALUE, frames.AMQP_SEQUENCE):
            raise DecodeError("a batch carries its events in data sections")
        pos = end
    key = envelope_key
    if key is None:
        key = next((event.partition_key for event in events if event.partition_key is not None), None)
    return Publication(events, key, envelope_entry)


# A geo-replicated namespace's offsets are strings that are not numbers (Azure.Messaging.EventHubs 5.12.0's
# notes); `--geo-offsets` serves this stand-in for them, `<replication segment>:<byte position>`.
GEO_SEGMENT = 1


def offset_text(offset: int, *, geo: bool = False) -> str:
    """An offset as delivered: the byte position, or with `geo` the geo-replicated stand-in (`-1`, nothing
    yet, stays `-1`)."""
    return f"{GEO_SEGMENT}:{offset}" if geo and offset >= 0 else str(offset)


def offset_position(text: str) -> int:
    """The byte position an offset names, in either form (a client's checkpoint may hold either);
    `ValueError` when it is neither."""
    segment, separator, position = text.partition(":")
    if separator and segment.isdigit():
        return int(position)
    return int(text)


def stamp_event(
    event: IncomingEvent,
    sequence_number: int,
    offset: int,
    enqueued_ms: int,
    envelope_key_entry: bytes = b"",
    *,
    geo: bool = False,
) -> bytes:
    """The event as delivered: header, the message annotations with the service's fields, the rest."""
    offset_bytes = offset_text(offset, geo=geo).encode()
    entries = b"".join(
        (
            _SEQUENCE_KEY,
            _q.pack(sequence_number),
            _OFFSET_KEY,
            bytes((0xA1, len(offset_bytes))),
            offset_bytes,
            _ENQUEUED_KEY,
            _q.pack(enqueued_ms),
            event.annotation_entries,
        )
    )
    count = 6 + event.annotation_count
    if envelope_key_entry and event.partition_key is None:
        entries += envelope_key_entry
        count += 2
    return b"".join(
        (
            event.header,
            event.delivery_annotations,
            _map_section(frames.MESSAGE_ANNOTATIONS, entries, count),
            *event.sections,
        )
    )


_LAST_SEQUENCE_KEY = _symbol_key("last_enqueued_sequence_number") + b"\x81"
_LAST_OFFSET_KEY = _symbol_key("last_enqueued_offset")
_LAST_TIME_KEY = _symbol_key("last_enqueued_time_utc") + b"\x83"
_RETRIEVAL_TIME_KEY = _symbol_key("runtime_info_retrieval_time_utc") + b"\x83"


# How a stored event's delivery annotations begin, right after its header.
DELIVERY_ANNOTATIONS_PREFIX = b"\x00\x53\x71"
_RUNTIME_KEYS = frozenset(
    (
        "last_enqueued_sequence_number",
        "last_enqueued_offset",
        "last_enqueued_time_utc",
        "runtime_info_retrieval_time_utc",
    )
)
RUNTIME_METRIC_COUNT = 8


def runtime_metric_entries(last_sequence: int, last_offset: str, last_enqueued_ms: int, now_ms: int) -> bytes:
    """The delivery-annotation entries for a receiver that asked for the partition's last-enqueued event
    (`RUNTIME_METRIC_COUNT` elements)."""
    return b"".join(
        (
            _LAST_SEQUENCE_KEY,
            _q.pack(last_sequence),
            _LAST_OFFSET_KEY,
            encode_string(last_offset),
            _LAST_TIME_KEY,
            _q.pack(last_enqueued_ms),
            _RETRIEVAL_TIME_KEY,
            _q.pack(now_ms),
        )
    )


def runtime_metric_section(entries: bytes) -> bytes:
    """Delivery annotations of `runtime_metric_entries` alone (the event has none of its own)."""
    return _map_section(frames.DELIVERY_ANNOTATIONS, entries, RUNTIME_METRIC_COUNT)


def merge_delivery_annotations(runtime_entries: bytes, message: Buffer, start: int) -> tuple[bytes, int]:
    """One delivery-annotations section of the runtime metric's entries and the producer's own (stored at
    `start`, without any key the service sets), and where the stored section ends."""
    value_start = start + len(DELIVERY_ANNOTATIONS_PREFIX)
    end = skip_value(message, value_start)
    entries, count = _map_entries(message, value_start, end, _RUNTIME_KEYS)
    merged = _map_section(
        frames.DELIVERY_ANNOTATIONS, runtime_entries + entries, RUNTIME_METRIC_COUNT + count
    )
    return merged, end


class MessageProperties(NamedTuple):
    """A message's `properties` section (AMQP 1.0 part 3), by field name."""

    message_id: Any = None
    user_id: Any = None
    to: Any = None
    subject: Any = None
    reply_to: Any = None
    correlation_id: Any = None
    content_type: Any = None
    content_encoding: Any = None
    absolute_expiry_time: Any = None
    creation_time: Any = None
    group_id: Any = None
    group_sequence: Any = None
    reply_to_group_id: Any = None


@dataclass(slots=True)
class RequestMessage:
    """A `$cbs` or `$management` request: only what the emulator reads from it."""

    message_id: Any
    application_properties: dict[str, Any]
    body: Any


def _text_keys(mapping: Any) -> dict[str, Any]:
    if not isinstance(mapping, dict):
        return {}
    return {str(key) if isinstance(key, str) else repr(key): value for key, value in mapping.items()}


def parse_request(payload: Buffer) -> RequestMessage:
    try:
        return _parse_request(payload)
    except (IndexError, struct.error) as exc:
        raise DecodeError(f"malformed request: {exc}") from exc


def _parse_request(payload: Buffer) -> RequestMessage:
    message_id: Any = None
    application_properties: dict[str, Any] = {}
    body: Any = None
    pos = 0
    while pos < len(payload):
        code, value_start = _section_code(payload, pos)
        value, pos = decode_value(payload, value_start)
        if code == frames.PROPERTIES and isinstance(value, list):
            message_id = MessageProperties(*value[: len(MessageProperties._fields)]).message_id
        elif code == frames.APPLICATION_PROPERTIES:
            application_properties = _text_keys(value)
        elif code == frames.AMQP_VALUE or code == frames.DATA:
            body = value
    return RequestMessage(message_id, application_properties, body)


def encode_reply(correlation_id: Any, status_code: int, description: str, body: Any = None) -> bytes:
    """A reply that pyamqp's request/response link correlates: correlation-id of the request's type,
    an integer status code, and the description under both names that the SDK's links read."""
    out = bytearray(b"\x00\x53\x73")
    encode_full_list(out, MessageProperties(correlation_id=correlation_id))
    out += b"\x00\x53\x74"
    encode_value(
        out,
        {
            "status-code": status_code,
            "status-description": description,
            "statusCode": status_code,
            "statusDescription": description,
        },
    )
    if body is not None:
        out += b"\x00\x53\x77"
        encode_value(out, body)
    return bytes(out)
