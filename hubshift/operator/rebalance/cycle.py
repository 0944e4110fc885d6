"""One step's context (`Cycle`: what it saw, when, the spec, the actions so far) and the one way a step
publishes a generation (`Cycle.publish` of a `Change`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hubshift.operator.rebalance.actions import (
    Action,
    EventReason,
    PublishAssignment,
    PublishReason,
    RecordEvent,
)
from hubshift.operator.rebalance.members import Roster
from hubshift.operator.rebalance.plans import (
    Planner,
    PoolPlan,
    forced_partitions,
    load_aware,
    packing_rules,
    strategy_planner,
)
from hubshift.operator.rebalance.state import RebalanceState, pending_handoffs, pending_partitions
from hubshift.ownership.model import ChangeKind, Phase
from hubshift.ownership.packing import PackingRules
from hubshift.ownership.planner import consumer_sort_key, plan_moves
from hubshift.spec import RebalanceSpec


@dataclass(frozen=True)
class Change:
    """A publication a step calls for: the plan, the assignment it moves from, why, and what kind."""

    plan: PoolPlan
    previous: Mapping[str, str | None]
    reason: PublishReason
    kind: ChangeKind
    detail: str  # for people: which consumers, which change
    ends_holddown: bool = False  # the holddown timer is over with it, published or not


@dataclass
class Cycle:
    roster: Roster
    now: float
    rebalance_spec: RebalanceSpec
    actions: list[Action] = field(default_factory=list)

    def event(self, reason: EventReason, message: str, *, warning: bool = False) -> None:
        self.actions.append(RecordEvent(reason, message, warning))

    @property
    def load_aware(self) -> bool:
        return load_aware(self.rebalance_spec)

    def packing(self) -> PackingRules:
        return packing_rules(self.rebalance_spec)

    def planner(self, max_moves: int | None = None) -> Planner:
        return strategy_planner(self.rebalance_spec, self.roster.observation.load, max_moves)

    def plan(self, members: list[str], joiners: list[str], current: Mapping[str, str | None]) -> PoolPlan:
        """The strategy's plan over `members` (of which `joiners` are not ready yet) from `current`."""
        return PoolPlan.over(self.roster.partitions, members, joiners, current, self.planner())

    def publish(self, state: RebalanceState, change: Change) -> RebalanceState:
        """Generation + 1 with the change's plan: each partition assigned to its planned owner when that
        consumer is ready, else (a joiner) kept by its current assignee and named in `planned`. Nothing is
        published when neither the assignment nor `planned` changes."""
        if change.ends_holddown:
            state = replace(state, holddown_until=None)
        previous = change.previous
        assignment, planned = change.plan.split(previous, self.roster)
        if state.generation and assignment == dict(state.assignment) and planned == dict(state.planned):
            return state
        generation = state.generation + 1
        moves = plan_moves(previous, assignment)
        forced = forced_partitions(assignment, previous, self.roster)
        planned_for = tuple(sorted(set(change.plan.members), key=consumer_sort_key))
        self.actions.append(
            PublishAssignment(
                generation, assignment, forced, moves, change.reason, change.detail, planned, change.kind
            )
        )
        waiting = f", {len(planned)} planned for consumers not ready yet" if planned else ""
        self.event(
            EventReason.REBALANCING,
            f"generation {generation} ({change.kind.value}): {len(moves)} moves ({len(forced)} forced)"
            f"{waiting} over {len(planned_for)} consumers: {change.detail}",
        )
        # A plan that only names consumers not ready yet moves nothing now: no handoff to wait for, unless a
        # lease is held where the new generation says otherwise (a joiner that read its share and is
        # dropped from the plan by a scale-in before it was ready: the StatefulSet waits for its release).
        owners = self.roster.observation.owners
        pending = set(pending_partitions(assignment, planned, owners))
        # The handoff time runs from the generation that moved something or left a lease where it should
        # not be: naming planned consumers only gives the pending handoffs no extra time.
        moved = assignment != dict(state.assignment)
        fresh = moved or bool(pending - set(pending_handoffs(state, owners)))
        opens_handoffs = assignment != dict(previous) or bool(pending)
        return replace(
            state,
            generation=generation,
            phase=Phase.REBALANCING if opens_handoffs else state.phase,
            assignment=assignment,
            consumers=planned_for,
            forced=forced,
            published_at=self.now if fresh or state.published_at is None else state.published_at,
            planned=planned,
            change=change.kind,
        )
