"""What the control loop says after each cycle: the figures it derives (backlog, lag in seconds, load), the
resource's status (`status.build_status`, published by the runtime), a warning Event when a partition
receives more than one consumer processes, the operator's metrics, and the `CycleReport` its callers read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hubshift.manifest import PartitionedConsumer
from hubshift.operator.autoscaler import Pause, ScalingDecision
from hubshift.operator.cadence import phase_bound
from hubshift.operator.data_loss import ExpiredStretch
from hubshift.operator.loop.decider import Decisions
from hubshift.operator.loop.inputs import ConsumersSeen
from hubshift.operator.loop.observer import Observer
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.observe import present_consumers, unowned
from hubshift.operator.partition_lag import PartitionLag, worst_lag
from hubshift.operator.rebalance import Action, RebalanceState, holddown_seconds
from hubshift.operator.runtime import ConsumerInstance, ConsumerRuntime
from hubshift.operator.status import (
    DATA_LOSS,
    PartitionedConsumerStatus,
    ResourcePhase,
    RolloutStatus,
    build_status,
    data_loss_condition,
    over_capacity,
)
from hubshift.ownership.model import Phase

# The Event the loop records when a partition receives more than a consumer processes.
OVER_CAPACITY_EVENT = "PartitionOverCapacity"


@dataclass
class CycleReport:
    """What one cycle saw and did (the local runtime's view, tests and benchmarks read it)."""

    state: RebalanceState
    status: PartitionedConsumerStatus
    decision: ScalingDecision | None
    owners: dict[str, str | None]
    backlog: dict[str, int] | None
    actions: tuple[Action, ...]
    store_requests: int
    duration: float
    next_cycle_in: float
    lag: dict[str, PartitionLag] | None = None
    load: dict[str, float] | None = None  # each partition's incoming events per second, when measured
    capacity: float | None = None  # events one consumer processes per second of work, when measured


@dataclass(frozen=True)
class Figures:
    """What a cycle derives from what it saw: each partition's backlog, lag in seconds and load."""

    backlog: dict[str, int] | None
    lag: dict[str, PartitionLag] | None
    load: dict[str, float] | None


class Reporter:
    """The status, Events and metrics of one resource's control loop."""

    def __init__(
        self,
        observer: Observer,
        runtime: ConsumerRuntime,
        *,
        metrics: OperatorMetrics | None,
        labels: tuple[str, str],
    ) -> None:
        self.observer = observer
        self.runtime = runtime
        self.metrics = metrics
        self.labels = labels  # (namespace, resource name)
        self.phase_since: tuple[str, float] | None = None  # (phase, when it began) for the metrics
        self.over_capacity: list[str] = []  # the partitions over a consumer's capacity at the last cycle
        self.expired_seen: set[tuple[str, int]] = set()  # (partition, last expired) at the last cycle

    async def figures(
        self, consumer: PartitionedConsumer, now: float, owners: Mapping[str, str | None]
    ) -> Figures:
        """The backlog, lag and load of this cycle, with the Event of a partition newly over capacity."""
        observer = self.observer
        backlog = observer.backlog(consumer.spec.consumer.start_position)
        lag = observer.lag(backlog, owners, now)
        load = observer.load(now, consumer.spec.rebalance.load_aware.window_seconds)
        await self._warn_over_capacity(load)
        return Figures(backlog, lag, load)

    async def _warn_over_capacity(self, load: Mapping[str, float] | None) -> None:
        """A warning Event when a partition starts receiving more than one consumer processes."""
        capacity = self.observer.capacity
        over = over_capacity(load, capacity)
        if over and not set(over) <= set(self.over_capacity) and load is not None:
            rates = ", ".join(f"{p} ({load[p]:.0f}/s)" for p in over)
            message = (
                f"partitions {rates} each receive more than one consumer processes "
                f"({capacity or 0:.0f}/s): add partitions or give each consumer more resources"
            )
            await self.runtime.record_event(OVER_CAPACITY_EVENT, message, warning=True)
        self.over_capacity = over

    async def _warn_data_loss(self, expired: tuple[ExpiredStretch, ...], fail: bool) -> None:
        """A warning Event when events of a partition are newly found expired unread (or more of them)."""
        seen = {(stretch.partition, stretch.last) for stretch in expired}
        if expired and not seen <= self.expired_seen:
            condition = data_loss_condition(expired, fail)
            await self.runtime.record_event(DATA_LOSS, condition.message, warning=True)
        self.expired_seen = seen

    async def publish_status(
        self,
        consumer: PartitionedConsumer,
        now: float,
        seen: ConsumersSeen,
        pause: Pause,
        decided: Decisions,
        figures: Figures,
        current: int,
        last_scale_time: float | None,
    ) -> PartitionedConsumerStatus:
        """The resource's status for this cycle, published by the runtime."""
        observer = self.observer
        backlog, worst = figures.backlog, None if figures.lag is None else worst_lag(figures.lag)
        status = build_status(
            state=decided.step.state,
            decision=decided.scaling_decision,
            pause=pause,
            owners=decided.owners,
            instances=seen.instances,
            current_replicas=current,
            partition_count=len(observer.partition_ids),
            total_backlog=None if backlog is None else sum(backlog.values()),
            previous_conditions=seen.inputs.previous_conditions,
            observed_generation=seen.inputs.spec_generation,
            now=now,
            last_scale_time=last_scale_time,
            probe_error=observer.probe_error,
            worst_lag=None if worst is None or worst.seconds is None else (worst.partition, worst.seconds),
            more_conditions=seen.inputs.conditions,
            rollout=RolloutStatus.of(consumer.spec.rebalance.rollout.strategy, decided.rollout),
            load=figures.load,
            capacity=observer.capacity,
            expired=decided.expired,
            fail_on_data_loss=consumer.spec.consumer.fail_on_data_loss,
            restoring=observer.restoring,
        )
        await self._warn_data_loss(decided.expired, consumer.spec.consumer.fail_on_data_loss)
        await self.runtime.publish_status(status.to_body())
        return status

    def export(
        self,
        consumer: PartitionedConsumer,
        now: float,
        decided: Decisions,
        instances: Sequence[ConsumerInstance],
        current: int,
        figures: Figures,
    ) -> None:
        """The operator's metrics of this cycle."""
        state = decided.step.state
        self._export_replicas(consumer, state, decided, instances, current, figures)
        if self.metrics is not None:
            self.metrics.set_load(*self.labels, figures.load, self.observer.capacity)
        self._export_ownership(consumer, state, decided.owners, now)

    def _export_replicas(
        self,
        consumer: PartitionedConsumer,
        state: RebalanceState,
        decided: Decisions,
        instances: Sequence[ConsumerInstance],
        current: int,
        figures: Figures,
    ) -> None:
        """The replica counts, the hub's partitions, backlog and lag, the phase and the events lost."""
        metrics = self.metrics
        if metrics is None:
            return
        decision, expired = decided.scaling_decision, decided.expired
        namespace, name = self.labels
        if decision is not None:
            metrics.desired_replicas.labels(namespace, name).set(decision.replicas)
            metrics.paused.labels(namespace, name).set(1 if decision.paused else 0)
            metrics.fallback_active.labels(namespace, name).set(1 if decision.fallback else 0)
        metrics.current_replicas.labels(namespace, name).set(current)
        metrics.ready_replicas.labels(namespace, name).set(len(present_consumers(instances)))
        hub = consumer.spec.event_hubs
        metrics.set_hub(namespace, name, hub.hub, hub.consumer_group)
        metrics.set_partitions(namespace, name, len(self.observer.partition_ids))
        if figures.backlog is not None:
            metrics.set_backlog(namespace, name, figures.backlog)
        if figures.lag is not None:
            metrics.set_lag(namespace, name, {p: x.seconds for p, x in figures.lag.items()})
        metrics.set_phase(namespace, name, ResourcePhase(state.phase.value))
        metrics.expired_unread.labels(namespace, name).set(sum(stretch.events for stretch in expired))

    def _export_ownership(
        self,
        consumer: PartitionedConsumer,
        state: RebalanceState,
        owners: Mapping[str, str | None],
        now: float,
    ) -> None:
        """Owners, partitions nobody reads, and how long the phase has lasted against its bound."""
        phase = state.phase.value
        if self.phase_since is None or self.phase_since[0] != phase:
            self.phase_since = (phase, now)
        metrics, snapshot = self.metrics, self.observer.snapshot
        if metrics is None or snapshot is None:
            return
        namespace, name = self.labels
        rebalance_spec = consumer.spec.rebalance
        metrics.set_owners(namespace, name, owners)
        metrics.unowned.labels(namespace, name).set(len(unowned(owners, snapshot.live_members)))
        began = self.phase_since[1]
        if state.phase is Phase.REBALANCING and state.published_at is not None:
            began = state.published_at  # survives an operator restart
        elif state.phase is Phase.HOLDDOWN and state.holddown_until is not None:
            began = state.holddown_until - holddown_seconds(rebalance_spec)
        metrics.phase_duration.labels(namespace, name).set(max(0.0, now - began))
        metrics.phase_bound.labels(namespace, name).set(phase_bound(state.phase, rebalance_spec))
