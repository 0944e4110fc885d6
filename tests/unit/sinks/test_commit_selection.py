"""Commit records and which of them count: exact totals after graceful handoffs and after crashes."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift.sinks.commits import BatchRecord, PartitionRange, WrittenFile, select_counted

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
_serial = iter(range(1_000_000))


def record(consumer: str, batch: int, *ranges: tuple[str, int, int], at: int | None = None) -> BatchRecord:
    serial = next(_serial)
    return BatchRecord(
        consumer_id=consumer,
        run="r1",
        batch_id=batch,
        stem=f"{consumer}-r1-{batch:09d}-{serial}",
        pipeline="aggregate",
        committed_at=T0 + timedelta(seconds=serial if at is None else at),
        partitions=tuple(
            PartitionRange(p, first, last, str(last * 10), last - first + 1) for p, first, last in ranges
        ),
        files=(WrittenFile("output", "aggregates", f"aggregates/x-{serial}.jsonl", 1),),
    )


def counted_events(records: Iterable[BatchRecord]) -> dict[str, int]:
    """Events per partition that the counted records cover (what a reader's totals are made of)."""
    records = list(records)
    counted = select_counted(records)
    totals: dict[str, int] = defaultdict(int)
    for record in records:
        for part in record.partitions:
            if part.partition in counted.get(record.stem, frozenset()):
                totals[part.partition] += part.events
    return dict(totals)


def test_record_json_round_trip() -> None:
    original = record("homes-0", 7, ("3", 10, 19), ("4", 0, 0))
    original = BatchRecord(
        **{
            **original.__dict__,
            "partitions": (
                PartitionRange("3", 10, 19, "190", 10, T0, T0 + timedelta(seconds=1)),
                original.partitions[1],
            ),
        }
    )
    assert BatchRecord.from_json(original.to_json()) == original
    assert original.name == f"_batches/{original.stem}.json"
    assert original.files_of("aggregates") == list(original.files)
    assert original.files_of("results") == []


def test_graceful_handoff_counts_every_record() -> None:
    a1 = record("a", 0, ("0", 0, 9), ("1", 0, 4))
    a2 = record("a", 1, ("0", 10, 19))
    b1 = record("b", 0, ("0", 20, 29), ("1", 5, 9))
    counted = select_counted([a1, a2, b1])
    assert counted == {a1.stem: {"0", "1"}, a2.stem: {"0"}, b1.stem: {"0", "1"}}
    assert counted_events([a1, a2, b1]) == {"0": 30, "1": 10}


def test_crash_replay_is_counted_once() -> None:
    """A checkpointed up to 19, then wrote 20-29 and died; B re-read from 20 in smaller batches."""
    a1 = record("a", 0, ("0", 0, 19))
    a2 = record("a", 1, ("0", 20, 29), ("1", 0, 9))  # partition 1 is not replayed: it counts
    b1 = record("b", 0, ("0", 20, 24))
    b2 = record("b", 1, ("0", 25, 40))
    counted = select_counted([a1, a2, b1, b2])
    assert counted[a2.stem] == {"1"}
    assert counted[b1.stem] == {"0"} and counted[b2.stem] == {"0"}
    assert counted_events([a1, a2, b1, b2]) == {"0": 41, "1": 10}


def test_the_same_batch_twice_counts_once_the_first_committed() -> None:
    first = record("a", 3, ("0", 0, 9), at=1)
    again = record("b", 0, ("0", 0, 9), at=2)
    assert select_counted([again, first]) == {first.stem: {"0"}}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=12),
    st.lists(st.integers(min_value=1, max_value=20), min_size=0, max_size=12),
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=0, max_value=3),
)
def test_any_crash_and_replay_counts_each_event_once(
    first_owner: list[int], second_owner: list[int], checkpoint_after: int, seed: int
) -> None:
    """Owner A writes batches; only the first `checkpoint_after` were checkpointed when it died. Owner B
    resumes after that checkpoint with its own batch sizes. Counted events = distinct events written."""
    records = []
    position = 0
    ends = []
    for batch, size in enumerate(first_owner):
        records.append(record("a", batch, ("0", position, position + size - 1)))
        position += size
        ends.append(position)
    checkpoint = ends[min(checkpoint_after, len(ends)) - 1] if checkpoint_after else 0
    position = checkpoint
    for batch, size in enumerate(second_owner):
        records.append(record("b", batch, ("0", position, position + size - 1)))
        position += size
    random.Random(seed).shuffle(records)
    distinct = max(ends[-1], position)
    assert counted_events(records) == {"0": distinct}
