"""Load-aware rebalancing (`strategy: loadAware`): when a change of load alone moves partitions."""

from __future__ import annotations

from hubshift.operator.rebalance.actions import PublishReason
from hubshift.operator.rebalance.cycle import Change, Cycle
from hubshift.operator.rebalance.plans import PoolPlan
from hubshift.operator.rebalance.state import RebalanceState
from hubshift.ownership.model import ChangeKind, Phase
from hubshift.ownership.packing import LoadLimits, consumer_loads, partition_weights
from hubshift.ownership.planner import consumer_sort_key, plan_moves

# No move for load alone while the busiest consumer carries at most this share of a consumer's measured
# capacity.
BUSY_SHARE = 0.5


def repack_due(state: RebalanceState, cycle: Cycle) -> bool:
    """Load-aware, with load figures, and nothing else under way: every consumer of the plan present, no
    handoff pending, no holddown, nothing planned for a consumer not ready yet; and, once a consumer's
    capacity is measured, a consumer busier than `BUSY_SHARE` of it (a move is a short pause for its
    partition: not worth it while every consumer has room)."""
    roster = cycle.roster
    load, capacity = roster.observation.load, roster.observation.capacity
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
        and set(state.consumers) <= set(roster.candidates)
    )


def repack(state: RebalanceState, cycle: Cycle) -> Change | None:
    """The packing of the current assignment when a consumer carries more than the tolerance over the mean
    load: at most `loadAware.maxMoves` moves, each a graceful handoff (every owner is present). None when
    the packing moves nothing."""
    assignees = dict(state.assignment)
    parts = cycle.roster.partitions
    planner = cycle.planner(cycle.rebalance_spec.load_aware.max_moves)
    plan = PoolPlan.over(parts, state.consumers, (), assignees, planner)
    if dict(plan.assignment) == assignees:
        return None
    load = cycle.roster.observation.load or {}
    weights = partition_weights(parts, load)
    loads = consumer_loads(assignees, weights)
    mean = LoadLimits.of(weights, len(state.consumers), cycle.packing()).mean
    busiest = max(sorted(loads, key=consumer_sort_key), key=lambda c: loads[c])
    moved = ", ".join(
        f"{m.partition} ({load.get(m.partition, 0.0):.0f}/s) {m.previous} -> {m.assignee}"
        for m in plan_moves(assignees, plan.assignment)
    )
    detail = (
        f"load: {busiest} carries {loads[busiest]:.0f} events/s, {loads[busiest] / mean:.2f}x the mean "
        f"{mean:.0f}; moving {moved}"
    )
    return Change(plan, assignees, PublishReason.LOAD, ChangeKind.PLANNED, detail)
