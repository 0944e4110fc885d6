"""The rebalance state machine: when to hand partitions over, and when the StatefulSet may shrink.

Pure: `step(state, observation, now, config)` returns the next state and the actions to take, over the
assignment planner. docs/decisions.md ("Rebalance state machine") fixes the exact semantics: a partition has
one owner at a time, an unplanned change of the consumers waits out a holddown before anything moves, and
a move is a graceful handoff (drain, final checkpoint, release) unless the old owner is gone.

Phases:
- `Ready`: the published assignment is balanced over the consumers present.
- `Holddown`: the consumer set changed so that the plan would move partitions; nothing moves until
  `holddown_until` (set at the *first* change, `delaySeconds` later, and not pushed back by later
  changes, so it bounds the time between the first and last change). If the consumers come back to a
  set the published assignment already suits, the holddown ends without a handoff, same generation.
  When the timer ends, the planner's assignment for the consumers present is published (generation+1).
- `Rebalancing`: a generation was published and not every move is done; it ends when the observed owner
  of every partition is its assignee, or at `published_at + maxHandoffSeconds`, when the new owners
  of the partitions still pending may break their leases (`BreakLeases`).

Planned changes (no holddown): a change of the replica count the operator decides itself (the autoscaler,
or the spec's bounds) names the consumers it brings in advance: replica `i` is `<pool>-<i>` (StatefulSet
ordinals). The machine publishes the plan for the new set at once, from the current assignment, with the
minimum moves. A partition planned for a consumer that is not ready yet keeps its current assignee in the
record (`assignment`) and is named in `planned`; in the cycle that consumer is ready, the machine publishes
the generation that hands it over (graceful: the assignee drains and releases). Partitions of the plan that
nobody reads (a cold start) wait for their planned consumer at most `delaySeconds` from the first cycle in
which another consumer could read them (`planned_until`); then the consumers not ready are dropped from the
plan and count as unplanned arrivals when they come.

Immediate publications (no holddown):
- the partition set changed: a full plan over the consumers present (and the planned ones);
- a partition's owner is gone for good (named in `departed`, or an ordinal at or beyond the desired replica
  count and not present): an orphan;
- a partition's owner is leaving (ordinal at or beyond the desired replica count, still present): the
  drain before a (planned) scale-in.
Orphans and drained partitions are re-planned over the consumers the published assignment was planned
for, minus those leaving or gone (standbys included: a standby takes an orphan over at once); other
pending changes keep their holddown. The StatefulSet shrinks (`SetReplicas`) only once no partition is
assigned to a leaving consumer and the handoffs are done or forced (a publication is a handoff to wait for
whenever a lease is held where it says otherwise, e.g. a joiner's cold-start share it read before it was
ready, when a scale-in drops it from the plan). Scale-out sets the replicas at once.

Consumers stopping and replaced (no holddown): a consumer whose pod is being deleted (`stopping`: an
eviction, a `kubectl delete`, a StatefulSet RollingUpdate, the operator's own rollout) hands its partitions
off on SIGTERM; they are re-planned at once over the others, never forced (its drain releases them), and
when the pool keeps its ordinal it is remembered (`returning`) and planned again as soon as its pod is gone,
so its replacement takes a planned share when ready. A consumer a rollout replaces next (`retiring`) leaves
the plan while still present: each of its partitions stays with it until the consumer planned for it is
ready (graceful, and read all along), or moves at once to a consumer that is.

Forced partitions: in a publication, a partition whose current owner (the observed lease owner, or
the previous assignee if nobody holds the lease) is not present cannot be handed over gracefully, so its new
owner may break the lease at once instead of waiting for `maxHandoffSeconds`.

Restart safety: the state is exactly what the assignment record holds (`to_record`/`from_record` with
`hubshift.ownership.model.Assignment`). When the record read from the store has a different generation
than the state passed in (an operator restart, a lost write, another writer), the record wins. Deadlines
are absolute wall-clock times, so they survive a restart unchanged.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from hubshift.ownership.model import Assignment, ChangeKind, Phase
from hubshift.ownership.packing import (
    Limits,
    PackingRules,
    consumer_loads,
    pack_assignment,
    partition_weights,
)
from hubshift.ownership.planner import (
    Move,
    consumer_sort_key,
    plan_assignment,
    plan_moves,
    sorted_partitions,
)
from hubshift.spec import RebalanceSpec

# Load-aware: no move for load alone while the busiest consumer carries at most this share of a
# consumer's measured capacity.
BUSY_SHARE = 0.5

__all__ = [
    "Action",
    "BreakLeases",
    "EventReason",
    "Observation",
    "PublishAssignment",
    "PublishReason",
    "RebalanceState",
    "RecordEvent",
    "SetReplicas",
    "Step",
    "consumer_name",
    "ordinal",
    "pending_handoffs",
    "starting_point",
    "step",
]


@dataclass(frozen=True)
class RebalanceState:
    """The published assignment and where the machine stands; round-trips through a plain dict."""

    generation: int = 0
    phase: Phase = Phase.READY
    assignment: Mapping[str, str | None] = field(default_factory=dict)  # every partition: its assignee now
    consumers: tuple[str, ...] = ()  # the consumers the plan is for (standbys and planned ones too)
    forced: frozenset[str] = frozenset()  # partitions the new owner may break at once
    published_at: float | None = None
    holddown_until: float | None = None
    replicas: int = 0  # the replica count last asked of the StatefulSet
    planned: Mapping[str, str] = field(default_factory=dict)  # partition -> its planned owner, not ready yet
    planned_until: float | None = None  # unread partitions of `planned` wait for their owner until then
    change: ChangeKind | None = None  # the kind of the last publication, until it is done
    # Consumers that left the plan stopping gracefully and whose ordinal the pool keeps: planned again as
    # soon as their old pod is gone (a replacement takes its share when ready, without a holddown).
    returning: tuple[str, ...] = ()

    @property
    def plan(self) -> dict[str, str | None]:
        """The plan the pool moves towards: each partition's planned owner, else its assignee."""
        return {p: self.planned.get(p, assignee) for p, assignee in self.assignment.items()}

    @property
    def running(self) -> ChangeKind | None:
        """The kind of change under way: `holddown` while its timer runs, else the last publication's."""
        return ChangeKind.HOLDDOWN if self.holddown_until is not None else self.change

    def handoff_deadline(self, config: RebalanceSpec) -> float | None:
        return None if self.published_at is None else self.published_at + config.max_handoff_seconds

    def partitions_of(self, consumer: str) -> list[str]:
        return [p for p, assignee in self.assignment.items() if assignee == consumer]

    def to_record(self, config: RebalanceSpec) -> Assignment:
        """The assignment record the consumers read (`hubshift.ownership.model.Assignment`)."""
        return Assignment(
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
            planned=dict(self.planned),
            planned_until=None if self.planned_until is None else _datetime(self.planned_until),
            change=self.change,
            returning=self.returning,
        )

    @classmethod
    def from_record(cls, record: Assignment) -> RebalanceState:
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
            planned=dict(record.planned),
            planned_until=None if record.planned_until is None else record.planned_until.timestamp(),
            change=record.change,
            returning=tuple(record.returning),
        )


@dataclass(frozen=True)
class Observation:
    """What the operator saw this cycle."""

    partitions: tuple[str, ...]
    consumers: tuple[str, ...]  # present and ready, e.g. ("homes-0", "homes-1")
    owners: Mapping[str, str | None]  # the lease owner of each partition now (None: free)
    desired_replicas: int  # from the autoscaler
    current_replicas: int  # the StatefulSet's spec.replicas
    record: RebalanceState | None = None  # the assignment record as read from the store
    departed: frozenset[str] = frozenset()  # consumers known to be gone for good (any naming)
    # Replica i is `<pool>-<i>` (the StatefulSet's pods); None: unknown, so no change can be planned.
    pool: str | None = None
    # Consumers whose pods are being deleted (SIGTERM: they hand their partitions off on their own).
    stopping: frozenset[str] = frozenset()
    # Present consumers a rollout replaces next: each keeps a partition until its planned owner is ready.
    retiring: frozenset[str] = frozenset()
    # Each partition's load in events per second (`operator.load.load_weights`); None: not measured yet.
    load: Mapping[str, float] | None = None
    capacity: float | None = None  # events one consumer processes per second of work; None: not measured


# --- actions --------------------------------------------------------------------------------------------


class PublishReason(enum.StrEnum):
    """Why a generation is published; the value is its metric label."""

    PARTITIONS_CHANGED = "partitions-changed"  # the hub's partition set changed (or the first cycle)
    HOLDDOWN_OVER = "holddown-over"  # the consumer set changed unplanned and the holddown ran out
    ORPHANS = "orphans"  # partitions of consumers gone for good move at once
    DRAIN = (
        "drain"  # planned scale-in: partitions of the consumers leaving move before the StatefulSet shrinks
    )
    PLANNED = "planned"  # planned scale-out or cold start: the plan for the new consumer set, at once
    JOINED = "joined"  # consumers of the plan are ready: the partitions planned for them are handed over
    JOINERS_LATE = "joiners-late"  # planned consumers not ready by `planned_until`: their share is re-planned
    STOPPING = "stopping"  # consumers stopping (pods being deleted): their partitions move to the others
    ROLLOUT = "rollout"  # a consumer a rollout replaces next: its partitions move to the consumers planned
    RETURNING = "returning"  # consumers that stopped come back: their share is planned for them
    LOAD = "load"  # loadAware: a consumer carries more than its tolerance over the mean load


class EventReason(enum.StrEnum):
    """The `reason` of the Kubernetes Events the machine records (one CamelCase word each)."""

    REBALANCING = "Rebalancing"
    REBALANCED = "Rebalanced"
    HOLDDOWN = "Holddown"
    HOLDDOWN_CANCELLED = "HolddownCancelled"
    HANDOFF_FORCED = "HandoffForced"
    SCALING_OUT = "ScalingOut"
    SCALING_IN = "ScalingIn"
    PLANNED = "Planned"
    JOINERS_LATE = "JoinersLate"


@dataclass(frozen=True)
class PublishAssignment:
    """Write this generation to the assignment record (compare-and-swap) before anything else."""

    generation: int
    assignment: Mapping[str, str | None]
    forced: frozenset[str]
    moves: tuple[Move, ...]
    reason: PublishReason
    detail: str  # for people: which consumers, which change
    planned: Mapping[str, str] = field(default_factory=dict)  # partitions kept for consumers not ready yet
    kind: ChangeKind = ChangeKind.IMMEDIATE


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


def consumer_name(pool: str, number: int) -> str:
    """Replica `number` of the pool: the StatefulSet's pod name (`homes`, 3 -> `homes-3`)."""
    return f"{pool}-{number}"


def pending_handoffs(state: RebalanceState, owners: Mapping[str, str | None]) -> list[str]:
    """Partitions whose observed owner is not (yet) their assignee. A partition without an assignee that
    its planned owner already owns is not pending: a joiner claims such a partition itself as soon
    as it has joined (`hubshift.consumer.ownership_step`)."""
    return _pending(state.assignment, state.planned, owners)


def _pending(
    assignment: Mapping[str, str | None], planned: Mapping[str, str], owners: Mapping[str, str | None]
) -> list[str]:
    return [
        p
        for p, assignee in assignment.items()
        if owners.get(p) != assignee and not (assignee is None and owners.get(p) == planned.get(p))
    ]


def step(state: RebalanceState | None, observation: Observation, now: float, config: RebalanceSpec) -> Step:
    """One control-loop cycle of the rebalance state machine."""
    cycle = _Cycle(_View.of(observation), now, config)
    current = starting_point(state, observation.record)
    current = _rebalance(current, cycle)
    current = _returning(current, cycle)
    current = _joiner_wait(current, cycle)
    current = _settle(current, cycle)
    current = _replicas(current, cycle)
    return Step(current, tuple(cycle.actions))


@dataclass(frozen=True)
class _View:
    observation: Observation
    partitions: list[str]
    present: list[str]

    @classmethod
    def of(cls, observation: Observation) -> _View:
        return cls(
            observation,
            sorted_partitions(observation.partitions),
            sorted(set(observation.consumers), key=consumer_sort_key),
        )

    @property
    def limit(self) -> int:
        """Ordinals at or beyond it are leaving (present) or gone (absent): the desired replica count. An
        ordinal the StatefulSet does not have yet but the machine scales out to is coming, not leaving."""
        return self.observation.desired_replicas

    def leaving(self, consumer: str) -> bool:
        number = ordinal(consumer)
        observation = self.observation
        return (
            consumer in observation.departed
            or consumer in observation.stopping
            or consumer in observation.retiring
            or (number is not None and number >= self.limit)
        )

    def gone(self, consumer: str) -> bool:
        """Leaving and absent for good (not merely stopping: that one hands off on its own)."""
        return self.leaving(consumer) and consumer not in self.present and not self.stopping(consumer)

    def stopping(self, consumer: str) -> bool:
        return consumer in self.observation.stopping

    def keeps_until_replaced(self, consumer: str) -> bool:
        """A consumer a rollout replaces next keeps each partition until its planned owner is ready."""
        return consumer in self.observation.retiring and consumer in self.present

    def kept(self, consumer: str) -> bool:
        """Whether the pool brings this consumer back when its pod is gone: a StatefulSet replica (named
        after the pool) below the desired count."""
        observation = self.observation
        number = ordinal(consumer)
        return (
            observation.pool is not None
            and number is not None
            and consumer == consumer_name(observation.pool, number)
            and number < self.limit
            and consumer not in observation.departed
        )

    @property
    def candidates(self) -> list[str]:
        """Who may own partitions now: present, and neither leaving nor departed."""
        return [c for c in self.present if not self.leaving(c)]

    @property
    def arriving(self) -> list[str]:
        """The consumers a scale-out brings (ordinals from the StatefulSet's count up to the desired one),
        not ready yet; none when the pool's naming is unknown."""
        observation = self.observation
        if observation.pool is None:
            return []
        names = (consumer_name(observation.pool, i) for i in range(observation.current_replicas, self.limit))
        return [name for name in names if name not in self.present]


# The strategy's planner: (partitions, consumers, current assignees) -> every partition's assignee.
Planner = Callable[[list[str], Sequence[str], Mapping[str, str | None]], Mapping[str, str | None]]


@dataclass
class _Cycle:
    view: _View
    now: float
    config: RebalanceSpec
    actions: list[Action] = field(default_factory=list)

    def event(self, reason: EventReason, message: str, *, warning: bool = False) -> None:
        self.actions.append(RecordEvent(reason, message, warning))

    @property
    def load_aware(self) -> bool:
        return self.config.strategy == "loadAware"

    def packing(self, max_moves: int | None = None) -> PackingRules:
        return PackingRules(self.config.load_aware.tolerance, max_moves)

    def planner(self, max_moves: int | None = None) -> Planner:
        """The strategy's planner: count-balanced, or load-aware packing moving at most `max_moves`
        partitions for load alone (None: as many as it takes)."""
        if not self.load_aware:
            return lambda parts, members, current: plan_assignment(parts, members, current).assignment
        load, rules = self.view.observation.load, self.packing(max_moves)
        return lambda parts, members, current: (
            pack_assignment(parts, members, current, load, rules).assignment
        )

    def publish(
        self,
        state: RebalanceState,
        plan: _Plan,
        previous: Mapping[str, str | None],
        reason: PublishReason,
        kind: ChangeKind,
        detail: str,
    ) -> RebalanceState:
        """Generation + 1 with `plan`, moving from `previous`: each partition assigned to its planned owner
        when that consumer is ready, else (a joiner) kept by its current assignee and named in `planned`."""
        assignment, planned = plan.split(previous, self.view)
        if state.generation and assignment == dict(state.assignment) and planned == dict(state.planned):
            return state
        generation = state.generation + 1
        moved = assignment != dict(state.assignment)
        moves = plan_moves(previous, assignment)
        forced = _forced(assignment, previous, self.view)
        planned_for = tuple(sorted(set(plan.members), key=consumer_sort_key))
        self.actions.append(
            PublishAssignment(generation, assignment, forced, moves, reason, detail, planned, kind)
        )
        waiting = f", {len(planned)} planned for consumers not ready yet" if planned else ""
        self.event(
            EventReason.REBALANCING,
            f"generation {generation} ({kind.value}): {len(moves)} moves ({len(forced)} forced){waiting} "
            f"over {len(planned_for)} consumers: {detail}",
        )
        # A plan that only names consumers not ready yet moves nothing now: no handoff to wait for, unless a
        # lease is held where the new generation says otherwise (a joiner that read its share and is
        # dropped from the plan by a scale-in before it was ready: the StatefulSet waits for its release).
        owners = self.view.observation.owners
        pending = set(_pending(assignment, planned, owners))
        # The handoff time runs from the generation that moved something or left a lease where it should
        # not be: naming planned consumers only gives the pending handoffs no extra time.
        fresh = moved or bool(pending - set(pending_handoffs(state, owners)))
        return replace(
            state,
            generation=generation,
            phase=Phase.REBALANCING if assignment != dict(previous) or pending else state.phase,
            assignment=assignment,
            consumers=planned_for,
            forced=forced,
            published_at=self.now if fresh or state.published_at is None else state.published_at,
            planned=planned,
            change=kind,
        )


@dataclass(frozen=True)
class _Plan:
    """The planner's plan (`assignment`: every partition's assignee in it) over `members`, of which
    `joiners` are expected but not ready yet."""

    assignment: Mapping[str, str | None]
    members: tuple[str, ...]
    joiners: frozenset[str]

    @classmethod
    def over(
        cls,
        partitions: list[str],
        members: Iterable[str],
        joiners: Iterable[str],
        current: Mapping[str, str | None],
        planner: Planner,
    ) -> _Plan:
        """The planner's plan over `members` with the fewest moves from `current` (each partition's
        assignee, or at the first cycle its lease owner)."""
        ordered = tuple(sorted(set(members), key=consumer_sort_key))
        return cls(planner(partitions, ordered, current), ordered, frozenset(joiners))

    def split(
        self, previous: Mapping[str, str | None], view: _View
    ) -> tuple[dict[str, str | None], dict[str, str]]:
        """(each partition's assignee now, the partitions kept for joiners): a partition planned for a joiner
        stays with its current assignee as long as that one is still in the plan and not leaving (else it
        has none until the joiner is ready)."""
        assignment: dict[str, str | None] = {}
        planned: dict[str, str] = {}
        members = set(self.members)
        for partition, assignee in self.assignment.items():
            if assignee is None or assignee not in self.joiners:
                assignment[partition] = assignee
                continue
            planned[partition] = assignee
            current = previous.get(partition)
            keeps = current is not None and (
                (current in members and not view.leaving(current)) or view.keeps_until_replaced(current)
            )
            assignment[partition] = current if keeps else None
        return assignment, planned


def starting_point(state: RebalanceState | None, record: RebalanceState | None) -> RebalanceState:
    """The state a cycle starts from: the record read from the store when its generation differs from the
    state kept (a restart, a lost write, another writer), else the state kept."""
    if record is not None and (state is None or record.generation != state.generation):
        return record
    return state if state is not None else RebalanceState()


def _rebalance(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """Publish at once for a partition change, a planned change, orphans or a drain, and hand a joiner its
    planned partitions when it is ready; otherwise hold down, then publish."""
    view = cycle.view
    parts = view.partitions
    assignees = dict(state.assignment)
    candidates = view.candidates
    arriving = [c for c in view.arriving if c not in state.consumers]  # a scale-out decided this cycle
    back = [c for c in state.returning if c not in state.consumers and not view.leaving(c)]
    incoming = _unique([*arriving, *back])
    expected = _expected_joiners(state, cycle)
    dropped = set(state.planned.values()) - set(expected) - set(view.present)  # late, or leaving
    late = sorted((c for c in dropped if not view.leaving(c)), key=consumer_sort_key)
    joiners = _unique([*expected, *(c for c in incoming if c not in view.present)])

    if set(parts) != set(assignees):
        # Without any record yet, plan from who really holds what, so the first plan is sticky too.
        base = assignees if state.generation else {p: view.observation.owners.get(p) for p in parts}
        plan = _Plan.over(parts, [*candidates, *joiners], joiners, base, cycle.planner())
        planned_change = (PublishReason.PLANNED, ChangeKind.PLANNED) if incoming else None
        reason, kind = planned_change or (PublishReason.PARTITIONS_CHANGED, ChangeKind.IMMEDIATE)
        if arriving:
            _announce(cycle, plan, arriving)
        return cycle.publish(
            replace(state, holddown_until=None),
            plan,
            base,
            reason,
            kind,
            f"partitions changed ({len(assignees)} -> {len(parts)})",
        )

    leaving = {c for c in assignees.values() if c is not None and view.leaving(c)}
    urgent = sorted(leaving, key=consumer_sort_key)
    if urgent or incoming or dropped:
        # Re-planned over the consumers the plan was made for (minus those leaving or dropped), so that a
        # consumer that may still come back, or one that just arrived, keeps waiting for the holddown.
        survivors = [c for c in state.consumers if not view.leaving(c) and c not in dropped] or candidates
        plan = _Plan.over(parts, [*survivors, *incoming], joiners, assignees, cycle.planner())
    else:
        plan = _Plan(state.plan, state.consumers, frozenset(joiners))

    state = _holddown(state, cycle, joiners, needed=_holddown_needed(cycle, plan, [*candidates, *joiners]))
    if state.holddown_until is not None and cycle.now >= state.holddown_until:
        return cycle.publish(
            replace(state, holddown_until=None),
            _Plan.over(parts, [*candidates, *joiners], joiners, assignees, cycle.planner()),
            assignees,
            PublishReason.HOLDDOWN_OVER,
            ChangeKind.HOLDDOWN,
            "holddown over",
        )
    if urgent:
        reason, detail = _urgent_reason(urgent, view)
        kind = ChangeKind.IMMEDIATE if reason is PublishReason.ORPHANS else ChangeKind.PLANNED
        return cycle.publish(state, plan, assignees, reason, kind, detail)
    if arriving:
        _announce(cycle, plan, arriving)
        return cycle.publish(
            state, plan, assignees, PublishReason.PLANNED, ChangeKind.PLANNED, f"scale-out to {view.limit}"
        )
    if back:
        detail = f"{_names(back)} coming back"
        return cycle.publish(state, plan, assignees, PublishReason.RETURNING, ChangeKind.PLANNED, detail)
    if late:
        cycle.event(
            EventReason.JOINERS_LATE,
            f"{_names(late)} not ready within "
            f"{cycle.config.delay_seconds:g}s while partitions planned for them went unread: "
            "their share goes to the consumers present",
        )
        return cycle.publish(
            state, plan, assignees, PublishReason.JOINERS_LATE, ChangeKind.HOLDDOWN, "planned consumers late"
        )
    if dropped:  # a scale-in before they were ready
        detail = f"scale-in to {view.limit} before {_names(sorted(dropped, key=consumer_sort_key))} was ready"
        return cycle.publish(state, plan, assignees, PublishReason.DRAIN, ChangeKind.PLANNED, detail)
    if _repack_due(state, cycle):
        return _repack(state, cycle)
    ready = sorted(set(state.planned.values()) & set(view.present), key=consumer_sort_key)
    kind = state.change or ChangeKind.PLANNED
    return cycle.publish(state, plan, assignees, PublishReason.JOINED, kind, f"{_names(ready)} ready")


def _holddown_needed(cycle: _Cycle, plan: _Plan, members: list[str]) -> bool:
    """Whether the consumers present (and the joiners) call for another plan than `plan`. Load-aware, only
    what the change of consumers itself asks counts: the partitions of the absent ones, or a consumer
    new to the plan; a change of load alone is `_repack`'s business."""
    parts = cycle.view.partitions
    if not cycle.load_aware:
        present_plan = _Plan.over(parts, members, plan.joiners, plan.assignment, cycle.planner())
        return present_plan.assignment != plan.assignment
    present_plan = _Plan.over(parts, members, plan.joiners, plan.assignment, cycle.planner(max_moves=0))
    return present_plan.assignment != plan.assignment or bool(set(members) - set(plan.members))


def _repack_due(state: RebalanceState, cycle: _Cycle) -> bool:
    """Load-aware, with load figures, and nothing else under way: every consumer of the plan present, no
    handoff pending, no holddown, nothing planned for a consumer not ready yet; and, once a consumer's
    capacity is measured, a consumer busier than `BUSY_SHARE` of it (a move is a short pause for its
    partition: not worth it while every consumer has room)."""
    view = cycle.view
    load, capacity = view.observation.load, view.observation.capacity
    if load is not None and capacity is not None:
        loads = consumer_loads(state.assignment, load)
        if max(loads.values(), default=0.0) <= BUSY_SHARE * capacity:
            return False
    return (
        cycle.load_aware
        and load is not None
        and state.generation > 0
        and state.phase is Phase.READY
        and state.holddown_until is None
        and not state.planned
        and set(state.consumers) <= set(view.candidates)
    )


def _repack(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """Publish the packing of the current assignment when a consumer carries more than the tolerance over
    the mean load: at most `loadAware.maxMoves` moves, each a graceful handoff (every owner is present)."""
    assignees = dict(state.assignment)
    parts = cycle.view.partitions
    planner = cycle.planner(cycle.config.load_aware.max_moves)
    plan = _Plan.over(parts, state.consumers, (), assignees, planner)
    if dict(plan.assignment) == assignees:
        return state
    load = cycle.view.observation.load or {}
    weights = partition_weights(parts, load)
    loads = consumer_loads(assignees, weights)
    mean = Limits.of(weights, len(state.consumers), cycle.packing()).mean
    busiest = max(sorted(loads, key=consumer_sort_key), key=lambda c: loads[c])
    moved = ", ".join(
        f"{m.partition} ({load.get(m.partition, 0.0):.0f}/s) {m.previous} -> {m.assignee}"
        for m in plan_moves(assignees, plan.assignment)
    )
    detail = (
        f"load: {busiest} carries {loads[busiest]:.0f} events/s, {loads[busiest] / mean:.2f}x the mean "
        f"{mean:.0f}; moving {moved}"
    )
    return cycle.publish(state, plan, assignees, PublishReason.LOAD, ChangeKind.PLANNED, detail)


def _expected_joiners(state: RebalanceState, cycle: _Cycle) -> list[str]:
    """The planned consumers still expected: not ready yet, not leaving, and not late (a partition planned
    for them unread past `planned_until`)."""
    view = cycle.view
    late = state.planned_until is not None and cycle.now >= state.planned_until
    unread = set(_unread(state, view)) if late else set()
    return [
        c
        for c in sorted(set(state.planned.values()), key=consumer_sort_key)
        if c not in view.present
        and not view.leaving(c)
        and not any(state.planned.get(p) == c for p in unread)
    ]


def _returning(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """Remember the stopping consumers the pool brings back, until a plan names them again (or the pool no
    longer keeps them)."""
    view = cycle.view
    names = {c for c in state.returning if c not in state.consumers} | set(view.observation.stopping)
    returning = tuple(sorted((c for c in names if view.kept(c)), key=consumer_sort_key))
    return state if returning == state.returning else replace(state, returning=returning)


def _unread(state: RebalanceState, view: _View) -> list[str]:
    """Partitions planned for a consumer not ready yet whose assignee is not present (nobody reads them)."""
    present = set(view.present)
    return [p for p in state.planned if state.assignment.get(p) not in present]


def _joiner_wait(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """Unread partitions wait for their planned consumer from the first cycle another consumer could read
    them, `delaySeconds` at most; the wait ends when none is unread."""
    if not _unread(state, cycle.view):
        return replace(state, planned_until=None) if state.planned_until is not None else state
    if state.planned_until is None and cycle.view.candidates:
        return replace(state, planned_until=cycle.now + cycle.config.delay_seconds)
    return state


def _announce(cycle: _Cycle, plan: _Plan, arriving: list[str]) -> None:
    """The Event of a planned scale-out: who comes, and that nothing waits for a holddown."""
    waiting = [p for p, assignee in plan.assignment.items() if assignee in plan.joiners]
    observation = cycle.view.observation
    cycle.event(
        EventReason.PLANNED,
        f"replicas {observation.current_replicas} -> {observation.desired_replicas}: {len(waiting)} "
        f"partitions planned for {_names(arriving)}, each handed over as soon as its consumer is ready "
        "(no holddown)",
    )


def _holddown(state: RebalanceState, cycle: _Cycle, joiners: list[str], *, needed: bool) -> RebalanceState:
    """Start the timer at the first change that would move partitions; drop it if none would any more."""
    if needed and state.holddown_until is None:
        until = cycle.now + cycle.config.delay_seconds
        cycle.event(
            EventReason.HOLDDOWN,
            f"consumers changed ({_change(state.consumers, cycle.view, joiners)}); "
            f"rebalancing in {cycle.config.delay_seconds:g}s unless they settle back",
        )
        return replace(state, holddown_until=until)
    if not needed and state.holddown_until is not None:
        cycle.event(EventReason.HOLDDOWN_CANCELLED, "the consumers settled back: no handoff")
        return replace(state, holddown_until=None)
    return state


def _urgent_reason(urgent: list[str], view: _View) -> tuple[PublishReason, str]:
    """Why the partitions of leaving consumers move now; the first kind present names the publication."""
    observation = view.observation
    kinds = (
        (PublishReason.ORPHANS, "orphans of {}", [c for c in urgent if view.gone(c)]),
        (PublishReason.STOPPING, "{} stopping", [c for c in urgent if view.stopping(c)]),
        (PublishReason.ROLLOUT, "replacing {} (rollout)", [c for c in urgent if c in observation.retiring]),
    )
    named = {c for _, _, names in kinds for c in names}
    draining = [c for c in urgent if c not in named]
    found = [(reason, text.format(_names(names))) for reason, text, names in kinds if names]
    if draining:
        found.append((PublishReason.DRAIN, f"draining {_names(draining)} before scale-in to {view.limit}"))
    return found[0][0], "; ".join(text for _, text in found)


def _forced(
    assignment: Mapping[str, str | None], previous: Mapping[str, str | None], view: _View
) -> frozenset[str]:
    """Partitions whose owner is not present to hand them over: the new owner may break at once."""
    owners = view.observation.owners
    # A stopping consumer is not present but releases its partitions itself (a graceful drain).
    handing_off = set(view.present) | set(view.observation.stopping)
    forced = set()
    for partition, assignee in assignment.items():
        owner = owners.get(partition) or previous.get(partition)
        if assignee is not None and owner is not None and owner != assignee and owner not in handing_off:
            forced.add(partition)
    return frozenset(forced)


def _settle(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """`Rebalancing` ends when every partition's owner is its assignee, or by force at the handoff deadline;
    the change is over once nothing is planned for a consumer not ready yet."""
    idle = Phase.HOLDDOWN if state.holddown_until is not None else Phase.READY
    if state.phase is not Phase.REBALANCING:
        return replace(state, phase=idle, change=state.change if state.planned else None)
    pending = pending_handoffs(state, cycle.view.observation.owners)
    if not pending:
        cycle.event(EventReason.REBALANCED, f"generation {state.generation}: every handoff done")
        return replace(state, phase=idle, change=state.change if state.planned else None)
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
    return replace(state, phase=idle, change=state.change if state.planned else None)


def _replicas(state: RebalanceState, cycle: _Cycle) -> RebalanceState:
    """Scale out at once; scale in only once the consumers about to go hold nothing."""
    desired = cycle.view.observation.desired_replicas
    current = cycle.view.observation.current_replicas
    shrink = desired < current and _drained(state, cycle.view)
    replicas = desired if desired > current or shrink else current
    if replicas != current:
        # Level-triggered: asked again every cycle until the StatefulSet shows it; one Event per change.
        why = "scale out" if replicas > current else "scale in after drain"
        cycle.actions.append(SetReplicas(replicas, why))
        if state.replicas != replicas:
            reason = EventReason.SCALING_OUT if replicas > current else EventReason.SCALING_IN
            cycle.event(reason, f"replicas {current} -> {replicas}")
    return replace(state, replicas=replicas)


def _drained(state: RebalanceState, view: _View) -> bool:
    """No partition is assigned to a consumer about to go, and every handoff is done or forced."""
    if state.phase is Phase.REBALANCING:
        return False
    return not any(c is not None and view.leaving(c) for c in state.assignment.values())


def _change(before: Iterable[str], view: _View, joiners: Iterable[str]) -> str:
    planned = set(before)
    expected = set(joiners)
    joined = [f"+{c}" for c in view.candidates if c not in planned]
    missing = [
        f"-{c}" for c in sorted(planned, key=consumer_sort_key) if c not in view.present and c not in expected
    ]
    return " ".join(joined + missing) or "same names"


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _names(consumers: Iterable[str]) -> str:
    names = list(consumers)
    return ", ".join(names) if names else "none"


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=UTC)
