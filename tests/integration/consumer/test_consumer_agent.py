"""The ownership agent against a real store (SQLite), with a recording engine and a clock the test turns:
claims and owner levels, checkpoints only after commit, graceful handoff by assignment, the handoff
deadline, a deposed consumer fenced off, SIGTERM, a store that refuses every write."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hubshift.consumer.agent import AgentSettings, OwnershipAgent
from hubshift.consumer.engine import Committed, Drained, Notify, Stolen
from hubshift.consumer.lag import ReadProgress
from hubshift.consumer.schedule import NUDGE_FLOOR_SECONDS
from hubshift.eventhubs.receiver import StartAt
from hubshift.ownership.assignment import publish_assignment, read_assignment
from hubshift.ownership.leases import claim_partition
from hubshift.ownership.membership import join_pool
from hubshift.ownership.model import Assignment, Checkpoint, Phase
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseStore
from hubshift.ownership.stores.locations import open_store, sqlite_url
from hubshift.ownership.stores.sqlite import SqliteLeaseStore
from hubshift.ownership.timing import Timing
from hubshift.spec import CheckpointPolicySpec, StartPositionSpec
from tests.harness.ownership import read_checkpoint

SCOPE = Scope("ns.example", "hub", "$default")
PARTITIONS = ["0", "1", "2", "3"]


@dataclass
class RecordingEngine:
    name: str = "recording"
    started: dict[str, tuple[int, StartAt, int | None]] = field(default_factory=dict)
    drained: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    enqueued: dict[tuple[str, int], datetime] = field(default_factory=dict)

    def start(self, notify: Notify) -> None:
        pass

    def start_partition(
        self, partition: str, owner_level: int, start: StartAt, next_sequence: int | None
    ) -> None:
        self.started[partition] = (owner_level, start, next_sequence)

    def drain_partition(self, partition: str) -> None:
        self.drained.append(partition)

    def stop_partition(self, partition: str) -> None:
        self.stopped.append(partition)

    def progress(self) -> dict[str, ReadProgress]:
        return {}

    def enqueued_time(self, partition: str, sequence_number: int) -> datetime | None:
        return self.enqueued.get((partition, sequence_number))

    def close(self) -> None:
        pass


class StaticHub:
    def partition_ids(self) -> list[str]:
        return list(PARTITIONS)

    def last_enqueued(self, partition: str) -> Checkpoint | None:
        return Checkpoint("4096", 41)


class Clocks:
    """The agent's monotonic clock and wall clock, turned by the test."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.now = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return sqlite_url(tmp_path / "store.db")


@pytest.fixture
def stores(store_url: str) -> Iterator[list[LeaseStore]]:
    opened: list[LeaseStore] = []
    yield opened
    for store in opened:
        store.close()


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def make_agent(
    name: str,
    store_url: str,
    stores: list[LeaseStore],
    clocks: Clocks,
    *,
    store: LeaseStore | None = None,
    **settings: object,
) -> tuple[OwnershipAgent, RecordingEngine]:
    store = store if store is not None else open_store(store_url, create=True)
    stores.append(store)
    engine = RecordingEngine()
    options: dict[str, object] = {
        "start": StartPositionSpec(),
        "checkpoint": CheckpointPolicySpec(every_events=10, every_seconds=60.0),
        "max_handoff_seconds": 15.0,
        "timing": Timing(list_interval_seconds=5.0),
        "grace_seconds": 25.0,
    }
    options.update(settings)
    agent = OwnershipAgent(
        store,
        SCOPE,
        name,
        engine,
        StaticHub(),
        AgentSettings(**options),  # type: ignore[arg-type]
        clock=lambda: clocks.mono,
        wall=lambda: clocks.now,
        watchdog=False,  # a real-time timer: these tests move the clock by hand
    )
    agent.start()
    return agent, engine


def publish(store: LeaseStore, owners: dict[str, str], generation: int, clocks: Clocks) -> None:
    record = read_assignment(store, SCOPE)
    assignment = Assignment(generation, owners, Phase.REBALANCING, 2, clocks.now)
    publish_assignment(store, SCOPE, assignment, etag=record.etag if record else None)


def test_claims_start_reading_and_checkpoints_follow_commits(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    agent, engine = make_agent("a", store_url, stores, clocks, start=StartPositionSpec(type="latest"))
    assert agent.step() is None
    assert sorted(engine.started) == PARTITIONS
    level, start, next_sequence = engine.started["0"]
    # `latest`: the first claim records the last enqueued event; reading starts after it.
    assert (level, start, next_sequence) == (1, StartAt(sequence_number=41), 42)
    store = stores[0]
    agent.notify(Committed("0", 1, Checkpoint("5000", 49), 8))
    agent.step()
    assert read_checkpoint(store, SCOPE, "0") == Checkpoint("4096", 41)  # 8 events: not due yet
    agent.notify(Committed("0", 1, Checkpoint("6000", 59), 10))
    agent.notify(Committed("1", 0, Checkpoint("9", 9), 100))  # an older epoch: ignored
    agent.step()
    assert read_checkpoint(store, SCOPE, "0") == Checkpoint("6000", 59)
    assert read_checkpoint(store, SCOPE, "1") == Checkpoint("4096", 41)


def test_checkpoints_carry_the_next_events_enqueued_time(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    """The control loop's lag in seconds: each checkpoint says when the event after it was enqueued."""
    agent, engine = make_agent("a", store_url, stores, clocks, start=StartPositionSpec(type="latest"))
    agent.step()
    store = stores[0]

    def row(partition: str) -> tuple[int, datetime | None]:
        found = take_snapshot(store, SCOPE).partition(partition)
        assert found is not None
        return found.checkpoint.sequence_number, found.next_enqueued

    t = clocks.now
    # claimed at 41 (latest); once the receiver has event 42, the unmoved checkpoint gets its time
    assert row("0") == (41, None)
    engine.enqueued[("0", 42)] = t
    agent.step()
    assert row("0") == (41, t)
    # a due checkpoint goes to the newest commit whose neighbour's time is known: 59 (60 is known), not 69
    engine.enqueued[("0", 50)] = t + timedelta(seconds=1)
    engine.enqueued[("0", 60)] = t + timedelta(seconds=2)
    agent.notify(Committed("0", 1, Checkpoint("490", 49), 8))
    agent.notify(Committed("0", 1, Checkpoint("590", 59), 10))
    agent.notify(Committed("0", 1, Checkpoint("690", 69), 10))
    agent.step()
    assert row("0") == (59, t + timedelta(seconds=2))
    # when none is known (caught up), the newest commit, without a time; the time follows when it is known
    agent.notify(Committed("0", 1, Checkpoint("790", 79), 10))
    agent.step()
    assert row("0") == (79, None)
    engine.enqueued[("0", 80)] = t + timedelta(seconds=9)
    agent.step()
    assert row("0") == (79, t + timedelta(seconds=9))


def test_sigterm_drains_writes_the_final_checkpoint_and_releases(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    agent, engine = make_agent("a", store_url, stores, clocks)
    agent.step()
    agent.notify(Committed("2", 1, Checkpoint("77", 7), 3))
    agent.request_stop()
    assert agent.step() is None
    assert sorted(engine.drained) == PARTITIONS
    for partition in PARTITIONS:
        agent.notify(Drained(partition, 1, Checkpoint("99", 9) if partition == "2" else None))
    assert agent.step() == 0
    agent.leave()
    snapshot = take_snapshot(stores[0], SCOPE)
    assert all(row.free for row in snapshot.partitions)
    assert read_checkpoint(stores[0], SCOPE, "2") == Checkpoint("99", 9)
    assert snapshot.live_members == []


def test_an_evicted_pod_reads_on_until_the_operator_moves_its_partitions_to_a_waiting_owner(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    """SIGTERM in a pod (`stop_follow_seconds`): nothing is drained until the record says so, then each
    partition goes straight to its new owner, who was waiting for it; nothing is claimed meanwhile."""
    a, engine_a = make_agent("a", store_url, stores, clocks, stop_follow_seconds=5.0)
    b, engine_b = make_agent("b", store_url, stores, clocks)
    publish(stores[0], {"0": "a", "1": "a", "2": "b", "3": "b"}, 1, clocks)
    a.step()
    b.step()
    a.request_stop()
    clocks.advance(1)
    assert a.step() is None
    assert engine_a.drained == [] and a.status()["stopping"] and not a.ready  # still reading
    # The operator saw the pod stopping: it publishes the move; the stopping consumer finds it by listing.
    publish(stores[0], dict.fromkeys(PARTITIONS, "b"), 2, clocks)
    b.reread_assignment()
    b.step()
    assert b.status()["waiting"] == ["0", "1"]
    clocks.advance(0.3)
    a.step()
    assert sorted(engine_a.drained) == ["0", "1"]
    for partition in ("0", "1"):
        a.notify(Drained(partition, 1, Checkpoint(f"{partition}00", 10)))
    assert a.step() == 0
    a.leave()
    clocks.advance(0.3)
    b.step()
    assert sorted(engine_b.started) == PARTITIONS
    assert engine_b.started["0"][1] == StartAt(sequence_number=10)  # from a's final checkpoint


def test_without_the_operator_an_evicted_pod_hands_off_when_its_follow_time_is_up(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    a, engine_a = make_agent("a", store_url, stores, clocks, stop_follow_seconds=5.0)
    publish(stores[0], dict.fromkeys(PARTITIONS, "a"), 1, clocks)
    a.step()
    a.request_stop()
    a.step()  # the agent wakes at once on SIGTERM: the follow time runs from here
    clocks.advance(4.9)
    a.step()
    assert engine_a.drained == []
    clocks.advance(0.2)
    a.step()
    assert sorted(engine_a.drained) == PARTITIONS


def test_without_an_assignment_record_sigterm_drains_at_once_whatever_the_follow_time(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    a, engine_a = make_agent("a", store_url, stores, clocks, stop_follow_seconds=5.0)
    a.step()  # fallback balancing: no operator to wait for
    a.request_stop()
    a.step()
    assert sorted(engine_a.drained) == PARTITIONS


def test_a_graceful_move_by_assignment(store_url: str, stores: list[LeaseStore], clocks: Clocks) -> None:
    a, engine_a = make_agent("a", store_url, stores, clocks)
    b, engine_b = make_agent("b", store_url, stores, clocks)
    publish(stores[0], dict.fromkeys(PARTITIONS, "a"), 1, clocks)
    a.step()
    b.step()
    assert sorted(engine_a.started) == PARTITIONS and engine_b.started == {}
    publish(stores[0], {"0": "a", "1": "b", "2": "a", "3": "a"}, 2, clocks)
    clocks.advance(NUDGE_FLOOR_SECONDS)  # nudges list at most this often
    a.reread_assignment()
    b.reread_assignment()
    a.step()
    b.step()
    assert engine_a.drained == ["1"]
    assert engine_b.started == {}  # a still holds it: b waits for the release
    assert b.status()["waiting"] == ["1"]
    a.notify(Drained("1", 1, Checkpoint("1900", 19)))
    a.step()
    clocks.advance(0.6)
    b.step()
    level, start, next_sequence = engine_b.started["1"]
    assert (level, start, next_sequence) == (2, StartAt(sequence_number=19), 20)
    assert read_checkpoint(stores[0], SCOPE, "1") == Checkpoint("1900", 19)


def test_the_new_owner_breaks_the_lease_after_the_handoff_deadline(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    a, engine_a = make_agent("a", store_url, stores, clocks)
    b, engine_b = make_agent("b", store_url, stores, clocks)
    publish(stores[0], dict.fromkeys(PARTITIONS, "a"), 1, clocks)
    a.step()
    publish(stores[0], {"0": "a", "1": "a", "2": "a", "3": "b"}, 2, clocks)
    b.reread_assignment()
    b.step()
    assert engine_b.started == {}
    clocks.advance(14)
    b.step()
    assert engine_b.started == {}
    clocks.advance(1.5)
    b.step()
    assert engine_b.started["3"][0] == 2
    # The old owner, hung in its batch, finds out at its next checkpoint: fenced off, it stops reading.
    a.notify(Committed("3", 1, Checkpoint("123", 500), 500))
    a.step()
    assert "3" in engine_a.stopped
    assert read_checkpoint(stores[0], SCOPE, "3") != Checkpoint("123", 500)


def test_a_deposed_consumer_stops_at_once_and_cannot_move_the_checkpoint(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    a, engine = make_agent("a", store_url, stores, clocks)
    a.step()
    join_pool(stores[0], SCOPE, "x", clock=lambda: clocks.mono)  # alive: its partitions are no orphans
    thief = claim_partition(stores[0], SCOPE, "0", "x", force=True)
    assert thief.owner_level == 2
    a.notify(Stolen("0", 1))  # the service disconnected our receiver for the higher owner level
    a.notify(Committed("0", 1, Checkpoint("777", 70), 100))
    a.step()
    assert "0" in engine.stopped
    assert "0" not in a.owned()
    assert read_checkpoint(stores[0], SCOPE, "0") == thief.checkpoint
    # A lease broken without a new receiver is found at the next listing.
    claim_partition(stores[0], SCOPE, "1", "x", force=True)
    clocks.advance(6)
    a.step()
    assert "1" in engine.stopped and sorted(a.owned()) == ["2", "3"]


def test_a_consumer_lost_long_after_the_publication_keeps_its_partitions_for_a_while(
    store_url: str, stores: list[LeaseStore], clocks: Clocks
) -> None:
    """A pod restarting hours after the last generation: the operator holds its partitions through the
    holddown; the others follow the record from when they saw the loss, not from its old publication."""
    a, engine_a = make_agent("a", store_url, stores, clocks)
    b, engine_b = make_agent("b", store_url, stores, clocks)
    owners = {"0": "a", "1": "a", "2": "b", "3": "b"}
    assignment = Assignment(1, owners, Phase.READY, 2, clocks.now - timedelta(hours=2))
    publish_assignment(stores[0], SCOPE, assignment, etag=None)
    a.step()
    b.step()
    assert sorted(engine_a.started) == ["0", "1"] and sorted(engine_b.started) == ["2", "3"]
    b.request_stop()  # SIGTERM: b drains, releases and leaves
    b.step()
    for partition in ("2", "3"):
        b.notify(Drained(partition, 1, None))
    assert b.step() == 0
    b.leave()
    stale_after = a.settings.stale_after_seconds
    clocks.advance(NUDGE_FLOOR_SECONDS)  # nudges list at most this often
    a.reread_assignment()
    a.step()
    clocks.advance(stale_after - 1)
    a.reread_assignment()
    a.step()
    assert sorted(engine_a.started) == ["0", "1"], "took b's partitions while the operator held them"
    clocks.advance(2)  # the operator had its time and did nothing: balance without it
    a.reread_assignment()
    a.step()
    assert sorted(engine_a.started) == PARTITIONS


def test_a_store_that_refuses_every_write_is_one_warning_until_it_works_again(
    tmp_path: Path, stores: list[LeaseStore], clocks: Clocks, caplog: pytest.LogCaptureFixture
) -> None:
    """Every write refused for 20 s (another process holds SQLite's write lock; in Azure, a refused token):
    the renewal retried every second and every checkpoint fail. That used to be a warning each, 70 in 45 s;
    it is one warning with the whole reason, the repeats at debug, and one line each when writes work
    again."""
    path = tmp_path / "store.db"
    store = SqliteLeaseStore(path, busy_timeout_seconds=0.01)
    agent, engine = make_agent("a", "", stores, clocks, store=store)
    agent.step()
    assert sorted(engine.started) == PARTITIONS
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    caplog.set_level(logging.DEBUG, logger="hubshift.consumer.agent")
    sequence = 10
    try:
        for _ in range(40):  # 20 s, a turn every 0.5 s: renewals fail from 15 s, checkpoints every turn
            clocks.advance(0.5)
            for partition in PARTITIONS:
                agent.notify(Committed(partition, 1, Checkpoint(str(sequence * 100), sequence), 10))
            sequence += 1
            agent.step()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    clocks.advance(1.0)
    agent.step()

    agent_lines = [r for r in caplog.records if r.name == "hubshift.consumer.agent"]
    warnings = [r.getMessage() for r in agent_lines if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("checkpoint failed (partition 0) (retrying): ") and "locked" in warnings[0]
    repeats = [r for r in agent_lines if r.levelno == logging.DEBUG and "again" in r.getMessage()]
    assert len(repeats) >= 40 * len(PARTITIONS)  # every refused write is still counted, at debug
    infos = [r.getMessage() for r in agent_lines if r.levelno == logging.INFO]
    assert "membership renewal failed too, for the same reason as checkpoint (retrying)" in infos
    assert any(m.startswith("membership renewal works again") for m in infos), infos
    assert any(m.startswith("checkpoint works again") for m in infos), infos
    assert read_checkpoint(store, SCOPE, "0") == Checkpoint(str((sequence - 1) * 100), sequence - 1)
