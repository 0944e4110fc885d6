"""The partitions this consumer owns, and the store writes and engine calls for them: claim (and start
reading), checkpoint, drain, release, lose. Used from the ownership agent's thread; the read-only views
(`levels`, `rows`) and the watchdog's `stop_reading` from any thread.

What to write and when is decided by `checkpointing.OwnedPartition`; which log line a failure gets by
`failures.FailureLog`.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from hubshift.consumer.checkpointing import OwnedPartition, next_enqueued
from hubshift.consumer.engine import Committed, Drained, Engine, EngineEvent, Stolen
from hubshift.consumer.failures import FailureLog, LogLine
from hubshift.consumer.lag import EnqueuedTime, lag_seconds
from hubshift.errors import UserError, one_line
from hubshift.eventhubs.receiver import StartAt
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition, release_partition
from hubshift.ownership.model import EARLIEST, Checkpoint, Claim, OwnershipSnapshot
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseConflict, LeaseLost, LeaseStore, StoreError
from hubshift.spec import CheckpointPolicySpec, StartPositionSpec

if TYPE_CHECKING:
    from hubshift.consumer.metrics import ConsumerMetrics

# The agent's logger: what an owned partition does is the ownership agent's to say (one logger to filter).
log = logging.getLogger("hubshift.consumer.agent")

# The kinds of operations whose failures `FailureLog` reports (the agent adds its own).
CLAIM = "claim"
CHECKPOINT_WRITE = "checkpoint"
RELEASE = "release"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def log_line(line: LogLine | None) -> None:
    """Log what `FailureLog` decided, if anything."""
    if line is not None:
        log.log(_LEVELS[line.level], "%s", line.message)


class Hub(Protocol):
    """What the agent asks Event Hubs (`eventhubs.EventHubsManagement`)."""

    def partition_ids(self) -> list[str]: ...

    def last_enqueued(self, partition: str) -> Checkpoint | None: ...

    def start_at(self, partition: str, sequence_number: int) -> Checkpoint: ...


# One agent turn's checkpoint writes stop after this long, the rest written in the next turns (the oldest
# written first): the membership is renewed between turns, and 1,024 partitions' writes in one turn took
# longer than the renewal could wait (bench/partitions.py: "membership not renewed before its safe
# deadline", every partition stopped).
WRITES_PER_TURN_SECONDS = 2.0


class OwnedPartitions:
    """The partitions `me` owns (read, or being drained), by partition id."""

    def __init__(
        self,
        store: LeaseStore,
        scope: Scope,
        me: str,
        engine: Engine,
        hub: Hub,
        failures: FailureLog,
        *,
        metrics: ConsumerMetrics | None,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.scope = scope
        self.me = me
        self.engine = engine
        self.hub = hub
        self.failures = failures
        self.metrics = metrics
        self.clock = clock
        self._lock = threading.Lock()
        self._owned: dict[str, OwnedPartition] = {}
        self._stopped_at_deadline: set[str] = set()

    # --- views ---------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._owned)

    def __contains__(self, partition: object) -> bool:
        return partition in self._owned

    def levels(self) -> dict[str, int]:
        """Partition -> owner level (any thread)."""
        with self._lock:
            return {p: o.lease.owner_level for p, o in self._owned.items()}

    def in_state(self, state: Literal["active", "draining"]) -> list[str]:
        return [p for p, o in self._owned.items() if o.state == state]

    def rows(self) -> dict[str, dict[str, Any]]:
        """What each owned partition is at, for the consumer's status (any thread)."""
        with self._lock:
            return {
                p: {
                    "state": o.state,
                    "ownerLevel": o.lease.owner_level,
                    "checkpoint": o.lease.checkpoint.sequence_number,
                    "committed": None if o.committed is None else o.committed.sequence_number,
                }
                for p, o in self._owned.items()
            }

    # --- the engine's reports ----------------------------------------------------------------------------

    def apply(self, event: EngineEvent) -> bool:
        """What the engine reported about an owned partition; True when a partition was handed off."""
        if not isinstance(event, Committed | Drained | Stolen):
            return False
        owned = self._owned.get(event.partition)
        if owned is None or owned.lease.owner_level != event.owner_level:
            return False  # an earlier epoch of a partition lost or handed off since
        if isinstance(event, Committed):
            owned.commit(event.position, event.events)
        elif isinstance(event, Drained):
            self._finish_drain(event.partition, owned, event.position)
            return True
        else:
            self.lose(event.partition, "a receiver with a higher owner level took it", release=True)
        return False

    # --- claiming ---------------------------------------------------------------------------------------

    def claim(self, claim: Claim, snapshot: OwnershipSnapshot, start: StartPositionSpec) -> bool:
        """Claim and start reading; False when it is not ours yet (the old owner still holds it, or the
        claim failed): tried again soon."""
        partition = claim.partition
        now = self.clock()
        try:
            initial = self._initial(partition, snapshot, start)
            lease = claim_partition(
                self.store, self.scope, partition, self.me, force=claim.force, initial=initial
            )
        except LeaseConflict:
            return False
        except StoreError as exc:
            log_line(self.failures.failed(CLAIM, str(exc), now, where=f"partition {partition}"))
            return False
        except Exception as exc:  # Event Hubs (where `latest` or a sequence number starts)
            reason = one_line(exc) if isinstance(exc, UserError) else type(exc).__name__
            log_line(self.failures.failed(CLAIM, reason, now, where=f"partition {partition}"))
            return False
        log_line(self.failures.succeeded(CLAIM, now))
        checkpoint = lease.checkpoint
        if not checkpoint.consumed_nothing:
            at = StartAt(sequence_number=checkpoint.sequence_number)
            next_sequence: int | None = checkpoint.sequence_number + 1
        else:
            at = StartAt(enqueued_time=checkpoint.start)
            next_sequence = None
        log.info(
            "partition %s: claimed (%s%s) at owner level %d, from sequence number %s",
            partition,
            claim.describe(),
            ", forced" if claim.force else "",
            lease.owner_level,
            checkpoint.sequence_number,
        )
        with self._lock:
            self._owned[partition] = OwnedPartition(lease=lease, last_written=self.clock())
        self.engine.start_partition(partition, lease.owner_level, at, next_sequence)
        if self.metrics:
            self.metrics.partition_acquired(partition, claim.reason.acquired_how)
        return True

    def _initial(self, partition: str, snapshot: OwnershipSnapshot, start: StartPositionSpec) -> Checkpoint:
        """Where a partition with no checkpoint blob yet starts (written by its first claim)."""
        if snapshot.partition(partition) is not None:
            return EARLIEST  # the blob exists: the claim reads its checkpoint
        chosen = start.of(partition)
        if chosen.type == "latest":
            last = self.hub.last_enqueued(partition)
            return last if last is not None else EARLIEST
        if chosen.type == "enqueuedTime" and chosen.enqueued_time is not None:
            return Checkpoint(offset="-1", sequence_number=-1, start=chosen.enqueued_time)
        if chosen.type == "sequenceNumber" and chosen.sequence_number is not None:
            return self.hub.start_at(partition, chosen.sequence_number)
        return EARLIEST

    # --- giving up ----------------------------------------------------------------------------------------

    def drain(self, partition: str) -> None:
        """Hand it off: the engine finishes the batch in flight, then reports `Drained`."""
        owned = self._owned.get(partition)
        if owned is None or not owned.start_drain(self.clock()):
            return  # not ours, or draining already
        log.info("partition %s: handing off (draining)", partition)
        self.engine.drain_partition(partition)

    def _finish_drain(self, partition: str, owned: OwnedPartition, position: Checkpoint | None) -> None:
        final = owned.final_position(position)
        released = self._release(partition, owned, final)
        if self.metrics:
            if released:
                if final is not None:
                    self.metrics.checkpoint_written(partition)
                drain = None if owned.drain_started is None else self.clock() - owned.drain_started
                self.metrics.partition_released(partition, drain)
            else:
                self.metrics.partition_lost(partition)
        log.info(
            "partition %s handed off at sequence number %s%s",
            partition,
            (final or owned.lease.checkpoint).sequence_number,
            "" if released else " (the lease was already gone)",
        )
        with self._lock:
            self._owned.pop(partition, None)

    def _release(self, partition: str, owned: OwnedPartition, final: Checkpoint | None) -> bool:
        """Write `final` (if any) and release the lease; False when it was not released."""
        now = self.clock()
        try:
            released = release_partition(
                self.store,
                owned.lease,
                final=final,
                next_enqueued=next_enqueued(final, self._enqueued_time(partition)),
            )
        except StoreError as exc:
            log_line(self.failures.failed(RELEASE, str(exc), now, where=f"partition {partition}"))
            return False
        log_line(self.failures.succeeded(RELEASE, now))
        return released

    def lose(self, partition: str, reason: str, *, release: bool = False) -> None:
        """It is someone else's now: stop reading it (and release what is left of the lease)."""
        owned = self._owned.get(partition)
        log.warning("partition %s: lost (%s); stopped reading it", partition, reason)
        self.engine.stop_partition(partition)
        with self._lock:
            self._owned.pop(partition, None)
        if self.metrics:
            self.metrics.partition_lost(partition)
        if release and owned is not None:
            try:
                release_partition(self.store, owned.lease)
            except StoreError:
                pass

    def abandon(self, reason: str) -> None:
        """Stop everything now: checkpoint what was committed, release, stop the engine's reading."""
        log.warning("stopping every partition: %s", reason)
        for partition, owned in list(self._owned.items()):
            self.engine.stop_partition(partition)
            now = self.clock()
            try:
                release_partition(self.store, owned.lease, final=owned.final_position())
            except StoreError as exc:
                log_line(self.failures.failed(RELEASE, str(exc), now, where=f"partition {partition}"))
        with self._lock:
            self._owned.clear()
        if self.metrics:
            self.metrics.partitions_owned([])

    def stop_all(self) -> None:
        """The membership could have expired: stop reading every partition before others take them."""
        for partition in list(self._owned):
            self.engine.stop_partition(partition)
            if self.metrics:
                self.metrics.partition_lost(partition)
        with self._lock:
            self._owned.clear()

    def stop_reading(self) -> int:
        """The watchdog's thread: stop the engine's reading of every partition at once; this thread forgets
        them at its next turn (`forget_stopped`). How many were stopped."""
        with self._lock:
            partitions = list(self._owned)
            self._stopped_at_deadline.update(partitions)
        for partition in partitions:
            self.engine.stop_partition(partition)
            if self.metrics:  # no longer read here: its gauges go now, not when this thread is back
                self.metrics.partition_lost(partition)
        return len(partitions)

    def forget_stopped(self) -> None:
        """The partitions the watchdog stopped are no longer read: forget them (they are claimed again,
        without force, once the membership is renewed)."""
        with self._lock:
            stopped, self._stopped_at_deadline = self._stopped_at_deadline, set()
            for partition in stopped:
                self._owned.pop(partition, None)

    # --- checkpoints --------------------------------------------------------------------------------------

    def write_due_checkpoints(self, now: float, policy: CheckpointPolicySpec) -> None:
        """Each owned partition's due checkpoint, or its written one again with its neighbour's enqueued
        time once known, the longest unwritten first, for `WRITES_PER_TURN_SECONDS` at most. The failures
        of one turn count as one (`FailureLog`): a partition that keeps failing while others succeed is one
        run of failures, not a warning every turn."""
        results: list[Literal["written", "lost", "failed"]] = []
        until = self.clock() + WRITES_PER_TURN_SECONDS
        for partition, owned in sorted(self._owned.items(), key=lambda item: item[1].last_written):
            if self.clock() > until:
                break  # the rest next turn
            enqueued = self._enqueued_time(partition)
            if not owned.due(now, policy):
                if owned.completes_checkpoint:
                    moment = next_enqueued(owned.lease.checkpoint, enqueued)
                    if moment is not None:
                        result = self._write(partition, owned, owned.lease.checkpoint, moment, now)
                        owned.written_with_next = result == "written"
                        results.append(result)
                continue
            position, moment = owned.to_write(enqueued)
            result = self._write(partition, owned, position, moment, now)
            results.append(result)
            if result == "written":
                owned.written(position, moment is not None, now)
                if self.metrics:
                    self.metrics.checkpoint_written(partition)
        if "written" in results and "failed" not in results:
            log_line(self.failures.succeeded(CHECKPOINT_WRITE, now))

    def _write(
        self,
        partition: str,
        owned: OwnedPartition,
        position: Checkpoint,
        next_enqueued: datetime | None,
        now: float,
    ) -> Literal["written", "lost", "failed"]:
        """Write the checkpoint under the partition's lease. A lost lease stops the partition; any other
        failure is tried again at the next turn."""
        try:
            owned.lease = write_checkpoint(self.store, owned.lease, position, next_enqueued=next_enqueued)
        except LeaseLost:
            if self.metrics:
                self.metrics.checkpoint_failed(fenced=True)
            self.lose(partition, "the checkpoint write was refused: the lease was broken")
            return "lost"
        except StoreError as exc:
            if self.metrics:
                self.metrics.checkpoint_failed()
            log_line(self.failures.failed(CHECKPOINT_WRITE, str(exc), now, where=f"partition {partition}"))
            return "failed"
        return "written"

    def report_progress(self) -> None:
        """Each owned partition's lag in events and in seconds, from what its receiver last heard: known
        here even while no operator computes it."""
        if self.metrics is None:
            return
        now = self.clock()
        for partition, progress in self.engine.progress().items():
            if partition in self._owned:
                self.metrics.set_backlog(partition, progress.backlog)
                seconds = lag_seconds(progress, self._enqueued_time(partition), now)
                self.metrics.set_lag(partition, seconds)

    def _enqueued_time(self, partition: str) -> EnqueuedTime:
        return functools.partial(self.engine.enqueued_time, partition)
