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
