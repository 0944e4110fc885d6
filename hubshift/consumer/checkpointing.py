"""A partition this consumer owns, as plain data: its lease, whether it is being drained, the positions
committed since its last checkpoint, and the decisions about them (pure, `now` passed in):

- `checkpoint_due`: the checkpoint cadence (events and seconds) of one partition;
- `OwnedPartition.to_write`: the position a due checkpoint goes to, the newest committed one whose next
  event's enqueued time is known (the control loop's lag in seconds, docs/observability.md), else the newest;
- `OwnedPartition.final_position`: what a drained or abandoned partition's last checkpoint writes.

The agent (`agent.py`) does the writes these decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from hubshift.consumer.lag import EnqueuedTime
from hubshift.ownership.model import Checkpoint, PartitionLease
from hubshift.spec import CheckpointPolicySpec

# Committed positions kept per partition between checkpoint writes (the candidates to write).
RECENT_COMMITS_KEPT = 32


def checkpoint_due(
    committed: Checkpoint | None,
    checkpointed: Checkpoint,
    events_since: int,
    last_written: float,
    now: float,
    *,
    every_events: int,
    every_seconds: float,
) -> bool:
    """Write a partition's checkpoint when it moved and enough events or enough time went by."""
    if committed is None or committed.sequence_number <= checkpointed.sequence_number:
        return False
    return events_since >= every_events or now - last_written >= every_seconds


def next_enqueued(position: Checkpoint | None, enqueued_time: EnqueuedTime) -> datetime | None:
    """When the event after `position` was enqueued, if known."""
    if position is None or position.consumed_nothing:
        return None
    return enqueued_time(position.sequence_number + 1)


@dataclass
class OwnedPartition:
    """A partition this consumer owns (read, or being drained) and its checkpoint bookkeeping."""

    lease: PartitionLease
    state: Literal["active", "draining"] = "active"
    committed: Checkpoint | None = None  # the newest position the sink committed
    events_since: int = 0  # events committed since the last checkpoint write
    last_written: float = 0.0
    drain_started: float | None = None
    recent: list[Checkpoint] = field(default_factory=list)  # committed since the last write, oldest first
    written_with_next: bool = False  # the written checkpoint carries its neighbour's enqueued time

    def commit(self, position: Checkpoint, events: int) -> None:
        """The sink committed `events` more, up to `position`."""
        self.committed = position
        self.events_since += events
        self.recent.append(position)
        del self.recent[:-RECENT_COMMITS_KEPT]

    def start_drain(self, now: float) -> bool:
        """Mark it draining from `now`; False when it already was."""
        if self.state == "draining":
            return False
        self.state = "draining"
        self.drain_started = now
        return True

    def due(self, now: float, policy: CheckpointPolicySpec) -> bool:
        return checkpoint_due(
            self.committed,
            self.lease.checkpoint,
            self.events_since,
            self.last_written,
            now,
            every_events=policy.every_events,
            every_seconds=policy.every_seconds,
        )

    def to_write(self, enqueued_time: EnqueuedTime) -> tuple[Checkpoint, datetime | None]:
        """The newest committed position whose neighbour's enqueued time is known (usually the newest: the
        receiver reads ahead), else the newest without it."""
        assert self.committed is not None
        for candidate in reversed(self.recent):
            if candidate.sequence_number <= self.lease.checkpoint.sequence_number:
                break
            moment = next_enqueued(candidate, enqueued_time)
            if moment is not None:
                return candidate, moment
        return self.committed, None

    def written(self, position: Checkpoint, next_known: bool, now: float) -> None:
        """A due checkpoint was written at `position` (the lease already carries it)."""
        self.events_since = 0
        self.last_written = now
        self.written_with_next = next_known
        self.recent = [c for c in self.recent if c.sequence_number > position.sequence_number]

    @property
    def completes_checkpoint(self) -> bool:
        """Its written checkpoint still lacks its neighbour's enqueued time: write it again, unmoved, once the
        receiver has that event (a partition that was caught up, or just claimed)."""
        return self.state == "active" and not self.written_with_next

    def final_position(self, drained_at: Checkpoint | None = None) -> Checkpoint | None:
        """The position the last checkpoint writes before the lease is released (where the drain ended,
        else the last commit); None when it is not ahead of the written checkpoint."""
        final = drained_at or self.committed
        if final is not None and final.sequence_number <= self.lease.checkpoint.sequence_number:
            return None
        return final
