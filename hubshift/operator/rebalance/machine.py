"""One step of the rebalance machine: a control-loop cycle's decisions, each a function of its own, in the
order docs/decisions.md ("Rebalance state machine", steps 1-8) gives them:

1. the starting point (`starting_point`: the record wins over a stale state);
2-5. at most one publication (`_publish`): the plan over the consumers present at once for a changed
   partition set; else the holddown started or cancelled, and the change due this cycle, the first that
   applies (`_change_due`);
6. the joiners' wait (`_wait_for_joiners`) and the returning consumers remembered (`_remember_returning`);
7. the phase the step ends in (`_decide_phase`);
8. the replica count (`_ask_replicas`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from hubshift.operator.rebalance.actions import (
    BreakLeases,
    EventReason,
    PublishReason,
    SetReplicas,
    Step,
)
from hubshift.operator.rebalance.cycle import Change, Cycle
from hubshift.operator.rebalance.members import Members, Roster, unread
from hubshift.operator.rebalance.plans import PoolPlan
from hubshift.operator.rebalance.repack import repack, repack_due
from hubshift.operator.rebalance.state import (
    Observation,
    RebalanceState,
    holddown_seconds,
    joiner_wait_seconds,
    pending_handoffs,
    starting_point,
)
from hubshift.ownership.model import ChangeKind, Phase
from hubshift.ownership.planner import consumer_sort_key
from hubshift.spec import RebalanceSpec


def step(
    state: RebalanceState | None, observation: Observation, now: float, rebalance_spec: RebalanceSpec
) -> Step:
    """One control-loop cycle of the rebalance state machine."""
    cycle = Cycle(Roster.of(observation), now, rebalance_spec)
    current = starting_point(state, observation.record)
    current = _publish(current, cycle)
    current = _remember_returning(current, cycle)
    current = _wait_for_joiners(current, cycle)
    current = _decide_phase(current, cycle)
    current = _ask_replicas(current, cycle)
    return Step(current, tuple(cycle.actions))


# --- the publication (steps 2-5) ------------------------------------------------------------------------


def _publish(state: RebalanceState, cycle: Cycle) -> RebalanceState:
    """At most one publication: at once for a changed partition set; otherwise the holddown's timer is
    started or cancelled first, then the change due this cycle (if any) is published."""
    members = Members.of(state, cycle.roster, cycle.now)
    if set(cycle.roster.partitions) != set(state.assignment):
        return cycle.publish(state, _new_partitions(state, cycle, members))
    replan = _replan(state, cycle, members)
    needed = _holddown_needed(cycle, replan, members.present_and_joining)
    state = _holddown(state, cycle, members.joiners, needed=needed)
    change = _change_due(state, cycle, members, replan)
    return state if change is None else cycle.publish(state, change)


def _new_partitions(state: RebalanceState, cycle: Cycle, members: Members) -> Change:
    """The partition set changed (or the first cycle): the plan over the candidates and the joiners, at
    once. Without any record yet it starts from who really holds what, so the first plan is sticky too; with
    consumers coming (a cold start) it is a planned change."""
    parts = cycle.roster.partitions
    owners = cycle.roster.observation.owners
    base = dict(state.assignment) if state.generation else {p: owners.get(p) for p in parts}
    plan = cycle.plan(members.present_and_joining, members.joiners, base)
    if members.arriving:
        _announce(cycle, plan, members.arriving)
    planned_change = (PublishReason.PLANNED, ChangeKind.PLANNED) if members.incoming else None
    reason, kind = planned_change or (PublishReason.PARTITIONS_CHANGED, ChangeKind.IMMEDIATE)
    detail = f"partitions changed ({len(state.assignment)} -> {len(parts)})"
    return Change(plan, base, reason, kind, detail, ends_holddown=True)


def _replan(state: RebalanceState, cycle: Cycle, members: Members) -> PoolPlan:
    """The plan with this cycle's planned changes of the members: when an assignee is leaving, consumers are
    incoming or planned ones were dropped, re-planned from the assignees over the consumers the plan was
    made for (minus those leaving or dropped) and the incoming, so that a consumer that may still come back,
    or one that just arrived, keeps waiting for the holddown; otherwise the plan published."""
    if not (members.leaving or members.incoming or members.dropped):
        return PoolPlan(state.plan, state.consumers, frozenset(members.joiners))
    roster = cycle.roster
    survivors = [
        c for c in state.consumers if not roster.leaving(c) and c not in members.dropped
    ] or members.candidates
    return cycle.plan([*survivors, *members.incoming], members.joiners, dict(state.assignment))


def _change_due(state: RebalanceState, cycle: Cycle, members: Members, replan: PoolPlan) -> Change | None:
    """The publication this cycle calls for, the first that applies; None: nothing to publish."""
    assignees = dict(state.assignment)
    if state.holddown_until is not None and cycle.now >= state.holddown_until:
        return _holddown_over(cycle, members, assignees)
    if members.leaving:
        return _leaving(cycle, members, replan, assignees)
    if members.arriving:
        return _scale_out(cycle, members, replan, assignees)
    if members.coming_back:
        return _coming_back(members, replan, assignees)
    if members.late:
        return _joiners_late(cycle, members, replan, assignees)
    if members.dropped:
        return _joiners_dropped(cycle, members, replan, assignees)
    if repack_due(state, cycle):
        return repack(state, cycle)
    return _joined(state, cycle, replan, assignees)


def _holddown_over(cycle: Cycle, members: Members, assignees: dict[str, str | None]) -> Change:
    """The holddown ran out: the plan over the consumers present and the joiners (it absorbs any re-plan)."""
    plan = cycle.plan(members.present_and_joining, members.joiners, assignees)
    return Change(
        plan, assignees, PublishReason.HOLDDOWN_OVER, ChangeKind.HOLDDOWN, "holddown over", ends_holddown=True
    )


def _leaving(cycle: Cycle, members: Members, replan: PoolPlan, assignees: dict[str, str | None]) -> Change:
    """Assignees are leaving: their partitions move now, forced only for the orphans of the gone."""
    reason, detail = _leaving_reason(members.leaving, cycle.roster)
    kind = ChangeKind.IMMEDIATE if reason is PublishReason.ORPHANS else ChangeKind.PLANNED
    return Change(replan, assignees, reason, kind, detail)


def _scale_out(cycle: Cycle, members: Members, replan: PoolPlan, assignees: dict[str, str | None]) -> Change:
    """A scale-out decided this cycle: its plan at once, each share handed over when its consumer is ready."""
    _announce(cycle, replan, members.arriving)
    detail = f"scale-out to {cycle.roster.limit}"
    return Change(replan, assignees, PublishReason.PLANNED, ChangeKind.PLANNED, detail)


def _coming_back(members: Members, replan: PoolPlan, assignees: dict[str, str | None]) -> Change:
    """Consumers that stopped are back (their old pods gone): their share is planned for them."""
    detail = f"{_names(members.coming_back)} coming back"
    return Change(replan, assignees, PublishReason.RETURNING, ChangeKind.PLANNED, detail)


def _joiners_late(
    cycle: Cycle, members: Members, replan: PoolPlan, assignees: dict[str, str | None]
) -> Change:
    """Planned consumers not ready within the joiners' wait while their share went unread: it goes to the
    consumers present."""
    cycle.event(
        EventReason.JOINERS_LATE,
        f"{_names(members.late)} not ready within "
        f"{joiner_wait_seconds(cycle.rebalance_spec):g}s while partitions planned for them went unread: "
        "their share goes to the consumers present",
    )
    detail = "planned consumers late"
    return Change(replan, assignees, PublishReason.JOINERS_LATE, ChangeKind.HOLDDOWN, detail)


def _joiners_dropped(
    cycle: Cycle, members: Members, replan: PoolPlan, assignees: dict[str, str | None]
) -> Change:
    """Planned consumers leaving before they were ready (a scale-in): the plan goes on without them."""
    dropped = _names(sorted(members.dropped, key=consumer_sort_key))
    detail = f"scale-in to {cycle.roster.limit} before {dropped} was ready"
    return Change(replan, assignees, PublishReason.DRAIN, ChangeKind.PLANNED, detail)


def _joined(
    state: RebalanceState, cycle: Cycle, replan: PoolPlan, assignees: dict[str, str | None]
) -> Change:
    """The plan published, handing each consumer now ready the partitions planned for it (nothing is
    published when none is)."""
    ready = sorted(set(state.planned.values()) & set(cycle.roster.present), key=consumer_sort_key)
    kind = state.change or ChangeKind.PLANNED
    return Change(replan, assignees, PublishReason.JOINED, kind, f"{_names(ready)} ready")


# --- the holddown (step 4) ------------------------------------------------------------------------------


def _holddown_needed(cycle: Cycle, plan: PoolPlan, members: list[str]) -> bool:
    """Whether the consumers present (and the joiners) call for another plan than `plan`. Load-aware, only
    what the change of consumers itself asks counts: the partitions of the absent ones, or a consumer
    new to the plan; a change of load alone is `repack`'s business."""
    parts = cycle.roster.partitions
    if not cycle.load_aware:
        present_plan = PoolPlan.over(parts, members, plan.joiners, plan.assignment, cycle.planner())
        return present_plan.assignment != plan.assignment
    present_plan = PoolPlan.over(parts, members, plan.joiners, plan.assignment, cycle.planner(max_moves=0))
    return present_plan.assignment != plan.assignment or bool(set(members) - set(plan.members))


def _holddown(state: RebalanceState, cycle: Cycle, joiners: list[str], *, needed: bool) -> RebalanceState:
    """Start the timer at the first change that would move partitions; drop it if none would any more."""
    seconds = holddown_seconds(cycle.rebalance_spec)
    if needed and state.holddown_until is None:
        cycle.event(
            EventReason.HOLDDOWN,
            f"consumers changed ({_consumer_change(state.consumers, cycle.roster, joiners)}); "
            f"rebalancing in {seconds:g}s unless they settle back",
        )
        return replace(state, holddown_until=cycle.now + seconds)
    if not needed and state.holddown_until is not None:
        cycle.event(EventReason.HOLDDOWN_CANCELLED, "the consumers settled back: no handoff")
        return replace(state, holddown_until=None)
    return state


# --- after the publication (steps 6-8) ------------------------------------------------------------------


def _remember_returning(state: RebalanceState, cycle: Cycle) -> RebalanceState:
    """Remember the stopping consumers the pool brings back, until a plan names them again (or the pool no
    longer keeps them)."""
    roster = cycle.roster
    names = {c for c in state.returning if c not in state.consumers} | set(roster.observation.stopping)
    returning = tuple(sorted((c for c in names if roster.kept(c)), key=consumer_sort_key))
    return state if returning == state.returning else replace(state, returning=returning)


def _wait_for_joiners(state: RebalanceState, cycle: Cycle) -> RebalanceState:
    """Unread partitions wait for their planned consumer from the first cycle another consumer could read
    them, the joiners' wait at most; the wait ends when none is unread."""
    if not unread(state, cycle.roster):
        return replace(state, planned_until=None) if state.planned_until is not None else state
    if state.planned_until is None and cycle.roster.candidates:
        return replace(state, planned_until=cycle.now + joiner_wait_seconds(cycle.rebalance_spec))
    return state


def _decide_phase(state: RebalanceState, cycle: Cycle) -> RebalanceState:
    """The phase the step ends in. `Rebalancing` (entered by a publication that leaves handoffs to wait for)
    lasts while they run; otherwise the phase is `Holddown` while its timer runs, else `Ready`, and the
    change is over once nothing is planned for a consumer not ready yet either."""
    if state.phase is Phase.REBALANCING and _handoffs_running(state, cycle):
        return state
    idle = Phase.HOLDDOWN if state.holddown_until is not None else Phase.READY
    return replace(state, phase=idle, change=state.change if state.planned else None)


def _handoffs_running(state: RebalanceState, cycle: Cycle) -> bool:
    """Whether the handoffs of the generation published still run. They end when every partition's owner is
    its assignee (`Rebalanced`), or by force at the handoff deadline (`HandoffForced`; the new owners of the
    partitions still pending may break their leases)."""
    pending = pending_handoffs(state, cycle.roster.observation.owners)
    if not pending:
        cycle.event(EventReason.REBALANCED, f"generation {state.generation}: every handoff done")
        return False
    deadline = state.handoff_deadline(cycle.rebalance_spec)
    if deadline is None or cycle.now < deadline:
        return True
    breakable = tuple(p for p in pending if state.assignment.get(p) is not None)
    if breakable:
        cycle.actions.append(BreakLeases(state.generation, breakable))
    cycle.event(
        EventReason.HANDOFF_FORCED,
        f"generation {state.generation}: {len(pending)} partitions not released within "
        f"{cycle.rebalance_spec.max_handoff_seconds:g}s; their new owners may break the leases",
        warning=True,
    )
    return False


def _ask_replicas(state: RebalanceState, cycle: Cycle) -> RebalanceState:
    """Scale out at once; scale in only once the consumers about to go hold nothing."""
    desired = cycle.roster.observation.desired_replicas
    current = cycle.roster.observation.current_replicas
    shrink = desired < current and _drained(state, cycle.roster)
    replicas = desired if desired > current or shrink else current
    if replicas != current:
        # Level-triggered: asked again every cycle until the StatefulSet shows it; one Event per change.
        why = "scale out" if replicas > current else "scale in after drain"
        cycle.actions.append(SetReplicas(replicas, why))
        if state.replicas != replicas:
            reason = EventReason.SCALING_OUT if replicas > current else EventReason.SCALING_IN
            cycle.event(reason, f"replicas {current} -> {replicas}")
    return replace(state, replicas=replicas)


def _drained(state: RebalanceState, roster: Roster) -> bool:
    """No partition is assigned to a consumer about to go, and every handoff is done or forced."""
    if state.phase is Phase.REBALANCING:
        return False
    return not any(c is not None and roster.leaving(c) for c in state.assignment.values())


# --- what the Events say --------------------------------------------------------------------------------


def _announce(cycle: Cycle, plan: PoolPlan, arriving: list[str]) -> None:
    """The Event of a planned scale-out: who comes, and that nothing waits for a holddown."""
    waiting = [p for p, assignee in plan.assignment.items() if assignee in plan.joiners]
    observation = cycle.roster.observation
    cycle.event(
        EventReason.PLANNED,
        f"replicas {observation.current_replicas} -> {observation.desired_replicas}: {len(waiting)} "
        f"partitions planned for {_names(arriving)}, each handed over as soon as its consumer is ready "
        "(no holddown)",
    )


def _leaving_reason(leaving: list[str], roster: Roster) -> tuple[PublishReason, str]:
    """Why the partitions of leaving consumers move now; the first kind present names the publication."""
    observation = roster.observation
    kinds = (
        (PublishReason.ORPHANS, "orphans of {}", [c for c in leaving if roster.gone(c)]),
        (PublishReason.STOPPING, "{} stopping", [c for c in leaving if roster.stopping(c)]),
        (PublishReason.ROLLOUT, "replacing {} (rollout)", [c for c in leaving if c in observation.retiring]),
    )
    named = {c for _, _, names in kinds for c in names}
    draining = [c for c in leaving if c not in named]
    found = [(reason, text.format(_names(names))) for reason, text, names in kinds if names]
    if draining:
        found.append((PublishReason.DRAIN, f"draining {_names(draining)} before scale-in to {roster.limit}"))
    return found[0][0], "; ".join(text for _, text in found)


def _consumer_change(before: Iterable[str], roster: Roster, joiners: Iterable[str]) -> str:
    planned = set(before)
    expected = set(joiners)
    joined = [f"+{c}" for c in roster.candidates if c not in planned]
    absent = [c for c in sorted(planned, key=consumer_sort_key) if c not in roster.present]
    missing = [f"-{c}" for c in absent if c not in expected]
    return " ".join(joined + missing) or "same names"


def _names(consumers: Iterable[str]) -> str:
    names = list(consumers)
    return ", ".join(names) if names else "none"
