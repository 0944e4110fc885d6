"""What Event Hubs says about a hub, as plain data (the management answers, before any decision)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as the service reports it now."""

    partition: str
    beginning: int  # the first sequence number still retained
    last_enqueued: int  # -1 when nothing was ever enqueued
    empty: bool
    last_enqueued_time: float | None = None  # when the last event was enqueued (Unix seconds), if reported
    # the last event's offset when it is a byte position (a number); None otherwise (geo-replication)
    last_enqueued_offset: int | None = None


@dataclass(frozen=True)
class EventAt:
    """Where one event sits in its partition: its sequence number, its offset (an opaque string: a
    geo-replicated namespace's is no number) and when it was enqueued (Unix seconds, if reported)."""

    sequence_number: int
    offset: str
    enqueued_time: float | None


def numeric_offset(value: object) -> int | None:
    """An offset as a byte position, when it is one (a geo-replicated hub's offsets are not)."""
    text = value.decode() if isinstance(value, bytes) else str(value) if value is not None else ""
    return int(text) if text.isdigit() else None
