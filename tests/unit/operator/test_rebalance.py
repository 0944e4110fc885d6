"""The rebalance state machine: planned changes, holddown, handoffs, orphans, drain before scale-in,
restarts."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift.operator.rebalance import (
    BreakLeases,
    Observation,
    PublishAssignment,
    PublishReason,
    RebalanceState,
    RecordEvent,
    SetReplicas,
    Step,
    ordinal,
    pending_handoffs,
    step,
)
from hubshift.ownership.model import ChangeKind, Phase
from hubshift.ownership.planner import plan_assignment, plan_moves
from hubshift.ownership.records import decode_assignment, encode_assignment
from hubshift.spec import LoadAwareSpec, RebalanceSpec
from tests.harness.ownership import is_balanced, minimum_moves

SPEC = RebalanceSpec(delay_seconds=5.0, max_handoff_seconds=3.0)


def stored(state: RebalanceState) -> RebalanceState:
    """`state` as the control loop reads it back from the store: its assignment record, as JSON."""
    return RebalanceState.from_record(decode_assignment(encode_assignment(state.to_record(SPEC))))


def ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def pods(n: int, start: int = 0) -> list[str]:
    return [f"homes-{i}" for i in range(start, start + n)]


@dataclass
class World:
    """The operator's surroundings: pods, leases and the record store, driven one cycle at a time.

    Consumers follow the published record the way docs/ownership.md says: an owner that is no longer
    assigned a partition releases it (graceful); the new owner acquires a free partition, and breaks a
    lease only if the partition is forced or the handoff time is over.
    """

    partitions: list[str]
    present: list[str]
    owners: dict[str, str | None]
    replicas: int
    desired: int
    record: RebalanceState | None = None
    state: RebalanceState | None = None
    now: float = 0.0
    departed: set[str] = field(default_factory=set)
    published: list[PublishAssignment] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    stuck: set[str] = field(default_factory=set)  # present consumers that never release (hung)
    early_breaks: list[str] = field(default_factory=list)  # live owners broken before the deadline
    breakable: set[str] = field(default_factory=set)
    pool: str | None = "homes"  # None: names the operator cannot plan with (every change waits)
    joined: set[str] = field(default_factory=set)  # consumers up and joined that the operator has not seen
    rebalance_spec: RebalanceSpec = SPEC
    load: dict[str, float] | None = None  # each partition's events per second, as the loop measured it
    capacity: float | None = None  # events per second one consumer processes, as the loop measured it

    def observe(self) -> Observation:
        return Observation(
            tuple(self.partitions),
            tuple(self.present),
            dict(self.owners),
            self.desired,
            self.replicas,
            record=self.record,
            departed=frozenset(self.departed),
            pool=self.pool,
            load=self.load,
            capacity=self.capacity,
        )

    def cycle(self, seconds: float = 1.0, *, consumers_act: bool = True) -> Step:
        result = step(self.state, self.observe(), self.now, self.rebalance_spec)
        self.steps.append(result)
        for action in result.actions:
            if isinstance(action, PublishAssignment):
                self.published.append(action)
                self.breakable = set(action.forced)
            elif isinstance(action, SetReplicas):
                self.replicas = action.replicas
                self.present = [c for c in self.present if (ordinal(c) or 0) < action.replicas]
                self.joined = {c for c in self.joined if (ordinal(c) or 0) < action.replicas}
            elif isinstance(action, BreakLeases):
                self.breakable |= set(action.partitions)
        self.state = self.record = result.state
        if consumers_act:
            self.consumers_act()
        self.now += seconds
        return result

    def consumers_act(self) -> None:
        record = self.record
        if record is None:
            return
        deadline = record.handoff_deadline(SPEC) or 0.0
        up = set(self.present) | self.joined
        for partition, planned in record.planned.items():  # nobody reads it: its planned owner claims it
            unread = record.assignment.get(partition) is None and self.owners.get(partition) is None
            if unread and planned in up:
                self.owners[partition] = planned
        for partition, assignee in record.assignment.items():
            owner = self.owners.get(partition)
            if owner == assignee or (assignee is None and owner == record.planned.get(partition)):
                continue
            if owner is not None and owner in up:
                if owner not in self.stuck:
                    self.owners[partition] = None  # final checkpoint, release
                elif assignee in self.present and (partition in self.breakable or self.now >= deadline):
                    if self.now < deadline and partition not in self.breakable:
                        self.early_breaks.append(partition)
                    self.owners[partition] = assignee
                continue
            if assignee is None or assignee not in self.present:
                continue
            if owner is None or partition in self.breakable or self.now >= deadline:
                self.owners[partition] = assignee

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.cycle()

    def run_until_balanced(self, limit: float) -> float:
        """Cycles until every partition is held by one consumer, counts ±1; the time that took."""
        start = self.now
        while not self.balanced():
            assert self.now - start <= limit, f"not balanced after {limit}s"
            self.cycle()
        return self.now - start

    def owned_by(self, consumer: str) -> list[str]:
        return [p for p, owner in self.owners.items() if owner == consumer]

    def balanced(self) -> bool:
        return is_balanced(self.owners, [c for c in self.present if (ordinal(c) or 0) < self.desired])

    def events(self) -> list[str]:
        return [a.reason for s in self.steps for a in s.actions if isinstance(a, RecordEvent)]


def phase_of(world: World) -> Phase:
    assert world.state is not None
    return world.state.phase


def settled_world(partitions: int = 32, consumers: int = 8) -> World:
    """A pool that has run for a while: balanced, gen 1, Ready."""
    plan = plan_assignment(ids(partitions), pods(consumers), {})
    world = World(ids(partitions), pods(consumers), dict(plan.assignment), consumers, consumers)
    world.cycle()
    world.run(SPEC.max_handoff_seconds + 1)
    assert world.state is not None and world.state.phase is Phase.READY
    world.published.clear()
    world.steps.clear()
    return world


# --- holddown -----------------------------------------------------------------------------------------


def test_a_consumer_that_returns_within_the_delay_causes_no_handoff() -> None:
    world = settled_world()
    generation = world.record.generation if world.record else 0
    world.present.remove("homes-3")
    start = world.now
    world.run(3)
    assert phase_of(world) is Phase.HOLDDOWN
    assert world.state is not None and world.state.holddown_until == start + SPEC.delay_seconds
    world.present.insert(3, "homes-3")
    world.run(10)
    assert world.published == []
    assert phase_of(world) is Phase.READY
    assert world.state.generation == generation
    assert "HolddownCancelled" in world.events()


def test_a_consumer_that_does_not_return_is_replaced_after_the_delay_and_forced_at_once() -> None:
    world = settled_world()
    lost = world.owned_by("homes-3")
    world.present.remove("homes-3")
    world.run(SPEC.delay_seconds + 1)
    (publication,) = world.published
    assert {m.partition for m in publication.moves} == set(lost)
    assert publication.forced == frozenset(lost)
    assert [s.published is not None for s in world.steps] == [False] * 5 + [True]  # at the delay
    world.run(1)
    assert world.balanced()
    assert world.state is not None and world.state.phase is Phase.READY


def test_the_holddown_deadline_is_set_by_the_first_change_only() -> None:
    world = settled_world()
    world.present.remove("homes-3")
    world.cycle()
    first = world.state.holddown_until if world.state else None
    world.present.remove("homes-5")
    world.cycle()
    assert world.state is not None and world.state.holddown_until == first
    world.run(SPEC.delay_seconds)
    (publication,) = world.published
    assert len(publication.moves) == 8


def test_without_ordinal_names_a_scale_out_waits_for_the_holddown() -> None:
    world = settled_world(consumers=4)
    world.pool = None  # the operator cannot name the consumers a scale-out brings
    world.desired = 8
    result = world.cycle()
    assert SetReplicas(8, "scale out") in result.actions
    assert result.published is None
    for pod in pods(4, start=4):  # the new pods get ready one second apart
        world.present.append(pod)
        world.cycle()
    elapsed = 4 + world.run_until_balanced(SPEC.delay_seconds + 5)
    (publication,) = world.published
    assert len(publication.moves) == 16  # the minimum for 4 -> 8 over 32 partitions
    assert publication.forced == frozenset()
    assert publication.reason is PublishReason.HOLDDOWN_OVER
    assert elapsed <= SPEC.delay_seconds + 5  # measured from the first new consumer


# --- planned changes ------------------------------------------------------------------------------------


def moves_of(world: World) -> int:
    return sum(len(p.moves) for p in world.published)


def test_a_planned_scale_out_publishes_the_plan_at_once_and_hands_each_joiner_its_share_when_ready() -> None:
    world = settled_world(consumers=4)
    before = dict(world.owners)
    world.desired = 8
    decided = world.cycle()
    assert SetReplicas(8, "scale out") in decided.actions
    plan = decided.published
    assert plan is not None and plan.reason is PublishReason.PLANNED and plan.kind is ChangeKind.PLANNED
    assert plan.moves == () and plan.assignment == before  # the current assignees keep reading
    assert sorted(set(plan.planned.values())) == pods(4, start=4)
    assert len(plan.planned) == minimum_moves(ids(32), pods(8), before) == 16
    assert world.state is not None and world.state.running is ChangeKind.PLANNED
    assert "Planned" in world.events()
    for pod in pods(4, start=4):  # each ready pod takes its share in the cycle that sees it
        world.present.append(pod)
        handover = world.cycle()
        world.consumers_act()  # the old owner released: the joiner claims
        assert handover.published is not None and handover.published.reason is PublishReason.JOINED
        assert {m.assignee for m in handover.published.moves} == {pod}
        assert sorted(world.owned_by(pod)) == sorted(p for p, c in plan.planned.items() if c == pod)
        assert world.state is not None and pod not in world.state.planned.values()
    assert world.balanced()
    assert moves_of(world) == 16 and all(not p.forced for p in world.published)
    assert world.early_breaks == []
    assert "Holddown" not in world.events()
    world.run(2)
    assert world.state is not None and world.state.phase is Phase.READY and world.state.running is None


def test_one_to_eight_planned_moves_28_and_is_balanced_the_cycle_the_last_is_ready() -> None:
    world = settled_world(consumers=1)
    world.desired = 8
    world.cycle()
    world.run(10)  # the new pods start slowly: nothing moves, homes-0 keeps reading all 32
    assert world.owned_by("homes-0") == ids(32) and len(world.published) == 1
    world.present.extend(pods(7, start=1))
    world.cycle()
    world.consumers_act()  # homes-0 released: the new owners claim
    assert world.balanced()
    assert moves_of(world) == 28


def test_a_planned_cold_start_gives_each_consumer_its_share_when_it_is_ready() -> None:
    world = World(ids(32), [], {}, replicas=0, desired=8)
    first = world.cycle()
    assert first.published is not None and first.published.reason is PublishReason.PLANNED
    assert first.published.assignment == dict.fromkeys(ids(32))  # nobody reads yet
    assert first.published.planned == plan_assignment(ids(32), pods(8), {}).assignment
    for pod in pods(8):
        world.present.append(pod)
        world.cycle(0.5)
        assert len(world.owned_by(pod)) == 4
    assert world.balanced()
    assert moves_of(world) == 32
    assert "Holddown" not in world.events()


def test_a_cold_start_share_read_before_the_operator_sees_it_ready_is_not_a_pending_handoff() -> None:
    world = World(ids(32), [], {}, replicas=0, desired=8)
    world.cycle()
    world.joined = set(pods(8))  # up and joined; readiness reaches the operator later (a kubelet probe)
    world.consumers_act()
    assert all(len(world.owned_by(pod)) == 4 for pod in pods(8))
    assert world.state is not None and pending_handoffs(world.state, world.owners) == []  # status: none
    world.run(SPEC.max_handoff_seconds + 2)  # nothing is pending: no deadline, no broken lease
    assert "HandoffForced" not in world.events() and world.early_breaks == []
    assert world.state is not None and world.state.phase is not Phase.REBALANCING
    before = dict(world.owners)
    world.present.extend(pods(8))
    handover = world.cycle()
    assert handover.published is not None and handover.published.reason is PublishReason.JOINED
    assert world.owners == before and world.balanced()  # the hand-over only records who reads what
    world.run(2)
    assert world.state.phase is Phase.READY and world.state.running is None
    assert moves_of(world) == 32 and "Holddown" not in world.events()


def test_a_scale_in_before_a_joiner_was_ready_waits_for_what_it_read_of_its_share() -> None:
    world = World(ids(4), [], {}, replicas=0, desired=1)
    world.cycle()
    world.joined.add("homes-0")
    world.consumers_act()
    assert world.owned_by("homes-0") == ids(4)  # its cold-start share, read before it was seen ready
    world.desired = 0
    drain = world.cycle()  # the plan is dropped; homes-0 follows the record and releases
    assert drain.published is not None and drain.published.reason is PublishReason.DRAIN
    assert not any(isinstance(a, SetReplicas) for a in drain.actions), "not while it still holds leases"
    assert world.state is not None and world.state.phase is Phase.REBALANCING
    assert world.owned_by("homes-0") == []
    assert SetReplicas(0, "scale in after drain") in world.cycle().actions


def test_partitions_planned_for_a_late_consumer_go_to_those_present_after_the_delay() -> None:
    world = World(ids(32), [], {}, replicas=0, desired=8)
    world.cycle()
    world.present.extend(pods(7))  # homes-7 does not start
    world.cycle()
    assert world.state is not None and world.state.planned_until == world.now - 1 + SPEC.delay_seconds
    assert all(world.owners.get(p) is None for p in world.state.planned)
    world.run(SPEC.delay_seconds - 1)
    assert world.state.planned and all(world.owners.get(p) is None for p in world.state.planned)
    world.run(2)
    late = world.published[-1]
    assert late.reason is PublishReason.JOINERS_LATE and not late.planned
    assert is_balanced(world.owners, pods(7)) and "JoinersLate" in world.events()
    world.present.append("homes-7")  # arrives after all: an unplanned arrival, held down
    world.cycle()
    assert world.state is not None and world.state.phase is Phase.HOLDDOWN
    assert world.state.running is ChangeKind.HOLDDOWN
    world.run(SPEC.delay_seconds + 2)
    assert world.balanced()


def test_a_joiner_that_never_comes_leaves_its_planned_partitions_with_their_assignees() -> None:
    world = settled_world(consumers=4)
    world.desired = 8
    world.cycle()
    world.present.extend(pods(3, start=4))  # homes-7 never becomes ready
    world.run(30)
    assert world.state is not None
    assert sorted(world.state.planned) == sorted(
        plan_assignment(ids(32), pods(8), {}).partitions_of("homes-7")
    )
    assert all(world.owners[p] in pods(4) for p in world.state.planned)  # still read
    assert world.state.phase is Phase.READY and world.state.planned_until is None
    assert "Holddown" not in world.events()


def test_a_crash_during_a_planned_scale_out_falls_back_to_the_holddown() -> None:
    world = settled_world(consumers=4)
    crashed = world.owned_by("homes-1")
    world.desired = 8
    world.cycle()
    world.present.remove("homes-1")  # unplanned: may come back
    world.present.extend(pods(4, start=4))
    result = world.cycle()
    assert world.state is not None and world.state.holddown_until is not None
    assert world.state.running is ChangeKind.HOLDDOWN
    assert result.published is not None and result.published.reason is PublishReason.JOINED
    # The joiners took their planned share, the part homes-1 was reading by force (it is gone).
    assert all(world.owners[p] is None or world.owners[p] != "homes-1" for p in result.published.forced)
    assert any(world.owners[p] == "homes-1" for p in crashed)  # the rest waits for the holddown
    world.run(SPEC.delay_seconds + 2)
    assert world.published[-1].reason is PublishReason.HOLDDOWN_OVER
    assert is_balanced(world.owners, [c for c in pods(8) if c != "homes-1"])


def test_a_scale_in_before_the_joiners_are_ready_replans_without_them() -> None:
    world = settled_world(consumers=2)
    world.desired = 6
    world.cycle()
    world.desired = 3
    result = world.cycle()
    assert result.published is not None
    assert set(result.published.planned.values()) == {"homes-2"}
    world.present.append("homes-2")
    world.run(3)
    assert world.balanced() and world.replicas == 3


def test_planning_is_deterministic() -> None:
    world = settled_world(consumers=3)
    world.desired = 7
    observation = world.observe()
    first = step(world.state, observation, world.now, SPEC)
    again = step(world.state, observation, world.now, SPEC)
    assert first == again


def test_a_standby_joining_or_leaving_moves_nothing() -> None:
    world = settled_world(partitions=4, consumers=4)
    world.present.append("homes-4")
    world.run(10)
    world.present.remove("homes-4")
    world.run(10)
    assert world.published == []
    assert "Holddown" not in world.events()


# --- immediate publications ------------------------------------------------------------------------------


def test_partition_count_change_rebalances_at_once() -> None:
    world = settled_world()
    world.partitions = ids(40)
    result = world.cycle()
    assert result.published is not None
    assert len(result.published.moves) == 8
    assert is_balanced(result.published.assignment, pods(8))


def test_orphans_of_a_pod_gone_for_good_get_an_owner_at_once_and_forced() -> None:
    world = settled_world()
    lost = world.owned_by("homes-7")
    world.present.remove("homes-7")
    world.replicas = 7  # the StatefulSet was shrunk by hand: ordinal 7 is gone for good
    world.desired = 7
    result = world.cycle()
    assert result.published is not None
    assert {m.partition for m in result.published.moves} == set(lost)
    assert result.published.forced == frozenset(lost)
    world.run(1)
    assert world.balanced()


def test_a_standby_takes_over_an_orphan_at_once() -> None:
    world = settled_world(partitions=4, consumers=5)
    lost = world.owned_by("homes-1")
    world.present.remove("homes-1")
    world.departed.add("homes-1")
    result = world.cycle()
    assert result.published is not None
    assert [(m.partition, m.assignee) for m in result.published.moves] == [(lost[0], "homes-4")]


@pytest.mark.xfail(
    strict=True,
    reason="a planned scale-out that only brings standbys publishes nothing, so the plan never names them: "
    "once the StatefulSet has grown they are no longer arriving, and ready, they are unplanned newcomers",
)
def test_a_standby_brought_by_a_planned_scale_out_takes_over_an_orphan_at_once() -> None:
    world = settled_world(partitions=4, consumers=4)
    world.desired = 5  # homes-4 would be a standby: "0 partitions planned for homes-4 (no holddown)"
    world.cycle()
    world.run(3)
    world.present.append("homes-4")
    world.run(3)
    lost = world.owned_by("homes-1")
    world.present.remove("homes-1")
    world.departed.add("homes-1")
    world.cycle()
    assert [(m.partition, m.assignee) for m in world.published[-1].moves] == [(lost[0], "homes-4")]
    assert "Holddown" not in world.events()


def test_orphans_during_a_holddown_keep_the_holddown_for_the_rest() -> None:
    world = settled_world()
    world.present.remove("homes-2")  # may come back
    world.cycle()
    world.present.remove("homes-7")
    world.departed.add("homes-7")
    result = world.cycle()
    assert result.published is not None
    assert all(m.previous == "homes-7" for m in result.published.moves)
    assert world.state is not None and world.state.holddown_until is not None
    world.present.insert(2, "homes-2")
    world.run(10)
    assert len(world.published) == 1
    assert world.balanced()


# --- drain-aware scale-in --------------------------------------------------------------------------------


def test_scale_in_hands_off_before_the_statefulset_shrinks() -> None:
    world = settled_world()
    world.desired = 4
    first = world.cycle(consumers_act=False)
    assert first.published is not None
    assert len(first.published.moves) == 16
    assert first.published.forced == frozenset()
    assert not any(isinstance(a, SetReplicas) for a in first.actions)
    shrink_at = None
    for _ in range(10):
        result = world.cycle()
        if any(isinstance(a, SetReplicas) for a in result.actions):
            shrink_at = result
            break
        assert world.replicas == 8
    assert shrink_at is not None
    assert SetReplicas(4, "scale in after drain") in shrink_at.actions
    assert world.replicas == 4
    assert world.balanced()


def test_scale_in_is_forced_after_the_max_handoff_time() -> None:
    world = settled_world()
    world.stuck.add("homes-6")  # hung: never releases
    world.desired = 4
    world.cycle()
    world.run(SPEC.max_handoff_seconds - 1)
    assert world.replicas == 8
    world.run(2)
    assert world.replicas == 4
    breaks = [a for s in world.steps for a in s.actions if isinstance(a, BreakLeases)]
    assert breaks and set(breaks[0].partitions) <= set(
        plan_assignment(ids(32), pods(8), {}).partitions_of("homes-6")
    )
    assert "HandoffForced" in world.events()
    assert world.early_breaks == []


def test_scale_to_zero_releases_everything_first() -> None:
    world = settled_world(partitions=4, consumers=2)
    world.desired = 0
    result = world.cycle()
    assert result.published is not None
    assert set(result.published.assignment.values()) == {None}
    world.run(3)
    assert world.replicas == 0
    assert set(world.owners.values()) == {None}


# --- restarts and the record -----------------------------------------------------------------------------


def test_operator_restart_mid_rebalance_resumes_from_the_record() -> None:
    world = settled_world()
    world.stuck.add("homes-7")
    world.desired = 6
    publication = world.cycle().published
    assert publication is not None
    deadline = world.record.handoff_deadline(SPEC) if world.record else None
    world.state = None  # the operator restarts; the record in the store is all it has
    assert world.record is not None
    world.record = stored(world.record)
    world.run(SPEC.max_handoff_seconds + 2)
    assert len(world.published) == 1  # nothing re-published
    assert world.record.handoff_deadline(SPEC) == deadline
    assert world.replicas == 6
    assert world.early_breaks == []


def test_a_lost_write_is_recomputed_with_the_same_generation() -> None:
    world = settled_world()
    before = world.record
    world.present.remove("homes-7")
    world.departed.add("homes-7")
    lost = step(world.state, world.observe(), world.now, SPEC)  # decided, never written
    assert lost.published is not None
    world.state = None
    world.record = before
    again = world.cycle()
    assert again.published is not None
    assert again.published.generation == lost.published.generation
    assert again.published.assignment == lost.published.assignment


def test_the_record_wins_over_a_stale_state() -> None:
    world = settled_world()
    assert world.record is not None
    world.record = replace(stored(world.record), generation=9)
    world.cycle()
    assert world.state is not None and world.state.generation == 9


def test_state_round_trips_through_the_assignment_record() -> None:
    world = settled_world()
    world.present.remove("homes-2")
    world.cycle()
    state = world.state
    assert state is not None and state.holddown_until is not None
    assert RebalanceState.from_record(state.to_record(SPEC)) == state
    assert stored(state) == state


def test_ordinal_reads_the_statefulset_suffix() -> None:
    assert ordinal("homes-12") == 12
    assert ordinal("homes") is None
    assert ordinal("worker-a") is None


# --- random event sequences -------------------------------------------------------------------------------


EVENTS = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 2.0, 4.0, 7.0])),
    st.tuples(st.just("crash"), st.integers(0, 9)),
    st.tuples(st.just("return"), st.integers(0, 9)),
    st.tuples(st.just("join"), st.integers(0, 9)),  # up and joined, not seen ready yet
    st.tuples(st.just("desired"), st.integers(0, 10)),
    st.tuples(st.just("partitions"), st.integers(1, 24)),
    st.tuples(st.just("hang"), st.integers(0, 9)),
    st.tuples(st.just("restart"), st.booleans()),
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 16), st.integers(0, 8), st.lists(EVENTS, min_size=1, max_size=40))
def test_invariants_hold_over_random_event_sequences(
    partitions: int, consumers: int, events: list[tuple[str, object]]
) -> None:
    world = World(ids(partitions), pods(consumers), {}, replicas=consumers, desired=consumers)
    seen: dict[int, dict[str, str | None]] = {}
    last_generation = 0
    for kind, value in events:
        if kind == "tick":
            assert isinstance(value, float)
            world.now += value
        elif kind == "crash":
            world.present = [c for c in world.present if c != f"homes-{value}"]
            world.joined.discard(f"homes-{value}")
        elif kind == "join":
            if isinstance(value, int) and value < world.replicas:
                world.joined.add(f"homes-{value}")
        elif kind == "return":
            pod = f"homes-{value}"
            if isinstance(value, int) and value < world.replicas and pod not in world.present:
                world.present = sorted([*world.present, pod], key=lambda c: ordinal(c) or 0)
        elif kind == "desired":
            assert isinstance(value, int)
            world.desired = value
        elif kind == "partitions":
            assert isinstance(value, int)
            world.partitions = ids(max(value, len(world.partitions)))  # Event Hubs only adds partitions
        elif kind == "hang":
            world.stuck.add(f"homes-{value}")
        elif kind == "restart":
            if value:  # the operator decides, then dies before writing anything
                step(world.state, world.observe(), world.now, SPEC)
            world.state = None
        before = world.record or world.state
        owners = dict(world.owners)
        live = set(world.present)
        replicas = world.replicas
        observation = world.observe()
        assert step(world.state, observation, world.now, SPEC) == step(
            world.state, observation, world.now, SPEC
        ), "deterministic"
        result = world.cycle(0.0)
        publication = result.published
        after = result.state
        for partition, joiner in after.planned.items():
            assert joiner not in live, "a planned consumer takes its share in the cycle it is ready"
            assignee = after.assignment[partition]
            assert assignee != joiner and (assignee is None or assignee in after.consumers), "one assignee"
            previous = before.assignment.get(partition) if before is not None else None
            if previous in live and previous in after.consumers:
                assert assignee == previous, "the current assignee keeps reading until then"
        if publication is not None:
            assert publication.generation > last_generation
            assert seen.get(publication.generation, publication.assignment) == publication.assignment
            seen[publication.generation] = dict(publication.assignment)
            last_generation = publication.generation
            assert is_balanced(after.plan, after.consumers), "the plan is balanced over its consumers"
            if before is not None and before.generation and set(before.assignment) == set(world.partitions):
                expected = minimum_moves(world.partitions, after.consumers, before.assignment)
                assert len(plan_moves(before.assignment, after.plan)) == expected, "minimum moves"
            for partition in publication.forced:
                owner = owners.get(partition) or (before.assignment.get(partition) if before else None)
                assert owner not in live, "a ready owner must be given the handoff time"
        for action in result.actions:
            if isinstance(action, SetReplicas) and action.replicas < replicas:
                # The StatefulSet shrinks only once the consumers about to go hold nothing, or their
                # handoff time is over.
                still_held = [
                    o for o in owners.values() if o is not None and (ordinal(o) or 0) >= action.replicas
                ]
                assert not still_held or world.now >= (after.handoff_deadline(SPEC) or 0.0)
        if after.phase is Phase.HOLDDOWN:
            assert after.holddown_until is not None
        assert stored(after) == after
        assert set(after.assignment) == set(world.partitions)
    assert world.early_breaks == [], "no live owner lost a partition before its handoff time"


def test_state_survives_the_stored_json_record() -> None:
    world = settled_world(partitions=6, consumers=2)
    world.now = 1_763_700_000.25
    world.present.remove("homes-1")
    world.departed.add("homes-1")
    world.cycle()
    state = world.state
    assert state is not None and state.forced
    stored = decode_assignment(encode_assignment(state.to_record(SPEC)))
    assert stored.max_handoff_seconds == SPEC.max_handoff_seconds
    assert RebalanceState.from_record(stored) == state


# --- load-aware ---------------------------------------------------------------------------------------------

LOAD_AWARE = RebalanceSpec(
    delay_seconds=5.0,
    max_handoff_seconds=3.0,
    strategy="loadAware",
    load_aware=LoadAwareSpec(tolerance=0.2, max_moves=2),
)


def skewed(hot: Collection[str], partitions: int = 16, rate: float = 200.0) -> dict[str, float]:
    """Ten events a second on every partition, `rate` on the hot ones."""
    return {p: rate if p in hot else 10.0 for p in ids(partitions)}


def load_aware_world(partitions: int = 16, consumers: int = 4) -> World:
    """A settled pool under the load-aware strategy, its load even so far."""
    world = settled_world(partitions, consumers)
    world.rebalance_spec = LOAD_AWARE
    world.load = {p: 10.0 for p in ids(partitions)}
    world.run(2)
    assert world.published == []
    return world


def test_a_hot_consumer_sheds_partitions_gracefully_and_within_the_cap() -> None:
    world = load_aware_world()
    world.load = skewed(hot={"0", "1", "2"})  # all three on homes-0 (partitions 0-3)
    world.cycle()
    (publication,) = world.published
    assert publication.reason is PublishReason.LOAD and publication.kind is ChangeKind.PLANNED
    assert len(publication.moves) == 2 and publication.forced == frozenset()
    assert {m.previous for m in publication.moves} == {"homes-0"}
    assert any("load: homes-0 carries" in message for message in messages(world))
    world.run(3)  # handed over; the next publication waits for the handoffs, then the cap again
    assert {world.owners[p] for p in ("0", "1", "2")} == {"homes-0", "homes-1", "homes-2"}
    assert world.early_breaks == []


def test_load_within_the_tolerance_moves_nothing() -> None:
    world = load_aware_world()
    world.load = {p: 10.0 + (1.0 if int(p) < 4 else 0.0) for p in ids(16)}  # homes-0 carries 10 % more
    world.run(5)
    assert world.published == []


def test_without_load_figures_nothing_moves_for_load() -> None:
    world = load_aware_world()
    world.load = None
    world.run(3)
    assert world.published == []


def test_a_change_of_load_alone_starts_no_holddown() -> None:
    world = load_aware_world()
    world.present.remove("homes-3")  # a holddown starts for the consumer ...
    world.cycle()
    assert phase_of(world) is Phase.HOLDDOWN
    world.present.append("homes-3")
    world.load = skewed(hot={"0", "1", "2"})  # ... and the load changes while it runs
    world.cycle()
    assert "HolddownCancelled" in world.events()
    world.run(2)
    assert [p.reason for p in world.published] == [PublishReason.LOAD]
    assert "Holddown" not in world.events()[world.events().index("HolddownCancelled") :]


def test_no_load_move_while_a_handoff_is_pending() -> None:
    world = load_aware_world()
    world.stuck.add("homes-0")  # it will not release
    world.load = skewed(hot={"0", "1", "2"})
    world.run(2)
    assert len(world.published) == 1
    world.load = skewed(hot={"4", "5", "6"})  # homes-1 is the hot one now
    world.run(2)
    assert len(world.published) == 1  # Rebalancing until the handoff deadline: no second publication


def messages(world: World) -> list[str]:
    return [a.message for s in world.steps for a in s.actions if isinstance(a, RecordEvent)]


LOAD_EVENTS = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 2.0, 4.0, 7.0])),
    st.tuples(st.just("crash"), st.integers(0, 5)),
    st.tuples(st.just("return"), st.integers(0, 5)),
    st.tuples(st.just("desired"), st.integers(1, 6)),
    st.tuples(st.just("hot"), st.lists(st.integers(0, 15), max_size=4)),
    st.tuples(st.just("hang"), st.integers(0, 5)),
)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 16), st.integers(1, 6), st.lists(LOAD_EVENTS, min_size=1, max_size=40))
def test_load_aware_invariants_hold_over_random_event_sequences(
    partitions: int, consumers: int, events: list[tuple[str, object]]
) -> None:
    """Load-aware: every partition has one assignee; a move for load only while nothing else is under way,
    at most `maxMoves`, never forced; no live owner loses a partition before its handoff time; the same
    inputs give the same step."""
    world = World(ids(partitions), pods(consumers), {}, replicas=consumers, desired=consumers)
    world.rebalance_spec = LOAD_AWARE
    world.load = {p: 10.0 for p in ids(partitions)}
    for kind, value in events:
        if kind == "tick":
            assert isinstance(value, float)
            world.now += value
        elif kind == "crash":
            world.present = [c for c in world.present if c != f"homes-{value}"]
        elif kind == "return":
            pod = f"homes-{value}"
            if isinstance(value, int) and value < world.replicas and pod not in world.present:
                world.present = sorted([*world.present, pod], key=lambda c: ordinal(c) or 0)
        elif kind == "desired":
            assert isinstance(value, int)
            world.desired = value
        elif kind == "hot":
            assert isinstance(value, list)
            world.load = skewed({str(p) for p in value}, partitions)
        elif kind == "hang":
            world.stuck.add(f"homes-{value}")
        before = world.state
        live = set(world.present)
        observation = world.observe()
        assert step(world.state, observation, world.now, LOAD_AWARE) == step(
            world.state, observation, world.now, LOAD_AWARE
        ), "deterministic"
        result = world.cycle(0.0)
        after = result.state
        assert set(after.assignment) == set(world.partitions)
        assert all(c is None or c in after.consumers for c in after.assignment.values()), "one assignee"
        publication = result.published
        if publication is not None and publication.reason is PublishReason.LOAD:
            assert before is not None and before.phase is Phase.READY and not before.planned
            assert before.holddown_until is None
            assert len(publication.moves) <= LOAD_AWARE.load_aware.max_moves
            assert publication.forced == frozenset()
            assert all(m.previous in live for m in publication.moves), "graceful: the owner hands over"
        assert stored(after) == after
    assert world.early_breaks == [], "no live owner lost a partition before its handoff time"


def test_no_load_move_while_every_consumer_has_room() -> None:
    world = load_aware_world()
    world.load = skewed(hot={"0", "1", "2"}, rate=20.0)  # homes-0: 61 events/s, a consumer processes 200
    world.capacity = 200.0
    world.run(3)
    assert world.published == []
    world.capacity = 100.0  # now it is over half of one consumer
    world.run(1)
    assert [p.reason for p in world.published] == [PublishReason.LOAD]
