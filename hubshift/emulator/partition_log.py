"""One partition's retained events, in memory: sequence numbers, offsets, enqueued times, and the events
as encoded for delivery.

Sequence numbers start at 0 and never repeat. An offset is the event's byte position in the partition
(the service's convention), carried as a string on the wire (with `geo`, in a form that is not a number, as
a geo-replicated namespace's) and compared as a number. Expired events leave from the front; the beginning
sequence number moves with them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hubshift.emulator.messages import IncomingEvent, offset_text, stamp_event

# AMQP's "not set" timestamp (0001-01-01T00:00:00Z); the SDK maps it to datetime.min.
NEVER_ENQUEUED_MS = -62_135_596_800_000

# Python object overhead per retained event, counted toward the size bound so it bounds real memory.
EVENT_OVERHEAD_BYTES = 160


@dataclass(frozen=True, slots=True)
class StoredEvent:
    sequence_number: int
    offset: int
    enqueued_ms: int
    header_length: int
    message: bytes


@dataclass(frozen=True, slots=True)
class PartitionState:
    """What `$management` reports for a partition."""

    beginning_sequence_number: int
    last_enqueued_sequence_number: int
    last_enqueued_offset: str
    last_enqueued_time_ms: int
    is_empty: bool


class PartitionLog:
    def __init__(self, partition_id: str, max_bytes: int, *, geo: bool = False) -> None:
        self.partition_id = partition_id
        self.max_bytes = max_bytes
        self.geo = geo
        self._messages: list[bytes] = []
        self._header_lengths: list[int] = []
        self._offsets: list[int] = []
        self._enqueued: list[int] = []
        self._head = 0  # index of the first retained event in the lists above
        self.beginning_sequence_number = 0
        self.next_sequence_number = 0
        self.next_offset = 0
        self.last_enqueued_ms = NEVER_ENQUEUED_MS
        self.last_offset = -1
        self.retained_bytes = 0
        self.listeners: set[Callable[[], None]] = set()

    # --- writing ------------------------------------------------------------------------------------

    def append(self, events: Sequence[IncomingEvent], now_ms: int, envelope_key_entry: bytes = b"") -> int:
        """Enqueue events in order; returns the first one's sequence number. Enqueued times never go
        backwards."""
        enqueued_ms = max(now_ms, self.last_enqueued_ms)
        first_sequence = sequence = self.next_sequence_number
        offset = self.next_offset
        messages = self._messages
        offsets = self._offsets
        added_bytes = 0
        for event in events:
            message = stamp_event(event, sequence, offset, enqueued_ms, envelope_key_entry, geo=self.geo)
            messages.append(message)
            self._header_lengths.append(len(event.header))
            offsets.append(offset)
            added_bytes += len(message)
            self.last_offset = offset
            sequence += 1
            offset += len(message)
        if sequence > first_sequence:
            self._enqueued.extend([enqueued_ms] * (sequence - first_sequence))
            self.retained_bytes += added_bytes + EVENT_OVERHEAD_BYTES * (sequence - first_sequence)
            self.next_sequence_number = sequence
            self.next_offset = offset
            self.last_enqueued_ms = enqueued_ms
            self._enforce_size()
            self.notify()
        return first_sequence

    def stored_events(self, first_sequence: int) -> list[StoredEvent]:
        """The retained events from `first_sequence` on, with everything needed to restore them."""
        start = self._head + max(0, first_sequence - self.beginning_sequence_number)
        return [
            StoredEvent(
                self.beginning_sequence_number + index - self._head,
                self._offsets[index],
                self._enqueued[index],
                self._header_lengths[index],
                self._messages[index],
            )
            for index in range(start, len(self._messages))
        ]

    def restore(
        self, events: Sequence[StoredEvent], next_sequence: int, next_offset: int, last_ms: int
    ) -> None:
        """Load events kept across a restart (oldest first) and the partition's counters."""
        for event in events:
            self._messages.append(event.message)
            self._header_lengths.append(event.header_length)
            self._offsets.append(event.offset)
            self._enqueued.append(event.enqueued_ms)
            self.retained_bytes += len(event.message) + EVENT_OVERHEAD_BYTES
        if events:
            self.beginning_sequence_number = events[0].sequence_number
            self.last_offset = events[-1].offset
        else:
            self.beginning_sequence_number = next_sequence
        self.next_sequence_number = next_sequence
        self.next_offset = next_offset
        self.last_enqueued_ms = last_ms
        if next_sequence > 0 and self.last_offset < 0:
            self.last_offset = next_offset - 1
        self._enforce_size()

    def notify(self) -> None:
        for listener in list(self.listeners):
            listener()

    # --- retention ----------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._messages) - self._head

    def _drop_front(self, count: int) -> None:
        end = self._head + count
        for index in range(self._head, end):
            self.retained_bytes -= len(self._messages[index]) + EVENT_OVERHEAD_BYTES
        self._head = end
        self.beginning_sequence_number += count
        if self._head > 1024 and self._head * 2 > len(self._messages):
            del self._messages[: self._head]
            del self._header_lengths[: self._head]
            del self._offsets[: self._head]
            del self._enqueued[: self._head]
            self._head = 0

    def _enforce_size(self) -> None:
        if self.retained_bytes <= self.max_bytes:
            return
        drop = 0
        excess = self.retained_bytes - self.max_bytes
        index = self._head
        # keep the newest event even when it alone exceeds the bound
        while excess > 0 and index < len(self._messages) - 1:
            excess -= len(self._messages[index]) + EVENT_OVERHEAD_BYTES
            index += 1
            drop += 1
        self._drop_front(drop)

    def expire(self, cutoff_ms: int) -> int:
        """Drop events enqueued before `cutoff_ms`; returns how many went."""
        end = bisect_left(self._enqueued, cutoff_ms, self._head)
        dropped = end - self._head
        if dropped:
            self._drop_front(dropped)
        return dropped

    # --- reading ------------------------------------------------------------------------------------

    def state(self) -> PartitionState:
        return PartitionState(
            beginning_sequence_number=self.beginning_sequence_number,
            last_enqueued_sequence_number=self.next_sequence_number - 1,
            last_enqueued_offset=offset_text(self.last_offset, geo=self.geo),
            last_enqueued_time_ms=self.last_enqueued_ms,
            is_empty=self.count == 0,
        )

    def read(self, sequence_number: int, max_count: int, max_bytes: int) -> tuple[list[bytes], list[int]]:
        """Up to `max_count` events from `sequence_number` on (at least one if any), as encoded, and the
        length of each one's header section."""
        start = self._head + (sequence_number - self.beginning_sequence_number)
        end = min(len(self._messages), start + max_count)
        if start >= end:
            return [], []
        messages = self._messages[start:end]
        total = 0
        for index, message in enumerate(messages):
            total += len(message)
            if total > max_bytes and index > 0:
                end = start + index
                messages = messages[:index]
                break
        return messages, self._header_lengths[start:end]

    def sequence_after_offset(self, offset: int, inclusive: bool) -> int:
        """The first sequence number whose offset is > (or >=) `offset`; past the end means "what comes
        next"."""
        find = bisect_left if inclusive else bisect_right
        index = find(self._offsets, offset, self._head)
        return self.beginning_sequence_number + (index - self._head)

    def sequence_after_time(self, enqueued_ms: int, inclusive: bool) -> int:
        find = bisect_left if inclusive else bisect_right
        index = find(self._enqueued, enqueued_ms, self._head)
        return self.beginning_sequence_number + (index - self._head)
