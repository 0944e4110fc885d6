"""The ownership agent: one thread of the consumer's main process that decides which partitions this
consumer reads and does every store write for them. It is the loop that does the I/O (the writes for the
partitions it owns in `owned.OwnedPartitions`); what to do and when is decided by pure code beside it:
`ownership_step` (claims and drains), `checkpointing` (what each owned partition's checkpoint writes and
when), `schedule` (when to list, renew, retry, stop) and `failures` (which log line a failure gets).

Each turn of its loop:
1. takes what the engine reported (batches committed, partitions drained, receivers stolen);
2. renews the membership lease, and stops reading everything at `safe_until` if renewals keep failing;
3. lists the scope (every `list_interval`, at once when nudged, often while waiting for a handoff) and
   follows the operator's assignment record, or the fallback balancer without a current one
   (`ownership_step`): claims (by force past the handoff deadline or for an orphan) and drains;
4. writes the checkpoints that are due (fenced by the partition lease: a deposed consumer is refused),
   and on a drained partition its final checkpoint, then releases its lease. With each checkpoint goes
   the enqueued time of the event after it when the receiver has it (the control loop's lag in seconds):
   a due checkpoint is written at the newest committed position whose neighbour's time is known (or the
   newest, without it), and a checkpoint written without it is written once more, unmoved, as soon as
   the receiver has that event (docs/observability.md).

SIGTERM (`request_stop`): drain everything, checkpoint, release, leave, within the grace period. With
`stop_follow_seconds` (a pod: the operator sees it stopping), it first keeps reading for at most that long
and follows the assignment record, listing at the claim retry: the operator moves its partitions to
consumers ready for them, each drained as the record says, so none waits unread for a new owner; whatever
is left then is drained at once. Without an operator's record (fallback balancing) it drains at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hubshift.consumer.engine import Engine, EngineEvent, EngineFailed
from hubshift.consumer.failures import FailureLog
from hubshift.consumer.owned import Hub, OwnedPartitions, log_line
from hubshift.consumer.ownership_step import OwnershipStep, lost_partitions, ownership_step, track_unhealthy
from hubshift.consumer.schedule import AgentSchedule, StopOutcome
from hubshift.manifest import PartitionedConsumerSpec
from hubshift.ownership.membership import Membership, join_pool, leave, renew
from hubshift.ownership.model import OwnershipSnapshot
from hubshift.ownership.scope import Scope, consumer_id
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseStore, StoreError
from hubshift.ownership.timing import Timing
from hubshift.spec import CheckpointPolicySpec, StartPositionSpec

if TYPE_CHECKING:
    from hubshift.consumer.metrics import ConsumerMetrics

log = logging.getLogger(__name__)


# The kinds of operations whose failures `FailureLog` reports (`owned.py` has the partitions' own).
RENEWAL = "membership renewal"
# One listing's claims stop after this long and go on after the next listing (at the claim retry): the
# membership is renewed between turns, and a first claim is five requests, 1,024 of them took longer than
# the renewal could wait (bench/partitions.py).
CLAIMS_PER_TURN_SECONDS = 2.0
LISTING = "listing the ownership table"
HUB_PARTITIONS = "reading the hub's partition ids"


@dataclass(frozen=True)
class AgentSettings:
    """The agent's configuration: the manifest's (`from_spec`) plus two knobs of its own."""

    start: StartPositionSpec
    checkpoint: CheckpointPolicySpec
    max_handoff_seconds: float
    timing: Timing
    # SIGTERM: drain and release within this long, then stop whatever is left.
    grace_seconds: float
    # How often a partition waiting for its old owner's release is tried again (one listing each, only
    # while a handoff runs: a graceful drain takes a batch, so a short cadence costs a few requests): every
    # `first_claim_retry_seconds` for the first half second of a wait (an SDK engine's drain and release
    # take tenths of a second, and the retry's overshoot is the handoff's own time), then every
    # `claim_retry_seconds` (a Spark batch's drain takes seconds).
    claim_retry_seconds: float = 0.2
    first_claim_retry_seconds: float = 0.05
    # How often the hub's partition ids are read again (a partition count change).
    partition_refresh_seconds: float = 300.0
    # SIGTERM: follow the operator's assignment this long at most before draining what is left.
    stop_follow_seconds: float = 0.0

    @classmethod
    def from_spec(
        cls,
        spec: PartitionedConsumerSpec,
        *,
        list_interval_seconds: float | None = None,
        grace_seconds: float | None = None,
        stop_follow_seconds: float = 0.0,
    ) -> AgentSettings:
        handoff = spec.rebalance.max_handoff_seconds
        return cls(
            start=spec.consumer.start_position,
            checkpoint=spec.consumer.checkpoint,
            max_handoff_seconds=handoff,
            timing=spec.rebalance.timing(list_interval_seconds),
            grace_seconds=grace_seconds if grace_seconds is not None else spec.rebalance.stop_budget_seconds,
            stop_follow_seconds=stop_follow_seconds,
        )

    @property
    def stale_after_seconds(self) -> float:
        """An assignment that leaves a partition to nobody alive is followed this long (the operator's
        time to notice a lost member and publish a new generation)."""
        t = self.timing
        return t.membership_lease_seconds + t.list_interval_seconds + self.max_handoff_seconds

    def schedule(self) -> AgentSchedule:
        """The agent's timers, all due at once."""
        return AgentSchedule(
            list_interval=self.timing.list_interval_seconds,
            claim_retry=self.claim_retry_seconds,
            first_claim_retry=self.first_claim_retry_seconds,
            partition_refresh=self.partition_refresh_seconds,
        )


class OwnershipAgent:
    """One consumer's ownership loop (module docstring): the I/O of each turn, the decisions beside it."""

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
        self._events: queue.Queue[EngineEvent] = queue.Queue()
        self._wake = threading.Event()
        self._nudged = threading.Event()
        self._stop_requested = threading.Event()
        self._failures = FailureLog()
        self._owned = OwnedPartitions(
            store, scope, self.me, engine, hub, self._failures, metrics=metrics, clock=clock
        )
        self._membership: Membership | None = None
        self._snapshot: OwnershipSnapshot | None = None
        self._partitions: list[str] = []
        self._step: OwnershipStep | None = None
        # (generation, when first seen) of an assignment record naming a consumer that is not alive.
        self._unhealthy: tuple[int, datetime] | None = None
        self._schedule = settings.schedule()
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
        step = self._step
        snapshot = self._snapshot
        assignment = snapshot.assignment if snapshot is not None else None
        return {
            "consumer": self.me,
            "ready": self.ready,
            "stopping": self._stop_requested.is_set(),
            "mode": step.mode if step else None,
            "assignmentGeneration": assignment.generation if assignment else None,
            "partitions": self._owned.rows(),
            "waiting": list(step.waiting) if step else [],
            "planned": list(step.planned) if step else [],
        }

    @property
    def failure(self) -> str | None:
        """Why the engine could not go on, once it said so (the consumer then exits 1)."""
        return self._failure

    def owned(self) -> dict[str, int]:
        """Partition -> owner level, for partitions read or being drained now."""
        return self._owned.levels()

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
        self._membership = join_pool(
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
            self._owned.abandon(self._failure)
            return 1
        self._keep_membership(now)
        stopping = self._stop_requested.is_set()
        settings = self.settings
        if stopping and self._schedule.stop(now, settings.grace_seconds, settings.stop_follow_seconds):
            log.info("stopping: handing off %d partitions", len(self._owned))
            self.ready = False
        if stopping and self._follows_operator(now):
            if self._listing_due(now):
                self._list_and_follow(now, claim=False)
        elif stopping:
            for partition in self._owned.levels():
                self._owned.drain(partition)
        elif self._listing_due(now):
            self._list_and_follow(now)
        membership = self._membership
        if membership is not None and membership.is_safe(now):
            self._owned.write_due_checkpoints(now, self.settings.checkpoint)
        self._owned.report_progress()
        outcome = self._schedule.stop_outcome(now, owned=len(self._owned))
        if outcome is StopOutcome.OUT_OF_TIME:
            self._owned.abandon("the grace period ran out")
        return None if outcome is StopOutcome.RUNNING else 0

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
        membership = self._membership
        wake = self._schedule.wake_at(
            now,
            renew_due=None if membership is None else membership.renew_due,
            waiting=self._waiting(),
            nudged=self._nudged.is_set(),
        )
        self._wake.wait(max(0.0, wake - self.clock()))
        self._wake.clear()

    def _waiting(self) -> bool:
        """Some partition assigned here is still held by its old owner (the claim is retried soon), or a stop
        follows the operator's assignment (it lists at the claim retry until its partitions are moved)."""
        if self._schedule.following(self.clock()) and self._stop_requested.is_set():
            return True
        return self._step is not None and bool(self._step.waiting)

    def _follows_operator(self, now: float) -> bool:
        """SIGTERM within the follow time, an operator's record followed, and something still read here."""
        step = self._step
        return (
            self._schedule.following(now)
            and step is not None
            and step.mode == "assignment"
            and bool(self._owned.in_state("active"))
        )

    def _take_engine_events(self) -> None:
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, EngineFailed):
                self._failure = event.reason
            elif self._owned.apply(event):
                # Handed off: whoever waits for it learns at its next claim attempt; we look again soon.
                self._schedule.released(self.clock())

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
        stopped = self._owned.stop_reading()
        if stopped:
            log.warning(
                "membership not renewed before its safe deadline: stopped reading %d partitions", stopped
            )
        self._wake.set()

    def _keep_membership(self, now: float) -> None:
        self._owned.forget_stopped()
        membership = self._membership
        assert membership is not None
        if self._schedule.renewal_due(now, membership.renew_due):
            self._renew(membership, now)
        membership = self._membership
        if membership is not None and not membership.is_safe(now) and len(self._owned):
            # Others may take our partitions once the lease could have expired: stop before that.
            self._owned.stop_all()
            log.warning("membership not renewed in time: stopped reading every partition")

    def _renew(self, membership: Membership, now: float) -> None:
        try:
            self._membership = renew(self.store, membership, clock=self.clock)
        except StoreError as exc:
            log_line(self._failures.failed(RENEWAL, str(exc), now))
            if self.metrics:
                self.metrics.lease_renewed(False)
            self._schedule.renewal_failed(now)
            return
        log_line(self._failures.succeeded(RENEWAL, now))
        self._arm_watchdog()
        if self.metrics:
            self.metrics.lease_renewed(True)
        if self._membership.lapsed:
            log.warning("membership renewed after its deadline: partitions are claimed again")

    # --- listing and following -----------------------------------------------------------------------

    def _listing_due(self, now: float) -> bool:
        """Whether to list the scope this turn (the schedule says so and the membership is safe)."""
        if not self._schedule.listing_due(now, nudged=self._nudged.is_set(), waiting=self._waiting()):
            return False
        membership = self._membership
        return membership is not None and membership.is_safe(now)

    def _list_and_follow(self, now: float, *, claim: bool = True) -> None:
        self._schedule.listing_started(now, nudged=self._nudged.is_set(), waiting=self._waiting())
        self._nudged.clear()
        snapshot = self._list(now)
        if snapshot is None:
            return
        self._snapshot = snapshot
        for partition, why in lost_partitions(self.me, self._owned.levels(), snapshot):
            self._owned.lose(partition, why)
        wall_now = self.wall()
        live = set(snapshot.live_members) | {self.me}
        record = snapshot.assignment
        self._unhealthy = track_unhealthy(self._unhealthy, record, self._partitions, live, wall_now)
        step = ownership_step(
            self.me,
            self._partitions,
            snapshot,
            self._owned.in_state("active"),
            self._owned.in_state("draining"),
            wall_now,
            max_handoff_seconds=self.settings.max_handoff_seconds,
            stale_after_seconds=self.settings.stale_after_seconds,
            unhealthy_since=None if self._unhealthy is None else self._unhealthy[1],
        )
        self._step = step
        for partition in step.drains:
            self._owned.drain(partition)
        claims = step.claims if claim else ()  # a consumer stopping takes nothing more
        claimed: list[bool] = []
        until = self.clock() + CLAIMS_PER_TURN_SECONDS
        for claim_ in claims:
            if self.clock() > until:  # the rest after the next listing, at the claim retry
                claimed.append(False)
                break
            claimed.append(self._owned.claim(claim_, snapshot, self.settings.start))
        self._schedule.listed(now, waiting=bool(step.waiting) or not all(claimed) or not claim)

    def _list(self, now: float) -> OwnershipSnapshot | None:
        """One listing of the scope (and the hub's partition ids when due); None when it failed."""
        due = self._schedule.partitions_due(now, known=bool(self._partitions))
        if due and not self._refresh_partitions(now):
            return None
        try:
            snapshot = take_snapshot(self.store, self.scope, previous=self._snapshot)
        except StoreError as exc:
            log_line(self._failures.failed(LISTING, str(exc), now))
            self._schedule.listing_failed(now)
            return None
        log_line(self._failures.succeeded(LISTING, now))
        record = snapshot.assignment
        if record is not None and not set(record.covered) <= set(self._partitions):
            # The operator saw partitions this consumer does not know yet (the hub grew): read them now
            # rather than at the next periodic refresh, so new partitions are read at once.
            self._refresh_partitions(now)
        return snapshot

    def _refresh_partitions(self, now: float) -> bool:
        """Read the hub's partition ids; False when they cannot be read and none are known."""
        try:
            self._partitions = self.hub.partition_ids()
        except Exception as exc:
            log_line(self._failures.failed(HUB_PARTITIONS, type(exc).__name__, now))
            if not self._partitions:
                self._schedule.listing_failed(now)
                return False
            return True
        self._schedule.partitions_read(now)
        log_line(self._failures.succeeded(HUB_PARTITIONS, now))
        return True
