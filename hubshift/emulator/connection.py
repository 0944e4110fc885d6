"""One AMQP 1.0 connection, server side, as an asyncio protocol: protocol headers, SASL ANONYMOUS, then
open / begin / attach / flow / transfer / disposition / detach / end / close.

Robustness rules: a connection never takes the server or another connection down. Bytes that are not
AMQP close this connection only; a peer that goes silent during the handshake is dropped; frames for
channels or handles that no longer exist (the SDK sends detaches after `end`) are ignored; every
producer delivery is settled with `accepted` or `rejected`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from hubshift.emulator import frames
from hubshift.emulator.broker import Broker, Hub, ReceiverRefused
from hubshift.emulator.cbs import Authorizer, Entity, parse_entity
from hubshift.emulator.codec import (
    Array,
    Buffer,
    DecodeError,
    Described,
    Symbol,
    UByte,
    UInt,
    ULong,
    UShort,
)
from hubshift.emulator.management import handle_management_request
from hubshift.emulator.messages import (
    DELIVERY_ANNOTATIONS_PREFIX,
    RequestMessage,
    encode_reply,
    merge_delivery_annotations,
    parse_request,
    runtime_metric_entries,
    runtime_metric_section,
    unpack_publication,
)
from hubshift.emulator.partition_log import PartitionLog

LOG = logging.getLogger(__name__)

CBS_NODE = "$cbs"
MANAGEMENT_NODE = "$management"
RUNTIME_METRIC = Symbol("com.microsoft:enable-receiver-runtime-metric")
EPOCH = "com.microsoft:epoch"
SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_FILTER_CODE = 0x0000468C00000004

SESSION_WINDOW = 2**31 - 1
# Grants expiring later than this (a SAS token without a key: never) are not watched.
WATCHED_EXPIRY_MS = 10 * 24 * 3600 * 1000
HANDLE_MAX = 65535
PUBLISHER_CREDIT = 1000
MAX_BYTES_PER_PUMP = 1 << 20
WRITE_BUFFER_HIGH = 4 << 20
WRITE_BUFFER_LOW = 1 << 20

_I = struct.Struct(">I")
# transfer frame head for one event: size, then doff/type/channel/descriptor/list/handle as a per-link
# prefix, delivery-id, delivery-tag (the id again) and the constant tail (format 0, settled, not more)
_TRANSFER_HEAD = struct.Struct(">I16sI2sI8s")
_TRANSFER_HEAD_SIZE = _TRANSFER_HEAD.size
_TAG_PREFIX = b"\xa0\x04"
_TRANSFER_TAIL = b"\x43\x41\x42\x40\x40\x40\x40\x40"
# accepted, settled disposition from the receiver side for one delivery id
_ACCEPTED_DISPOSITION = struct.Struct(">IBBH3sBBBBBIBIB3s2s")


class ProtocolViolation(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


@dataclass
class ServerContext:
    """What every connection of one server shares."""

    broker: Broker
    authorizer: Authorizer
    max_frame_size: int = 65536
    max_message_size: int = 1048576
    advertised_idle_timeout_ms: int | None = 240_000
    handshake_timeout: float = 30.0
    container_id: str = field(default_factory=lambda: f"hubshift-emulator-{uuid.uuid4()}")
    connections: set[AmqpConnection] = field(default_factory=set)


def _address(terminus: object) -> str | None:
    if isinstance(terminus, Described) and isinstance(terminus.value, list) and terminus.value:
        address = terminus.value[0]
        if isinstance(address, bytes):
            return address.decode("utf-8", "replace")
        if isinstance(address, str):
            return address
    return None


def _selector(source: object) -> str | None:
    """The selector expression of a receiver's source filter, by symbolic or numeric descriptor."""
    if not isinstance(source, Described) or not isinstance(source.value, list) or len(source.value) < 8:
        return None
    filters = source.value[7]
    if not isinstance(filters, dict):
        return None
    for value in filters.values():
        if isinstance(value, Described) and (
            value.descriptor == SELECTOR_FILTER or value.descriptor == SELECTOR_FILTER_CODE
        ):
            expression = value.value
            if isinstance(expression, bytes):
                return expression.decode("utf-8", "replace")
            if isinstance(expression, str):
                return expression
    return None


class Session:
    def __init__(self, connection: AmqpConnection, local_channel: int, remote_channel: int) -> None:
        self.connection = connection
        self.local_channel = local_channel
        self.remote_channel = remote_channel
        self.links: dict[int, Link] = {}
        self._local_handles: set[int] = set()
        self.next_delivery_id = 0
        self.next_outgoing_id = 0
        self.next_incoming_id = 0
        self.reply_links: dict[str, ReplyLink] = {}
        self.pending_replies: dict[str, list[bytes]] = {}

    def allocate_handle(self) -> int:
        handle = 0
        while handle in self._local_handles:
            handle += 1
        self._local_handles.add(handle)
        return handle

    def release_handle(self, handle: int) -> None:
        self._local_handles.discard(handle)

    def send(self, code: int, fields: list[Any], payload: Buffer = b"") -> None:
        self.connection.write(frames.encode_frame(self.local_channel, code, fields, payload))

    def flow_fields(self) -> list[Any]:
        return [
            UInt(self.next_incoming_id & 0xFFFFFFFF),
            UInt(SESSION_WINDOW),
            UInt(self.next_outgoing_id & 0xFFFFFFFF),
            UInt(SESSION_WINDOW),
        ]

    def send_reply(self, node: str, message: bytes) -> None:
        link = self.reply_links.get(node)
        if link is None or link.detached:
            self.pending_replies.setdefault(node, []).append(message)
            return
        link.send_message(message)

    def close_links(self) -> None:
        for link in list(self.links.values()):
            link.release()
        self.links.clear()


class Link:
    """A link as attached by the peer; `role_is_receiver` is OUR role on it."""

    role_is_receiver: bool = False

    def __init__(self, session: Session, name: Any, remote_handle: int, source: Any, target: Any) -> None:
        self.session = session
        self.connection = session.connection
        self.name = name
        self.remote_handle = remote_handle
        self.handle = session.allocate_handle()
        self.source = source
        self.target = target
        self.detached = False
        self.delivery_count = 0
        self.credit = 0
        # the entity an event link reads or writes (and its address), whose token must stay valid while
        # it is attached
        self.entity: Entity | None = None
        self.address = ""

    # our reply to the peer's attach
    def attach_fields(self, peer_fields: list[Any]) -> list[Any]:
        return [
            self.name,
            UInt(self.handle),
            self.role_is_receiver,
            peer_fields[3] if peer_fields[3] is not None else UByte(2),
            UByte(0),
            self.source,
            self.target,
            None,
            None,
            None if self.role_is_receiver else UInt(self.delivery_count),
            ULong(self.connection.context.max_message_size),
            None,
            None,
            {frames.TRACKING_ID: str(uuid.uuid4())},
        ]

    def on_flow(self, fields: list[Any]) -> None:
        if fields[9]:  # echo
            self.send_flow()

    def send_flow(self) -> None:
        session = self.session
        session.send(
            frames.FLOW,
            [
                *session.flow_fields(),
                UInt(self.handle),
                UInt(self.delivery_count & 0xFFFFFFFF),
                UInt(max(self.credit, 0)),
                None,
                False,
                False,
                None,
            ],
        )

    def on_transfer(self, fields: list[Any], payload: memoryview) -> None:
        raise ProtocolViolation("amqp:not-allowed", "transfer on a link where the emulator is the sender")

    def detach(self, error: Described | None) -> None:
        """Detach and close from our side (the peer answers with its own detach)."""
        if self.detached:
            return
        self.detached = True
        self.session.send(frames.DETACH, [UInt(self.handle), True, error])
        self.release()

    def on_peer_detach(self, closed: bool) -> None:
        if not self.detached:
            self.detached = True
            self.session.send(frames.DETACH, [UInt(self.handle), bool(closed), None])
        self.release()
        self.session.release_handle(self.handle)

    def release(self) -> None:
        """Give back what the link holds outside the connection (receivers, listeners)."""


class IncomingDeliveries(Link):
    """A link on which the peer sends messages to us, reassembled across transfer frames."""

    role_is_receiver = True

    def __init__(self, session: Session, name: Any, remote_handle: int, source: Any, target: Any) -> None:
        super().__init__(session, name, remote_handle, source, target)
        self._chunks: list[memoryview] | None = None
        self._size = 0
        self._delivery_id = 0
        self._message_format = 0
        self._settled = False

    def on_transfer(self, fields: list[Any], payload: memoryview) -> None:
        if self._chunks is None:
            if fields[1] is None:
                raise ProtocolViolation(
                    "amqp:session:invalid-field", "first transfer of a delivery has no id"
                )
            self._chunks = []
            self._size = 0
            self._delivery_id = int(fields[1])
            self._message_format = int(fields[3] or 0)
            self._settled = bool(fields[4])
        if fields[4]:
            self._settled = True
        if fields[9]:  # aborted: nothing to settle
            self._chunks = None
            return
        self._size += len(payload)
        if self._size <= self.connection.context.max_message_size:
            self._chunks.append(payload)
        if fields[5]:  # more
            return
        chunks = self._chunks
        self._chunks = None
        self.delivery_count += 1
        self.credit -= 1
        if self._size > self.connection.context.max_message_size:
            self.settle(
                frames.rejected_outcome(
                    "amqp:link:message-size-exceeded",
                    f"The received message (delivery-id:{self._delivery_id}, size:{self._size} bytes) "
                    f"exceeds the limit ({self.connection.context.max_message_size} bytes) currently allowed "
                    "on the link.",
                )
            )
        else:
            body: Buffer = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            self.on_message(self._message_format, body)
        if self.credit < PUBLISHER_CREDIT // 2:
            self.credit = PUBLISHER_CREDIT
            self.send_flow()

    def on_message(self, message_format: int, payload: Buffer) -> None:
        raise NotImplementedError

    def settle(self, state: Described | None) -> None:
        """Settle the current delivery (unless the peer sent it settled)."""
        if self._settled:
            return
        if state is None:
            session = self.session
            self.connection.write(
                _ACCEPTED_DISPOSITION.pack(
                    31,
                    2,
                    0,
                    session.local_channel,
                    b"\x00\x53\x15",
                    0xC0,
                    18,
                    6,
                    0x41,
                    0x70,
                    self._delivery_id,
                    0x70,
                    self._delivery_id,
                    0x41,
                    b"\x00\x53\x24",
                    b"\x45\x40",
                )
            )
            return
        self.session.send(
            frames.DISPOSITION, [True, UInt(self._delivery_id), UInt(self._delivery_id), True, state, None]
        )


class PublisherLink(IncomingDeliveries):
    """Events from a producer, to the hub (routed) or to one partition."""

    def __init__(
        self,
        session: Session,
        name: Any,
        remote_handle: int,
        source: Any,
        target: Any,
        hub: Hub,
        partition: PartitionLog | None,
    ) -> None:
        super().__init__(session, name, remote_handle, source, target)
        self.hub = hub
        self.partition = partition

    def on_message(self, message_format: int, payload: Buffer) -> None:
        try:
            publication = unpack_publication(message_format, payload)
        except DecodeError as exc:
            self.settle(
                frames.rejected_outcome("amqp:decode-error", f"The message could not be decoded: {exc}")
            )
            return
        try:
            self.connection.context.broker.publish(self.hub, self.partition, publication)
        except Exception as exc:
            LOG.exception("storing a delivery failed")
            self.settle(
                frames.rejected_outcome("amqp:internal-error", f"The event could not be stored: {exc}")
            )
            return
        self.settle(None)


class RequestLink(IncomingDeliveries):
    """Requests to `$cbs` or `$management`; replies go out on the same session's link from that node."""

    def __init__(
        self, session: Session, name: Any, remote_handle: int, source: Any, target: Any, node: str
    ) -> None:
        super().__init__(session, name, remote_handle, source, target)
        self.node = node

    def on_message(self, message_format: int, payload: Buffer) -> None:
        try:
            request = parse_request(payload)
        except DecodeError as exc:
            self.settle(
                frames.rejected_outcome("amqp:decode-error", f"The request could not be decoded: {exc}")
            )
            return
        self.settle(None)
        status, description, body = self.connection.answer(self.node, request)
        self.session.send_reply(self.node, encode_reply(request.message_id, status, description, body))


class OutgoingLink(Link):
    """A link on which we send: replies, or events to a consumer."""

    def on_flow(self, fields: list[Any]) -> None:
        peer_count = fields[5]
        link_credit = fields[6]
        if link_credit is not None:
            self.credit = (
                (int(peer_count) if peer_count is not None else 0) + int(link_credit) - self.delivery_count
            )
        super().on_flow(fields)

    def next_delivery_id(self) -> int:
        session = self.session
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) & 0xFFFFFFFF
        return delivery_id


class ReplyLink(OutgoingLink):
    def __init__(
        self, session: Session, name: Any, remote_handle: int, source: Any, target: Any, node: str
    ) -> None:
        super().__init__(session, name, remote_handle, source, target)
        self.node = node

    def send_message(self, message: bytes) -> None:
        delivery_id = self.next_delivery_id()
        self.session.next_outgoing_id += 1
        self.delivery_count += 1
        self.credit -= 1
        self.session.send(
            frames.TRANSFER,
            [UInt(self.handle), UInt(delivery_id), _I.pack(delivery_id), UInt(0), True, False],
            message,
        )


class ConsumerLink(OutgoingLink):
    """Events of one partition to one receiver, pre-settled, as far as the receiver's credit goes."""

    def __init__(
        self,
        session: Session,
        name: Any,
        remote_handle: int,
        source: Any,
        target: Any,
        *,
        hub: Hub,
        consumer_group: str,
        partition: PartitionLog,
        next_sequence: int,
        owner_level: int | None,
        runtime_metric: bool,
    ) -> None:
        super().__init__(session, name, remote_handle, source, target)
        self.hub = hub
        self.consumer_group = consumer_group
        self.partition = partition
        self.next_sequence = next_sequence
        self._owner_level = owner_level
        self.runtime_metric = runtime_metric
        self._pump_scheduled = False
        self._registered = False
        self._drain = False
        # doff, type, channel, transfer descriptor, list8 of 25 bytes and 11 fields, handle, delivery-id code
        self._head_prefix = b"".join(
            (
                b"\x02\x00",
                session.local_channel.to_bytes(2, "big"),
                b"\x00\x53\x14\xc0\x19\x0b\x70",
                _I.pack(self.handle),
                b"\x70",
            )
        )

    @property
    def owner_level(self) -> int | None:
        return self._owner_level

    def attach_fields(self, peer_fields: list[Any]) -> list[Any]:
        fields = super().attach_fields(peer_fields)
        fields[3] = UByte(1)  # settled: the SDK never settles received events
        if self.runtime_metric:
            fields[11] = [RUNTIME_METRIC]
        return fields

    def register(self) -> None:
        self.connection.context.broker.attach_receiver(
            self.hub, self.consumer_group, self.partition.partition_id, self
        )
        self._registered = True
        self.partition.listeners.add(self.wake)
        self.connection.consumers.add(self)

    def release(self) -> None:
        if self._registered:
            self._registered = False
            self.connection.context.broker.detach_receiver(
                self.hub, self.consumer_group, self.partition.partition_id, self
            )
        self.partition.listeners.discard(self.wake)
        self.connection.consumers.discard(self)

    def steal(self, condition: str, description: str) -> None:
        self._registered = False  # the broker already removed it
        self.detach(frames.amqp_error(condition, description))
        self.connection.flush()

    def on_flow(self, fields: list[Any]) -> None:
        super().on_flow(fields)
        self._drain = bool(fields[8])
        self.wake()

    def wake(self) -> None:
        if not self._pump_scheduled and self.credit > 0 and not self.detached:
            self._pump_scheduled = True
            self.connection.loop.call_soon(self.pump)

    def pump(self) -> None:
        """Send what the partition holds past `next_sequence`, up to the credit; yields to the loop
        after about a megabyte so one busy receiver cannot starve the others."""
        self._pump_scheduled = False
        connection = self.connection
        if self.detached or connection.closing or connection.paused:
            return
        log = self.partition
        if self.next_sequence < log.beginning_sequence_number:
            self.next_sequence = log.beginning_sequence_number
        available = log.next_sequence_number - self.next_sequence
        if self.credit <= 0 or available <= 0:
            if self._drain and self.credit > 0:
                self.delivery_count += self.credit
                self.credit = 0
                self._drain = False
                self.send_flow()
                connection.flush()
            return
        messages, header_lengths = log.read(
            self.next_sequence, min(self.credit, available), MAX_BYTES_PER_PUMP
        )
        metric = metric_entries = b""
        if self.runtime_metric:
            state = log.state()
            metric_entries = runtime_metric_entries(
                state.last_enqueued_sequence_number,
                state.last_enqueued_offset,
                state.last_enqueued_time_ms,
                connection.context.broker.now_ms(),
            )
            metric = runtime_metric_section(metric_entries)
        session = self.session
        delivery_id = session.next_delivery_id
        prefix = self._head_prefix
        pack = _TRANSFER_HEAD.pack
        max_frame = connection.remote_max_frame_size
        parts: list[Buffer] = []
        append = parts.append
        for message, header_length in zip(messages, header_lengths, strict=True):
            # the delivery annotations go right after the header: the runtime metric, merged with the
            # producer's own when the event carries some (they then end at `rest`)
            section, rest = metric, header_length
            if metric and message.startswith(DELIVERY_ANNOTATIONS_PREFIX, header_length):
                section, rest = merge_delivery_annotations(metric_entries, message, header_length)
            frame_size = _TRANSFER_HEAD_SIZE + header_length + len(section) + len(message) - rest
            if frame_size > max_frame:
                payload = message[:header_length] + section + message[rest:] if section else message
                parts.extend(self._fragments(delivery_id, payload, max_frame))
            else:
                append(pack(frame_size, prefix, delivery_id, _TAG_PREFIX, delivery_id, _TRANSFER_TAIL))
                if section:
                    if rest:
                        view = memoryview(message)
                        if header_length:
                            append(view[:header_length])
                        append(section)
                        append(view[rest:])
                    else:
                        append(section)
                        append(message)
                else:
                    append(message)
            delivery_id = (delivery_id + 1) & 0xFFFFFFFF
        count = len(messages)
        session.next_delivery_id = delivery_id
        session.next_outgoing_id += count
        self.next_sequence += count
        self.delivery_count += count
        self.credit -= count
        connection.write_many(parts)
        connection.flush()
        if (self.credit > 0 and self.next_sequence < log.next_sequence_number) or self._drain:
            self.wake()

    def _fragments(self, delivery_id: int, payload: bytes, max_frame: int) -> list[bytes]:
        chunk_size = max(max_frame - 64, 256)
        chunks = [payload[start : start + chunk_size] for start in range(0, len(payload), chunk_size)]
        tag = _I.pack(delivery_id)
        return [
            frames.encode_frame(
                self.session.local_channel,
                frames.TRANSFER,
                [UInt(self.handle), UInt(delivery_id), tag, UInt(0), True, index < len(chunks) - 1],
                chunk,
            )
            for index, chunk in enumerate(chunks)
        ]


# --- start positions -----------------------------------------------------------------------------------


def resolve_start(log: PartitionLog, selector: str | None) -> int:
    """The first sequence number a receiver gets, from its selector filter (offset, sequence number or
    enqueued time; `>` or `>=`). `-1` is the beginning and `@latest` what comes next, for either operator;
    a position past the end waits for new events."""
    if selector is None:
        return log.beginning_sequence_number
    field_name, operator, value = _parse_selector(selector)
    inclusive = operator == ">="
    if field_name == "x-opt-offset":
        if value == "@latest":
            return log.next_sequence_number
        number = _number(value, selector)
        if number < 0:
            return log.beginning_sequence_number
        start = log.sequence_after_offset(number, inclusive)
    elif field_name == "x-opt-sequence-number":
        number = _number(value, selector)
        start = number if inclusive else number + 1
    elif field_name == "x-opt-enqueued-time":
        start = log.sequence_after_time(_number(value, selector), inclusive)
    else:
        raise ReceiverRefused("com.microsoft:argument-error", f"Unsupported filter field in '{selector}'.")
    return max(log.beginning_sequence_number, min(start, log.next_sequence_number))


def _parse_selector(selector: str) -> tuple[str, str, str]:
    text = selector.strip()
    prefix = "amqp.annotation."
    if not text.lower().startswith(prefix):
        raise ReceiverRefused("com.microsoft:argument-error", f"Unsupported selector '{selector}'.")
    rest = text[len(prefix) :]
    for operator in (">=", ">", "="):
        field_name, found, value = rest.partition(operator)
        if found:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == "'":
                value = value[1:-1]
            return field_name.strip().lower(), ">=" if operator == "=" else operator, value
    raise ReceiverRefused("com.microsoft:argument-error", f"Unsupported selector '{selector}'.")


def _number(value: str, selector: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ReceiverRefused(
            "com.microsoft:argument-error", f"The value '{value}' in the filter '{selector}' is not a number."
        ) from None


# --- the connection -------------------------------------------------------------------------------------


class AmqpConnection(asyncio.Protocol):
    def __init__(self, context: ServerContext, loop: asyncio.AbstractEventLoop) -> None:
        self.context = context
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closing = False
        self.paused = False
        self.remote_max_frame_size = 1 << 20
        self.hostname = "localhost"
        self.consumers: set[ConsumerLink] = set()
        self._buffer = bytearray()
        self._needed = 0
        self._expect_header = True
        self._phase = "header"  # header -> sasl -> amqp-header -> open-wait -> open
        self._sessions: dict[int, Session] = {}
        self._out: list[Buffer] = []
        self._flush_scheduled = False
        self._authorized: list[tuple[Entity, int]] = []
        self._expiry: asyncio.TimerHandle | None = None
        # the handshake deadline until `open`, then the heartbeat (when the peer asked for one)
        self._timer: asyncio.TimerHandle | None = None
        self._last_write = time.monotonic()

    # --- asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = str(transport.get_extra_info("peername"))
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _enable_keepalive(sock)
        self.context.connections.add(self)
        self._timer = self.loop.call_later(self.context.handshake_timeout, self._check_handshake)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.context.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._expiry is not None:
            self._expiry.cancel()
        for session in self._sessions.values():
            session.close_links()
        self._sessions.clear()
        self._out.clear()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for consumer in list(self.consumers):
            consumer.wake()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._needed:
                return
            data = bytes(self._buffer)
            self._buffer = bytearray()
        try:
            consumed = self._process(data)
            if consumed < len(data) and not self.closing:
                self._buffer = bytearray(data[consumed:])
        except ProtocolViolation as exc:
            self.fail(exc.condition, exc.description)
        except DecodeError as exc:
            self.fail("amqp:decode-error", str(exc))
        except Exception as exc:
            LOG.exception("connection %s: unexpected error", self.peer)
            self.fail("amqp:internal-error", f"{type(exc).__name__}: {exc}")
        self.flush()

    def eof_received(self) -> bool | None:
        return False

    # --- writing ---------------------------------------------------------------------------------------

    def write(self, data: Buffer) -> None:
        if self.closing:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def write_many(self, parts: list[Buffer]) -> None:
        if not self.closing:
            self._out.extend(parts)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None or self.transport.is_closing():
            self._out.clear()
            return
        out = self._out
        self._out = []
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        self._last_write = time.monotonic()

    def fail(self, condition: str, description: str) -> None:
        """Close this connection because of the peer's bytes, telling it why when it speaks AMQP."""
        if self.closing:
            return
        LOG.info("connection %s closed: %s %s", self.peer, condition, description)
        if self._phase == "open":
            self.write(frames.encode_frame(0, frames.CLOSE, [frames.amqp_error(condition, description)]))
        self.close_transport()

    def close_transport(self) -> None:
        self.flush()
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    # --- framing ---------------------------------------------------------------------------------------

    def _process(self, data: bytes) -> int:
        pos = 0
        end = len(data)
        view = memoryview(data)
        unpack = frames.FRAME_HEADER.unpack_from
        while pos < end and not self.closing:
            if self._expect_header:
                if end - pos < 8:
                    if not b"AMQP".startswith(data[pos : pos + 4]):
                        self._bad_header(data[pos:end])
                        return end
                    self._needed = 8
                    return pos
                self._on_header(data[pos : pos + 8])
                pos += 8
                continue
            if end - pos < 8:
                self._needed = 8
                return pos
            size, doff, frame_type, channel = unpack(data, pos)
            limit = self.context.max_frame_size if self._phase == "open" else 65536
            if size < 8 or size > limit or doff < 2 or doff * 4 > size:
                raise ProtocolViolation(
                    "amqp:connection:framing-error", f"bad frame header (size {size}, data offset {doff})"
                )
            if end - pos < size:
                self._needed = size
                return pos
            body = view[pos + doff * 4 : pos + size]
            pos += size
            if frame_type == frames.FRAME_TYPE_AMQP:
                if self._phase not in ("open-wait", "open"):
                    raise ProtocolViolation(
                        "amqp:connection:framing-error", "AMQP frame before the handshake"
                    )
                if len(body):
                    self._on_performative(channel, body)
            elif frame_type == frames.FRAME_TYPE_SASL and self._phase == "sasl":
                self._on_sasl(body)
            else:
                raise ProtocolViolation(
                    "amqp:connection:framing-error", f"unexpected frame type {frame_type}"
                )
        return pos

    def _bad_header(self, received: Buffer) -> None:
        LOG.info("connection %s: not an AMQP 1.0 header: %r", self.peer, bytes(received[:8]))
        if self.transport is not None:
            self.transport.write(frames.AMQP_HEADER)
        self.close_transport()

    def _on_header(self, header: bytes) -> None:
        self._expect_header = False
        if self._phase == "header" and header == frames.SASL_HEADER:
            self._phase = "sasl"
            self.write(frames.SASL_HEADER)
            self.write(
                frames.encode_frame(
                    0,
                    frames.SASL_MECHANISMS,
                    [Array("symbol", (Symbol("ANONYMOUS"), Symbol("PLAIN"), Symbol("EXTERNAL")))],
                    frame_type=frames.FRAME_TYPE_SASL,
                )
            )
        elif self._phase in ("header", "amqp-header") and header == frames.AMQP_HEADER:
            self._phase = "open-wait"
            self.write(frames.AMQP_HEADER)
        else:
            self._bad_header(header)

    def _on_sasl(self, body: memoryview) -> None:
        code, _fields, _ = frames.decode_performative(body)
        if code != frames.SASL_INIT:
            raise ProtocolViolation("amqp:connection:framing-error", "expected sasl-init")
        # Authorization happens per entity through $cbs, so every mechanism is accepted here.
        self.write(
            frames.encode_frame(0, frames.SASL_OUTCOME, [UByte(0), None], frame_type=frames.FRAME_TYPE_SASL)
        )
        self._phase = "amqp-header"
        self._expect_header = True

    def _check_handshake(self) -> None:
        if self._phase != "open" and not self.closing:
            LOG.info(
                "connection %s: no AMQP open within %ss, dropped", self.peer, self.context.handshake_timeout
            )
            self.abort()

    # --- performatives -----------------------------------------------------------------------------------

    def _on_performative(self, channel: int, body: memoryview) -> None:
        code, fields, payload_start = frames.decode_performative(body)
        if code == frames.TRANSFER:
            session = self._sessions.get(channel)
            if session is None:
                return
            session.next_incoming_id += 1
            link = session.links.get(fields[0])
            if link is None or link.detached:
                return
            link.on_transfer(fields, body[payload_start:])
        elif code == frames.FLOW:
            self._on_flow(channel, fields)
        elif code == frames.DISPOSITION:
            return  # we only send pre-settled deliveries
        elif code == frames.ATTACH:
            self._on_attach(channel, fields)
        elif code == frames.DETACH:
            session = self._sessions.get(channel)
            link = session.links.pop(fields[0], None) if session is not None else None
            if link is not None:
                link.on_peer_detach(bool(fields[1]))
        elif code == frames.BEGIN:
            self._on_begin(channel, fields)
        elif code == frames.END:
            ended = self._sessions.pop(channel, None)
            if ended is not None:
                ended.close_links()
                self.write(frames.encode_frame(ended.local_channel, frames.END, [None]))
        elif code == frames.OPEN:
            self._on_open(fields)
        elif code == frames.CLOSE:
            self.write(frames.encode_frame(0, frames.CLOSE, [None]))
            self.close_transport()
        else:
            raise ProtocolViolation("amqp:not-implemented", f"unexpected performative 0x{code:02x}")

    def _on_open(self, fields: list[Any]) -> None:
        if self._phase == "open":
            raise ProtocolViolation("amqp:illegal-state", "second open on one connection")
        self._phase = "open"
        if isinstance(fields[1], str) and fields[1]:
            self.hostname = fields[1]
        max_frame = fields[2]
        if isinstance(max_frame, int) and max_frame >= 512:
            self.remote_max_frame_size = min(int(max_frame), 1 << 24)
        idle = self.context.advertised_idle_timeout_ms
        self.write(
            frames.encode_frame(
                0,
                frames.OPEN,
                [
                    self.context.container_id,
                    None,
                    UInt(self.context.max_frame_size),
                    UShort(65535),
                    UInt(idle) if idle else None,
                    None,
                    None,
                    None,
                    None,
                    {Symbol("product"): "hubshift-emulator"},
                ],
            )
        )
        peer_idle = fields[4]
        if isinstance(peer_idle, int) and peer_idle > 0:
            self._schedule_heartbeat(peer_idle / 2000)

    def _schedule_heartbeat(self, interval: float) -> None:
        """Empty frames at half the peer's idle timeout, so it never closes an idle connection."""

        def beat() -> None:
            if self.closing:
                return
            if time.monotonic() - self._last_write >= interval / 2:
                self.write(frames.EMPTY_FRAME)
            self._timer = self.loop.call_later(interval, beat)

        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(interval, beat)

    def _on_begin(self, channel: int, fields: list[Any]) -> None:
        if channel in self._sessions:
            raise ProtocolViolation("amqp:illegal-state", f"begin on channel {channel} which is in use")
        used = {session.local_channel for session in self._sessions.values()}
        local = 0
        while local in used:
            local += 1
        session = Session(self, local, channel)
        if isinstance(fields[1], int):
            session.next_incoming_id = int(fields[1])
        self._sessions[channel] = session
        self.write(
            frames.encode_frame(
                local,
                frames.BEGIN,
                [
                    UShort(channel),
                    UInt(0),
                    UInt(SESSION_WINDOW),
                    UInt(SESSION_WINDOW),
                    UInt(HANDLE_MAX),
                    None,
                    None,
                    None,
                ],
            )
        )

    def _on_flow(self, channel: int, fields: list[Any]) -> None:
        session = self._sessions.get(channel)
        if session is None:
            return
        handle = fields[4]
        if handle is None:
            if fields[9]:
                session.send(
                    frames.FLOW, [*session.flow_fields(), None, None, None, None, False, False, None]
                )
            return
        link = session.links.get(handle)
        if link is not None and not link.detached:
            link.on_flow(fields)

    # --- attach -------------------------------------------------------------------------------------------

    def _on_attach(self, channel: int, fields: list[Any]) -> None:
        session = self._sessions.get(channel)
        if session is None:
            return
        name, remote_handle, peer_is_receiver = fields[0], fields[1], bool(fields[2])
        source, target = fields[5], fields[6]
        if not isinstance(remote_handle, int):
            raise ProtocolViolation("amqp:invalid-field", "attach without a handle")
        stale = session.links.pop(remote_handle, None)
        if stale is not None:
            stale.release()
            session.release_handle(stale.handle)
        try:
            link = self._create_link(session, fields, name, remote_handle, peer_is_receiver, source, target)
        except ReceiverRefused as refusal:
            self._refuse(session, fields, peer_is_receiver, refusal.condition, refusal.description)
            return
        session.links[remote_handle] = link
        if isinstance(link, PublisherLink | ConsumerLink):
            link.address = _address(target if isinstance(link, PublisherLink) else source) or ""
            link.entity = parse_entity(link.address)
        if isinstance(link, ConsumerLink):
            try:
                link.register()
            except ReceiverRefused as refusal:
                del session.links[remote_handle]
                session.release_handle(link.handle)
                self._refuse(session, fields, peer_is_receiver, refusal.condition, refusal.description)
                return
        session.send(frames.ATTACH, link.attach_fields(fields))
        if isinstance(link, IncomingDeliveries):
            link.delivery_count = int(fields[9]) if isinstance(fields[9], int) else 0
            link.credit = PUBLISHER_CREDIT
            link.send_flow()
        if isinstance(link, ReplyLink):
            session.reply_links[link.node] = link
            for message in session.pending_replies.pop(link.node, []):
                link.send_message(message)

    def _refuse(
        self, session: Session, fields: list[Any], peer_is_receiver: bool, condition: str, description: str
    ) -> None:
        """The service's refusal: an attach with a null terminus, then a closing detach with the error."""
        handle = session.allocate_handle()
        reply = [
            fields[0],
            UInt(handle),
            not peer_is_receiver,
            fields[3],
            fields[4],
            None if peer_is_receiver else fields[5],
            fields[6] if peer_is_receiver else None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        ]
        session.send(frames.ATTACH, reply)
        session.send(frames.DETACH, [UInt(handle), True, frames.amqp_error(condition, description)])
        session.release_handle(handle)

    def _create_link(
        self,
        session: Session,
        fields: list[Any],
        name: Any,
        remote_handle: int,
        peer_is_receiver: bool,
        source: Any,
        target: Any,
    ) -> Link:
        address = _address(source if peer_is_receiver else target)
        if address is None:
            raise ReceiverRefused("amqp:invalid-field", "The link has no address.")
        node = address.lower()
        if node in (CBS_NODE, MANAGEMENT_NODE):
            if peer_is_receiver:
                return ReplyLink(session, name, remote_handle, source, target, node)
            return RequestLink(session, name, remote_handle, source, target, node)
        entity = parse_entity(address)
        hub = self.context.broker.find_hub(entity.path[0]) if entity.path else None
        if hub is None:
            raise ReceiverRefused("amqp:not-found", f"The messaging entity '{address}' could not be found.")
        if self.context.authorizer.enforcing and not self._is_authorized(entity):
            raise ReceiverRefused(
                "amqp:unauthorized-access",
                f"Unauthorized access to '{address}': put a valid token on $cbs first.",
            )
        rest = entity.path[1:]
        if not peer_is_receiver:
            partition: PartitionLog | None = None
            if rest:
                if len(rest) != 2 or rest[0] != "partitions":
                    raise ReceiverRefused(
                        "amqp:not-found", f"The messaging entity '{address}' could not be found."
                    )
                partition = self._partition(hub, rest[1])
            return PublisherLink(session, name, remote_handle, source, target, hub, partition)
        if len(rest) != 4 or rest[0] != "consumergroups" or rest[2] != "partitions":
            raise ReceiverRefused("amqp:not-found", f"The messaging entity '{address}' could not be found.")
        consumer_group = rest[1]
        if not hub.has_consumer_group(consumer_group):
            raise ReceiverRefused(
                "amqp:not-found",
                f"The messaging entity '{hub.name}/ConsumerGroups/{consumer_group}' could not be found.",
            )
        log = self._partition(hub, rest[3])
        properties = fields[13] if isinstance(fields[13], dict) else {}
        epoch = properties.get(EPOCH)
        owner_level = int(epoch) if isinstance(epoch, int) and not isinstance(epoch, bool) else None
        desired = fields[12]
        desired_list = desired.items if isinstance(desired, Array) else desired
        runtime_metric = (
            isinstance(desired_list, list | tuple) and RUNTIME_METRIC in desired_list
        ) or desired == RUNTIME_METRIC
        start = resolve_start(log, _selector(source))
        return ConsumerLink(
            session,
            name,
            remote_handle,
            source,
            target,
            hub=hub,
            consumer_group=consumer_group,
            partition=log,
            next_sequence=start,
            owner_level=owner_level,
            runtime_metric=runtime_metric,
        )

    @staticmethod
    def _partition(hub: Hub, partition_id: str) -> PartitionLog:
        log = hub.partition(partition_id)
        if log is None:
            raise ReceiverRefused(
                "com.microsoft:argument-out-of-range",
                "The specified partition is invalid for an EventHub partition sender or receiver. It "
                f"should be between 0 and {len(hub.partitions) - 1}.",
            )
        return log

    # --- $cbs and $management -----------------------------------------------------------------------------

    def _is_authorized(self, entity: Entity) -> bool:
        now_ms = self.context.broker.now_ms()
        return any(granted.covers(entity) and expiry > now_ms for granted, expiry in self._authorized)

    def answer(self, node: str, request: RequestMessage) -> tuple[int, str, Any]:
        if node == MANAGEMENT_NODE:
            reply = handle_management_request(
                request, self.context.broker, self.context.authorizer, self.hostname
            )
            return reply.status_code, reply.description, reply.body
        return self._put_token(request)

    def _put_token(self, request: RequestMessage) -> tuple[int, str, Any]:
        properties = request.application_properties
        if properties.get("operation") != "put-token":
            return 400, f"The operation '{properties.get('operation')}' is not supported on $cbs.", None
        audience = properties.get("name")
        if not isinstance(audience, str):
            return 400, "The put-token request has no audience 'name'.", None
        entity = parse_entity(audience)
        if entity.path:
            hub = self.context.broker.find_hub(entity.path[0])
            rest = entity.path[1:]
            group_missing = (
                hub is not None
                and len(rest) >= 2
                and rest[0] == "consumergroups"
                and not hub.has_consumer_group(rest[1])
            )
            if hub is None or group_missing:
                return 404, f"The messaging entity '{audience}' could not be found.", None
        verdict = self.context.authorizer.verify(request.body, audience, properties.get("type"))
        if verdict.accepted:
            now_ms = self.context.broker.now_ms()
            if any(granted.covers(entity) and now_ms < expiry for granted, expiry in self._authorized):
                LOG.info("connection %s: token for %s renewed", self.peer, audience)
            self._authorized = [(g, e) for g, e in self._authorized if e > now_ms]
            self._authorized.append((entity, verdict.expires_at_ms))
            self._watch_expiry()
        else:
            LOG.info("connection %s: token for %s refused: %s", self.peer, audience, verdict.description)
        return verdict.status_code, verdict.description, None

    def _watch_expiry(self) -> None:
        """Detach, when its token expires unrenewed, every event link the token allowed, as the service
        does; checked at the earliest expiry of the grants held (far-off ones are not watched)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if not self.context.authorizer.enforcing or self.closing:
            return
        now_ms = self.context.broker.now_ms()
        pending = [expiry for _, expiry in self._authorized if now_ms < expiry < now_ms + WATCHED_EXPIRY_MS]
        if pending:
            self._expiry = self.loop.call_later((min(pending) - now_ms) / 1000 + 0.01, self._expire_links)

    def _expire_links(self) -> None:
        self._expiry = None
        if self.closing:
            return
        for session in list(self._sessions.values()):
            for link in list(session.links.values()):
                if link.entity is None or link.detached or self._is_authorized(link.entity):
                    continue
                LOG.info("connection %s: the token for %s expired: link detached", self.peer, link.address)
                link.detach(
                    frames.amqp_error(
                        "amqp:unauthorized-access",
                        "The token has expired; put a new one on $cbs before its expiration time.",
                    )
                )
        self.flush()
        self._watch_expiry()


def _enable_keepalive(sock: socket.socket) -> None:
    """Find peers that vanished without a FIN (half-open connections) within about a minute."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:
        pass
