"""The control loop (DESIGN §3): one cycle per PartitionedConsumer, the same for pods and local processes.

One cycle:
1. observe: the hub's partitions and last enqueued sequence numbers (`EventHubsProbe`, once per polling
   interval), the ownership table (one store listing: checkpoints, lease holders, members, the assignment
   record's ETag), the consumers and the replica count (the `ConsumerRuntime`);
2. decide the replica count (`autoscaler.decide_replicas`, on fresh backlog only);
3. run the rebalance state machine (`rebalance.step`);
4. write the assignment record when the state changed (compare-and-swap; a lost swap re-reads and runs
   the cycle again), before anything else;
5. act: set the replicas, end the membership of holders that are gone so their forced partitions move
   at once, nudge the consumers (`POST /assignment`), record the Events;
6. report: the status (`runtime.publish_status`) and the operator's metrics.

The decisions are pure (`autoscaler`, `rebalance`, and the helpers at the top of this module); the store
is synchronous and runs in a worker thread, so a cycle never blocks the operator's event loop.

Between cycles a `ControlLoop` keeps what the decisions hand back. What must survive a restart is in the
store: the assignment record (the rebalance state) and `<scope>/hubshift/autoscaler` (the autoscaler's
stabilisation history), one small JSON blob written only when it changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from hubshift.eventhubs.management import EventHubsProbe, PartitionInfo, ProbeError
from hubshift.operator import autoscaler, rebalance
from hubshift.operator.autoscaler import Pause, ScalingDecision, ScalingObservation, ScalingState
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.rebalance import (
    BreakLeases,
    Observation,
    PublishAssignment,
    RebalanceState,
    RecordEvent,
    SetReplicas,
    Step,
)
from hubshift.operator.runtime import ConsumerInstance, ConsumerRuntime
from hubshift.operator.status import (
    ACTIVE,
    FALLBACK,
    PAUSED,
    READY,
    REBALANCING,
    Condition,
    ConsumerAssignment,
    PartitionedConsumerStatus,
    PendingHandoff,
    carry_transition_time,
)
from hubshift.ownership.assignment import encode_assignment, publish_assignment
from hubshift.ownership.membership import expel
from hubshift.ownership.model import Assignment, OwnershipSnapshot, Phase
from hubshift.ownership.planner import consumer_sort_key
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import BlobNotFound, LeaseStore, StoreError, WriteConflict
from hubshift.spec import PartitionedConsumer, StartPosition

log = logging.getLogger(__name__)

AUTOSCALER_RECORD = "hubshift/autoscaler"  # under the scope's prefix
CAS_ATTEMPTS = 3
NUDGE_TIMEOUT_SECONDS = 1.0
# While a holddown runs or handoffs are pending, cycles come this often (the state machine's clock).
BUSY_CYCLE_SECONDS = 1.0


# --- pure helpers ---------------------------------------------------------------------------------------


def lease_holders(snapshot: OwnershipSnapshot, partitions: Iterable[str]) -> dict[str, str | None]:
    """Who holds each partition's lease now, alive or not; None when nobody does."""
    rows = {row.partition: row for row in snapshot.partitions}
    holders: dict[str, str | None] = {}
    for partition in partitions:
        row = rows.get(partition)
        holders[partition] = None if row is None or row.free else row.owner
    return holders


def backlog_per_partition(
    partitions: Mapping[str, PartitionInfo], snapshot: OwnershipSnapshot, start: StartPosition
) -> dict[str, int]:
    """Last enqueued - checkpoint for every partition; a missing checkpoint counts from the start position."""
    rows = {row.partition: row for row in snapshot.partitions}
    backlog = {}
    for partition, info in partitions.items():
        row = rows.get(partition)
        checkpoint = None if row is None else row.checkpoint.sequence_number
        backlog[partition] = autoscaler.partition_backlog(
            last_enqueued=info.last_enqueued,
            checkpoint=checkpoint,
            beginning=info.beginning,
            empty=info.empty,
            start="latest" if start.type == "latest" else "earliest",
        )
    return backlog


def present_consumers(instances: Iterable[ConsumerInstance]) -> tuple[str, ...]:
    """The consumers that may own partitions: ready and not being stopped."""
    return tuple(sorted((i.name for i in instances if i.ready and not i.terminating), key=consumer_sort_key))


def record_changed(new: Assignment, old: Assignment | None) -> bool:
    """Whether the record must be written: what the consumers would read differs."""
    return old is None or encode_assignment(new) != encode_assignment(old)


def holders_to_expel(
    published: PublishAssignment, holders: Mapping[str, str | None], spared: Iterable[str]
) -> list[str]:
    """The holders of forced partitions to expel: ending their membership lets the new owners take those
    partitions at once (an orphan is claimed by force) instead of after the membership lease. `spared`
    are the consumers present or still handing off after SIGTERM (they release on their own)."""
    keep = set(spared)
    gone = {holders.get(p) for p in published.forced}
    return sorted((c for c in gone if c is not None and c not in keep and c != "?"), key=consumer_sort_key)


def next_cycle_in(state: RebalanceState, now: float, polling_interval: float) -> float:
    """Seconds until the next cycle: the polling interval, sooner while a holddown or handoff runs."""
    wait = polling_interval
    if state.phase is not Phase.READY:
        wait = min(wait, BUSY_CYCLE_SECONDS)
    if state.holddown_until is not None:
        wait = min(wait, max(0.0, state.holddown_until - now))
    return wait


def assignment_by_consumer(state: RebalanceState) -> list[ConsumerAssignment]:
    consumers = sorted({c for c in state.assignment.values() if c is not None}, key=consumer_sort_key)
    return [ConsumerAssignment(consumer=c, partitions=state.partitions_of(c)) for c in consumers]


def pending(state: RebalanceState, holders: Mapping[str, str | None]) -> list[PendingHandoff]:
    since = None if state.published_at is None else _datetime(state.published_at)
    return [
        PendingHandoff(partition=p, from_owner=holders.get(p), to_owner=target, since=since)
        for p in rebalance.pending_handoffs(state, holders)
        if (target := state.assignment.get(p)) is not None
    ]


@dataclass(frozen=True)
class CycleInputs:
    """What the PartitionedConsumer itself says this cycle (its metadata and previous status)."""

    annotations: Mapping[str, str] = field(default_factory=dict)
    created_at: float | None = None
    generation: int | None = None
    previous_conditions: Sequence[Mapping[str, Any]] = ()

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> CycleInputs:
        metadata = body.get("metadata") or {}
        created = metadata.get("creationTimestamp")
        status = body.get("status") or {}
        return cls(
            annotations=dict(metadata.get("annotations") or {}),
            created_at=_parse_time(created) if isinstance(created, str) else None,
            generation=metadata.get("generation"),
            previous_conditions=list(status.get("conditions") or []),
        )


def build_status(
    *,
    state: RebalanceState,
    decision: ScalingDecision | None,
    pause: Pause,
    holders: Mapping[str, str | None],
    instances: Sequence[ConsumerInstance],
    current_replicas: int,
    partition_count: int,
    total_backlog: int | None,
    inputs: CycleInputs,
    now: float,
    last_scale_time: float | None,
    probe_error: str | None,
) -> PartitionedConsumerStatus:
    """The status subresource for this cycle (pure)."""
    moment = _datetime(now).replace(microsecond=0)
    handoffs = pending(state, holders)
    phase = state.phase.value
    if state.phase is Phase.HOLDDOWN and state.holddown_until is not None:
        message = (
            f"consumers changed; the assignment is held until {_datetime(state.holddown_until):%H:%M:%S} UTC"
        )
    elif state.phase is Phase.REBALANCING:
        message = f"generation {state.generation}: {len(handoffs)} handoffs pending"
    else:
        message = f"generation {state.generation}: balanced"
    if probe_error:
        message += f"; {probe_error}"
    conditions = [
        Condition(
            type=READY,
            status="True" if state.phase is Phase.READY else "False",
            reason="Balanced" if state.phase is Phase.READY else phase,
            message=message,
        ),
        Condition(
            type=REBALANCING,
            status="True" if state.phase is Phase.REBALANCING else "False",
            reason="HandoffsPending" if state.phase is Phase.REBALANCING else "NoHandoffs",
            message=f"{len(handoffs)} partitions moving",
        ),
    ]
    if decision is not None:
        problems = "; ".join(pause.problems)
        conditions += [
            Condition(
                type=ACTIVE,
                status="True" if decision.active else "False",
                reason="BacklogAboveActivation" if decision.active else "Idle",
                message=decision.reason,
            ),
            Condition(
                type=FALLBACK,
                status="True" if decision.fallback else "False",
                reason="BacklogUnreadable" if decision.fallback else "BacklogRead",
                message=probe_error or "the backlog was read",
            ),
            Condition(
                type=PAUSED,
                status="True" if decision.paused else "False",
                reason="PauseAnnotation"
                if decision.paused
                else ("BadAnnotation" if problems else "NotPaused"),
                message=problems or (decision.reason if decision.paused else "no pause annotation"),
            ),
        ]
    stamped = [
        carry_transition_time(list(inputs.previous_conditions), c, moment, inputs.generation)
        for c in conditions
    ]
    last_active = None if decision is None else decision.state.last_active_at
    return PartitionedConsumerStatus(
        phase=state.phase.value,
        message=message,
        observed_generation=inputs.generation,
        conditions=stamped,
        desired_replicas=None if decision is None else decision.replicas,
        current_replicas=current_replicas,
        ready_replicas=sum(1 for i in instances if i.ready and not i.terminating),
        partition_count=partition_count,
        total_backlog=total_backlog,
        assignment_generation=state.generation,
        assignment=assignment_by_consumer(state),
        holddown_until=None if state.holddown_until is None else _datetime(state.holddown_until),
        pending_handoffs=handoffs,
        last_scale_time=None if last_scale_time is None else _datetime(last_scale_time),
        last_active_time=None if last_active is None else _datetime(last_active),
    )


# --- nudges ---------------------------------------------------------------------------------------------


async def nudge_consumer(address: str, generation: int, timeout: float = NUDGE_TIMEOUT_SECONDS) -> bool:
    """`POST http://<address>/assignment`: re-read the assignment now. False when it did not answer 202."""
    host, _, port = address.rpartition(":")
    body = json.dumps({"generation": generation}).encode()
    request = (
        f"POST /assignment HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
        parts = line.split()
        return len(parts) >= 2 and parts[1] == b"202"
    except (OSError, TimeoutError, ValueError):
        return False
    finally:
        if writer is not None:
            writer.close()


Nudger = Callable[[str, int], Awaitable[bool]]


# --- the loop -------------------------------------------------------------------------------------------


@dataclass
class CycleReport:
    """What one cycle saw and did (the local runtime's view, tests and benchmarks read it)."""

    state: RebalanceState
    status: PartitionedConsumerStatus
    decision: ScalingDecision | None
    holders: dict[str, str | None]
    backlog: dict[str, int] | None
    actions: tuple[rebalance.Action, ...]
    store_requests: int
    duration: float
    next_cycle_in: float


@dataclass
class _Memory:
    scaling: ScalingState | None = None
    scaling_saved: dict[str, Any] | None = None
    scaling_etag: str | None = None
    scaling_loaded: bool = False
    rebalance: RebalanceState | None = None
    snapshot: OwnershipSnapshot | None = None
    partitions: dict[str, PartitionInfo] | None = None
    partition_ids: tuple[str, ...] = ()
    decision: ScalingDecision | None = None
    probed_at: float | None = None
    probe_error: str | None = None
    last_scale_time: float | None = None
    moving: dict[str, tuple[str, float]] = field(default_factory=dict)  # partition -> (target, published)
    expelled: set[str] = field(default_factory=set)


class CountingStore:
    """A `LeaseStore` wrapper that counts requests by kind (the benchmark's and the tests' meter)."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.store, name)
        if not callable(attribute) or name == "close":
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            return attribute(*args, **kwargs)

        return counted

    @property
    def total(self) -> int:
        return sum(self.counts.values())


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
    ) -> None:
        self.consumer = consumer
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
        self.labels = (consumer.metadata.namespace, consumer.metadata.name)

    def apply(self, consumer: PartitionedConsumer) -> None:
        """A changed spec: scaling and rebalance settings from the next cycle on."""
        self.consumer = consumer
        self.scaling = consumer.spec.scaling
        self.config = consumer.spec.rebalance
        self.memory.probed_at = None  # decide replicas again at once

    async def close(self) -> None:
        await self.probe.close()
        await asyncio.to_thread(self.store.store.close)

    # --- one cycle ---------------------------------------------------------------------------------

    async def cycle(self, inputs: CycleInputs | None = None) -> CycleReport:
        inputs = inputs or CycleInputs()
        started = time.perf_counter()
        requests_before = self.store.total
        now = self.clock()
        pause = autoscaler.parse_pause(inputs.annotations)
        for problem in pause.problems:
            log.warning("%s: %s", self.consumer.metadata.name, problem)

        await self._observe_hub(now)
        instances = await self.runtime.consumers()
        current = await self.runtime.replicas()
        decision = await self._decide_replicas(now, current, pause, inputs)
        desired = decision.replicas if decision is not None else current

        step, holders = await self._rebalance(now, instances, desired, current)
        await self._act(step, holders, instances, now, current)
        current = await self.runtime.replicas()

        memory = self.memory
        backlog = self._backlog()
        status = build_status(
            state=step.state,
            decision=decision,
            pause=pause,
            holders=holders,
            instances=instances,
            current_replicas=current,
            partition_count=len(memory.partition_ids),
            total_backlog=None if backlog is None else sum(backlog.values()),
            inputs=inputs,
            now=now,
            last_scale_time=memory.last_scale_time,
            probe_error=memory.probe_error,
        )
        await self.runtime.publish_status(status.to_body())
        duration = time.perf_counter() - started
        self._report_metrics(step.state, decision, instances, current, backlog, duration)
        return CycleReport(
            state=step.state,
            status=status,
            decision=decision,
            holders=holders,
            backlog=backlog,
            actions=step.actions,
            store_requests=self.store.total - requests_before,
            duration=duration,
            next_cycle_in=next_cycle_in(
                step.state, self.clock(), self.consumer.spec.scaling.polling_interval_seconds
            ),
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
        except ProbeError as exc:
            memory.partitions = None
            memory.probe_error = str(exc)
            log.warning("%s: backlog unreadable: %s", self.consumer.metadata.name, exc)

    def _backlog(self) -> dict[str, int] | None:
        memory = self.memory
        if memory.partitions is None or memory.snapshot is None:
            return None
        return backlog_per_partition(
            memory.partitions, memory.snapshot, self.consumer.spec.consumer.start_position
        )

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
        """The autoscaler runs on fresh backlog (once per polling interval); in between, its last decision."""
        memory = self.memory
        fresh = memory.probed_at == now
        if not fresh and memory.decision is not None:
            return memory.decision
        if not memory.scaling_loaded:
            await self._load_scaling_state()
        snapshot = await self._snapshot()
        backlog = None
        if memory.partitions is not None:
            per_partition = backlog_per_partition(
                memory.partitions, snapshot, self.consumer.spec.consumer.start_position
            )
            backlog = sum(per_partition.values())
        partition_count = len(memory.partition_ids) or len(
            snapshot.assignment.partition_ids if snapshot.assignment else ()
        )
        if partition_count == 0:
            return memory.decision
        decision = autoscaler.decide_replicas(
            self.scaling,
            memory.scaling or ScalingState(),
            ScalingObservation(backlog, partition_count, current, inputs.created_at),
            now,
            pause,
        )
        memory.scaling = decision.state
        memory.decision = decision
        await self._save_scaling_state(decision.state)
        return decision

    async def _load_scaling_state(self) -> None:
        memory = self.memory
        memory.scaling_loaded = True
        try:
            data, etag = await asyncio.to_thread(self.store.read, self.scope.prefix + AUTOSCALER_RECORD)
            memory.scaling = ScalingState.from_dict(json.loads(data))
            memory.scaling_saved = memory.scaling.to_dict()
            memory.scaling_etag = etag
        except BlobNotFound:
            pass
        except (StoreError, ValueError, TypeError) as exc:
            log.warning(
                "%s: the autoscaler's saved state is unreadable (%s): starting afresh", self.scope, exc
            )

    async def _save_scaling_state(self, state: ScalingState) -> None:
        memory = self.memory
        document = state.to_dict()
        if document == memory.scaling_saved:
            return
        name = self.scope.prefix + AUTOSCALER_RECORD
        data = json.dumps(document).encode()
        try:
            memory.scaling_etag = await asyncio.to_thread(
                self.store.write, name, data, etag=memory.scaling_etag
            )
            memory.scaling_saved = document
        except WriteConflict:
            # Another operator wrote it (or it is gone): take its ETag, write ours next cycle.
            try:
                _, memory.scaling_etag = await asyncio.to_thread(self.store.read, name)
            except BlobNotFound:
                memory.scaling_etag = None
        except StoreError as exc:
            log.warning("%s: could not save the autoscaler's state: %s", self.scope, exc)

    # --- rebalance ---------------------------------------------------------------------------------

    async def _rebalance(
        self, now: float, instances: Sequence[ConsumerInstance], desired: int, current: int
    ) -> tuple[Step, dict[str, str | None]]:
        """The state machine over a fresh listing; its state written (CAS) before any action."""
        memory = self.memory
        present = present_consumers(instances)
        snapshot = memory.snapshot if memory.snapshot is not None and memory.probed_at == now else None
        for _attempt in range(CAS_ATTEMPTS):
            if snapshot is None:
                snapshot = await self._snapshot()
            record = snapshot.assignment
            partitions = memory.partition_ids or (record.partition_ids if record else ())
            holders = lease_holders(snapshot, partitions)
            if not partitions:  # nothing known about the hub yet: nothing to decide
                state = memory.rebalance or RebalanceState()
                return Step(state, ()), holders
            observation = Observation(
                partitions=partitions,
                consumers=present,
                owners=holders,
                desired_replicas=desired,
                current_replicas=current,
                record=None if record is None else RebalanceState.from_record(record),
            )
            step = rebalance.step(memory.rebalance, observation, now, self.config)
            written = step.state.to_record(self.config)
            if not record_changed(written, record):
                memory.rebalance = step.state
                return step, holders
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
            return step, holders
        raise StoreError(f"{self.scope}: the assignment record kept changing ({CAS_ATTEMPTS} attempts)")

    # --- act ---------------------------------------------------------------------------------------

    async def _act(
        self,
        step: Step,
        holders: Mapping[str, str | None],
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
                    memory.moving[move.partition] = (move.target, now)
                stopping = [i.name for i in instances if i.terminating]
                for gone in holders_to_expel(action, holders, [*present, *stopping]):
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
        self._observe_handoffs(holders, now)

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

    def _observe_handoffs(self, holders: Mapping[str, str | None], now: float) -> None:
        """The handoff-duration histogram: from a move's publication to the new owner holding it."""
        memory = self.memory
        state = memory.rebalance
        for partition, (target, published) in list(memory.moving.items()):
            if state is not None and state.assignment.get(partition) != target:
                del memory.moving[partition]  # superseded by a later generation
            elif holders.get(partition) == target:
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
        metrics.partitions.labels(namespace, name).set(len(self.memory.partition_ids))
        if backlog is not None:
            metrics.set_backlog(namespace, name, backlog)
        metrics.set_phase(namespace, name, state.phase.value)


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=UTC)


def _parse_time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
