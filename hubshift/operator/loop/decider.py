"""What the control loop decides each cycle with the pure decisions, and keeps between cycles: the replica
count (`autoscaler.decide_replicas`: `spec.replicas` when set, else the autoscaler; its state kept in the
store by `ScalingRecord`), the rollout (`rollout.decide`) and the rebalance step (`rebalance.step`), whose
state it writes to the assignment record (compare-and-swap; a lost swap reads the record again and decides
again) before anything acts on it. It also holds this resource's reservation of its scope, and refuses to
drive a scope another resource drives."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumer
from hubshift.operator import autoscaler, data_loss, rebalance, rollout
from hubshift.operator.autoscaler import Pause, ScalingDecision, ScalingObservation, ScalingState
from hubshift.operator.data_loss import ExpiredStretch
from hubshift.operator.loop.inputs import ConsumersSeen, CycleInputs
from hubshift.operator.loop.observer import Observer
from hubshift.operator.observe import backlog_per_partition, lease_owners, present_consumers
from hubshift.operator.publication import record_changed
from hubshift.operator.rebalance import Observation, RebalanceState, Step
from hubshift.operator.reservations import Reservation, ScopeReservations, driving_refusal
from hubshift.operator.rollout import RolloutDecision, RolloutObservation, RolloutState
from hubshift.operator.runtime import ConsumerRuntime
from hubshift.operator.scaling_record import ScalingRecord
from hubshift.operator.sizing import LoadFigures
from hubshift.ownership.assignment import publish_assignment
from hubshift.ownership.model import Driver
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import StoreError, WriteConflict
from hubshift.ownership.stores.counting import CountingStore

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 3
# The Event the loop records when the lag target changes the replica count.
LAG_TARGET_EVENT = "LagTarget"


@dataclass(frozen=True)
class Decisions:
    """What a cycle decided: the replica count, the rebalance step over the lease owners it saw, and the
    rollout's decisions."""

    scaling_decision: ScalingDecision | None
    step: Step
    owners: dict[str, str | None]
    rollout: RolloutDecision
    expired: tuple[ExpiredStretch, ...] = ()  # events that expired unread, as the last probe saw them


class Decider:
    """The decisions of one resource's control loop, over what its `Observer` saw."""

    def __init__(
        self,
        scope: Scope,
        store: CountingStore,
        observer: Observer,
        runtime: ConsumerRuntime,
        *,
        driver: Driver | None,
        reservations: ScopeReservations | None,
        created: str,
    ) -> None:
        self.scope = scope
        self.store = store
        self.observer = observer
        self.runtime = runtime
        self.driver = driver  # written into the records it publishes; None: no check (tests, benchmarks)
        # the operator's reservations of hubs and consumer groups, this resource's among them
        self.reservations = reservations
        self.reservation = None if driver is None or reservations is None else Reservation(driver, created)
        if reservations is not None and self.reservation is not None:
            reservations.add(scope, self.reservation)
        self.scaling_record = ScalingRecord(store, scope)
        self.scaling_state: ScalingState | None = None
        self.scaling_loaded = False
        self.decision: ScalingDecision | None = None
        self.rebalance_state: RebalanceState | None = None
        self.rollout_state: RolloutState | None = None  # as the last cycle left it (also in the status)
        self.expired: tuple[ExpiredStretch, ...] = ()  # kept while the hub cannot be read

    async def refuse_if_reserved(self) -> None:
        """An older resource of this operator consumes the same hub and consumer group: this one's pods are
        stopped (with their own checkpoint store they would balance among themselves and steal the hub's
        partitions from the older pool) and the cycle fails with why (the status says it)."""
        if self.reservations is None or self.reservation is None:
            return
        refusal = self.reservations.refusal(self.scope, self.reservation)
        if refusal is None:
            return
        if await self.runtime.replicas() != 0:
            await self.runtime.set_replicas(0)
        raise UserError(refusal)

    def _outranks(self, driver: Driver | None) -> bool:
        """The record's driver is a younger resource of this operator on the same scope (refused by the
        reservations): this one takes the record over rather than both standing refused."""
        if self.reservations is None or self.reservation is None or driver is None:
            return False
        return self.reservations.outranks(self.scope, self.reservation, driver)

    async def decide(
        self,
        consumer: PartitionedConsumer,
        now: float,
        seen: ConsumersSeen,
        pause: Pause,
        clock: Callable[[], float],
    ) -> Decisions:
        """The replica count, then the rollout and the rebalance step for it (its state written)."""
        decision = await self.replica_decision(consumer, now, seen.current_replicas, pause, seen.inputs)
        observer = self.observer
        if observer.partitions is not None and observer.snapshot is not None:
            self.expired = data_loss.expired_unread(observer.partitions, observer.snapshot)
        if decision is not None:
            decision = data_loss.stop_the_pool(
                decision, self.expired, consumer.spec.consumer.fail_on_data_loss
            )
        desired = decision.replicas if decision is not None else seen.current_replicas
        step, owners, replacing = await self.rebalance_step(consumer, now, seen, desired, clock)
        return Decisions(decision, step, owners, replacing, self.expired)

    async def replica_decision(
        self, consumer: PartitionedConsumer, now: float, current: int, pause: Pause, inputs: CycleInputs
    ) -> ScalingDecision | None:
        """The autoscaler runs on fresh backlog (once per polling interval), and when there is no decision
        (the first cycle, a changed spec); in between, its last decision."""
        observer = self.observer
        if not observer.probed(now) and self.decision is not None:
            return self.decision
        if not self.scaling_loaded:
            self.scaling_state = await self.scaling_record.load()
            self.scaling_loaded = True
        snapshot = await observer.take_snapshot()
        backlog = None
        figures = None
        rebalance_spec = consumer.spec.rebalance
        if observer.partitions is not None:
            start = consumer.spec.consumer.start_position
            per_partition = backlog_per_partition(observer.partitions, snapshot, start)
            backlog = sum(per_partition.values())
            rates = observer.load(now, rebalance_spec.load_aware.window_seconds) or {}
            figures = LoadFigures(rates, per_partition, observer.capacity, rebalance_spec.strategy)
        partition_count = len(observer.partition_ids) or len(
            snapshot.assignment.partition_ids if snapshot.assignment else ()
        )
        if partition_count == 0:
            return self.decision
        decision = autoscaler.decide_replicas(
            consumer.spec.scaling,
            self.scaling_state or ScalingState(),
            ScalingObservation(backlog, partition_count, current, inputs.created_at, figures),
            now,
            pause,
            requested=consumer.spec.replicas,
        )
        previous = self.decision
        if decision.sizing is not None and previous is not None and decision.replicas != previous.replicas:
            await self.runtime.record_event(LAG_TARGET_EVENT, decision.reason)
        self.scaling_state = decision.state
        self.decision = decision
        await self.scaling_record.save(decision.state)
        return decision

    async def rebalance_step(
        self,
        consumer: PartitionedConsumer,
        now: float,
        seen: ConsumersSeen,
        desired: int,
        clock: Callable[[], float],
    ) -> tuple[Step, dict[str, str | None], RolloutDecision]:
        """The rollout's decisions and the state machine over a fresh listing; the state written (CAS)
        before any action."""
        observer = self.observer
        rebalance_spec = consumer.spec.rebalance
        present = present_consumers(seen.instances)
        snapshot = observer.snapshot if observer.snapshot is not None and observer.probed(now) else None
        for _attempt in range(CAS_ATTEMPTS):
            if snapshot is None:
                snapshot = await observer.take_snapshot()
            record = snapshot.assignment
            if self.driver is not None and record is not None:
                refusal = driving_refusal(record.driver, self.driver, str(self.scope))
                if refusal is not None and not self._outranks(record.driver):
                    raise UserError(refusal)
            partitions = observer.partition_ids or (record.partition_ids if record else ())
            owners = lease_owners(snapshot, partitions)
            if not partitions:  # nothing known about the hub yet: nothing to decide
                state = self.rebalance_state or RebalanceState()
                return Step(state, ()), owners, RolloutDecision(desired)
            stored = None if record is None else RebalanceState.from_record(record)
            start = rebalance.starting_point(self.rebalance_state, stored)
            replacing = self._rollout(consumer, now, seen, desired, start, owners)
            observation = Observation(
                partitions=partitions,
                consumers=present,
                owners=owners,
                desired_replicas=replacing.desired_replicas,
                current_replicas=seen.current_replicas,
                record=stored,
                pool=consumer.metadata.name,  # replica i is `<name>-<i>` in both runtimes
                stopping=replacing.stopping,
                retiring=replacing.retiring,
                load=observer.load(now, rebalance_spec.load_aware.window_seconds),
                capacity=observer.capacity,
            )
            # The clock read again: a slow cycle (a busy hub or store) must not eat into the handoff time
            # the record gives from its publication (`maxHandoffSeconds` from `updatedAt`).
            step = rebalance.step(self.rebalance_state, observation, clock(), rebalance_spec)
            written = replace(step.state.to_record(rebalance_spec), driver=self.driver)
            if not record_changed(written, record):
                self.rebalance_state = step.state
                return step, owners, replacing
            try:
                etag = await asyncio.to_thread(
                    publish_assignment, self.store, self.scope, written, etag=snapshot.assignment_etag
                )
            except WriteConflict:
                log.info("%s: the assignment record changed under us; reading it again", self.scope)
                self.rebalance_state = None
                snapshot = None
                continue
            self.rebalance_state = step.state
            observer.snapshot = replace(snapshot, assignment=written, assignment_etag=etag)
            return step, owners, replacing
        raise StoreError(f"{self.scope}: the assignment record kept changing ({CAS_ATTEMPTS} attempts)")

    def _rollout(
        self,
        consumer: PartitionedConsumer,
        now: float,
        seen: ConsumersSeen,
        desired: int,
        state: RebalanceState,
        owners: Mapping[str, str | None],
    ) -> RolloutDecision:
        """The rollout's decisions for this cycle (`rollout.decide`), remembered for the next one."""
        previous = self.rollout_state or RolloutState.from_status(seen.inputs.previous_rollout)
        observation = RolloutObservation(
            pool=consumer.metadata.name,
            pods=tuple(seen.instances),
            revision=seen.revision,
            desired_replicas=desired,
            current_replicas=seen.current_replicas,
            max_replicas=consumer.spec.scaling.max_replicas,
            state=state,
            owners=owners,
            paused=rollout.parse_paused(seen.inputs.annotations),
            previous=previous,
        )
        decision = rollout.decide(observation, now, consumer.spec.rebalance.rollout)
        self.rollout_state = decision.state
        return decision

    async def release(self) -> None:
        """The resource is gone: its record no longer names it as the scope's driver, so another resource
        may take the scope over. Best effort (CAS, one attempt)."""
        if self.driver is None:
            return
        snapshot = await self.observer.take_snapshot()
        record = snapshot.assignment
        if record is None or record.driver != self.driver:
            return
        try:
            await asyncio.to_thread(
                publish_assignment,
                self.store,
                self.scope,
                replace(record, driver=None),
                etag=snapshot.assignment_etag,
            )
        except (WriteConflict, StoreError) as exc:
            log.warning("%s: could not release the assignment record: %s", self.scope, exc)

    def drop_reservation(self) -> None:
        if self.reservations is not None and self.reservation is not None:
            self.reservations.drop(self.scope, self.reservation)
