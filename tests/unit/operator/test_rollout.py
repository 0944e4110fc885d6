"""Rollouts and evictions as pure decisions (hubshift/operator/rollout.py) over the rebalance machine: a
StatefulSet, its pods and their consumers simulated one cycle (one second) at a time, the operator's memory
dropped at will (what a restart keeps: the assignment record and the status)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hubshift.operator import rebalance, rollout
from hubshift.operator.rebalance import (
    BreakLeases,
    Observation,
    PublishAssignment,
    PublishReason,
    RebalanceState,
    SetReplicas,
)
from hubshift.operator.rollout import RolloutDecision, RolloutObservation, RolloutState
from hubshift.operator.runtime import ConsumerInstance
from hubshift.operator.status import RolloutStatus
from hubshift.ownership.model import Phase
from hubshift.ownership.records import decode_assignment, encode_assignment
from hubshift.spec import ROLLOUT_PAUSED_ANNOTATION, RebalanceSpec, RolloutSpec
from tests.harness.ownership import is_balanced

CONFIG = RebalanceSpec(delay_seconds=5.0, max_handoff_seconds=3.0)
POOL = "homes"
FOLLOW_SECONDS = 3  # a SIGTERMed consumer follows the record this long (STOP_FOLLOW_SECONDS, in cycles)


@dataclass
class Pod:
    ordinal: int
    revision: str
    created: float
    start_seconds: float
    terminating_since: float | None = None

    def ready(self, now: float) -> bool:
        return self.terminating_since is None and now >= self.created + self.start_seconds


@dataclass
class Fleet:
    """A StatefulSet of consumer pods, the consumers following the published record (a released partition is
    taken by its assignee in the same second, a lease is broken only when the record allows it), and the
    operator's cycle: `rollout.decide`, then `rebalance.step`, as the control loop runs them."""

    partitions: list[str]
    desired: int
    max_replicas: int
    spec: RolloutSpec = field(default_factory=RolloutSpec)
    start_seconds: float = 3.0
    never_ready: set[str] = field(default_factory=set)  # revisions whose pods never get ready
    now: float = 0.0
    revision: str = "r1"
    replicas: int = 0
    pods: dict[str, Pod] = field(default_factory=dict)
    owners: dict[str, str | None] = field(default_factory=dict)
    record: RebalanceState | None = None  # as stored (JSON round trip)
    state: RebalanceState | None = None  # the operator's memory
    status: dict[str, object] | None = None  # the status' rollout block, as the API server stores it
    memory: RolloutState | None = None
    paused: bool = False
    published: list[PublishAssignment] = field(default_factory=list)
    decisions: list[RolloutDecision] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # leases of a live owner broken: a second reader
    unread: int = 0  # partition-seconds without an owner
    least_ready: int | None = None  # the fewest ready pods seen while rolling out
    deleted: list[str] = field(default_factory=list)
    held_down: list[float] = field(default_factory=list)  # cycles ending with a holddown timer running

    @classmethod
    def settled(cls, partitions: int = 8, consumers: int = 4, **kwargs: object) -> Fleet:
        fleet = cls([str(p) for p in range(partitions)], consumers, **kwargs)  # type: ignore[arg-type]
        fleet.replicas = consumers
        fleet.run(fleet.start_seconds + 10)
        assert fleet.balanced(), fleet.owners
        fleet.published.clear()
        fleet.held_down.clear()
        return fleet

    # -- the operator ----------------------------------------------------------------------------------

    def instances(self) -> list[ConsumerInstance]:
        return [
            ConsumerInstance(
                name,
                pod.ordinal,
                pod.ready(self.now) and pod.revision not in self.never_ready,
                None,
                terminating=pod.terminating_since is not None,
                revision=pod.revision,
            )
            for name, pod in sorted(self.pods.items(), key=lambda item: item[1].ordinal)
        ]

    def restart_operator(self) -> None:
        """What a new operator has: the record and the status, nothing else."""
        self.state = None
        self.memory = None

    def operate(self) -> None:
        instances = self.instances()
        start = rebalance.starting_point(self.state, self.record)
        previous = self.memory or RolloutState.from_status(self.status)
        decision = rollout.decide(
            RolloutObservation(
                pool=POOL,
                pods=tuple(instances),
                revision=self.revision,
                desired_replicas=self.desired,
                current_replicas=self.replicas,
                max_replicas=self.max_replicas,
                state=start,
                owners=dict(self.owners),
                paused=self.paused,
                previous=previous,
            ),
            self.now,
            self.spec,
        )
        self.decisions.append(decision)
        present = tuple(i.name for i in instances if i.ready and not i.terminating)
        step = rebalance.step(
            self.state,
            Observation(
                tuple(self.partitions),
                present,
                dict(self.owners),
                decision.desired_replicas,
                self.replicas,
                record=self.record,
                pool=POOL,
                stopping=decision.stopping,
                retiring=decision.retiring,
            ),
            self.now,
            CONFIG,
        )
        stored = step.state.to_record(CONFIG)
        self.record = RebalanceState.from_record(decode_assignment(encode_assignment(stored)))
        self.state = step.state
        if step.state.holddown_until is not None:
            self.held_down.append(self.now)
        self.memory = decision.state
        body = RolloutStatus.of(self.spec.strategy, decision).model_dump(by_alias=True, mode="json")
        self.status = body
        for action in step.actions:
            if isinstance(action, PublishAssignment):
                self.published.append(action)
            elif isinstance(action, SetReplicas):
                self.replicas = action.replicas
            elif isinstance(action, BreakLeases):
                pass  # the consumers read the deadline from the record
        for name in decision.delete:
            assert not self.holds(name), f"{name} deleted while it held {self.owned_by(name)}"
            self.evict(name)
            self.deleted.append(name)

    # -- the cluster -----------------------------------------------------------------------------------

    def evict(self, name: str) -> None:
        pod = self.pods.get(name)
        if pod is not None and pod.terminating_since is None:
            pod.terminating_since = self.now

    def statefulset(self) -> None:
        for name, pod in list(self.pods.items()):
            if pod.ordinal >= self.replicas:
                self.evict(name)  # Parallel: every pod beyond the count at once
        for ordinal in range(self.replicas):
            name = f"{POOL}-{ordinal}"
            if name not in self.pods:
                self.pods[name] = Pod(ordinal, self.revision, self.now, self.start_seconds)
        if self.spec.strategy == "RollingUpdate":
            pods = [self.pods[f"{POOL}-{i}"] for i in range(self.replicas) if f"{POOL}-{i}" in self.pods]
            if all(p.ready(self.now) for p in pods) and len(pods) == self.replicas:
                outdated = [p for p in pods if p.revision != self.revision]
                if outdated:
                    self.evict(f"{POOL}-{max(p.ordinal for p in outdated)}")

    def consumers(self) -> None:
        record = self.record
        up = {i.name for i in self.instances() if i.ready}
        following = {
            name
            for name, pod in self.pods.items()
            if pod.terminating_since is not None and self.now - pod.terminating_since < FOLLOW_SECONDS
        }
        for name, pod in list(self.pods.items()):  # a stopping consumer past its follow time drains all
            if pod.terminating_since is not None and name not in following:
                for partition in self.owned_by(name):
                    self.owners[partition] = None
        if record is not None:
            deadline = (record.published_at or 0.0) + CONFIG.max_handoff_seconds
            for partition, assignee in record.assignment.items():
                owner = self.owners.get(partition)
                if owner is not None and owner != assignee and owner in up | following:
                    self.owners[partition] = None  # drained, checkpointed, released
                    owner = None
                if assignee is None or assignee not in up or owner == assignee:
                    continue
                if owner is None:
                    self.owners[partition] = assignee
                elif partition in record.forced or self.now >= deadline:
                    if owner in up | following:
                        self.broken.append(partition)
                    self.owners[partition] = assignee
            for partition, planned in record.planned.items():  # a cold start: the planned owner claims
                free = record.assignment.get(partition) is None and self.owners.get(partition) is None
                if free and planned in up:
                    self.owners[partition] = planned
        for name, pod in list(self.pods.items()):
            if pod.terminating_since is not None and not self.owned_by(name):
                del self.pods[name]  # exited
        self.unread += sum(1 for owner in self.owners.values() if owner is None)

    def cycle(self) -> None:
        self.statefulset()
        self.operate()
        self.consumers()
        self.statefulset()
        if self.rolling():
            ready = sum(1 for i in self.instances() if i.ready)
            self.least_ready = ready if self.least_ready is None else min(self.least_ready, ready)
        self.now += 1

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.cycle()

    def roll(self, revision: str = "r2", limit: float = 300) -> float:
        """A change that needs new pods; cycles until every pod is at `revision`, the pool back to its size
        and balanced. The time that took."""
        self.revision = revision
        started = self.now
        self.cycle()
        while not self.done():
            assert self.now - started < limit, self.describe()
            self.cycle()
        return self.now - started

    # -- what it looks like ----------------------------------------------------------------------------

    def rolling(self) -> bool:
        return (
            any(pod.revision != self.revision for pod in self.pods.values()) or self.replicas != self.desired
        )

    def done(self) -> bool:
        return not self.rolling() and self.balanced() and all(p.ready(self.now) for p in self.pods.values())

    def owned_by(self, consumer: str) -> list[str]:
        return [p for p, owner in self.owners.items() if owner == consumer]

    def holds(self, consumer: str) -> bool:
        record = self.record
        assigned = record is not None and (
            consumer in record.assignment.values() or consumer in record.planned.values()
        )
        return assigned or bool(self.owned_by(consumer))

    def balanced(self) -> bool:
        pool = [f"{POOL}-{i}" for i in range(self.desired)]
        record = self.record
        return (
            is_balanced(self.owners, pool)
            and record is not None
            and record.phase is Phase.READY
            and dict(record.assignment) == self.owners
        )

    def moves(self) -> int:
        return sum(len(p.moves) for p in self.published)

    def reasons(self) -> list[PublishReason]:
        return [p.reason for p in self.published]

    def events(self) -> list[str]:
        return [e.reason for d in self.decisions for e in d.events]

    def describe(self) -> str:
        return (
            f"t={self.now} replicas={self.replicas} pods="
            f"{ {n: (p.revision, p.ready(self.now), p.terminating_since) for n, p in self.pods.items()} } "
            f"owners={self.owners} record={self.record} last={self.decisions[-1] if self.decisions else None}"
        )


# --- the operator's rollout --------------------------------------------------------------------------------


def test_a_rollout_with_a_surge_pod_moves_each_share_once_and_keeps_every_pod_reading() -> None:
    fleet = Fleet.settled(partitions=8, consumers=4, max_replicas=8)
    took = fleet.roll()
    # Each old pod's share went to the surge pod or the pod replaced before it: 4 shares + the surge's.
    assert fleet.moves() == 5 * 2, fleet.reasons()
    assert fleet.broken == []  # every move a graceful handoff: no second reader, nothing replayed
    assert fleet.least_ready is not None and fleet.least_ready >= 4  # as many pods read as before
    assert fleet.deleted == [f"{POOL}-{i}" for i in range(4)]  # one at a time, lowest ordinal first
    assert fleet.replicas == 4 and sorted(fleet.pods) == [f"{POOL}-{i}" for i in range(4)]
    assert PublishReason.ROLLOUT in fleet.reasons() and PublishReason.HOLDDOWN_OVER not in fleet.reasons()
    assert fleet.held_down == []
    assert fleet.events() == ["RolloutStarted", "RolloutDone"]
    assert fleet.unread == 0  # released and taken within the same second: never unread
    assert took < 5 * (fleet.start_seconds + 4)
    done = fleet.status
    assert done is not None and done["phase"] == "Done" and done["revision"] == "r2"


def test_without_room_for_a_surge_pod_one_pod_fewer_reads_and_still_nothing_is_forced() -> None:
    fleet = Fleet.settled(partitions=8, consumers=4, max_replicas=4)
    fleet.roll()
    assert fleet.broken == []
    assert fleet.least_ready is not None and fleet.least_ready >= 3
    assert fleet.replicas == 4
    # The first pod's share is spread over the others, each pod replaced takes (about) the next one's, the
    # last takes a share back: never more than every share out and back, as the StatefulSet's own update.
    assert fleet.moves() <= 2 * 8


def test_max_surge_zero_replaces_in_place() -> None:
    fleet = Fleet.settled(partitions=8, consumers=4, max_replicas=8, spec=RolloutSpec(max_surge=0))
    fleet.roll()
    assert fleet.broken == []
    assert max(d.desired_replicas for d in fleet.decisions) == 4


def test_a_pod_is_deleted_only_once_it_holds_nothing() -> None:
    # Fleet.operate asserts it for every deletion; here the old pod also read right up to the handoff.
    fleet = Fleet.settled(partitions=12, consumers=3, max_replicas=6, start_seconds=6)
    fleet.revision = "r2"
    share = set(fleet.owned_by(f"{POOL}-0"))
    while f"{POOL}-0" not in fleet.deleted:
        fleet.cycle()
        if fleet.pods.get(f"{POOL}-3") is not None and not fleet.pods[f"{POOL}-3"].ready(fleet.now):
            assert set(fleet.owned_by(f"{POOL}-0")) == share  # kept until the surge pod is ready
    assert set(fleet.owned_by(f"{POOL}-3")) == share  # the surge pod took exactly that share


def test_a_broken_new_revision_never_takes_an_old_pod_down() -> None:
    fleet = Fleet.settled(partitions=8, consumers=4, max_replicas=8, never_ready={"r2"})
    fleet.revision = "r2"
    fleet.run(60)
    assert fleet.deleted == []
    assert all(fleet.owned_by(f"{POOL}-{i}") for i in range(4))  # every old pod still reads its share
    assert fleet.unread == 0
    last = fleet.decisions[-1]
    assert last.phase == "RollingOut" and last.current == f"{POOL}-0"


def test_a_paused_rollout_replaces_no_pod_until_resumed() -> None:
    fleet = Fleet.settled(partitions=8, consumers=4, max_replicas=8)
    fleet.revision = "r2"
    fleet.run(2 * (fleet.start_seconds + 3))
    assert len(fleet.deleted) >= 1
    fleet.paused = True
    deleted = list(fleet.deleted)
    fleet.run(40)
    assert fleet.deleted == deleted
    assert fleet.decisions[-1].phase == "Paused"
    assert "RolloutPaused" in fleet.events()
    fleet.paused = False
    fleet.roll()
    assert fleet.broken == []
    assert fleet.events()[-2:] == ["RolloutResumed", "RolloutDone"]
    assert fleet.held_down == []


def test_a_rollout_paused_before_its_first_retirement_asks_the_surge_pod_with_it() -> None:
    # A pod per partition: a surge pod asked before anyone is retired would be a standby the plan never
    # names, and once ready, a newcomer whose arrival starts a holddown at the first retirement.
    fleet = Fleet.settled(partitions=2, consumers=2, max_replicas=3, start_seconds=6)
    fleet.revision = "r2"
    fleet.paused = True
    fleet.run(10)
    assert fleet.replicas == 2 and sorted(fleet.pods) == [f"{POOL}-0", f"{POOL}-1"]
    assert {d.desired_replicas for d in fleet.decisions} == {2}
    assert fleet.decisions[-1].phase == "Paused" and fleet.published == []
    fleet.paused = False
    fleet.cycle()
    assert fleet.replicas == 3 and fleet.decisions[-1].retiring == {f"{POOL}-0"}
    first = fleet.published[-1]
    assert first.reason is PublishReason.ROLLOUT
    assert set(first.planned.values()) == {f"{POOL}-2"}  # the retiree's share waits for the surge pod
    fleet.roll()
    assert fleet.held_down == [] and PublishReason.HOLDDOWN_OVER not in fleet.reasons()
    assert fleet.broken == [] and fleet.unread == 0
    assert fleet.least_ready is not None and fleet.least_ready >= 2


def test_the_pause_annotation() -> None:
    assert rollout.parse_paused({ROLLOUT_PAUSED_ANNOTATION: "True"})
    assert not rollout.parse_paused({ROLLOUT_PAUSED_ANNOTATION: "no"})
    assert not rollout.parse_paused({})


@pytest.mark.parametrize("kill_at", [1, 4, 7, 11, 15, 22])
def test_an_operator_restarted_midway_carries_on_with_no_extra_move(kill_at: int) -> None:
    steady = Fleet.settled(partitions=8, consumers=4, max_replicas=8)
    steady.roll()
    fleet = Fleet.settled(partitions=8, consumers=4, max_replicas=8)
    fleet.revision = "r2"
    fleet.run(kill_at)
    fleet.restart_operator()
    fleet.roll()
    assert fleet.broken == []
    assert fleet.moves() == steady.moves()
    assert fleet.events().count("RolloutStarted") == 1


# --- evictions and the StatefulSet's own rolling update ---------------------------------------------------


def test_an_evicted_pod_hands_off_at_once_and_its_replacement_gets_a_planned_share() -> None:
    fleet = Fleet.settled(partitions=8, consumers=4, max_replicas=8)
    fleet.evict(f"{POOL}-2")  # kubectl drain: SIGTERM, the pod follows the record for a few seconds
    fleet.run(1)
    assert fleet.reasons() == [PublishReason.STOPPING]
    assert fleet.owned_by(f"{POOL}-2") == []
    fleet.run(fleet.start_seconds + 6)
    assert fleet.balanced()
    assert PublishReason.HOLDDOWN_OVER not in fleet.reasons()
    assert PublishReason.RETURNING in fleet.reasons()
    assert fleet.broken == [] and fleet.unread == 0


def test_a_rolling_update_of_the_statefulset_hands_off_on_each_sigterm_without_a_holddown() -> None:
    fleet = Fleet.settled(
        partitions=8, consumers=4, max_replicas=8, spec=RolloutSpec(strategy="RollingUpdate")
    )
    fleet.roll()
    assert fleet.broken == [] and fleet.unread == 0
    assert PublishReason.HOLDDOWN_OVER not in fleet.reasons()
    assert fleet.least_ready is not None and fleet.least_ready >= 3
    assert fleet.moves() <= 2 * 8  # each share out to the others and back, at most
    assert fleet.deleted == []  # the StatefulSet deleted them, not the operator


def test_a_whole_pool_going_away_is_not_stopping() -> None:
    pods = tuple(ConsumerInstance(f"{POOL}-{i}", i, False, None, terminating=True) for i in range(2))
    observation = RolloutObservation(POOL, pods, "r1", 2, 2, 4, RebalanceState(), {})
    assert rollout.decide(observation, 0.0, RolloutSpec()).stopping == frozenset()


def test_rollout_state_round_trips_through_the_status() -> None:
    state = RolloutState("homes-5d8", 1_800_000_000.5, surge=True, paused=True)
    decision = RolloutDecision(5, state=state, phase="Paused", updated=2, current="homes-2")
    body = RolloutStatus.of("Operator", decision).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert RolloutState.from_status(body) == state
    assert body["updatedReplicas"] == 2 and body["current"] == "homes-2"
    finished = replace(state, finished_at=1_800_000_100.0, paused=False, surge=False)
    done = RolloutStatus.of("Operator", replace(decision, state=finished))
    assert RolloutState.from_status(done.model_dump(by_alias=True, mode="json")) == finished
    assert RolloutState.from_status({"revision": "x"}) is None
    assert RolloutState.from_status(None) is None


# --- properties ---------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    consumers=st.integers(2, 5),
    extra_partitions=st.integers(0, 8),
    surge=st.booleans(),
    start_seconds=st.integers(1, 6),
    kills=st.lists(st.integers(0, 60), max_size=3),
    pause=st.one_of(st.none(), st.tuples(st.integers(0, 30), st.integers(1, 20))),
)
# Paused in its first second, with a pod per partition: the surge pod was asked before anyone was retired,
# a standby the plan never named, and the first retirement then started a holddown.
@example(consumers=2, extra_partitions=0, surge=True, start_seconds=6, kills=[], pause=(0, 1))
@example(consumers=3, extra_partitions=0, surge=True, start_seconds=2, kills=[], pause=(0, 5))
def test_any_rollout_finishes_with_one_reader_per_partition_and_the_pods_the_plan_needs(
    consumers: int,
    extra_partitions: int,
    surge: bool,
    start_seconds: int,
    kills: list[int],
    pause: tuple[int, int] | None,
) -> None:
    fleet = Fleet.settled(
        partitions=consumers + extra_partitions,
        consumers=consumers,
        max_replicas=consumers + (1 if surge else 0),
        start_seconds=start_seconds,
    )
    fleet.revision = "r2"
    started = fleet.now
    while not fleet.done():
        elapsed = int(fleet.now - started)
        assert elapsed < 40 * (consumers + 1) * (start_seconds + 2), fleet.describe()
        if elapsed in kills:
            fleet.restart_operator()  # its memory gone: the record and the status remain
        if pause is not None:
            fleet.paused = pause[0] <= elapsed < pause[0] + pause[1]
        fleet.cycle()
    assert fleet.broken == []  # never two readers: every lease released before it was taken
    assert fleet.unread == 0  # and every partition read at every second
    floor = consumers if surge else consumers - 1
    assert fleet.least_ready is not None and fleet.least_ready >= floor
    assert all(pod.revision == "r2" for pod in fleet.pods.values())
    assert fleet.replicas == consumers
    # The rollout's own changes are planned: no holddown timer ever starts, let alone runs out.
    assert fleet.held_down == [], fleet.reasons()
    assert PublishReason.HOLDDOWN_OVER not in fleet.reasons()
