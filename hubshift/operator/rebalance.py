"""The rebalance state machine: when to hand partitions over, and when the StatefulSet may shrink.

Pure: `step(state, observation, now, config)` returns the next state and the actions to take. Solace's
partitioned-queue semantics (docs/architecture.md, "The control loop"), over the assignment planner.

Phases:
- `Ready`: the published assignment is balanced over the consumers present.
- `Holddown`: the consumer set changed so that the plan would move partitions; nothing moves until
  `holddown_until` (set at the *first* change, `delaySeconds` later, and not pushed back by later
  changes, so it bounds the time between the first and last change). If the consumers come back to a
  set the published assignment already suits, the holddown ends without a handoff, same generation.
  When the timer ends, the planner's assignment for the consumers present is published (generation+1).
- `Rebalancing`: a generation was published and not every move is done; it ends when the observed owner
  of every partition is the assigned one, or at `published_at + maxHandoffSeconds`, when the new owners
  of the partitions still pending may break their leases (`BreakLeases`).

Immediate publications (no holddown):
- the partition set changed: a full plan over the consumers present;
- a partition's owner is gone for good (named in `departed`, or an ordinal at or beyond the replica
  count and not present): an orphan;
- a partition's owner is leaving (ordinal at or beyond the desired replica count, still present): the
  drain before a scale-in.
Orphans and drained partitions are re-planned over the consumers the published assignment was planned
for, minus those leaving or gone (standbys included: one takes over at once, as in Solace); other
pending changes keep their holddown. The StatefulSet shrinks (`SetReplicas`) only once no partition is
assigned to a leaving consumer and the handoffs are done or forced. Scale-out sets the replicas at once;
the new consumers then go through the holddown.

Forced partitions: in a publication, a partition whose current holder (the observed lease owner, or
the previous assignee if nobody holds it) is not present cannot be handed over gracefully, so its new
owner may break the lease at once instead of waiting for `maxHandoffSeconds`.

Restart safety: the state is exactly what the assignment record holds (`to_dict`/`from_dict`, or
`to_record`/`from_record` with `hubshift.ownership.model.Assignment`). When the record read from the
store has a different generation than the state passed in (an operator restart, a lost write, another
writer), the record wins. Deadlines are absolute wall-clock times, so they survive a restart unchanged.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from hubshift.ownership.model import Assignment as AssignmentRecord
from hubshift.ownership.model import Phase
from hubshift.ownership.planner import (
    Move,
    consumer_sort_key,
    plan_assignment,
    plan_moves,
    sorted_partitions,
)
from hubshift.spec import RebalanceSpec

__all__ = [
    "Action",
    "BreakLeases",
    "EventReason",
    "Observation",
    "Phase",
    "PublishAssignment",
    "PublishReason",
    "RebalanceState",
    "RecordEvent",
    "SetReplicas",
    "Step",
    "ordinal",
    "pending_handoffs",
    "step",
]


@dataclass(frozen=True)
class RebalanceState:
    """The published assignment and where the machine stands; round-trips through a plain dict."""

    generation: int = 0
    phase: Phase = Phase.READY
    assignment: Mapping[str, str | None] = field(default_factory=dict)  # every partition
    consumers: tuple[str, ...] = ()  # the consumers the assignment was planned for (standbys too)
    forced: frozenset[str] = frozenset()  # partitions the new owner may break at once
    published_at: float | None = None
    holddown_until: float | None = None
    replicas: int = 0  # the replica count last asked of the StatefulSet

    def handoff_deadline(self, config: RebalanceSpec) -> float | None:
        return None if self.published_at is None else self.published_at + config.max_handoff_seconds

    def partitions_of(self, consumer: str) -> list[str]:
        return [p for p, owner in self.assignment.items() if owner == consumer]

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "phase": self.phase.value,
            "assignment": dict(self.assignment),
            "consumers": list(self.consumers),
            "forced": sorted_partitions(self.forced),
            "publishedAt": self.published_at,
            "holddownUntil": self.holddown_until,
            "replicas": self.replicas,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RebalanceState:
        assignment = {str(p): (None if c is None else str(c)) for p, c in data.get("assignment", {}).items()}
        return cls(
            generation=int(data.get("generation", 0)),
            phase=Phase(data.get("phase", Phase.READY.value)),
            assignment={p: assignment[p] for p in sorted_partitions(assignment)},
            consumers=tuple(str(c) for c in data.get("consumers", ())),
            forced=frozenset(str(p) for p in data.get("forced", ())),
            published_at=_optional_float(data.get("publishedAt")),
            holddown_until=_optional_float(data.get("holddownUntil")),
            replicas=int(data.get("replicas", 0)),
        )

    def to_record(self, config: RebalanceSpec) -> AssignmentRecord:
        """The assignment record the consumers read (`hubshift.ownership.model.Assignment`)."""
        return AssignmentRecord(
            generation=self.generation,
            partitions={p: c for p, c in self.assignment.items() if c is not None},
            phase=self.phase,
            replicas=self.replicas,
            updated_at=_datetime(self.published_at or 0.0),
            holddown_until=None if self.holddown_until is None else _datetime(self.holddown_until),
            max_handoff_seconds=config.max_handoff_seconds,
            partition_ids=tuple(sorted_partitions(self.assignment)),
            consumers=self.consumers,
            forced=self.forced,
        )

    @classmethod
    def from_record(cls, record: AssignmentRecord) -> RebalanceState:
        ids = record.covered
        consumers = record.consumers or sorted(set(record.partitions.values()), key=consumer_sort_key)
        return cls(
            generation=record.generation,
            phase=record.phase,
            assignment={p: record.partitions.get(p) for p in sorted_partitions(ids)},
            consumers=tuple(str(c) for c in consumers),
            forced=record.forced,
            published_at=record.updated_at.timestamp() if record.generation else None,
            holddown_until=None if record.holddown_until is None else record.holddown_until.timestamp(),
            replicas=record.replicas,
        )


@dataclass(frozen=True)
class Observation:
    """What the operator saw this cycle."""

    partitions: tuple[str, ...]
    consumers: tuple[str, ...]  # present and ready, e.g. ("homes-0", "homes-1")
    owners: Mapping[str, str | None]  # the lease holder of each partition now (None: free)
    desired_replicas: int  # from the autoscaler
    current_replicas: int  # the StatefulSet's spec.replicas
    record: RebalanceState | None = None  # the assignment record as read from the store
    departed: frozenset[str] = frozenset()  # consumers known to be gone for good (any naming)


# --- actions --------------------------------------------------------------------------------------------


class PublishReason(enum.StrEnum):
    """Why a generation is published; the value is its metric label."""

    PARTITIONS_CHANGED = "partitions-changed"  # the hub's partition set changed (or the first cycle)
    HOLDDOWN_OVER = "holddown-over"  # the consumer set changed and the holddown ran out
    ORPHANS = "orphans"  # partitions of consumers gone for good move at once
    DRAIN = "drain"  # partitions of consumers about to be scaled in move before the StatefulSet shrinks


class EventReason(enum.StrEnum):
    """The `reason` of the Kubernetes Events the machine records (one CamelCase word each)."""

    REBALANCING = "Rebalancing"
    REBALANCED = "Rebalanced"
    HOLDDOWN = "Holddown"
    HOLDDOWN_CANCELLED = "HolddownCancelled"
    HANDOFF_FORCED = "HandoffForced"
    SCALING_OUT = "ScalingOut"
    SCALING_IN = "ScalingIn"


@dataclass(frozen=True)
class PublishAssignment:
    """Write this generation to the assignment record (compare-and-swap) before anything else."""

    generation: int
    assignment: Mapping[str, str | None]
    forced: frozenset[str]
    moves: tuple[Move, ...]
    reason: PublishReason
    detail: str  # for people: which consumers, which change


@dataclass(frozen=True)
class SetReplicas:
    replicas: int
    reason: str


@dataclass(frozen=True)
class BreakLeases:
    """The handoff time of `generation` is over: the new owners of `partitions` may break their leases."""

    generation: int
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class RecordEvent:
    """A Kubernetes Event on the PartitionedConsumer."""

    reason: EventReason
    message: str
    warning: bool = False


Action = PublishAssignment | SetReplicas | BreakLeases | RecordEvent


@dataclass(frozen=True)
class Step:
    state: RebalanceState
    actions: tuple[Action, ...]

    @property
    def published(self) -> PublishAssignment | None:
        return next((a for a in self.actions if isinstance(a, PublishAssignment)), None)


# --- the machine ----------------------------------------------------------------------------------------


def ordinal(consumer: str) -> int | None:
    """The StatefulSet ordinal at the end of a consumer's name (`homes-3` -> 3); None without one."""
    _, dash, tail = consumer.rpartition("-")
    return int(tail) if dash and tail.isdigit() else None


def pending_handoffs(state: RebalanceState, owners: Mapping[str, str | None]) -> list[str]:
    """Partitions whose observed owner is not (yet) the assigned one."""
    return [p for p, target in state.assignment.items() if owners.get(p) != target]


def step(state: RebalanceState | None, observation: Observation, now: float, config: RebalanceSpec) -> Step:
    """One control-loop cycle of the rebalance state machine."""
    cycle = _Cycle(_View.of(observation), now, config)
    current = _starting_point(state, observation.record)
    current = _rebalance(current, cycle)
    current = _settle(current, cycle)
    current = _replicas(current, cycle)
    return Step(current, tuple(cycle.actions))


@dataclass(frozen=True)
class _View:
    observation: Observation
    partitions: list[str]
    present: list[str]
    limit: int  # ordinals at or beyond it are leaving (present) or gone (absent)

    @classmethod
    def of(cls, observation: Observation) -> _View:
        return cls(
            observation,
            sorted_partitions(observation.partitions),
            sorted(set(observation.consumers), key=consumer_sort_key),
            min(observation.desired_replicas, observation.current_replicas),
        )

    def leaving(self, consumer: str) -> bool:
        number = ordinal(consumer)
        return consumer in self.observation.departed or (number is not None and number >= self.limit)

    def gone(self, consumer: str) -> bool:
        return self.leaving(consumer) and consumer not in self.present

    @property
    def candidates(self) -> list[str]:
        """Who may own partitions now: present, and neither leaving nor departed."""
        return [c for c in self.present if not self.leaving(c)]


@dataclass
class _Cycle:
    view: _View
    now: float
    config: RebalanceSpec
    actions: list[Action] = field(default_factory=list)

    def event(self, reason: EventReason, message: str, *, warning: bool = False) -> None:
        self.actions.append(RecordEvent(reason, message, warning))

    def publish(
        self,
        state: RebalanceState,
        assignment: Mapping[str, str | None],
        consumers: Iterable[str],
        previous: Mapping[str, str | None],
        reason: PublishReason,
        detail: str,
    ) -> RebalanceState:
        """Generation + 1 with `assignment`, planned for `consumers`, moving from `previous`."""
        if state.generation and dict(assignment) == dict(state.assignment):
            return state
        generation = state.generation + 1
        moves = plan_moves(previous, assignment)
        forced = _forced(assignment, previous, self.view)
        planned_for = tuple(sorted(set(consumers), key=consumer_sort_key))
        self.actions.append(PublishAssignment(generation, dict(assignment), forced, moves, reason, detail))
        self.event(
            EventReason.REBALANCING,
            f"generation {generation}: {len(moves)} moves ({len(forced)} forced) "
            f"over {len(planned_for)} consumers: {detail}",
        )
        return replace(
            state,
            generation=generation,
            phase=Phase.REBALANCING,
            assignment=dict(assignment),
            consumers=planned_for,
            forced=forced,
            published_at=self.now,
        )


def _starting_point(state: RebalanceState | None, record: RebalanceState | None) -> RebalanceState:
    if record is not None and (state is None or record.generation != state.generation):
        return record
    return state if state is not None else RebalanceState()


def _rebalance(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """Publish at once for a partition change, orphans or a drain; otherwise hold down, then publish."""
    view = cycle.view
    parts = view.partitions
    published = dict(state.assignment)
    candidates = view.candidates

    if set(parts) != set(published):
        # Without any record yet, plan from who really holds what, so the first plan is sticky too.
        base = published if state.generation else {p: view.observation.owners.get(p) for p in parts}
        plan = plan_assignment(parts, candidates, base)
        detail = f"partitions changed ({len(published)} -> {len(parts)})"
        return cycle.publish(
            replace(state, holddown_until=None),
            plan.assignment,
            candidates,
            base,
            PublishReason.PARTITIONS_CHANGED,
            detail,
        )

    urgent = sorted(
        {o for o in published.values() if o is not None and view.leaving(o)}, key=consumer_sort_key
    )
    # Orphans and drains are re-planned over the consumers the assignment was made for, so that a
    # consumer that may still come back, or one that just arrived, keeps waiting for the holddown.
    survivors = [c for c in state.consumers if not view.leaving(c)] or candidates
    interim = plan_assignment(parts, survivors, published).assignment if urgent else published

    state = _holddown(state, cycle, needed=plan_assignment(parts, candidates, interim).assignment != interim)
    if state.holddown_until is not None and cycle.now >= state.holddown_until:
        plan = plan_assignment(parts, candidates, published)
        return cycle.publish(
            replace(state, holddown_until=None),
            plan.assignment,
            candidates,
            published,
            PublishReason.HOLDDOWN_OVER,
            "holddown over",
        )
    if urgent:
        return cycle.publish(state, interim, survivors, published, *_urgent_reason(urgent, view))
    return state


def _holddown(state: RebalanceState, cycle: _Cycle, *, needed: bool) -> RebalanceState:
    """Start the timer at the first change that would move partitions; drop it if none would any more."""
    if needed and state.holddown_until is None:
        until = cycle.now + cycle.config.delay_seconds
        cycle.event(
            EventReason.HOLDDOWN,
            f"consumers changed ({_change(state.consumers, cycle.view)}); "
            f"rebalancing in {cycle.config.delay_seconds:g}s unless they settle back",
        )
        return replace(state, holddown_until=until)
    if not needed and state.holddown_until is not None:
        cycle.event(EventReason.HOLDDOWN_CANCELLED, "the consumers settled back: no handoff")
        return replace(state, holddown_until=None)
    return state


def _urgent_reason(urgent: list[str], view: _View) -> tuple[PublishReason, str]:
    gone = [c for c in urgent if view.gone(c)]
    draining = [c for c in urgent if not view.gone(c)]
    reasons = []
    if gone:
        reasons.append(f"orphans of {_names(gone)}")
    if draining:
        reasons.append(f"draining {_names(draining)} before scale-in to {view.limit}")
    return (PublishReason.ORPHANS if gone else PublishReason.DRAIN), "; ".join(reasons)


def _forced(
    assignment: Mapping[str, str | None], previous: Mapping[str, str | None], view: _View
) -> frozenset[str]:
    """Partitions whose holder is not present to hand them over: the new owner may break at once."""
    owners = view.observation.owners
    present = set(view.present)
    forced = set()
    for partition, target in assignment.items():
        holder = owners.get(partition) or previous.get(partition)
        if target is not None and holder is not None and holder != target and holder not in present:
            forced.add(partition)
    return frozenset(forced)


def _settle(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """`Rebalancing` ends when every owner is the assigned one, or by force at the handoff deadline."""
    idle = Phase.HOLDDOWN if state.holddown_until is not None else Phase.READY
    if state.phase is not Phase.REBALANCING:
        return replace(state, phase=idle)
    pending = pending_handoffs(state, cycle.view.observation.owners)
    if not pending:
        cycle.event(EventReason.REBALANCED, f"generation {state.generation}: every handoff done")
        return replace(state, phase=idle)
    deadline = state.handoff_deadline(cycle.config)
    if deadline is None or cycle.now < deadline:
        return state
    breakable = tuple(p for p in pending if state.assignment.get(p) is not None)
    if breakable:
        cycle.actions.append(BreakLeases(state.generation, breakable))
    cycle.event(
        EventReason.HANDOFF_FORCED,
        f"generation {state.generation}: {len(pending)} partitions not released within "
        f"{cycle.config.max_handoff_seconds:g}s; their new owners may break the leases",
        warning=True,
    )
    return replace(state, phase=idle)


def _replicas(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """Scale out at once; scale in only once the consumers about to go hold nothing."""
    desired = cycle.view.observation.desired_replicas
    current = cycle.view.observation.current_replicas
    target = desired if desired > current or (desired < current and _drained(state, cycle.view)) else current
    if target != current:
        # Level-triggered: asked again every cycle until the StatefulSet shows it; one Event per change.
        cycle.actions.append(SetReplicas(target, "scale out" if target > current else "scale in after drain"))
        if state.replicas != target:
            reason = EventReason.SCALING_OUT if target > current else EventReason.SCALING_IN
            cycle.event(reason, f"replicas {current} -> {target}")
    return replace(state, replicas=target)


def _drained(state: RebalanceState, view: _View) -> bool:
    """No partition is assigned to a consumer about to go, and every handoff is done or forced."""
    if state.phase is Phase.REBALANCING:
        return False
    return not any(owner is not None and view.leaving(owner) for owner in state.assignment.values())


def _change(before: Iterable[str], view: _View) -> str:
    planned = set(before)
    joined = [f"+{c}" for c in view.candidates if c not in planned]
    missing = [f"-{c}" for c in sorted(planned, key=consumer_sort_key) if c not in view.present]
    return " ".join(joined + missing) or "same names"


def _names(consumers: Iterable[str]) -> str:
    names = list(consumers)
    return ", ".join(names) if names else "none"


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=UTC)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
