"""The `PartitionedConsumer` status: what the control loop reports, typed once.

The CRD's status schema is generated from these models (`hubshift.operator.kubernetes.crd`), so a field the
control loop writes is never pruned by the API server. Build one `PartitionedConsumerStatus`, then
`runtime.publish_status(status.to_body())`. No field here may ever carry a secret.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from hubshift.operator import data_loss, rebalance
from hubshift.operator.autoscaler import Pause, ScalingDecision
from hubshift.operator.data_loss import ExpiredStretch
from hubshift.operator.rebalance import RebalanceState
from hubshift.operator.rollout import RolloutDecision
from hubshift.operator.runtime import ConsumerInstance
from hubshift.operator.sizing import LagSizing
from hubshift.ownership.model import ChangeKind, Phase
from hubshift.ownership.planner import consumer_sort_key
from hubshift.spec import Model


class ResourcePhase(enum.StrEnum):
    """The PartitionedConsumer's `status.phase`: the rebalance phase (`Phase`) once a cycle ran."""

    PENDING = "Pending"  # children created, no control-loop cycle yet
    READY = Phase.READY.value
    HOLDDOWN = Phase.HOLDDOWN.value
    REBALANCING = Phase.REBALANCING.value
    INVALID = "Invalid"  # the spec failed the operator's validation


def _inline_enum(kind: type[enum.StrEnum]) -> WithJsonSchema:
    """The enum's values inline in the JSON schema (the CRD's schema has no references)."""
    return WithJsonSchema({"type": "string", "enum": [member.value for member in kind]})


# The Rebalancing condition's reason while a change of each kind runs.
CHANGE_REASONS: dict[ChangeKind, str] = {
    ChangeKind.PLANNED: "Planned",
    ChangeKind.HOLDDOWN: "Holddown",
    ChangeKind.IMMEDIATE: "Immediate",
}

# Condition types, KEDA's plus ours.
READY = "Ready"
ACTIVE = "Active"
FALLBACK = "Fallback"
PAUSED = "Paused"
REBALANCING = "Rebalancing"
PARTITION_OVER_CAPACITY = "PartitionOverCapacity"
DATA_LOSS = "DataLoss"
CHILDREN_APPLIED = "ChildrenApplied"  # in a cluster only
OUTPUT_DURABLE = "OutputDurable"  # in a cluster only

# Every condition type the status may carry, with what True means: the CRD's description of `conditions` and
# the reference page's table (docs/reference.md) are made from it.
CONDITION_TYPES: dict[str, str] = {
    READY: "the pool is balanced: every partition read by its assignee (False: holddown, rebalancing, a "
    "refused spec, a failed cycle, or a pool stopped for data loss; the reason says which)",
    ACTIVE: "the backlog is above the activation threshold (scaling.activation), or force-activation is set "
    "(reason SpecReplicas: spec.replicas fixes the count, whatever the backlog)",
    FALLBACK: "the backlog could not be read, and scaling.fallback's count applies",
    PAUSED: "a pause annotation fixes the replica count (reason BadAnnotation: one was not understood)",
    REBALANCING: "partitions are moving between consumers, or waiting for their planned consumer (reason: "
    "Planned, Holddown or Immediate)",
    PARTITION_OVER_CAPACITY: "a partition receives more events per second than one consumer processes",
    DATA_LOSS: "events expired from the hub before they were read: a partition's checkpoint is older than "
    "the first event the hub still retains (the message names the partitions and sequence numbers; with "
    "consumer.failOnDataLoss the pool is stopped)",
    CHILDREN_APPLIED: "the StatefulSet and the other children are as the spec says (False: the API server "
    "refused them, the pods run as the last accepted spec said)",
    OUTPUT_DURABLE: "what the sink writes outlives a consumer pod (False: a folder sink on an emptyDir; "
    "Unknown: a sink Spark writes, where its block says)",
}
CONDITION_TYPES_TEXT = "; ".join(f"{kind}: {meaning}" for kind, meaning in CONDITION_TYPES.items()) + "."


class Condition(Model):
    """A Kubernetes-style condition (`kubectl wait --for=condition=Ready pcon/NAME`)."""

    type: str = Field(min_length=1, description="One of " + ", ".join(CONDITION_TYPES) + ".")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="One CamelCase word.")
    message: str = Field(default="", description="What a person needs to know.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the condition was set for."
    )


class AssignedPartitions(Model):
    """The partitions one consumer is assigned in the published assignment."""

    consumer: str = Field(min_length=1, description="Consumer identity (pod name).")
    partitions: list[str] = Field(default_factory=list, description="Event Hubs partition ids.")
    events_per_second: float | None = Field(
        default=None, ge=0, description="The incoming rate of these partitions together (when measured)."
    )


class PartitionRate(Model):
    """One partition's incoming rate (events per second, with backlog: what must be read per second)."""

    partition: str = Field(description="Event Hubs partition id.")
    events_per_second: float = Field(ge=0, description="Its incoming rate plus its backlog over the target.")


class LagTargetStatus(Model):
    """What the lag target (`spec.scaling.target.lagSeconds`) sized the pool for, and which partitions."""

    replicas: int = Field(ge=0, description="The replica count it asked for.")
    demand_events_per_second: float = Field(
        ge=0, description="Incoming events per second plus each partition's backlog over the target."
    )
    busiest: list[PartitionRate] = Field(
        default_factory=list,
        description="The partitions of the busiest consumer at that count: the load that drove it.",
    )


class ExpiredEvents(Model):
    """Events of one partition that expired from the hub before they were read."""

    partition: str = Field(description="Event Hubs partition id.")
    first_sequence_number: int = Field(
        ge=0, description="The first event lost (the one after the checkpoint)."
    )
    last_sequence_number: int = Field(ge=0, description="The last one lost (before the first one retained).")
    events: int = Field(ge=1, description="How many.")


class PendingHandoff(Model):
    """A partition moving between consumers, not yet taken by its new owner."""

    partition: str = Field(description="Event Hubs partition id.")
    from_owner: str | None = Field(default=None, description="The consumer releasing it (none if orphaned).")
    to_owner: str = Field(min_length=1, description="The consumer taking it.")
    since: datetime | None = Field(default=None, description="When the move was published.")


class RestoringPartition(Model):
    """A streaming job's partition whose new owner is restoring its state (its query has not committed its
    first batch since it started from the partition's checkpoint)."""

    partition: str = Field(description="Event Hubs partition id.")
    consumer: str = Field(min_length=1, description="The consumer restoring it.")
    since: datetime = Field(description="When its query started.")
    seconds: float = Field(ge=0, description="How long it has been restoring, when the status was written.")


class RolloutStatus(Model):
    """Where the replacement of the consumer pods stands (`spec.rebalance.rollout`)."""

    strategy: str = Field(description="Operator or RollingUpdate.")
    phase: str = Field(description="Idle, RollingOut, Paused or Done.")
    revision: str | None = Field(default=None, description="The StatefulSet revision the pods roll to.")
    updated_replicas: int = Field(default=0, ge=0, description="Pods ready at that revision.")
    current: str | None = Field(default=None, description="The pod being replaced now.")
    surge: bool = Field(default=False, description="Whether the pool runs one extra pod meanwhile.")
    paused: bool = Field(default=False, description="rollout.hubshift.dev/paused is set.")
    message: str | None = Field(default=None, description="What the rollout waits for, for people.")
    started_at: datetime | None = Field(default=None, description="When the last rollout began.")
    finished_at: datetime | None = Field(default=None, description="When it ended.")

    @classmethod
    def of(cls, strategy: str, decision: RolloutDecision) -> RolloutStatus:
        state = decision.state
        return cls(
            strategy=strategy,
            phase=decision.phase,
            revision=None if state is None else state.revision,
            updated_replicas=decision.updated,
            current=decision.current,
            surge=state is not None and state.surge,
            paused=state is not None and state.paused,
            message=decision.message or None,
            started_at=None if state is None else _datetime(state.started_at),
            finished_at=None if state is None or state.finished_at is None else _datetime(state.finished_at),
        )


class PartitionedConsumerStatus(Model):
    # The default as the CRD stores it (a plain string), validated into the enum.
    phase: Annotated[ResourcePhase, _inline_enum(ResourcePhase)] = Field(
        default=ResourcePhase.PENDING.value,
        validate_default=True,
        description="Pending, Ready, Holddown, Rebalancing or Invalid.",
    )
    message: str | None = Field(default=None, description="Why the phase is what it is, for people.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="One per type, each with its status, reason and message: " + CONDITION_TYPES_TEXT,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    desired_replicas: int | None = Field(default=None, ge=0, description="Replicas the control loop wants.")
    current_replicas: int | None = Field(default=None, ge=0, description="The StatefulSet's replicas.")
    replicas: int | None = Field(
        default=None,
        ge=0,
        description="The consumers asked of the runtime now (currentReplicas): the scale subresource's "
        "status.replicas, which kubectl scale, an HPA and KEDA read.",
    )
    selector: str | None = Field(
        default=None,
        description="The label selector of the pool's consumer pods: the scale subresource's selector, with "
        "which an HPA finds the pods whose CPU or memory it reads.",
    )
    ready_replicas: int | None = Field(default=None, ge=0, description="Consumer pods passing readiness.")
    partition_count: int | None = Field(default=None, ge=0, description="Partitions of the Event Hub.")
    total_backlog: int | None = Field(
        default=None, ge=0, description="Unprocessed events over all partitions."
    )
    lag_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Age in seconds of the oldest unprocessed event, in the worst partition (0: caught up).",
    )
    lagging_partition: str | None = Field(
        default=None, description="The partition whose oldest unprocessed event is oldest (lagSeconds)."
    )
    incoming_events_per_second: float | None = Field(
        default=None, ge=0, description="Events enqueued per second over all partitions (when measured)."
    )
    consumer_capacity_events_per_second: float | None = Field(
        default=None, ge=0, description="Events one consumer processes per second of work (when measured)."
    )
    lag_target: LagTargetStatus | None = Field(
        default=None, description="What the lag target sized the pool for (set with lagSeconds)."
    )
    assignment_generation: int | None = Field(
        default=None, ge=0, description="Generation of the published assignment record."
    )
    assignment: list[AssignedPartitions] = Field(
        default_factory=list, description="The published assignment, one entry per consumer."
    )
    holddown_until: datetime | None = Field(
        default=None, description="While in Holddown: when the new assignment will be published."
    )
    change: Annotated[ChangeKind, _inline_enum(ChangeKind)] | None = Field(
        default=None,
        description="The kind of change under way: planned (a scale the operator decided: published at once, "
        "no holddown), holddown (the consumers changed unplanned: waited out) or immediate (the partitions "
        "changed, or a consumer is gone for good).",
    )
    planned: list[AssignedPartitions] = Field(
        default_factory=list,
        description="Partitions planned for consumers not ready yet, one entry per consumer; each keeps its "
        "current assignee until its consumer is ready.",
    )
    planned_until: datetime | None = Field(
        default=None,
        description="Planned partitions that nobody reads wait for their consumer until then; then they go "
        "to the consumers ready.",
    )
    pending_handoffs: list[PendingHandoff] = Field(
        default_factory=list, description="Moves published but not yet done."
    )
    expired_events: list[ExpiredEvents] = Field(
        default_factory=list,
        description="Partitions whose checkpoint the hub's retention passed, as the last probe saw them: "
        "their events after the checkpoint expired unread (the DataLoss condition; "
        "spec.consumer.failOnDataLoss).",
    )
    restoring: list[RestoringPartition] = Field(
        default_factory=list,
        description="A streaming job's partitions whose state their consumer is restoring (after a handoff, "
        "a restart or a failed query), oldest first.",
    )
    last_scale_time: datetime | None = Field(default=None, description="When replicas last changed.")
    last_active_time: datetime | None = Field(
        default=None, description="When the backlog was last above the activation threshold."
    )
    rollout: RolloutStatus | None = Field(default=None, description="The replacement of the consumer pods.")

    def to_body(self) -> dict[str, Any]:
        """The status as the API server stores it (camelCase, RFC 3339 times, unset fields left out)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


def carry_transition_time(
    previous: object, condition: Condition, now: datetime, generation: int | None = None
) -> Condition:
    """`condition` stamped with when its status last changed: kept from `previous` (the CR's current
    `status.conditions`, as stored) when the status is the same, else `now`."""
    since = now
    for old in previous if isinstance(previous, list) else []:
        if (
            isinstance(old, dict)
            and old.get("type") == condition.type
            and old.get("status") == condition.status
        ):
            stamp = old.get("lastTransitionTime")
            if isinstance(stamp, str):
                since = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return condition.model_copy(update={"last_transition_time": since, "observed_generation": generation})


# --- the status of one cycle (pure) ---------------------------------------------------------------------


def failed_cycle_status(
    last: PartitionedConsumerStatus | None, previous_conditions: object, message: str, now: float
) -> PartitionedConsumerStatus:
    """The status after a cycle that failed (the store or the hub refusing, an access refusal, a scope driven
    by another resource): the last cycle's figures kept, `Ready` False with the failure's one line, so the
    resource never says it is fine while its loop cannot run."""
    base = last or PartitionedConsumerStatus()
    moment = _datetime(now)
    ready = carry_transition_time(
        previous_conditions,
        Condition(type=READY, status="False", reason="CycleFailed", message=message),
        moment,
        base.observed_generation,
    )
    others = [condition for condition in base.conditions if condition.type != READY]
    return base.model_copy(update={"conditions": [ready, *others], "message": message})


def assignment_by_consumer(
    assignment: Mapping[str, str | None], load: Mapping[str, float] | None = None
) -> list[AssignedPartitions]:
    """One entry per consumer named in `assignment` (partition -> consumer), in natural order, with the
    rate of its partitions when `load` (partition -> events per second) is known."""
    consumers = sorted({c for c in assignment.values() if c is not None}, key=consumer_sort_key)
    entries = []
    for consumer in consumers:
        partitions = [p for p, owner in assignment.items() if owner == consumer]
        rate = None if load is None else round(sum(load.get(p, 0.0) for p in partitions), 1)
        entries.append(AssignedPartitions(consumer=consumer, partitions=partitions, events_per_second=rate))
    return entries


def over_capacity(load: Mapping[str, float] | None, capacity: float | None) -> list[str]:
    """Partitions whose incoming rate alone is more than one consumer processes (no assignment helps)."""
    if load is None or not capacity:
        return []
    return sorted((p for p, rate in load.items() if rate > capacity), key=lambda p: (-load[p], p))


def _capacity_condition(load: Mapping[str, float], capacity: float) -> Condition:
    over = over_capacity(load, capacity)
    if not over:
        return Condition(
            type=PARTITION_OVER_CAPACITY,
            status="False",
            reason="WithinCapacity",
            message=f"every partition receives less than one consumer processes ({capacity:.0f}/s)",
        )
    rates = ", ".join(f"{p} ({load[p]:.0f}/s)" for p in over)
    return Condition(
        type=PARTITION_OVER_CAPACITY,
        status="True",
        reason="PartitionOverCapacity",
        message=f"partitions {rates} each receive more than one consumer processes ({capacity:.0f}/s): no "
        "assignment can keep up with them; add partitions (and spread the keys) or give each consumer "
        "more resources",
    )


def data_loss_condition(expired: Sequence[ExpiredStretch], fail: bool) -> Condition:
    """DataLoss: True while events expired unread, naming the partitions and what the pool does about it."""
    if not expired:
        return Condition(
            type=DATA_LOSS,
            status="False",
            reason="NoExpiredEvents",
            message="every checkpoint is within the hub's retention",
        )
    lost = data_loss.describe(tuple(expired))
    if fail:
        return Condition(
            type=DATA_LOSS,
            status="True",
            reason="PoolStopped",
            message=f"{lost}; the pool is stopped ({data_loss.FAIL_ON_DATA_LOSS} is true): set it to false "
            "to go on past them, or move the checkpoints on (hubshift checkpoints reset)",
        )
    return Condition(
        type=DATA_LOSS,
        status="True",
        reason="EventsExpired",
        message=f"{lost}; the pool goes on past them ({data_loss.FAIL_ON_DATA_LOSS} is false)",
    )


def _lag_target(sizing: LagSizing | None) -> LagTargetStatus | None:
    if sizing is None:
        return None
    return LagTargetStatus(
        replicas=sizing.replicas,
        demand_events_per_second=round(sizing.demand, 1),
        busiest=[PartitionRate(partition=p, events_per_second=round(d, 1)) for p, d in sizing.busiest],
    )


def pending(state: RebalanceState, owners: Mapping[str, str | None]) -> list[PendingHandoff]:
    since = None if state.published_at is None else _datetime(state.published_at)
    return [
        PendingHandoff(partition=p, from_owner=owners.get(p), to_owner=assignee, since=since)
        for p in rebalance.pending_handoffs(state, owners)
        if (assignee := state.assignment.get(p)) is not None
    ]


def restoring_partitions(restoring: Mapping[str, tuple[str, float]], now: float) -> list[RestoringPartition]:
    """The partitions being restored, oldest first (`now` and the start times are Unix times)."""
    return [
        RestoringPartition(
            partition=partition,
            consumer=consumer,
            since=_datetime(since).replace(microsecond=0),
            seconds=round(max(0.0, now - since), 1),
        )
        for partition, (consumer, since) in sorted(restoring.items(), key=lambda item: (item[1][1], item[0]))
    ]


def build_status(
    *,
    state: RebalanceState,
    decision: ScalingDecision | None,
    pause: Pause,
    owners: Mapping[str, str | None],
    instances: Sequence[ConsumerInstance],
    current_replicas: int,
    partition_count: int,
    total_backlog: int | None,
    previous_conditions: Sequence[Mapping[str, Any]],
    observed_generation: int | None,
    now: float,
    last_scale_time: float | None,
    probe_error: str | None,
    worst_lag: tuple[str, float] | None = None,
    more_conditions: Sequence[Condition] = (),
    rollout: RolloutStatus | None = None,
    load: Mapping[str, float] | None = None,
    capacity: float | None = None,
    expired: Sequence[ExpiredStretch] = (),
    fail_on_data_loss: bool = True,
    restoring: Mapping[str, tuple[str, float]] | None = None,
) -> PartitionedConsumerStatus:
    """The status subresource for this cycle (pure); `more_conditions`: the runtime's about the spec;
    `load`: each partition's incoming events per second; `capacity`: events one consumer processes per
    second (both when measured); `expired`: the events that expired unread, and `fail_on_data_loss` whether
    that stops the pool; `restoring`: partition -> (consumer, when its query started, Unix time)."""
    moment = _datetime(now).replace(microsecond=0)
    handoffs = pending(state, owners)
    change = state.running
    waiting = assignment_by_consumer(state.planned)
    message = _message(state, len(handoffs), waiting, probe_error)
    stopped = bool(expired) and fail_on_data_loss  # stopped for data loss: not ready, balanced or not
    conditions = _rebalance_conditions(state, message, len(handoffs), bool(waiting), stopped)
    if decision is not None:
        conditions += _scaling_conditions(decision, pause, probe_error)
    conditions += more_conditions
    if load is not None and capacity:
        conditions.append(_capacity_condition(load, capacity))
    conditions.append(data_loss_condition(expired, fail_on_data_loss))
    if stopped:
        message = f"stopped for data loss; {message}"
    stamped = [
        carry_transition_time(list(previous_conditions), c, moment, observed_generation) for c in conditions
    ]
    last_active = None if decision is None else decision.state.last_active_at
    return PartitionedConsumerStatus(
        phase=ResourcePhase(state.phase.value),
        message=message,
        observed_generation=observed_generation,
        conditions=stamped,
        desired_replicas=None if decision is None else decision.replicas,
        current_replicas=current_replicas,
        replicas=current_replicas,
        ready_replicas=sum(1 for i in instances if i.ready and not i.terminating),
        partition_count=partition_count,
        total_backlog=total_backlog,
        lag_seconds=None if worst_lag is None else round(worst_lag[1], 3),
        lagging_partition=None if worst_lag is None else worst_lag[0],
        incoming_events_per_second=None if load is None else round(sum(load.values()), 1),
        consumer_capacity_events_per_second=None if capacity is None else round(capacity, 1),
        lag_target=_lag_target(None if decision is None else decision.sizing),
        assignment_generation=state.generation,
        assignment=assignment_by_consumer(state.assignment, load),
        holddown_until=None if state.holddown_until is None else _datetime(state.holddown_until),
        change=change,
        planned=waiting,
        planned_until=None if state.planned_until is None else _datetime(state.planned_until),
        pending_handoffs=handoffs,
        expired_events=[_expired_events(stretch) for stretch in expired],
        restoring=restoring_partitions(restoring or {}, now),
        last_scale_time=None if last_scale_time is None else _datetime(last_scale_time),
        last_active_time=None if last_active is None else _datetime(last_active),
        rollout=rollout,
    )


def _expired_events(stretch: ExpiredStretch) -> ExpiredEvents:
    return ExpiredEvents(
        partition=stretch.partition,
        first_sequence_number=stretch.first,
        last_sequence_number=stretch.last,
        events=stretch.events,
    )


def _rebalance_conditions(
    state: RebalanceState, message: str, handoffs: int, waiting: bool, stopped: bool
) -> list[Condition]:
    """Ready (the phase; never while the pool is `stopped` for data loss) and Rebalancing (partitions moving,
    or planned for consumers not ready yet)."""
    moving = state.phase is Phase.REBALANCING or waiting
    change = state.running
    return [
        Condition(
            type=READY,
            status="True" if state.phase is Phase.READY and not stopped else "False",
            reason=DATA_LOSS if stopped else "Balanced" if state.phase is Phase.READY else state.phase.value,
            message=f"stopped for data loss; {message}" if stopped else message,
        ),
        Condition(
            type=REBALANCING,
            status="True" if moving else "False",
            reason=CHANGE_REASONS[change] if moving and change is not None else "NoHandoffs",
            message=f"{handoffs} partitions moving; {len(state.planned)} planned, not ready yet",
        ),
    ]


def _message(
    state: RebalanceState, handoffs: int, waiting: list[AssignedPartitions], probe_error: str | None
) -> str:
    """Why the phase is what it is, for people."""
    change = state.running
    if state.phase is Phase.HOLDDOWN and state.holddown_until is not None:
        message = (
            f"consumers changed; the assignment is held until {_datetime(state.holddown_until):%H:%M:%S} UTC"
        )
    elif state.phase is Phase.REBALANCING:
        kind = f" ({change.value})" if change is not None else ""
        message = f"generation {state.generation}{kind}: {handoffs} handoffs pending"
    else:
        message = f"generation {state.generation}: balanced"
    if waiting:
        names = ", ".join(w.consumer for w in waiting)
        message += f"; {len(state.planned)} partitions planned for {names} (not ready yet)"
    if probe_error:
        message += f"; {probe_error}"
    return message


def _scaling_conditions(decision: ScalingDecision, pause: Pause, probe_error: str | None) -> list[Condition]:
    """The autoscaler's conditions: Active, Fallback, Paused."""
    problems = "; ".join(pause.problems)
    return [
        Condition(
            type=ACTIVE,
            status="True" if decision.active else "False",
            # SpecReplicas: spec.replicas fixes the count (the scale subresource), whatever the backlog says
            reason="SpecReplicas"
            if decision.manual
            else "BacklogAboveActivation"
            if decision.active
            else "Idle",
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
            reason="PauseAnnotation" if decision.paused else ("BadAnnotation" if problems else "NotPaused"),
            message=problems or (decision.reason if decision.paused else "no pause annotation"),
        ),
    ]


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=UTC)
