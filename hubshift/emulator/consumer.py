"""The consumer's side: a link from one partition to one receiver, pre-settled, as far as the receiver's
credit goes, from the start position its selector filter names, under the owner-level rules."""

from __future__ import annotations

import struct

from hubshift.emulator.broker import EmulatedHub, ReceiverRefused
from hubshift.emulator.codec import Buffer, Described, Symbol, UByte, UInt
from hubshift.emulator.links import OutgoingLink
from hubshift.emulator.messages import (
    DELIVERY_ANNOTATIONS_PREFIX,
    merge_delivery_annotations,
    offset_position,
    runtime_metric_entries,
    runtime_metric_section,
)
from hubshift.emulator.partition_log import PartitionLog
from hubshift.emulator.performatives import Attach, Flow, SourceTerminus, Transfer, amqp_error, frame_of
from hubshift.emulator.session import Session

RUNTIME_METRIC = Symbol("com.microsoft:enable-receiver-runtime-metric")
SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_FILTER_CODE = 0x0000468C00000004
MAX_BYTES_PER_PUMP = 1 << 20

_I = struct.Struct(">I")
# transfer frame head for one event: size, then doff/type/channel/descriptor/list/handle as a per-link
# prefix, delivery-id, delivery-tag (the id again) and the constant tail (format 0, settled, not more)
_TRANSFER_HEAD = struct.Struct(">I16sI2sI8s")
_TRANSFER_HEAD_SIZE = _TRANSFER_HEAD.size
_TAG_PREFIX = b"\xa0\x04"
_TRANSFER_TAIL = b"\x43\x41\x42\x40\x40\x40\x40\x40"


class ConsumerLink(OutgoingLink):
    """Events of one partition to one receiver, pre-settled, as far as the receiver's credit goes."""

    def __init__(
        self,
        session: Session,
        attach: Attach,
        *,
        hub: EmulatedHub,
        consumer_group: str,
        partition: PartitionLog,
        next_sequence: int,
        owner_level: int | None,
        runtime_metric: bool,
    ) -> None:
        super().__init__(session, attach)
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

    def attach_reply(self, peer: Attach) -> Attach:
        return (
            super()
            .attach_reply(peer)
            ._replace(
                snd_settle_mode=UByte(1),  # settled: the SDK never settles received events
                offered_capabilities=[RUNTIME_METRIC] if self.runtime_metric else None,
            )
        )

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
        self.detach(amqp_error(condition, description))
        self.connection.flush()

    def on_flow(self, flow: Flow) -> None:
        super().on_flow(flow)
        self._drain = bool(flow.drain)
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
        parts = self._frames(messages, header_lengths)
        count = len(messages)
        session = self.session
        session.next_delivery_id = (session.next_delivery_id + count) & 0xFFFFFFFF
        session.next_outgoing_id += count
        self.next_sequence += count
        self.delivery_count += count
        self.credit -= count
        connection.write_many(parts)
        connection.flush()
        if (self.credit > 0 and self.next_sequence < log.next_sequence_number) or self._drain:
            self.wake()

    def _frames(self, messages: list[bytes], header_lengths: list[int]) -> list[Buffer]:
        """The transfer frames of these stored events, numbered from the session's next delivery id."""
        connection = self.connection
        log = self.partition
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
        delivery_id = self.session.next_delivery_id
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
        return parts

    def _fragments(self, delivery_id: int, payload: bytes, max_frame: int) -> list[bytes]:
        chunk_size = max(max_frame - 64, 256)
        chunks = [payload[start : start + chunk_size] for start in range(0, len(payload), chunk_size)]
        tag = _I.pack(delivery_id)
        return [
            frame_of(
                self.session.local_channel,
                Transfer(
                    handle=UInt(self.handle),
                    delivery_id=UInt(delivery_id),
                    delivery_tag=tag,
                    message_format=UInt(0),
                    settled=True,
                    more=index < len(chunks) - 1,
                ),
                chunk,
            )
            for index, chunk in enumerate(chunks)
        ]


# --- start positions -----------------------------------------------------------------------------------


def selector_of(source: object) -> str | None:
    """The selector expression of a receiver's source filter, by symbolic or numeric descriptor."""
    view = SourceTerminus.view(source)
    if view is None or not isinstance(view.filter, dict):
        return None
    for value in view.filter.values():
        if isinstance(value, Described) and (
            value.descriptor == SELECTOR_FILTER or value.descriptor == SELECTOR_FILTER_CODE
        ):
            expression = value.value
            if isinstance(expression, bytes):
                return expression.decode("utf-8", "replace")
            if isinstance(expression, str):
                return expression
    return None


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
        try:
            position = offset_position(value)
        except ValueError:
            raise ReceiverRefused(
                "com.microsoft:argument-error", f"The offset '{value}' in the filter '{selector}' is invalid."
            ) from None
        if position < 0:
            return log.beginning_sequence_number
        start = log.sequence_after_offset(position, inclusive)
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
