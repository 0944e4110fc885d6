"""The ownership agent: one thread of the consumer's main process that decides which partitions this
consumer reads and does every store write for them.

Each turn of its loop:
1. takes what the engine reported (batches committed, partitions drained, receivers stolen);
2. renews the membership lease, and stops reading everything at `safe_until` if renewals keep failing;
3. lists the scope (every `list_interval`, at once when nudged, often while waiting for a handoff) and
   follows the operator's assignment record, or the fallback balancer without a current one
   (`plan.plan_ownership`): claims (by force past the handoff deadline or for an orphan) and drains;
4. writes the checkpoints that are due (fenced by the partition lease: a deposed consumer is refused),
   and on a drained partition its final checkpoint, then releases its lease. With each checkpoint goes
   the enqueued time of the event after it when the receiver has it (the control loop's lag in seconds):
   a due checkpoint is written at the newest committed position whose neighbour's time is known (or the
   newest, without it), and a checkpoint written without it is written once more, unmoved, as soon as
   the receiver has that event (docs/observability.md).

SIGTERM (`request_stop`): drain everything, checkpoint, release, leave, within the grace period.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from hubshift.consumer.engine import Committed, Drained, Engine, EngineEvent, EngineFailed, Stolen
from hubshift.consumer.plan import (
    ClaimPlan,
    OwnershipPlan,
    assignment_is_healthy,
    checkpoint_due,
    plan_ownership,
)
from hubshift.eventhubs.receiver import StartAt
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition, release_partition
from hubshift.ownership.membership import Membership, join, leave, renew
from hubshift.ownership.model import EARLIEST, Checkpoint, OwnershipSnapshot, PartitionLease
from hubshift.ownership.scope import Scope, consumer_id
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseConflict, LeaseLost, LeaseStore, StoreError
from hubshift.ownership.timing import Timing
from hubshift.spec import CheckpointPolicy, PartitionedConsumerSpec, StartPosition

if TYPE_CHECKING:
    from hubshift.consumer.metrics import ConsumerMetrics

log = logging.getLogger(__name__)

# SIGTERM: a consumer hands off within maxHandoffSeconds plus this (the pod's grace period is longer).
GRACE_MARGIN_SECONDS = 10.0
# Nudges (`POST /assignment`) make the consumer list the scope at most this often.
NUDGE_FLOOR_SECONDS = 0.5


class Hub(Protocol):
    """What the agent asks Event Hubs (`eventhubs.EventHubsManagement`)."""

    def partition_ids(self) -> list[str]: ...

    def last_enqueued(self, partition: str) -> Checkpoint | None: ...


@dataclass(frozen=True)
class AgentSettings:
    """The agent's configuration: the manifest's (`from_spec`) plus two knobs of its own."""

    start: StartPosition
    checkpoint: CheckpointPolicy
    max_handoff_seconds: float
    timing: Timing
    # SIGTERM: drain and release within this long, then stop whatever is left.
    grace_seconds: float
    # How often a partition waiting for its old owner's release is tried again (one listing each, only
    # while a handoff runs: a graceful drain takes a batch, so a short cadence costs a few requests).
    claim_retry_seconds: float = 0.2
    # How often the hub's partition ids are read again (a partition count change).
    partition_refresh_seconds: float = 300.0

    @classmethod
    def from_spec(
        cls,
        spec: PartitionedConsumerSpec,
        *,
        list_interval_seconds: float | None = None,
        grace_seconds: float | None = None,
    ) -> AgentSettings:
        handoff = spec.rebalance.max_handoff_seconds
        return cls(
            start=spec.consumer.start_position,
            checkpoint=spec.consumer.checkpoint,
            max_handoff_seconds=handoff,
            timing=spec.rebalance.timing(list_interval_seconds),
            grace_seconds=grace_seconds if grace_seconds is not None else handoff + GRACE_MARGIN_SECONDS,
        )

    @property
    def stale_after_seconds(self) -> float:
        """An assignment that leaves a partition to nobody alive is followed this long (the operator's
        time to notice a lost member and publish a new generation)."""
        t = self.timing
        return t.membership_lease_seconds + t.list_interval_seconds + self.max_handoff_seconds


# Committed positions kept per partition between checkpoint writes (the candidates to write).
RECENT_COMMITS_KEPT = 32


@dataclass
class _Owned:
    lease: PartitionLease
    state: Literal["active", "draining"] = "active"
    committed: Checkpoint | None = None
    events_since: int = 0
    last_written: float = 0.0
    drain_started: float | None = None
    recent: list[Checkpoint] = field(default_factory=list)  # committed since the last write, oldest first
    written_with_next: bool = False  # the written checkpoint carries its neighbour's enqueued time


class OwnershipAgent:
    def __init__(
        self,
        store: LeaseStore,
        scope: Scope,
        consumer: str,
        engine: Engine,
        hub: Hub,
        settings: AgentSettings,
        *,
        metrics: ConsumerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        watchdog: bool = True,
    ) -> None:
        self.store = store
        self.scope = scope
        self.me = consumer_id(consumer)
        self.engine = engine
        self.hub = hub
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        # A timer on the real clock behind `safe_until`; tests that drive `clock` by hand turn it off.
        self.watchdog = watchdog
        self._watchdog_timer: threading.Timer | None = None
        self._stopped_at_deadline: set[str] = set()
        self._events: queue.Queue[EngineEvent] = queue.Queue()
        self._wake = threading.Event()
        self._nudged = threading.Event()
        self._stop_requested = threading.Event()
        self._lock = threading.Lock()
        self._owned: dict[str, _Owned] = {}
        self._membership: Membership | None = None
        self._snapshot: OwnershipSnapshot | None = None
        self._partitions: list[str] = []
        self._plan: OwnershipPlan | None = None
        # (generation, when first seen) of an assignment record naming a consumer that is not alive.
        self._unhealthy: tuple[int, datetime] | None = None
        self._next_list = 0.0
        self._last_listing = float("-inf")
        self._next_claim_retry = 0.0
        self._next_partition_refresh = 0.0
        self._stop_deadline: float | None = None
        self._renew_retry_at = 0.0
        self._failure: str | None = None
        self.ready = False

    # --- called from other threads ---------------------------------------------------------------

    def notify(self, event: EngineEvent) -> None:
        """The engine's callback (any thread)."""
        self._events.put(event)
        self._wake.set()

    def reread_assignment(self) -> None:
        """List the scope now: the operator published a new generation (its nudge)."""
        self._nudged.set()
        self._wake.set()

    def request_stop(self) -> None:
        """SIGTERM: hand everything off gracefully, then return from `run`."""
        self._stop_requested.set()
        self._wake.set()

    def status(self) -> dict[str, Any]:
        """What this consumer owns and does, for the HTTP server and the operator (JSON-ready)."""
        with self._lock:
            plan = self._plan
            owned = {
                p: {
                    "state": o.state,
                    "ownerLevel": o.lease.owner_level,
                    "checkpoint": o.lease.checkpoint.sequence_number,
                    "committed": None if o.committed is None else o.committed.sequence_number,
                }
                for p, o in self._owned.items()
            }
            assignment = self._snapshot.assignment if self._snapshot is not None else None
        return {
            "consumer": self.me,
            "ready": self.ready,
            "stopping": self._stop_requested.is_set(),
            "mode": plan.mode if plan else None,
            "assignmentGeneration": assignment.generation if assignment else None,
            "partitions": owned,
            "waiting": list(plan.waiting) if plan else [],
            "planned": list(plan.planned) if plan else [],
        }

    @property
    def failure(self) -> str | None:
        """Why the engine could not go on, once it said so (the consumer then exits 1)."""
        return self._failure

    def owned(self) -> dict[str, int]:
        """Partition -> owner level, for partitions read or being drained now."""
        with self._lock:
            return {p: o.lease.owner_level for p, o in self._owned.items()}

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        """Until stopped: 0 after a graceful stop, 1 when the engine failed."""
        self.start()
        try:
            while (code := self.step()) is None:
                self._wait(self.clock())
            return code
        finally:
            self.leave()

    def start(self) -> None:
        """Register (membership lease); claiming starts with the first `step`. The hub's partition ids are
        read first, so a consumer that reports ready claims in its first listing (a joiner's share at a cold
        start) without a management round trip in between."""
        self._refresh_partitions(self.clock())
        self._membership = join(
            self.store, self.scope, self.me, clock=self.clock, timing=self.settings.timing
        )
        self._arm_watchdog()
        if self.metrics:
            self.metrics.lease_renewed(True)
        self.ready = True

    def step(self) -> int | None:
        """One turn of the loop; the exit code once the consumer is done."""
        now = self.clock()
        self._take_engine_events()
        if self._failure is not None:
            self._abandon(self._failure)
            return 1
        self._keep_membership(now)
        if self._stop_requested.is_set() and self._stop_deadline is None:
            self._stop_deadline = now + self.settings.grace_seconds
            log.info("stopping: handing off %d partitions", len(self._owned))
            self.ready = False
        self._decide(now)
        self._write_due_checkpoints(now)
        self._report_backlog()
        if self._stop_deadline is not None:
            if not self._owned:
                return 0
            if now >= self._stop_deadline:
                self._abandon("the grace period ran out")
                return 0
        return None

    def leave(self) -> None:
        """Deregister, so survivors may take what is left at once."""
        self.ready = False
        self._disarm_watchdog()
        if self._membership is not None:
            try:
                leave(self.store, self._membership)
            except StoreError as exc:
                log.warning("could not leave the membership: %s", exc)
            self._membership = None

    def _wait(self, now: float) -> None:
        deadlines = [now + 1.0, self._next_list]
        if self._membership is not None:
            deadlines.append(max(self._membership.renew_due, self._renew_retry_at))
        if self._plan is not None and self._plan.waiting:
            deadlines.append(self._next_claim_retry)
        if self._stop_deadline is not None:
            deadlines.append(self._stop_deadline)
        timeout = max(0.0, min(deadlines) - self.clock())
        self._wake.wait(timeout)
        self._wake.clear()

    # --- engine reports --------------------------------------------------------------------------

    def _take_engine_events(self) -> None:
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, EngineFailed):
                self._failure = event.reason
                continue
            owned = self._owned.get(event.partition)
            if owned is None or owned.lease.owner_level != event.owner_level:
                continue  # an earlier epoch of a partition lost or handed off since
            if isinstance(event, Committed):
                owned.committed = event.position
                owned.events_since += event.events
                owned.recent.append(event.position)
                del owned.recent[:-RECENT_COMMITS_KEPT]
            elif isinstance(event, Drained):
                self._finish_drain(event.partition, owned, event.position)
            elif isinstance(event, Stolen):
                self._lost(event.partition, "a receiver with a higher owner level took it", release=True)

    def _finish_drain(self, partition: str, owned: _Owned, position: Checkpoint | None) -> None:
        final = position or owned.committed
        if final is not None and final.sequence_number <= owned.lease.checkpoint.sequence_number:
            final = None
        released = False
        try:
            released = release_partition(
                self.store, owned.lease, final=final, next_enqueued=self._next_enqueued(partition, final)
            )
        except StoreError as exc:
            log.warning("partition %s: releasing failed: %s", partition, exc)
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
        # Whoever waits for it learns at its next claim attempt; look again soon ourselves.
        self._next_list = min(self._next_list, self.clock() + 0.5)

    def _lost(self, partition: str, reason: str, *, release: bool = False) -> None:
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

    def _abandon(self, reason: str) -> None:
        """Stop everything now: checkpoint what was committed, release, stop the engine's reading."""
        log.warning("stopping every partition: %s", reason)
        for partition, owned in list(self._owned.items()):
            self.engine.stop_partition(partition)
            final = owned.committed
            if final is not None and final.sequence_number <= owned.lease.checkpoint.sequence_number:
                final = None
            try:
                release_partition(self.store, owned.lease, final=final)
            except StoreError as exc:
                log.warning("partition %s: releasing failed: %s", partition, exc)
        with self._lock:
            self._owned.clear()
        if self.metrics:
            self.metrics.partitions_owned([])

    # --- membership ------------------------------------------------------------------------------

    def _arm_watchdog(self) -> None:
        """Stop reading at the membership's `safe_until` even if this thread is then stuck in a store call
        that has not timed out yet (a store that stopped answering): a timer of its own, moved on by every
        renewal. Only the engine's reading is stopped there; this thread tidies up when it returns."""
        if not self.watchdog or self._membership is None:
            return
        membership = self._membership
        self._disarm_watchdog()
        timer = threading.Timer(
            max(0.0, membership.safe_until - self.clock()), self._deadline_passed, args=(membership,)
        )
        timer.daemon = True
        timer.name = "hubshift-lease-watchdog"
        self._watchdog_timer = timer
        timer.start()

    def _disarm_watchdog(self) -> None:
        if self._watchdog_timer is not None:
            self._watchdog_timer.cancel()
            self._watchdog_timer = None

    def _deadline_passed(self, membership: Membership) -> None:
        if self._membership is not membership:
            return  # renewed meanwhile
        with self._lock:
            partitions = list(self._owned)
            self._stopped_at_deadline.update(partitions)
        for partition in partitions:
            self.engine.stop_partition(partition)
        if partitions:
            log.warning(
                "membership not renewed before its safe deadline: stopped reading %d partitions",
                len(partitions),
            )
        self._wake.set()

    def _forget_stopped_at_deadline(self) -> None:
        """The partitions the watchdog stopped are no longer read: forget them (they are claimed again,
        without force, once the membership is renewed)."""
        with self._lock:
            stopped, self._stopped_at_deadline = self._stopped_at_deadline, set()
            for partition in stopped:
                self._owned.pop(partition, None)
        for partition in stopped:
            if self.metrics:
                self.metrics.partition_lost(partition)

    def _keep_membership(self, now: float) -> None:
        self._forget_stopped_at_deadline()
        membership = self._membership
        assert membership is not None
        if now >= membership.renew_due and now >= self._renew_retry_at:
            try:
                self._membership = renew(self.store, membership, clock=self.clock)
                self._arm_watchdog()
                if self.metrics:
                    self.metrics.lease_renewed(True)
                if self._membership.lapsed:
                    log.warning("membership renewed after its deadline: partitions are claimed again")
            except StoreError as exc:
                log.warning("membership renewal failed (retrying): %s", exc)
                if self.metrics:
                    self.metrics.lease_renewed(False)
                self._renew_retry_at = now + 1.0
        membership = self._membership
        if membership is not None and not membership.is_safe(now) and self._owned:
            # Others may take our partitions once the lease could have expired: stop before that.
            for partition in list(self._owned):
                self.engine.stop_partition(partition)
                if self.metrics:
                    self.metrics.partition_lost(partition)
            with self._lock:
                self._owned.clear()
            log.warning("membership not renewed in time: stopped reading every partition")

    # --- ownership decisions -----------------------------------------------------------------------

    def _decide(self, now: float) -> None:
        # A nudge lists the scope at once, but at most once per NUDGE_FLOOR_SECONDS: whoever can reach the
        # HTTP port may only make the consumer read the store, never more often than that.
        nudged = self._nudged.is_set() and now >= self._last_listing + NUDGE_FLOOR_SECONDS
        waiting = self._plan is not None and bool(self._plan.waiting) and now >= self._next_claim_retry
        stopping = self._stop_requested.is_set()
        if stopping:
            self._drain_all()
            return
        if not (nudged or now >= self._next_list or waiting):
            return
        membership = self._membership
        if membership is None or not membership.is_safe(now):
            return
        self._nudged.clear()
        self._last_listing = now
        if (now >= self._next_partition_refresh or not self._partitions) and not self._refresh_partitions(
            now
        ):
            return
        try:
            snapshot = take_snapshot(self.store, self.scope, previous=self._snapshot)
        except StoreError as exc:
            log.warning("could not list the ownership table: %s", exc)
            self._next_list = now + 1.0
            return
        record = snapshot.assignment
        if record is not None and not set(record.covered) <= set(self._partitions):
            # The operator saw partitions this consumer does not know yet (the hub grew): read them now
            # rather than at the next periodic refresh, so new partitions are read at once.
            self._refresh_partitions(now)
        self._next_list = now + self.settings.timing.list_interval_seconds
        self._snapshot = snapshot
        self._check_still_mine(snapshot)
        active = [p for p, o in self._owned.items() if o.state == "active"]
        draining = [p for p, o in self._owned.items() if o.state == "draining"]
        wall_now = self.wall()
        plan = plan_ownership(
            self.me,
            self._partitions,
            snapshot,
            active,
            draining,
            wall_now,
            max_handoff_seconds=self.settings.max_handoff_seconds,
            stale_after_seconds=self.settings.stale_after_seconds,
            unhealthy_since=self._unhealthy_since(snapshot, wall_now),
        )
        with self._lock:
            self._plan = plan
        for partition in plan.drains:
            self._drain(partition)
        still_waiting = list(plan.waiting)
        for claim in plan.claims:
            if not self._claim(claim, snapshot):
                still_waiting.append(claim.partition)
        if still_waiting:
            self._next_claim_retry = now + self.settings.claim_retry_seconds
            # Re-list at the retry: a released partition shows as free in the listing.
            self._next_list = min(self._next_list, self._next_claim_retry)

    def _refresh_partitions(self, now: float) -> bool:
        """Read the hub's partition ids; False when they cannot be read and none are known."""
        try:
            self._partitions = self.hub.partition_ids()
            self._next_partition_refresh = now + self.settings.partition_refresh_seconds
        except Exception as exc:
            log.warning("could not read the hub's partition ids: %s", type(exc).__name__)
            if not self._partitions:
                self._next_list = now + 1.0
                return False
        return True

    def _unhealthy_since(self, snapshot: OwnershipSnapshot, now: datetime) -> datetime | None:
        """When this consumer first saw the record's generation assign a partition to a consumer that is
        not alive (a pod gone, maybe coming back within the operator's holddown); None while it does not.
        The record is followed for `stale_after_seconds` from then, not from its publication, which may
        be long past."""
        record = snapshot.assignment
        live = set(snapshot.live_members) | {self.me}
        if record is None or assignment_is_healthy(record, self._partitions, live):
            self._unhealthy = None
            return None
        if self._unhealthy is None or self._unhealthy[0] != record.generation:
            self._unhealthy = (record.generation, now)
        return self._unhealthy[1]

    def _check_still_mine(self, snapshot: OwnershipSnapshot) -> None:
        """A partition whose lease is no longer ours in the listing was taken (broken): stop it now."""
        for partition in list(self._owned):
            row = snapshot.partition(partition)
            if row is None or row.free or row.owner != self.me:
                self._lost(partition, "its lease is held by someone else")
            elif row.owner_level > self._owned[partition].lease.owner_level:
                self._lost(partition, f"it was claimed again at owner level {row.owner_level}")

    def _drain(self, partition: str) -> None:
        owned = self._owned.get(partition)
        if owned is None or owned.state == "draining":
            return
        log.info("partition %s: handing off (draining)", partition)
        owned.state = "draining"
        owned.drain_started = self.clock()
        self.engine.drain_partition(partition)

    def _drain_all(self) -> None:
        for partition in list(self._owned):
            self._drain(partition)

    def _initial(self, partition: str, snapshot: OwnershipSnapshot) -> Checkpoint:
        """Where a partition with no checkpoint blob yet starts (written by its first claim)."""
        if snapshot.partition(partition) is not None:
            return EARLIEST  # the blob exists: the claim reads its checkpoint
        start = self.settings.start
        if start.type == "latest":
            last = self.hub.last_enqueued(partition)
            return last if last is not None else EARLIEST
        if start.type == "enqueuedTime" and start.enqueued_time is not None:
            return Checkpoint(offset="-1", sequence_number=-1, start=start.enqueued_time)
        return EARLIEST

    def _claim(self, plan: ClaimPlan, snapshot: OwnershipSnapshot) -> bool:
        """Claim and start reading; False when the old owner still holds it (try again soon)."""
        partition = plan.partition
        try:
            initial = self._initial(partition, snapshot)
            lease = claim_partition(
                self.store, self.scope, partition, self.me, force=plan.force, initial=initial
            )
        except LeaseConflict:
            return False
        except StoreError as exc:
            log.warning("partition %s: claim failed: %s", partition, exc)
            return False
        except Exception as exc:  # Event Hubs (the start position of `latest`)
            log.warning("partition %s: claim failed: %s", partition, type(exc).__name__)
            return False
        checkpoint = lease.checkpoint
        if checkpoint.sequence_number >= 0:
            start = StartAt(sequence_number=checkpoint.sequence_number)
            next_sequence: int | None = checkpoint.sequence_number + 1
        else:
            start = StartAt(enqueued_time=checkpoint.start)
            next_sequence = None
        log.info(
            "partition %s: claimed (%s%s) at owner level %d, from sequence number %s",
            partition,
            plan.describe(),
            ", forced" if plan.force else "",
            lease.owner_level,
            checkpoint.sequence_number,
        )
        with self._lock:
            self._owned[partition] = _Owned(lease=lease, last_written=self.clock())
        self.engine.start_partition(partition, lease.owner_level, start, next_sequence)
        if self.metrics:
            self.metrics.partition_acquired(partition, plan.reason.metric_label)
        return True

    def _report_backlog(self) -> None:
        if self.metrics is None:
            return
        for partition, events in self.engine.backlog().items():
            if partition in self._owned:
                self.metrics.set_backlog(partition, events)

    # --- checkpoints -------------------------------------------------------------------------------

    def _next_enqueued(self, partition: str, position: Checkpoint | None) -> datetime | None:
        """When the event after `position` was enqueued, if the engine's receiver has it."""
        if position is None or position.sequence_number < 0:
            return None
        return self.engine.enqueued_time(partition, position.sequence_number + 1)

    def _to_write(self, partition: str, owned: _Owned) -> tuple[Checkpoint, datetime | None]:
        """The newest committed position whose neighbour's enqueued time is known (usually the newest: the
        receiver reads ahead), else the newest without it."""
        assert owned.committed is not None
        for candidate in reversed(owned.recent):
            if candidate.sequence_number <= owned.lease.checkpoint.sequence_number:
                break
            moment = self._next_enqueued(partition, candidate)
            if moment is not None:
                return candidate, moment
        return owned.committed, None

    def _write_due_checkpoints(self, now: float) -> None:
        membership = self._membership
        if membership is None or not membership.is_safe(now):
            return
        for partition, owned in list(self._owned.items()):
            if not checkpoint_due(
                owned.committed,
                owned.lease.checkpoint,
                owned.events_since,
                owned.last_written,
                now,
                every_events=self.settings.checkpoint.every_events,
                every_seconds=self.settings.checkpoint.every_seconds,
            ):
                if owned.state == "active" and not owned.written_with_next:
                    self._complete_checkpoint(partition, owned)
                continue
            position, next_enqueued = self._to_write(partition, owned)
            if not self._write(partition, owned, position, next_enqueued):
                continue
            owned.events_since = 0
            owned.last_written = now
            owned.written_with_next = next_enqueued is not None
            owned.recent = [c for c in owned.recent if c.sequence_number > position.sequence_number]
            if self.metrics:
                self.metrics.checkpoint_written(partition)

    def _complete_checkpoint(self, partition: str, owned: _Owned) -> None:
        """The written checkpoint again, unmoved, with its neighbour's enqueued time once the receiver has
        that event (a partition that was caught up, or just claimed): one write per such change."""
        moment = self._next_enqueued(partition, owned.lease.checkpoint)
        if moment is not None and self._write(partition, owned, owned.lease.checkpoint, moment):
            owned.written_with_next = True

    def _write(
        self, partition: str, owned: _Owned, position: Checkpoint, next_enqueued: datetime | None
    ) -> bool:
        """Write the checkpoint under the partition's lease; False when it failed (a lost lease stops the
        partition; any other failure is tried again at the next turn)."""
        try:
            owned.lease = write_checkpoint(self.store, owned.lease, position, next_enqueued=next_enqueued)
        except LeaseLost:
            if self.metrics:
                self.metrics.checkpoint_failed(fenced=True)
            self._lost(partition, "the checkpoint write was refused: the lease was broken")
            return False
        except StoreError as exc:
            if self.metrics:
                self.metrics.checkpoint_failed()
            log.warning("partition %s: checkpoint failed (will retry): %s", partition, exc)
            return False
        return True
