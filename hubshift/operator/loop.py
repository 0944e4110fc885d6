"""The control loop: one cycle per PartitionedConsumer, the same for pods and local processes.

One cycle:
1. observe: the hub's partitions and last enqueued sequence numbers (`EventHubsProbe`, once per polling
   interval), the ownership table (one store listing: checkpoints, lease owners, members, the assignment
   record's ETag), the consumers and the replica count (the `ConsumerRuntime`);
2. decide the replica count (`autoscaler.decide_replicas`, on fresh backlog only);
3. run the rollout's decisions (`rollout.decide`: pods stopping, the pod a rollout replaces next, its
   surge) and the rebalance state machine over them (`rebalance.step`);
4. write the assignment record when the state changed (compare-and-swap; a lost swap re-reads and runs
   the cycle again), before anything else;
5. act: set the replicas, end the membership of owners that are gone so their forced partitions move
   at once, nudge the consumers (`POST /assignment`), delete (evict) the pods a rollout replaces once they
   hold nothing, record the Events;
6. report: the status (`runtime.publish_status`) and the operator's metrics, with each partition's lag in
   seconds (`observe.lag_per_partition`: from the times the owners write beside their checkpoints; the
   few events nobody reads are read in the background, `observe.lag_reads`).

The decisions are pure (`autoscaler`, `rebalance`, `observe`, `status.build_status`); the store is
synchronous and runs in a worker thread, so a cycle never blocks the event loop. When cycles run is the
`LoopDriver`'s business (`driver.py`), the same for both runtimes.

Between cycles a `ControlLoop` keeps what the decisions hand back. What must survive a restart is in the
store: the assignment record (the rebalance state) and the autoscaler's record (`scaling_record.py`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hubshift.connections import event_hubs_target, open_checkpoint_store, ownership_scope
from hubshift.errors import UserError
from hubshift.eventhubs.management import EventHubsProbe, ProbeError
from hubshift.eventhubs.model import PartitionInfo
from hubshift.manifest import PartitionedConsumer
from hubshift.operator import autoscaler, rebalance, rollout
from hubshift.operator.autoscaler import Pause, ScalingDecision, ScalingObservation, ScalingState
from hubshift.operator.cadence import next_cycle_in, phase_bound
from hubshift.operator.consumer_http import Nudger, consumer_work, nudge_consumer
from hubshift.operator.load import (
    HubSample,
    WorkSample,
    consumer_capacity,
    load_weights,
    partition_loads,
    within,
)
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.observe import backlog_per_partition, lease_owners, present_consumers, unowned
from hubshift.operator.partition_lag import (
    PartitionLag,
    lag_per_partition,
    lag_reads,
    remember_probes,
    worst_lag,
)
from hubshift.operator.publication import owners_to_expel, record_changed
from hubshift.operator.rebalance import (
    BreakLeases,
    Observation,
    PublishAssignment,
    RebalanceState,
    RecordEvent,
    SetReplicas,
    Step,
)
from hubshift.operator.reservations import Reservation, ScopeReservations, driving_refusal
from hubshift.operator.rollout import RolloutDecision, RolloutObservation, RolloutState
from hubshift.operator.runtime import ConsumerInstance, ConsumerRuntime
from hubshift.operator.scaling_record import ScalingRecord
from hubshift.operator.sizing import LoadFigures
from hubshift.operator.status import (
    Condition,
    PartitionedConsumerStatus,
    ResourcePhase,
    RolloutStatus,
    build_status,
    over_capacity,
)
from hubshift.ownership.assignment import publish_assignment
from hubshift.ownership.membership import expel
from hubshift.ownership.model import Driver, OwnershipSnapshot, Phase
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseStore, StoreError, WriteConflict
from hubshift.ownership.stores.counting import CountingStore
from hubshift.ownership.timing import epoch_seconds
from hubshift.spec import TokenCredentialSpec

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 3
# Events the loop records when the lag target changes the replica count, and when a partition receives
# more than a consumer processes.
LAG_TARGET_EVENT = "LagTarget"
OVER_CAPACITY_EVENT = "PartitionOverCapacity"


@dataclass(frozen=True)
class CycleInputs:
    """What the PartitionedConsumer itself says this cycle (its metadata and previous status)."""

    annotations: Mapping[str, str] = field(default_factory=dict)
    created_at: float | None = None
    spec_generation: int | None = None  # the resource's metadata.generation
    previous_conditions: Sequence[Mapping[str, Any]] = ()
    # What the runtime says of the spec where it runs (Kubernetes: whether the output outlives a pod).
    conditions: Sequence[Condition] = ()
    previous_rollout: Mapping[str, Any] | None = None  # the status' `rollout` block as last written

    @classmethod
    def from_body(cls, body: Mapping[str, Any], conditions: Sequence[Condition] = ()) -> CycleInputs:
        metadata = body.get("metadata") or {}
        created = metadata.get("creationTimestamp")
        status = body.get("status") or {}
        return cls(
            annotations=dict(metadata.get("annotations") or {}),
            created_at=epoch_seconds(created),
            spec_generation=metadata.get("generation"),
            previous_conditions=list(status.get("conditions") or []),
            conditions=tuple(conditions),
            previous_rollout=status.get("rollout") if isinstance(status.get("rollout"), Mapping) else None,
        )


@dataclass
class CycleReport:
    """What one cycle saw and did (the local runtime's view, tests and benchmarks read it)."""

    state: RebalanceState
    status: PartitionedConsumerStatus
    decision: ScalingDecision | None
    owners: dict[str, str | None]
    backlog: dict[str, int] | None
    actions: tuple[rebalance.Action, ...]
    store_requests: int
    duration: float
    next_cycle_in: float
    lag: dict[str, PartitionLag] | None = None
    load: dict[str, float] | None = None  # each partition's incoming events per second, when measured
    capacity: float | None = None  # events one consumer processes per second of work, when measured


@dataclass
class _Memory:
    scaling: ScalingState | None = None
    scaling_loaded: bool = False
    rebalance: RebalanceState | None = None
    snapshot: OwnershipSnapshot | None = None
    partitions: dict[str, PartitionInfo] | None = None
    partition_ids: tuple[str, ...] = ()
    decision: ScalingDecision | None = None
    probed_at: float | None = None
    probe_error: str | None = None
    last_scale_time: float | None = None
    moving: dict[str, tuple[str, float]] = field(default_factory=dict)  # partition -> (assignee, published)
    expelled: set[str] = field(default_factory=set)
    # lag in seconds: events read by the loop itself, partition -> (sequence number, enqueued time), and
    # the reads tried, partition -> (sequence number, when)
    lag_read: dict[str, tuple[int, float]] = field(default_factory=dict)
    lag_tried: dict[str, tuple[int, float]] = field(default_factory=dict)
    lag_reading: asyncio.Task[None] | None = None
    # the probes that bound a lag from below, partition -> ((last enqueued sequence number, when), ...)
    lag_probes: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    phase_since: tuple[str, float] | None = None  # (phase, when it began) for the metrics
    rollout: RolloutState | None = None  # the rollout as the last cycle left it (also in the status)
    # load and capacity (operator/load.py): the hub's positions at each probe, the consumers' work at each
    # probe, the capacity last measured, and the partitions over it at the last cycle
    hub_samples: list[HubSample] = field(default_factory=list)
    work_samples: list[WorkSample] = field(default_factory=list)
    capacity: float | None = None
    over_capacity: list[str] = field(default_factory=list)


class ControlLoop:
    """The control loop of one PartitionedConsumer. `cycle()` runs one cycle; the caller schedules them
    (`report.next_cycle_in`), and runs one at once when a consumer appears, goes or changes readiness."""

    def __init__(
        self,
        consumer: PartitionedConsumer,
        scope: Scope,
        store: LeaseStore,
        probe: EventHubsProbe | Any,
        runtime: ConsumerRuntime,
        *,
        metrics: OperatorMetrics | None = None,
        nudge: Nudger = nudge_consumer,
        clock: Callable[[], float] = time.time,
        driver: Driver | None = None,
        reservations: ScopeReservations | None = None,
        created: str = "",
    ) -> None:
        self.consumer = consumer
        self.driver = driver  # written into the records it publishes; None: no check (tests, benchmarks)
        # the operator's reservations of hubs and consumer groups (operator/reservations.py), this
        # resource's among them
        self.reservations = reservations
        self.reservation = None if driver is None or reservations is None else Reservation(driver, created)
        if reservations is not None and self.reservation is not None:
            reservations.add(scope, self.reservation)
        self.scope = scope
        self.store = CountingStore(store)
        self.probe = probe
        self.runtime = runtime
        self.metrics = metrics
        self.nudge = nudge
        self.clock = clock
        self.scaling = consumer.spec.scaling
        self.config = consumer.spec.rebalance
        self.memory = _Memory()
        self.scaling_record = ScalingRecord(self.store, scope)
        self.labels = (consumer.metadata.namespace, consumer.metadata.name)

    def apply(self, consumer: PartitionedConsumer) -> None:
        """A changed spec: scaling and rebalance settings from the next cycle on."""
        self.consumer = consumer
        self.scaling = consumer.spec.scaling
        self.config = consumer.spec.rebalance
        # Decide replicas again at once, on the backlog last read (at most a polling interval old): probing
        # every partition first would delay the scale the new bounds ask for by that probe.
        self.memory.decision = None

    async def release(self) -> None:
        """The resource is gone (deleted, or `hubshift run` ends): its record no longer names it as the
        scope's driver, so another resource may take the scope over. Best effort (CAS, one attempt)."""
        if self.driver is None:
            return
        snapshot = await self._snapshot()
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

    async def close(self) -> None:
        if self.reservations is not None and self.reservation is not None:
            self.reservations.drop(self.scope, self.reservation)
        reading = self.memory.lag_reading
        if reading is not None and not reading.done():
            reading.cancel()
        await self.probe.close()
        await asyncio.to_thread(self.store.store.close)

    # --- one cycle ---------------------------------------------------------------------------------

    async def _refuse_if_reserved(self) -> None:
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

    async def cycle(self, inputs: CycleInputs | None = None) -> CycleReport:
        inputs = inputs or CycleInputs()
        await self._refuse_if_reserved()
        started = time.perf_counter()
        requests_before = self.store.total
        now = self.clock()
        pause = autoscaler.parse_pause(inputs.annotations)
        for problem in pause.problems:
            log.warning("%s: %s", self.consumer.metadata.name, problem)

        await self._observe_hub(now)
        instances = await self.runtime.consumers()
        await self._observe_work(now, instances)
        current = await self.runtime.replicas()
        revision = await self.runtime.revision()
        decision = await self._decide_replicas(now, current, pause, inputs)
        desired = decision.replicas if decision is not None else current

        pods = _Pods(instances, revision, inputs)
        step, owners, replacing = await self._rebalance(now, pods, desired, current)
        await self._act(step, owners, instances, now, current)
        await self._replace(replacing)
        current = await self.runtime.replicas()

        memory = self.memory
        backlog = self._backlog()
        lag = self._lag(backlog, owners, now)
        load = self._load(now)
        await self._report_over_capacity(load)
        worst = None if lag is None else worst_lag(lag)
        status = build_status(
            state=step.state,
            decision=decision,
            pause=pause,
            owners=owners,
            instances=instances,
            current_replicas=current,
            partition_count=len(memory.partition_ids),
            total_backlog=None if backlog is None else sum(backlog.values()),
            previous_conditions=inputs.previous_conditions,
            observed_generation=inputs.spec_generation,
            now=now,
            last_scale_time=memory.last_scale_time,
            probe_error=memory.probe_error,
            worst_lag=None if worst is None or worst.seconds is None else (worst.partition, worst.seconds),
            more_conditions=inputs.conditions,
            rollout=RolloutStatus.of(self.config.rollout.strategy, replacing),
            load=load,
            capacity=memory.capacity,
        )
        await self.runtime.publish_status(status.to_body())
        duration = time.perf_counter() - started
        self._report_metrics(step.state, decision, instances, current, backlog, duration, lag)
        self._report_load(load)
        self._report_ownership(step.state, owners, now)
        return CycleReport(
            state=step.state,
            status=status,
            decision=decision,
            owners=owners,
            backlog=backlog,
            lag=lag,
            actions=step.actions,
            store_requests=self.store.total - requests_before,
            duration=duration,
            next_cycle_in=next_cycle_in(
                step.state, self.clock(), self.consumer.spec.scaling.polling_interval_seconds
            ),
            load=load,
            capacity=memory.capacity,
        )

    # --- observe -----------------------------------------------------------------------------------

    async def _observe_hub(self, now: float) -> None:
        """Partition ids and last enqueued sequence numbers, once per polling interval."""
        memory = self.memory
        interval = self.consumer.spec.scaling.polling_interval_seconds
        if memory.probed_at is not None and now - memory.probed_at < interval:
            return
        memory.probed_at = now
        try:
            memory.partitions = await self.probe.partitions()
            memory.partition_ids = tuple(memory.partitions)
            memory.probe_error = None
            positions = {p: (i.last_enqueued, i.last_enqueued_offset) for p, i in memory.partitions.items()}
            memory.hub_samples = within([*memory.hub_samples, HubSample(now, positions)], now, self._window)
        except ProbeError as exc:
            memory.partitions = None
            memory.probe_error = str(exc)
            log.warning("%s: backlog unreadable: %s", self.consumer.metadata.name, exc)

    @property
    def _window(self) -> float:
        return self.config.load_aware.window_seconds

    async def _observe_work(self, now: float, instances: Sequence[ConsumerInstance]) -> None:
        """At each probe, what every ready consumer has processed and for how long: their capacity."""
        memory = self.memory
        if memory.probed_at != now:
            return
        reachable = [i for i in instances if i.address and i.ready and not i.terminating]
        answers = await asyncio.gather(*(consumer_work(str(i.address)) for i in reachable))
        work = {i.name: answer for i, answer in zip(reachable, answers, strict=True) if answer is not None}
        memory.work_samples = within([*memory.work_samples, WorkSample(now, work)], now, self._window)
        capacity = consumer_capacity(memory.work_samples, now, self._window)
        if capacity is not None:
            memory.capacity = capacity  # kept while the consumers are idle: an idle pool is not slower

    def _load(self, now: float) -> dict[str, float] | None:
        """Each partition's incoming events per second over the window; None before two probes."""
        loads = partition_loads(self.memory.hub_samples, now, self._window)
        return load_weights(loads) if loads else None

    async def _report_over_capacity(self, load: Mapping[str, float] | None) -> None:
        """A warning Event when a partition starts receiving more than one consumer processes."""
        memory = self.memory
        over = over_capacity(load, memory.capacity)
        if over and not set(over) <= set(memory.over_capacity) and load is not None:
            rates = ", ".join(f"{p} ({load[p]:.0f}/s)" for p in over)
            message = (
                f"partitions {rates} each receive more than one consumer processes "
                f"({memory.capacity or 0:.0f}/s): add partitions or give each consumer more resources"
            )
            await self.runtime.record_event(OVER_CAPACITY_EVENT, message, warning=True)
        memory.over_capacity = over

    def _backlog(self) -> dict[str, int] | None:
        memory = self.memory
        if memory.partitions is None or memory.snapshot is None:
            return None
        return backlog_per_partition(
            memory.partitions, memory.snapshot, self.consumer.spec.consumer.start_position
        )

    def _lag(
        self, backlog: Mapping[str, int] | None, owners: Mapping[str, str | None], now: float
    ) -> dict[str, PartitionLag] | None:
        """Each partition's lag in seconds; starts reading, in the background, the few events whose time
        nobody wrote (partitions nobody reads), for the next cycles."""
        memory = self.memory
        if backlog is None or memory.partitions is None or memory.snapshot is None:
            return None
        if memory.probed_at == now:  # a fresh probe: its position joins the bounds (operator/observe.py)
            memory.lag_probes = remember_probes(memory.lag_probes, memory.partitions, backlog, now)
        lag = lag_per_partition(
            memory.partitions, memory.snapshot, backlog, memory.lag_read, now, memory.lag_probes
        )
        if memory.lag_reading is None or memory.lag_reading.done():
            reads = lag_reads(lag, backlog, owners, memory.snapshot.live_members, memory.lag_tried, now)
            if reads and hasattr(self.probe, "enqueued_time"):
                for partition, sequence in reads:
                    memory.lag_tried[partition] = (sequence, now)
                memory.lag_reading = asyncio.get_running_loop().create_task(self._read_enqueued(reads))
        return lag

    async def _read_enqueued(self, reads: Sequence[tuple[str, int]]) -> None:
        for partition, sequence in reads:
            try:
                moment = await self.probe.enqueued_time(partition, sequence)
            except Exception as exc:  # one unreadable event leaves that lag unknown; the loop goes on
                log.debug("%s: reading partition %s failed: %s", self.scope, partition, type(exc).__name__)
                moment = None
            if self.metrics is not None:
                self.metrics.lag_reads.labels(*self.labels, "ok" if moment is not None else "failed").inc()
            if moment is not None:
                self.memory.lag_read[partition] = (sequence, moment)

    async def _snapshot(self) -> OwnershipSnapshot:
        memory = self.memory
        memory.snapshot = await asyncio.to_thread(
            take_snapshot, self.store, self.scope, previous=memory.snapshot
        )
        return memory.snapshot

    # --- decide replicas ---------------------------------------------------------------------------

    async def _decide_replicas(
        self, now: float, current: int, pause: Pause, inputs: CycleInputs
    ) -> ScalingDecision | None:
        """The autoscaler runs on fresh backlog (once per polling interval), and when there is no decision
        (the first cycle, a changed spec); in between, its last decision."""
        memory = self.memory
        fresh = memory.probed_at == now
        if not fresh and memory.decision is not None:
            return memory.decision
        if not memory.scaling_loaded:
            memory.scaling = await self.scaling_record.load()
            memory.scaling_loaded = True
        snapshot = await self._snapshot()
        backlog = None
        figures = None
        if memory.partitions is not None:
            per_partition = backlog_per_partition(
                memory.partitions, snapshot, self.consumer.spec.consumer.start_position
            )
            backlog = sum(per_partition.values())
            rates = self._load(now) or {}
            figures = LoadFigures(rates, per_partition, memory.capacity, self.config.strategy)
        partition_count = len(memory.partition_ids) or len(
            snapshot.assignment.partition_ids if snapshot.assignment else ()
        )
        if partition_count == 0:
            return memory.decision
        decision = autoscaler.decide_replicas(
            self.scaling,
            memory.scaling or ScalingState(),
            ScalingObservation(backlog, partition_count, current, inputs.created_at, figures),
            now,
            pause,
        )
        previous = memory.decision
        if decision.sizing is not None and previous is not None and decision.replicas != previous.replicas:
            await self.runtime.record_event(LAG_TARGET_EVENT, decision.reason)
        memory.scaling = decision.state
        memory.decision = decision
        await self.scaling_record.save(decision.state)
        return decision

    # --- rebalance ---------------------------------------------------------------------------------

    async def _rebalance(
        self, now: float, pods: _Pods, desired: int, current: int
    ) -> tuple[Step, dict[str, str | None], RolloutDecision]:
        """The rollout's decisions and the state machine over a fresh listing; the state written (CAS)
        before any action."""
        memory = self.memory
        present = present_consumers(pods.instances)
        snapshot = memory.snapshot if memory.snapshot is not None and memory.probed_at == now else None
        for _attempt in range(CAS_ATTEMPTS):
            if snapshot is None:
                snapshot = await self._snapshot()
            record = snapshot.assignment
            if self.driver is not None and record is not None:
                refusal = driving_refusal(record.driver, self.driver, str(self.scope))
                if refusal is not None and not self._outranks(record.driver):
                    raise UserError(refusal)
            partitions = memory.partition_ids or (record.partition_ids if record else ())
            owners = lease_owners(snapshot, partitions)
            if not partitions:  # nothing known about the hub yet: nothing to decide
                state = memory.rebalance or RebalanceState()
                return Step(state, ()), owners, RolloutDecision(desired)
            stored = None if record is None else RebalanceState.from_record(record)
            start = rebalance.starting_point(memory.rebalance, stored)
            replacing = self._rollout(now, pods, desired, current, start, owners)
            observation = Observation(
                partitions=partitions,
                consumers=present,
                owners=owners,
                desired_replicas=replacing.desired_replicas,
                current_replicas=current,
                record=stored,
                pool=self.consumer.metadata.name,  # replica i is `<name>-<i>` in both runtimes
                stopping=replacing.stopping,
                retiring=replacing.retiring,
                load=self._load(now),
                capacity=memory.capacity,
            )
            # The clock read again: a slow cycle (a busy hub or store) must not eat into the handoff time
            # the record gives from its publication (`maxHandoffSeconds` from `updatedAt`).
            step = rebalance.step(memory.rebalance, observation, self.clock(), self.config)
            written = replace(step.state.to_record(self.config), driver=self.driver)
            if not record_changed(written, record):
                memory.rebalance = step.state
                return step, owners, replacing
            try:
                etag = await asyncio.to_thread(
                    publish_assignment, self.store, self.scope, written, etag=snapshot.assignment_etag
                )
            except WriteConflict:
                log.info("%s: the assignment record changed under us; reading it again", self.scope)
                memory.rebalance = None
                snapshot = None
                continue
            memory.rebalance = step.state
            memory.snapshot = replace(snapshot, assignment=written, assignment_etag=etag)
            return step, owners, replacing
        raise StoreError(f"{self.scope}: the assignment record kept changing ({CAS_ATTEMPTS} attempts)")

    def _rollout(
        self,
        now: float,
        pods: _Pods,
        desired: int,
        current: int,
        state: RebalanceState,
        owners: Mapping[str, str | None],
    ) -> RolloutDecision:
        """The rollout's decisions for this cycle (`rollout.decide`), remembered for the next one."""
        memory = self.memory
        previous = memory.rollout or RolloutState.from_status(pods.inputs.previous_rollout)
        observation = RolloutObservation(
            pool=self.consumer.metadata.name,
            pods=tuple(pods.instances),
            revision=pods.revision,
            desired_replicas=desired,
            current_replicas=current,
            max_replicas=self.scaling.max_replicas,
            state=state,
            owners=owners,
            paused=rollout.parse_paused(pods.inputs.annotations),
            previous=previous,
        )
        decision = rollout.decide(observation, now, self.config.rollout)
        memory.rollout = decision.state
        return decision

    # --- act ---------------------------------------------------------------------------------------

    async def _act(
        self,
        step: Step,
        owners: Mapping[str, str | None],
        instances: Sequence[ConsumerInstance],
        now: float,
        current: int,
    ) -> None:
        memory = self.memory
        namespace, name = self.labels
        nudge_generation: int | None = None
        present = present_consumers(instances)
        for action in step.actions:
            if isinstance(action, PublishAssignment):
                nudge_generation = action.generation
                for move in action.moves:
                    memory.moving[move.partition] = (move.assignee, now)
                stopping = [i.name for i in instances if i.terminating]
                for gone in owners_to_expel(action, owners, [*present, *stopping]):
                    await self._expel(gone)
                if self.metrics is not None:
                    self.metrics.moves.labels(namespace, name).inc(len(action.moves))
                    self.metrics.rebalances.labels(namespace, name, action.reason.value).inc()
            elif isinstance(action, BreakLeases):
                nudge_generation = action.generation
            elif isinstance(action, SetReplicas):
                await self.runtime.set_replicas(action.replicas)
                if action.replicas != current:
                    memory.last_scale_time = now
                    if self.metrics is not None:
                        self.metrics.record_scale(namespace, name, current, action.replicas)
        if nudge_generation is not None:
            await self._nudge_all(instances, nudge_generation)
        for action in step.actions:
            if isinstance(action, RecordEvent):
                await self.runtime.record_event(action.reason, action.message, warning=action.warning)
        self._observe_handoffs(owners, now)

    async def _replace(self, decision: RolloutDecision) -> None:
        """Delete the pods the rollout replaces (they hold nothing now), then record its Events."""
        for name in decision.delete:
            if await self.runtime.replace_consumer(name):
                revision = decision.state.revision if decision.state is not None else "?"
                await self.runtime.record_event(
                    "Replacing", f"{name} holds no partition: deleted, made again at revision {revision}"
                )
            else:
                log.info("%s: the PodDisruptionBudget refuses to evict %s now; retrying", self.scope, name)
        for event in decision.events:
            await self.runtime.record_event(event.reason, event.message, warning=event.warning)

    async def _expel(self, consumer: str) -> None:
        memory = self.memory
        try:
            await asyncio.to_thread(expel, self.store, self.scope, consumer)
            memory.expelled.add(consumer)
            log.info(
                "%s: ended the membership of %s (gone): its partitions move at once", self.scope, consumer
            )
        except StoreError as exc:
            log.warning("%s: could not end the membership of %s: %s", self.scope, consumer, exc)

    async def _nudge_all(self, instances: Sequence[ConsumerInstance], generation: int) -> None:
        addresses = [i.address for i in instances if i.address and not i.terminating]
        results = await asyncio.gather(*(self.nudge(a, generation) for a in addresses))
        missed = [a for a, ok in zip(addresses, results, strict=True) if not ok]
        if missed:
            log.debug(
                "%s: %d consumers did not take the nudge (they list on their own)", self.scope, len(missed)
            )

    def _observe_handoffs(self, owners: Mapping[str, str | None], now: float) -> None:
        """The handoff-duration histogram: from a move's publication to the new owner holding it."""
        memory = self.memory
        state = memory.rebalance
        for partition, (assignee, published) in list(memory.moving.items()):
            if state is not None and state.assignment.get(partition) != assignee:
                del memory.moving[partition]  # superseded by a later generation
            elif owners.get(partition) == assignee:
                del memory.moving[partition]
                if self.metrics is not None:
                    self.metrics.handoff_duration.labels(*self.labels).observe(max(0.0, now - published))

    # --- report ------------------------------------------------------------------------------------

    def _report_metrics(
        self,
        state: RebalanceState,
        decision: ScalingDecision | None,
        instances: Sequence[ConsumerInstance],
        current: int,
        backlog: Mapping[str, int] | None,
        duration: float,
        lag: Mapping[str, PartitionLag] | None = None,
    ) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        namespace, name = self.labels
        if decision is not None:
            metrics.desired_replicas.labels(namespace, name).set(decision.replicas)
            metrics.paused.labels(namespace, name).set(1 if decision.paused else 0)
            metrics.fallback_active.labels(namespace, name).set(1 if decision.fallback else 0)
        metrics.current_replicas.labels(namespace, name).set(current)
        metrics.ready_replicas.labels(namespace, name).set(len(present_consumers(instances)))
        hub = self.consumer.spec.event_hubs
        metrics.set_hub(namespace, name, hub.hub, hub.consumer_group)
        metrics.set_partitions(namespace, name, len(self.memory.partition_ids))
        if backlog is not None:
            metrics.set_backlog(namespace, name, backlog)
        if lag is not None:
            metrics.set_lag(namespace, name, {p: x.seconds for p, x in lag.items()})
        metrics.set_phase(namespace, name, ResourcePhase(state.phase.value))

    def _report_load(self, load: Mapping[str, float] | None) -> None:
        if self.metrics is not None:
            self.metrics.set_load(*self.labels, load, self.memory.capacity)

    def _report_ownership(self, state: RebalanceState, owners: Mapping[str, str | None], now: float) -> None:
        """Owners, partitions nobody reads, and how long the phase has lasted against its bound."""
        memory = self.memory
        phase = state.phase.value
        if memory.phase_since is None or memory.phase_since[0] != phase:
            memory.phase_since = (phase, now)
        metrics = self.metrics
        if metrics is None or memory.snapshot is None:
            return
        namespace, name = self.labels
        metrics.set_owners(namespace, name, owners)
        metrics.unowned.labels(namespace, name).set(len(unowned(owners, memory.snapshot.live_members)))
        began = memory.phase_since[1]
        if state.phase is Phase.REBALANCING and state.published_at is not None:
            began = state.published_at  # survives an operator restart
        elif state.phase is Phase.HOLDDOWN and state.holddown_until is not None:
            began = state.holddown_until - self.config.delay_seconds
        metrics.phase_duration.labels(namespace, name).set(max(0.0, now - began))
        metrics.phase_bound.labels(namespace, name).set(phase_bound(state.phase, self.config))


@dataclass(frozen=True)
class _Pods:
    """The consumers as the runtime reports them this cycle, the revision new ones are made from, and what
    the resource says (the rollout's pause, its last status)."""

    instances: Sequence[ConsumerInstance]
    revision: str | None
    inputs: CycleInputs


async def open_control_loop(
    consumer: PartitionedConsumer,
    environ: Mapping[str, str],
    runtime: ConsumerRuntime,
    *,
    metrics: OperatorMetrics | None = None,
    check_hub: bool = False,
    identity: TokenCredentialSpec | None = None,
    driver: Driver | None = None,
    reservations: ScopeReservations | None = None,
    created: str = "",
) -> ControlLoop:
    """A control loop with its clients for this spec: the hub (one probe, kept open) and the store, their
    connection strings from `environ`, their token credentials the spec's (or `identity`, the operator's
    own, in their place). A bad spec or credential is a `UserError` (one line); with `check_hub`, so is a
    hub that cannot be read now (`hubshift run` checks up front; the operator reports it in status)."""
    target = event_hubs_target(consumer.spec.event_hubs, environ, identity=identity)
    store = await asyncio.to_thread(
        functools.partial(open_checkpoint_store, consumer.spec.checkpoint_store, environ, identity=identity)
    )
    probe = EventHubsProbe(target)
    if check_hub:
        try:
            await probe.partition_ids()
        except ProbeError as exc:
            await probe.close()
            store.close()
            raise UserError(str(exc)) from None
    return ControlLoop(
        consumer,
        ownership_scope(target),
        store,
        probe,
        runtime,
        metrics=metrics,
        driver=driver,
        reservations=reservations,
        created=created,
    )
