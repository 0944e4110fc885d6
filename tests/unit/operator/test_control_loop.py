"""The control loop: its pure helpers, and whole cycles over a SQLite store with a fake hub and runtime."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift.eventhubs.management import ProbeError
from hubshift.eventhubs.model import PartitionInfo
from hubshift.manifest import PartitionedConsumer, parse_manifest
from hubshift.operator import autoscaler
from hubshift.operator.cadence import BUSY_CYCLE_SECONDS, next_cycle_in
from hubshift.operator.consumer_http import ConsumerFigures
from hubshift.operator.loop import ControlLoop, CycleInputs, CycleReport
from hubshift.operator.observe import backlog_per_partition, lease_owners, present_consumers
from hubshift.operator.partition_lag import PartitionLag
from hubshift.operator.publication import owners_to_expel, record_changed
from hubshift.operator.rebalance import PublishAssignment, PublishReason, RebalanceState
from hubshift.operator.runtime import ConsumerInstance
from hubshift.operator.scaling_record import AUTOSCALER_RECORD
from hubshift.operator.status import build_status
from hubshift.ownership.assignment import publish_assignment, read_assignment
from hubshift.ownership.leases import claim_partition
from hubshift.ownership.membership import join_pool
from hubshift.ownership.model import ChangeKind, Checkpoint, OwnershipSnapshot, Phase
from hubshift.ownership.records import decode_assignment, encode_assignment
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.stores.sqlite import SqliteLeaseStore
from hubshift.spec import RebalanceSpec, StartPositionSpec

SCOPE = Scope("ns.example.net", "hub", "$default")


def manifest(**scaling: object) -> PartitionedConsumer:
    return manifest_with({}, **scaling)


def manifest_with(rebalance: Mapping[str, object], **scaling: object) -> PartitionedConsumer:
    return parse_manifest(
        {
            "apiVersion": "hubshift.dev/v1alpha1",
            "kind": "PartitionedConsumer",
            "metadata": {"name": "homes"},
            "spec": {
                "eventHubs": {"hub": "hub"},
                "checkpointStore": {"sqlite": {"path": "unused.db"}},
                "scaling": {"minReplicas": 2, "maxReplicas": 4, "pollingIntervalSeconds": 5, **scaling},
                "rebalance": {"delaySeconds": 5, "maxHandoffSeconds": 10, **rebalance},
            },
        }
    )


# --- pure helpers ---------------------------------------------------------------------------------------


def snapshot_with(
    store: SqliteLeaseStore, checkpoints: dict[str, int], owner: str = "homes-0"
) -> OwnershipSnapshot:
    join_pool(store, SCOPE, owner, clock=lambda: 0.0)
    for partition, sequence in checkpoints.items():
        lease = claim_partition(store, SCOPE, partition, owner)
        if sequence >= 0:
            from hubshift.ownership.checkpoints import write_checkpoint

            write_checkpoint(store, lease, Checkpoint(str(sequence * 10), sequence))
    return take_snapshot(store, SCOPE)


def test_backlog_and_lease_owners_from_one_listing(tmp_path: Path) -> None:
    store = SqliteLeaseStore(tmp_path / "s.db")
    snapshot = snapshot_with(store, {"0": 40, "1": -1})
    infos = {
        "0": PartitionInfo("0", 0, 99, False),
        "1": PartitionInfo("1", 0, 9, False),  # "nothing consumed yet": all 10 events
        "2": PartitionInfo("2", 0, 19, False),  # no checkpoint blob: from the start position
        "3": PartitionInfo("3", 0, -1, True),
    }
    earliest = backlog_per_partition(infos, snapshot, StartPositionSpec(type="earliest"))
    assert earliest == {"0": 59, "1": 10, "2": 20, "3": 0}
    latest = backlog_per_partition(infos, snapshot, StartPositionSpec(type="latest"))
    assert latest == {"0": 59, "1": 0, "2": 0, "3": 0}
    assert lease_owners(snapshot, ["0", "1", "2"]) == {"0": "homes-0", "1": "homes-0", "2": None}
    own = StartPositionSpec.model_validate(
        {
            "type": "latest",
            "partitions": {
                "0": {"type": "sequenceNumber", "sequenceNumber": 90},  # its checkpoint wins
                "1": {"type": "sequenceNumber", "sequenceNumber": 4},  # 4-9
                "2": {"type": "earliest"},
            },
        }
    )
    assert backlog_per_partition(infos, snapshot, own) == {"0": 59, "1": 6, "2": 20, "3": 0}


def test_present_consumers_are_ready_and_not_stopping_in_natural_order() -> None:
    instances = [
        ConsumerInstance("homes-10", 10, True, "a"),
        ConsumerInstance("homes-2", 2, True, "b"),
        ConsumerInstance("homes-3", 3, False, "c"),
        ConsumerInstance("homes-4", 4, True, "d", terminating=True),
    ]
    assert present_consumers(instances) == ("homes-2", "homes-10")


@st.composite
def states(draw: st.DrawFn) -> RebalanceState:
    partitions = [str(p) for p in range(draw(st.integers(1, 12)))]
    consumers = [f"homes-{i}" for i in range(draw(st.integers(0, 4)))]
    owner = st.sampled_from([None, *consumers]) if consumers else st.none()
    generation = draw(st.integers(0, 50))
    published = draw(st.floats(1.6e9, 2.0e9, allow_nan=False)) if generation else None
    return RebalanceState(
        generation=generation,
        phase=draw(st.sampled_from(list(Phase))),
        assignment={p: draw(owner) for p in partitions},
        consumers=tuple(consumers),
        forced=frozenset(draw(st.sets(st.sampled_from(partitions)))),
        published_at=published,
        holddown_until=draw(st.none() | st.floats(1.6e9, 2.0e9, allow_nan=False)),
        replicas=draw(st.integers(0, 8)),
        planned={p: f"homes-{draw(st.integers(4, 7))}" for p in draw(st.sets(st.sampled_from(partitions)))},
        planned_until=draw(st.none() | st.floats(1.6e9, 2.0e9, allow_nan=False)),
        change=draw(st.none() | st.sampled_from(list(ChangeKind))),
    )


@settings(max_examples=200)
@given(states())
def test_a_record_read_back_is_not_written_again(state: RebalanceState) -> None:
    """The loop writes only when the record would change: a state read back from its own record must
    compare equal, or every cycle would write (and wake every consumer)."""
    config = RebalanceSpec()
    record = state.to_record(config)
    read_back = decode_assignment(encode_assignment(record))
    again = RebalanceState.from_record(read_back).to_record(config)
    assert not record_changed(again, read_back)
    changed = RebalanceState.from_record(read_back)
    bumped = changed.__class__(**{**changed.__dict__, "generation": changed.generation + 1})
    assert record_changed(bumped.to_record(config), read_back)


def test_only_absent_owners_of_forced_partitions_are_expelled() -> None:
    published = PublishAssignment(
        3,
        {"0": "homes-0", "1": "homes-0", "2": "homes-1"},
        frozenset({"0", "2"}),
        (),
        PublishReason.ORPHANS,
        "x",
    )
    owners = {"0": "homes-5", "1": "homes-6", "2": "homes-1", "3": None}
    assert owners_to_expel(published, owners, ["homes-0", "homes-1"]) == ["homes-5"]
    assert owners_to_expel(published, owners, ["homes-0", "homes-1", "homes-5"]) == []


def test_next_cycle_comes_sooner_while_the_machine_is_busy() -> None:
    ready = RebalanceState(phase=Phase.READY)
    assert next_cycle_in(ready, 100.0, 15.0) == 15.0
    assert next_cycle_in(RebalanceState(phase=Phase.REBALANCING), 100.0, 15.0) == BUSY_CYCLE_SECONDS
    holddown = RebalanceState(phase=Phase.HOLDDOWN, holddown_until=100.4)
    assert next_cycle_in(holddown, 100.0, 15.0) == pytest.approx(0.4)


def test_status_shows_assignment_handoffs_and_keeps_transition_times() -> None:
    state = RebalanceState(
        generation=4,
        phase=Phase.REBALANCING,
        assignment={"0": "homes-0", "1": "homes-1", "2": "homes-1"},
        consumers=("homes-0", "homes-1"),
        published_at=1_800_000_000.0,
    )
    earlier = "2026-01-01T00:00:00Z"
    status = build_status(
        state=state,
        decision=None,
        pause=autoscaler.Pause(),
        owners={"0": "homes-0", "1": "homes-0", "2": None},
        instances=[ConsumerInstance("homes-0", 0, True, "x"), ConsumerInstance("homes-1", 1, False, "y")],
        current_replicas=2,
        partition_count=3,
        total_backlog=12,
        previous_conditions=[{"type": "Ready", "status": "False", "lastTransitionTime": earlier}],
        observed_generation=7,
        now=1_800_000_001.0,
        last_scale_time=None,
        probe_error=None,
    )
    body = status.to_body()
    assert body["phase"] == "Rebalancing" and body["observedGeneration"] == 7
    assert body["assignment"] == [
        {"consumer": "homes-0", "partitions": ["0"]},
        {"consumer": "homes-1", "partitions": ["1", "2"]},
    ]
    assert [(h["partition"], h.get("fromOwner"), h["toOwner"]) for h in body["pendingHandoffs"]] == [
        ("1", "homes-0", "homes-1"),
        ("2", None, "homes-1"),
    ]
    ready = next(c for c in body["conditions"] if c["type"] == "Ready")
    assert (
        ready["lastTransitionTime"] == earlier.replace("Z", "+00:00")
        or ready["lastTransitionTime"] == earlier
    )
    assert body["readyReplicas"] == 1 and body["totalBacklog"] == 12


def test_cycle_inputs_from_a_custom_resource() -> None:
    inputs = CycleInputs.from_body(
        {
            "metadata": {
                "annotations": {"autoscaling.hubshift.dev/paused": "true"},
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "generation": 3,
            },
            "status": {"conditions": [{"type": "Ready"}]},
        }
    )
    assert inputs.spec_generation == 3
    assert inputs.created_at == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert autoscaler.parse_pause(inputs.annotations).paused


# --- whole cycles ----------------------------------------------------------------------------------------


class FakeProbe:
    def __init__(self, partitions: int) -> None:
        self.last = {str(p): -1 for p in range(partitions)}
        self.fail = False
        self.calls = 0
        self.enqueued: dict[tuple[str, int], float] = {}  # what `enqueued_time` answers
        self.reads: list[tuple[str, int]] = []

    async def partitions(self) -> dict[str, PartitionInfo]:
        self.calls += 1
        if self.fail:
            raise ProbeError("Event Hubs namespace x: cannot connect")
        return {p: PartitionInfo(p, 0, last, last < 0) for p, last in self.last.items()}

    async def enqueued_time(self, partition: str, sequence_number: int) -> float | None:
        self.reads.append((partition, sequence_number))
        return self.enqueued.get((partition, sequence_number))

    async def close(self) -> None:
        pass


@dataclass
class FakeRuntime:
    instances: list[ConsumerInstance] = field(default_factory=list)
    replica_count: int = 0
    events: list[tuple[str, str]] = field(default_factory=list)
    status: dict[str, object] = field(default_factory=dict)
    update_revision: str | None = None
    replaced: list[str] = field(default_factory=list)

    async def consumers(self) -> list[ConsumerInstance]:
        return list(self.instances)

    async def replicas(self) -> int:
        return self.replica_count

    async def set_replicas(self, count: int) -> None:
        self.replica_count = count

    async def revision(self) -> str | None:
        return self.update_revision

    async def replace_consumer(self, name: str) -> bool:
        self.replaced.append(name)
        return True

    async def record_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((reason, message))

    async def publish_status(self, status: dict[str, object]) -> None:
        self.status = status

    def ready(self, *ordinals: int, revisions: dict[int, str] | None = None) -> None:
        self.instances = [
            ConsumerInstance(
                f"homes-{i}", i, True, f"127.0.0.1:{9000 + i}", revision=(revisions or {}).get(i)
            )
            for i in ordinals
        ]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    loop: ControlLoop
    runtime: FakeRuntime
    probe: FakeProbe
    clock: Clock
    store: SqliteLeaseStore
    nudges: list[tuple[str, int]]

    def cycle(self, **inputs: object) -> CycleReport:
        return asyncio.run(self.loop.cycle(CycleInputs(**inputs)))  # type: ignore[arg-type]

    def settle(self) -> None:
        """From a cold start to Ready: the plan for homes-0 and homes-1 published at once, handed to them
        when they are ready (generation 2) and followed by them."""
        self.cycle()
        self.runtime.ready(0, 1)
        self.clock.now += 1
        report = self.cycle()
        hold(self.store, dict(report.state.assignment))
        self.clock.now += 1
        assert self.cycle().state.phase is Phase.READY

    def restart(self) -> Harness:
        """A new operator process: nothing in memory, the same store."""
        return make_harness(self.store, self.runtime, self.probe, self.clock)


def make_harness(
    store: SqliteLeaseStore, runtime: FakeRuntime, probe: FakeProbe, clock: Clock, **scaling: object
) -> Harness:
    nudges: list[tuple[str, int]] = []

    async def nudge(address: str, generation: int) -> bool:
        nudges.append((address, generation))
        return True

    loop = ControlLoop(manifest(**scaling), SCOPE, store, probe, runtime, nudge=nudge, clock=clock)
    return Harness(loop, runtime, probe, clock, store, nudges)


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return make_harness(SqliteLeaseStore(tmp_path / "store.db"), FakeRuntime(), FakeProbe(8), Clock())


def hold(store: SqliteLeaseStore, assignment: dict[str, str | None]) -> None:
    """The consumers follow the record: each assigned partition is claimed by its assignee."""
    for partition, consumer in assignment.items():
        if consumer is not None:
            join_pool(store, SCOPE, consumer, clock=lambda: 0.0)
            claim_partition(store, SCOPE, partition, consumer, force=True)


def test_cold_start_publishes_the_plan_at_once_and_hands_each_consumer_its_share_when_ready(
    harness: Harness,
) -> None:
    report = harness.cycle()
    assert harness.runtime.replica_count == 2  # minReplicas, at once
    record = read_assignment(harness.store, SCOPE)
    assert record is not None and record.assignment.generation == 1
    assert record.assignment.partitions == {}  # nobody reads yet
    assert sorted(set(record.assignment.planned.values())) == ["homes-0", "homes-1"]  # the plan, at once
    assert record.assignment.change is ChangeKind.PLANNED
    assert report.status.to_body()["change"] == "planned"

    harness.runtime.ready(0)
    harness.clock.now += 1
    report = harness.cycle()
    assert report.state.generation == 2 and report.state.phase is Phase.REBALANCING
    assert harness.nudges == [("127.0.0.1:9000", 2)]
    stored = read_assignment(harness.store, SCOPE)
    assert stored is not None and set(stored.assignment.partitions.values()) == {"homes-0"}
    assert set(stored.assignment.planned.values()) == {"homes-1"}
    body = report.status.to_body()
    assert body["planned"] == [{"consumer": "homes-1", "partitions": ["4", "5", "6", "7"]}]
    assert body["plannedUntil"]  # unread partitions wait for homes-1 at most delaySeconds

    harness.runtime.ready(0, 1)
    harness.clock.now += 1
    report = harness.cycle()
    assert report.state.generation == 3 and not report.state.planned
    hold(harness.store, dict(report.state.assignment))
    harness.clock.now += 1
    report = harness.cycle()
    assert report.state.phase is Phase.READY and report.state.running is None
    assert report.status.to_body()["phase"] == "Ready" and "change" not in report.status.to_body()
    reasons = [reason for reason, _ in harness.runtime.events]
    assert "Planned" in reasons and "ScalingOut" in reasons and "Holddown" not in reasons


def test_a_settled_pool_costs_one_listing_per_cycle_and_writes_nothing(harness: Harness) -> None:
    harness.settle()
    harness.clock.now += 1  # inside the polling interval: no Event Hubs probe, no autoscaler
    calls = harness.probe.calls
    report = harness.cycle()
    assert harness.probe.calls == calls
    assert harness.loop.store.counts  # counted
    assert report.store_requests == 1  # one list, nothing written


def test_a_changed_spec_scales_in_its_first_cycle_on_the_backlog_last_read(harness: Harness) -> None:
    harness.settle()
    harness.clock.now += 1  # inside the polling interval
    calls = harness.probe.calls
    harness.loop.apply(manifest(minReplicas=1, maxReplicas=1))
    report = harness.cycle()
    assert harness.probe.calls == calls  # no probe of every partition before acting
    assert report.decision is not None and report.decision.replicas == 1
    published = [a for a in report.actions if isinstance(a, PublishAssignment)]
    assert published and published[0].reason is PublishReason.DRAIN  # homes-1 drains in this cycle
    harness.clock.now += 1
    assert harness.cycle().decision == report.decision  # decided once; the next probe comes on time
    assert harness.probe.calls == calls


def test_lag_in_seconds_from_the_owners_metadata_and_the_loops_own_reads(harness: Harness) -> None:
    from hubshift.ownership.checkpoints import write_checkpoint

    harness.settle()
    now = harness.clock.now
    harness.probe.last = {str(p): 99 for p in range(8)}
    # partition 0: its owner wrote when event 40 was enqueued; partition 1: nobody holds it any more
    record = read_assignment(harness.store, SCOPE)
    assert record is not None
    owner = record.assignment.partitions["0"]
    lease = claim_partition(harness.store, SCOPE, "0", owner)
    write_checkpoint(
        harness.store, lease, Checkpoint("390", 39), next_enqueued=datetime.fromtimestamp(now - 30, UTC)
    )
    harness.store.break_lease(SCOPE.checkpoint_blob("1"))
    harness.probe.enqueued[("1", 0)] = now - 45
    harness.clock.now += 6  # a new poll of the hub
    report = harness.cycle()
    assert report.lag is not None
    assert report.lag["0"].seconds == 36 and report.lag["0"].source == "checkpoint"
    # nothing known of event 0 but that this poll saw it enqueued (a lower bound of 0 s): the loop reads it
    assert report.lag["1"] == PartitionLag("1", 0.0, "probe", 0) and harness.probe.reads[:1] == [("1", 0)]
    assert ("2", 0) not in harness.probe.reads  # held by a live consumer: it writes the time itself
    harness.clock.now += 1
    report = harness.cycle()  # the read landed meanwhile
    assert report.lag is not None and report.lag["1"].seconds == 52 and report.lag["1"].source == "read"
    assert report.status.lag_seconds == 52 and report.status.lagging_partition == "1"
    assert harness.runtime.status["lagSeconds"] == 52


def test_a_lost_compare_and_swap_reads_again_and_still_publishes(harness: Harness) -> None:
    harness.cycle()
    harness.runtime.ready(0, 1)
    # Another writer bumps the record behind the loop's back (same content, new ETag).
    record = read_assignment(harness.store, SCOPE)
    assert record is not None
    publish_assignment(harness.store, SCOPE, record.assignment, etag=record.etag)
    harness.clock.now += 1
    report = harness.cycle()
    assert report.state.generation == 2
    stored = read_assignment(harness.store, SCOPE)
    assert stored is not None and stored.assignment.generation == 2


def test_the_handoff_time_runs_from_the_publication_not_from_the_start_of_a_slow_cycle(
    harness: Harness,
) -> None:
    """A cycle that waited 12 s for the hub (a busy machine) publishes a plan whose handoff deadline is
    `maxHandoffSeconds` (10) from the write: the new owners must not break a lease the old owner is still
    draining (a replay) because the cycle began long before."""
    harness.settle()
    harness.loop.apply(manifest(minReplicas=3, maxReplicas=3))
    harness.clock.now += 1
    assert harness.cycle().state.planned  # a share planned for homes-2, not ready yet
    slow = harness.probe.partitions

    async def partitions() -> dict[str, PartitionInfo]:
        harness.clock.now += 12
        return await slow()

    harness.probe.partitions = partitions  # type: ignore[method-assign]
    harness.runtime.ready(0, 1, 2)
    harness.clock.now += 5
    report = harness.cycle()  # homes-2 ready: its share is handed over
    assert report.state.phase is Phase.REBALANCING and not report.state.planned
    record = read_assignment(harness.store, SCOPE)
    assert record is not None and record.assignment.generation == report.state.generation
    assert record.assignment.updated_at.timestamp() == harness.clock.now  # after the hub answered


def test_an_operator_restart_keeps_the_holddown_and_publishes_once(harness: Harness) -> None:
    harness.settle()
    settled = read_assignment(harness.store, SCOPE)
    assert settled is not None
    generation = settled.assignment.generation
    harness.runtime.ready(0)  # homes-1 is gone: unplanned
    harness.clock.now += 1
    assert harness.cycle().state.phase is Phase.HOLDDOWN
    restarted = harness.restart()
    restarted.clock.now += 2
    report = restarted.cycle()
    assert report.state.phase is Phase.HOLDDOWN and report.state.generation == generation
    assert report.status.to_body()["change"] == "holddown"
    restarted.clock.now += 4
    report = restarted.cycle()
    assert report.state.generation == generation + 1
    again = restarted.restart()
    again.clock.now += 1
    report = again.cycle()
    assert report.state.generation == generation + 1  # not published twice


def test_the_autoscalers_history_survives_a_restart(harness: Harness) -> None:
    harness.probe.last = {str(p): 5000 for p in range(8)}  # 40k backlog: scale out to max 4
    harness.cycle()
    assert harness.runtime.replica_count == 4
    saved = json.loads(harness.store.read(SCOPE.prefix + AUTOSCALER_RECORD)[0])
    assert saved["replicas"] == 4 and saved["scaleEvents"]
    restarted = harness.restart()
    restarted.probe.last = {str(p): -1 for p in range(8)}
    restarted.clock.now += 5
    restarted.cycle()
    # The 300 s scale-down stabilisation remembers the recommendation of 4 made before the restart.
    assert restarted.runtime.replica_count == 4


def test_an_unreadable_hub_keeps_the_pool_and_says_why(harness: Harness) -> None:
    harness.cycle()
    harness.probe.fail = True
    harness.clock.now += 5
    report = harness.cycle()
    body = report.status.to_body()
    assert harness.runtime.replica_count == 2
    assert "cannot connect" in body["message"]


def test_a_consumer_that_is_gone_loses_its_membership_so_its_partitions_move_at_once(
    harness: Harness,
) -> None:
    harness.settle()
    # homes-1 crashes and does not come back: its membership lease would last another 30 s.
    harness.runtime.ready(0)
    harness.clock.now += 1
    harness.cycle()  # holddown
    assert "homes-1" in take_snapshot(harness.store, SCOPE).live_members
    harness.clock.now += 5
    report = harness.cycle()
    assert report.state.generation == 3 and report.state.forced
    snapshot = take_snapshot(harness.store, SCOPE)
    assert "homes-1" not in snapshot.live_members
    assert all(row.owner != "homes-1" or row.orphaned for row in snapshot.partitions)


def test_a_rollout_surges_hands_the_first_pods_share_over_and_evicts_it_once_it_holds_nothing(
    harness: Harness,
) -> None:
    harness.settle()
    runtime = harness.runtime
    runtime.update_revision = "homes-2"  # the StatefulSet's new revision: every pod is outdated
    runtime.ready(0, 1, revisions={0: "homes-1", 1: "homes-1"})
    harness.clock.now += 1
    report = harness.cycle()
    assert runtime.replica_count == 3  # the surge pod
    assert report.state.planned and set(report.state.planned.values()) == {"homes-2"}
    assert "homes-0" not in report.state.consumers  # retiring: it keeps reading until homes-2 is ready
    rollout = report.status.to_body()["rollout"]
    assert rollout["phase"] == "RollingOut" and rollout["surge"] and rollout["current"] == "homes-0"
    assert (
        "RolloutStarted",
        "2 pods to replace for revision homes-2, one extra pod meanwhile",
    ) in runtime.events

    # A new operator process midway: the record and the status are all it has.
    harness = harness.restart()
    runtime.ready(0, 1, 2, revisions={0: "homes-1", 1: "homes-1", 2: "homes-2"})
    harness.clock.now += 1
    report = harness.cycle(previous_rollout=rollout)
    moved = [p for p, c in report.state.assignment.items() if c == "homes-2"]
    assert len(moved) == 4 and runtime.replaced == []  # handed over, not released yet
    hold(harness.store, dict(report.state.assignment))
    harness.clock.now += 1
    report = harness.cycle(previous_rollout=report.status.to_body()["rollout"])
    assert runtime.replaced == ["homes-0"]
    assert [e for e in runtime.events if e[0] == "Replacing"]
    assert [e[0] for e in runtime.events].count("RolloutStarted") == 1  # the restart carried on
    assert report.status.rollout is not None and report.status.rollout.phase == "RollingOut"


def test_load_aware_moves_a_hot_partition_off_the_busy_consumer_and_reports_load(tmp_path: Path) -> None:
    store = SqliteLeaseStore(tmp_path / "store.db")
    runtime, probe, clock = FakeRuntime(), FakeProbe(8), Clock()
    harness = make_harness(store, runtime, probe, clock)
    load_aware = {"strategy": "loadAware", "loadAware": {"windowSeconds": 30}}
    harness.loop.apply(manifest_with(load_aware, minReplicas=2, maxReplicas=2))
    harness.settle()
    record = read_assignment(store, SCOPE)
    assert record is not None
    first, second, *rest = record.assignment.partitions_of("homes-0")
    rates = {str(p): 100.0 if str(p) in (first, second) else 5.0 for p in range(8)}  # both on homes-0
    publications: list[PublishAssignment] = []
    for _poll in range(3):
        probe.last = {p: last + round(rates[p] * 6) for p, last in probe.last.items()}
        clock.now += 6
        report = harness.cycle()
        publications += [a for a in report.actions if isinstance(a, PublishAssignment)]
    (moved,) = publications  # one of the two, at the first probe that measured the load
    assert moved.reason is PublishReason.LOAD and [m.partition for m in moved.moves] == [first]
    assert report.load is not None and report.load[first] == 100.0
    body = runtime.status
    assert body["incomingEventsPerSecond"] == 230.0
    homes_0 = {"consumer": "homes-0", "partitions": [second, *rest], "eventsPerSecond": 110.0}
    assert isinstance(body["assignment"], list) and homes_0 in body["assignment"]
    assert any("load: homes-0 carries" in message for _, message in runtime.events)


def test_the_lag_target_gives_a_hot_partition_a_consumer_and_keeps_the_others_under_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 0 alone receives more than a consumer processes: it gets a consumer of its own, and the
    others are sized to keep up (a partition over capacity does not lift the limit for the rest). The Event
    and the status name it."""
    store = SqliteLeaseStore(tmp_path / "store.db")
    runtime, probe, clock = FakeRuntime(), FakeProbe(8), Clock()
    started = clock.now

    async def work(address: str) -> ConsumerFigures:
        busy = (clock.now - started) / 2  # every consumer busy half the time, at 100 events a busy second
        return ConsumerFigures((100.0 * busy, busy), {})

    monkeypatch.setattr("hubshift.operator.loop.observer.consumer_figures", work)
    harness = make_harness(store, runtime, probe, clock)
    target = {"unprocessedEventsPerReplica": 1_000_000, "lagSeconds": 5}
    harness.loop.apply(manifest_with({"strategy": "loadAware"}, minReplicas=2, maxReplicas=8, target=target))
    harness.settle()
    assert runtime.replica_count == 2
    rates = {str(p): 150.0 if p == 0 else 30.0 for p in range(8)}  # partition 0 over 100/s, 210/s the rest
    assignment = dict(harness.cycle().state.assignment)
    for _poll in range(12):  # scale-up is limited to 4 pods a minute (HPA's default): 0 -> 2 -> 4, then 5
        probe.last = {p: last + round(rates[p] * 6) for p, last in probe.last.items()}
        caught_up(store, assignment, probe.last)  # no backlog: the rates alone decide
        clock.now += 6
        assignment = dict(harness.cycle().state.assignment)
    # Partition 0 alone, and 210/s over consumers at most 80 % busy (80/s): two partitions each, 1 + 4.
    assert runtime.replica_count == 5
    *_, lag_event = [message for reason, message in runtime.events if reason == "LagTarget"]
    assert lag_event.startswith("lag target 5s: 360 events/s to process, 100/s per consumer; ")
    assert "busiest consumer: partitions 0 (150/s) -> 5" in lag_event
    (over,) = [message for reason, message in runtime.events if reason == "PartitionOverCapacity"]
    # Named when it starts: at the first probes that measured it.
    assert re.match(r"partitions 0 \(\d+/s\) each receive more than one consumer processes \(100/s\)", over)
    body = runtime.status
    lag_target = body["lagTarget"]
    assert isinstance(lag_target, dict) and lag_target["replicas"] == 5
    assert lag_target["busiest"] == [{"partition": "0", "eventsPerSecond": 150.0}]
    conditions = body["conditions"]
    assert isinstance(conditions, list)
    assert any(c["type"] == "PartitionOverCapacity" and c["status"] == "True" for c in conditions)


def caught_up(store: SqliteLeaseStore, assignment: dict[str, str | None], last: Mapping[str, int]) -> None:
    """Each assignee holds its partitions, checkpointed at the last event: no backlog."""
    from hubshift.ownership.checkpoints import write_checkpoint

    for partition, consumer in assignment.items():
        if consumer is not None and last[partition] >= 0:
            join_pool(store, SCOPE, consumer, clock=lambda: 0.0)
            lease = claim_partition(store, SCOPE, partition, consumer, force=True)
            write_checkpoint(store, lease, Checkpoint(str(last[partition] * 10), last[partition]))


def manifest_replicas(replicas: int | None, fail_on_data_loss: bool = True) -> PartitionedConsumer:
    """`manifest()` with spec.replicas (what the scale subresource sets) and consumer.failOnDataLoss."""
    document = manifest().model_dump(by_alias=True, mode="json", exclude_none=True)
    document["spec"]["consumer"]["failOnDataLoss"] = fail_on_data_loss
    if replicas is not None:
        document["spec"]["replicas"] = replicas
    return parse_manifest(document)


def test_spec_replicas_is_planned_at_once_whatever_the_autoscaler_would_say(harness: Harness) -> None:
    harness.settle()
    harness.clock.now += 1  # inside the polling interval: the change applies without a probe
    harness.loop.apply(manifest_replicas(4))  # kubectl scale pcon/homes --replicas=4 (maxReplicas is 4)
    report = harness.cycle()
    assert report.decision is not None and report.decision.replicas == 4 and report.decision.manual
    assert harness.runtime.replica_count == 4
    assert report.state.running is ChangeKind.PLANNED  # planned like an autoscaler decision: no holddown
    assert sorted(set(report.state.planned.values())) == ["homes-2", "homes-3"]
    assert report.status.to_body()["replicas"] == 4

    harness.clock.now += 1
    harness.loop.apply(manifest_replicas(20))  # more than the hub's 8 partitions
    assert harness.cycle().decision.replicas == 8  # type: ignore[union-attr]

    harness.clock.now += 1
    harness.loop.apply(manifest_replicas(None))  # handed back to the autoscaler: its maxReplicas again,
    report = harness.cycle()  # and its scale-down window keeps it from the 2 the backlog asks for
    assert report.decision is not None and not report.decision.manual and report.decision.replicas == 4


class ExpiringProbe(FakeProbe):
    """The hub's retention has passed the checkpoints of some partitions (`beginning` per partition)."""

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self.beginning: dict[str, int] = {}

    async def partitions(self) -> dict[str, PartitionInfo]:
        self.calls += 1
        return {
            p: PartitionInfo(p, self.beginning.get(p, 0), last, last < 0) for p, last in self.last.items()
        }


def test_events_expired_unread_stop_the_pool_until_fail_on_data_loss_is_off(tmp_path: Path) -> None:
    store = SqliteLeaseStore(tmp_path / "store.db")
    probe = ExpiringProbe(8)
    harness = make_harness(store, FakeRuntime(), probe, Clock())
    probe.last = {p: 99 for p in probe.last}
    harness.settle()
    snapshot_with(store, {"3": 9}, owner="homes-0")  # its owner checkpointed partition 3 at 9
    probe.beginning["3"] = 50  # retention passed it: 10-49 are gone
    harness.clock.now += 10  # the next probe
    report = harness.cycle()
    assert report.decision is not None and report.decision.replicas == 0  # drained, then scaled to 0
    body = report.status.to_body()
    assert body["desiredReplicas"] == 0 and body["message"].startswith("stopped for data loss")
    loss = next(c for c in body["conditions"] if c["type"] == "DataLoss")
    assert (loss["status"], loss["reason"]) == ("True", "PoolStopped")
    assert "partition 3: 40 events (10-49)" in loss["message"]
    ready = next(c for c in body["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "DataLoss")
    assert body["expiredEvents"] == [
        {"partition": "3", "firstSequenceNumber": 10, "lastSequenceNumber": 49, "events": 40}
    ]
    assert [reason for reason, _ in harness.runtime.events].count("DataLoss") == 1
    harness.clock.now += 10
    assert harness.cycle().decision.replicas == 0  # type: ignore[union-attr]  # stays stopped, one Event
    assert [reason for reason, _ in harness.runtime.events].count("DataLoss") == 1

    harness.loop.apply(manifest_replicas(None, fail_on_data_loss=False))
    harness.clock.now += 1
    report = harness.cycle()
    assert report.decision is not None and report.decision.replicas == 2  # goes on, still saying so
    loss = next(c for c in report.status.to_body()["conditions"] if c["type"] == "DataLoss")
    assert (loss["status"], loss["reason"]) == ("True", "EventsExpired")
    ready = next(c for c in report.status.to_body()["conditions"] if c["type"] == "Ready")
    assert ready["reason"] != "DataLoss"
