"""An owned partition's checkpoint decisions: the cadence, which committed position a due checkpoint goes
to (the newest whose next event's enqueued time is known), the commits kept, and what a drained or
abandoned partition's last checkpoint writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from hubshift.consumer.checkpointing import (
    RECENT_COMMITS_KEPT,
    OwnedPartition,
    checkpoint_due,
    next_enqueued,
)
from hubshift.ownership.model import EARLIEST, Checkpoint, PartitionLease
from hubshift.ownership.scope import Scope
from hubshift.spec import CheckpointPolicySpec

SCOPE = Scope("ns.servicebus.windows.net", "hub", "$default")
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def at(sequence_number: int) -> Checkpoint:
    return Checkpoint(str(sequence_number * 100), sequence_number)


def owned(checkpoint: Checkpoint = EARLIEST, **fields: object) -> OwnedPartition:
    lease = PartitionLease(SCOPE, "0", "a", "lease", 1, checkpoint)
    return OwnedPartition(lease, **fields)  # type: ignore[arg-type]


def test_checkpoint_cadence() -> None:
    written = Checkpoint("100", 10)
    moved = Checkpoint("200", 20)

    def due(committed: Checkpoint | None, events: int, now: float) -> bool:
        return checkpoint_due(committed, written, events, 0.0, now, every_events=100, every_seconds=5.0)

    assert not due(None, 0, 100.0)
    assert not due(written, 500, 100.0)  # nothing moved
    assert not due(moved, 10, 4.0)
    assert due(moved, 10, 5.0)  # time
    assert due(moved, 100, 0.1)  # events
    partition = owned(written, committed=moved, events_since=10, last_written=0.0)
    policy = CheckpointPolicySpec(every_events=100, every_seconds=5.0)
    assert not partition.due(4.0, policy) and partition.due(5.0, policy)


def test_commits_are_counted_and_the_newest_kept() -> None:
    partition = owned()
    for n in range(1, 41):
        partition.commit(at(n), 2)
    assert partition.committed == at(40) and partition.events_since == 80
    assert partition.recent == [at(n) for n in range(41 - RECENT_COMMITS_KEPT, 41)]


@given(
    st.integers(-1, 20),
    st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True).map(sorted),
    st.sets(st.integers(0, 41)),
)
def test_a_due_checkpoint_goes_to_the_newest_commit_whose_next_event_time_is_known(
    written: int, commits: list[int], known: set[int]
) -> None:
    partition = owned(at(written) if written >= 0 else EARLIEST)
    for n in commits:
        partition.commit(at(n), 1)
    times = {n: T0 + timedelta(seconds=n) for n in known}
    position, moment = partition.to_write(times.get)
    candidates = [n for n in commits if n > written and n + 1 in known]
    if candidates:
        assert position == at(max(candidates)) and moment == times[max(candidates) + 1]
    else:
        assert position == at(commits[-1]) and moment is None
    partition.written(position, moment is not None, 50.0)
    assert partition.events_since == 0 and partition.last_written == 50.0
    assert all(c.sequence_number > position.sequence_number for c in partition.recent)
    assert partition.written_with_next == (moment is not None)


def test_the_next_events_time_of_nothing_consumed_is_unknown() -> None:
    assert next_enqueued(None, lambda n: T0) is None
    assert next_enqueued(EARLIEST, lambda n: T0) is None
    assert next_enqueued(at(7), {8: T0}.get) == T0


def test_a_checkpoint_written_without_its_neighbours_time_is_completed_while_active() -> None:
    partition = owned(at(5))
    assert partition.completes_checkpoint
    partition.written_with_next = True
    assert not partition.completes_checkpoint
    draining = owned(at(5))
    assert draining.start_drain(3.0) and draining.drain_started == 3.0
    assert not draining.start_drain(4.0) and draining.drain_started == 3.0  # once
    assert not draining.completes_checkpoint


def test_the_final_checkpoint_writes_only_a_position_ahead_of_the_written_one() -> None:
    partition = owned(at(10), committed=at(12))
    assert partition.final_position() == at(12)
    assert partition.final_position(at(14)) == at(14)  # where the drain ended wins
    assert partition.final_position(at(9)) is None  # behind the checkpoint: nothing to write
    assert owned(at(10), committed=at(10)).final_position() is None
    assert owned(at(10)).final_position() is None  # nothing committed
