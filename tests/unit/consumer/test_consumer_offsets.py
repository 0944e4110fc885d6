"""The source's offsets and micro-batch planning: canonical JSON, read-limit splitting, epochs, handoffs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubshift.consumer.spark.offsets import (
    Found,
    OffsetError,
    PartitionPosition,
    ReadRange,
    SourceOffset,
    SourcePartition,
    SpoolExtent,
    incomplete,
    offset_log_end,
    plan_latest,
    plan_ranges,
    split_budget,
    total,
)

partition_ids = st.sampled_from([str(i) for i in range(40)])
positions = st.builds(PartitionPosition, st.integers(0, 50), st.integers(0, 10**12), st.integers(0, 10**12))


@given(st.integers(0, 10**6), st.dictionaries(partition_ids, positions, max_size=20))
def test_offset_json_is_canonical_and_round_trips(
    generation: int, parts: dict[str, PartitionPosition]
) -> None:
    offset = SourceOffset(generation, parts)
    document = offset.to_json()
    # Spark compares json.dumps(offset) strings: our order must be the sorted one.
    assert json.dumps(document) == json.dumps(document, sort_keys=True)
    assert SourceOffset.from_json(json.loads(json.dumps(document))) == offset
    # Equal content built in another insertion order gives the same string.
    reordered = SourceOffset(generation, dict(reversed(list(parts.items()))))
    assert json.dumps(reordered.to_json()) == json.dumps(document)


def test_a_batchs_end_offset_is_read_from_its_entry_of_sparks_offset_log() -> None:
    end = SourceOffset(3, {"0": PartitionPosition(1, 0, 300)})
    metadata = '{"batchWatermarkMs":0,"batchTimestampMs":1}'
    assert offset_log_end(f"v1\n{metadata}\n{json.dumps(end.to_json())}") == end
    assert offset_log_end(None) is None  # no entry
    assert offset_log_end(f"v1\n{metadata}") is None  # no source's line
    assert offset_log_end(f"x\n{metadata}\n{json.dumps(end.to_json())}") is None  # not an offset log


@pytest.mark.parametrize(
    "document",
    [
        {"g": 1, "p": {}},
        {"v": 2, "g": 1, "p": {}},
        {"v": 1, "p": {}},
        {"v": 1, "g": 1, "p": {"0": {"e": 1, "s": 4}}},
    ],
)
def test_foreign_offsets_are_refused(document: dict[str, object]) -> None:
    with pytest.raises(OffsetError):
        SourceOffset.from_json(document)


@given(st.dictionaries(partition_ids, st.integers(-5, 10_000), max_size=16), st.integers(0, 50_000))
def test_split_budget_never_exceeds_the_limit_or_what_is_available(
    available: dict[str, int], limit: int
) -> None:
    granted = split_budget(available, limit)
    assert set(granted) == set(available)
    assert sum(granted.values()) <= limit
    for p, n in granted.items():
        assert 0 <= n <= max(0, available[p])
    wanted = sum(max(0, n) for n in available.values())
    # Water filling uses the whole budget when there is enough to read.
    assert sum(granted.values()) == min(limit, wanted)
    # Fair: a partition short of what it wants got at least as much as any other.
    short = [p for p in granted if granted[p] < max(0, available[p])]
    for p in short:
        assert granted[p] >= max(granted.values()) - 1


def test_split_budget_gives_unused_share_to_the_others() -> None:
    assert split_budget({"0": 5, "1": 100, "2": 100}, 65) == {"0": 5, "1": 30, "2": 30}
    assert split_budget({"0": 10, "1": 10}, None) == {"0": 10, "1": 10}
    assert split_budget({"0": 3, "1": 3, "2": 3}, 7) == {"0": 3, "1": 2, "2": 2}


def owned(**levels: int) -> dict[str, SourcePartition]:
    return {p.removeprefix("p"): SourcePartition(level) for p, level in levels.items()}


def at(level: int, first: int, next_sequence: int | None = None) -> PartitionPosition:
    return PartitionPosition(level, first, first if next_sequence is None else next_sequence)


def test_a_new_epoch_is_read_in_the_batch_that_brings_it_in() -> None:
    ownership = {"0": SourcePartition(3, next_sequence=100), "1": SourcePartition(1)}
    spooled = {"0": SpoolExtent(100, 150), "1": SpoolExtent(7, 20)}
    first = plan_latest(None, 1, ownership, spooled, max_rows=1000)
    assert first.partitions == {"0": at(3, 100, 150), "1": at(1, 7, 20)}
    ranges = plan_ranges(None, first)
    assert [(r.partition, r.start, r.end) for r in ranges] == [("0", 100, 150), ("1", 7, 20)]
    # No new data: exactly the same offset, so Spark runs no batch.
    again = plan_latest(first, 1, ownership, spooled, 1000)
    assert json.dumps(again.to_json()) == json.dumps(first.to_json())
    more = plan_latest(first, 1, ownership, {"0": SpoolExtent(100, 180), "1": SpoolExtent(7, 20)}, 1000)
    assert [(r.partition, r.start, r.end) for r in plan_ranges(first, more)] == [("0", 150, 180)]


def test_a_new_epoch_waits_for_its_first_events() -> None:
    # Nothing spooled yet: the offset does not change, so a claim alone runs no empty batch.
    start = SourceOffset(1, {})
    assert plan_latest(start, 1, {"4": SourcePartition(2), "5": SourcePartition(1, 10)}, {}, None) == start


def test_admission_control_splits_the_limit() -> None:
    start = SourceOffset(1, {"0": at(1, 0), "1": at(1, 0)})
    end = plan_latest(start, 1, owned(p0=1, p1=1), {"0": SpoolExtent(0, 1000), "1": SpoolExtent(0, 10)}, 100)
    assert end.partitions["0"].next_sequence == 90
    assert end.partitions["1"].next_sequence == 10
    assert total(plan_ranges(start, end)) == 100


def test_draining_and_released_partitions_leave_the_offset_and_are_not_read() -> None:
    start = SourceOffset(1, {"0": at(1, 0, 10), "1": at(1, 0, 10)})
    ownership = {"0": SourcePartition(1, draining=True)}
    end = plan_latest(start, 2, ownership, {"0": SpoolExtent(0, 50), "1": SpoolExtent(0, 50)}, None)
    assert end == SourceOffset(2, {})
    assert plan_ranges(start, end) == []


def test_a_regained_partition_resumes_at_the_handed_over_position_not_a_stale_offset() -> None:
    start = SourceOffset(1, {"0": at(1, 0, 500)})
    ownership = {"0": SourcePartition(2, next_sequence=420)}
    end = plan_latest(start, 2, ownership, {"0": SpoolExtent(420, 600)}, None)
    assert end.partitions["0"] == at(2, 420, 600)
    assert [(r.owner_level, r.start, r.end) for r in plan_ranges(start, end)] == [(2, 420, 600)]


def test_an_ownership_change_alone_changes_the_offset() -> None:
    start = SourceOffset(1, {"0": at(1, 0, 10)})
    end = plan_latest(start, 2, owned(p0=1), {"0": SpoolExtent(0, 10)}, None)
    assert end != start and end.ownership_version == 2
    assert plan_ranges(start, end) == []


def test_a_batch_is_complete_when_it_holds_every_event_its_plan_read() -> None:
    planned = [ReadRange("0", 1, 100, 150), ReadRange("3", 2, 0, 10)]
    nothing_expired = lambda r: 0  # noqa: E731
    whole = {"0": Found(100, 149, 50), "3": Found(0, 9, 10)}
    assert incomplete(planned, whole, nothing_expired) is None
    # 427 and 443-492 of a range missing (the loss that was found): refused, naming what it holds
    holed = {"0": Found(100, 149, 49), "3": Found(0, 9, 10)}
    assert incomplete(planned, holed, nothing_expired) == (
        "partition 0: the plan read 50 events, sequence numbers 100 to 149; "
        "the batch holds 49, from 100 to 149"
    )
    assert incomplete(planned, {"0": Found(100, 149, 50)}, nothing_expired) is not None  # 3 missing
    assert incomplete(planned, {**whole, "5": Found(0, 0, 1)}, nothing_expired) is not None
    assert incomplete(planned, {**whole, "0": Found(100, 150, 50)}, nothing_expired) is not None
    # events that expired from the hub before they were read are no hole
    twenty_expired = lambda r: 20 if r.partition == "0" else 0  # noqa: E731
    assert incomplete(planned, {**whole, "0": Found(120, 149, 30)}, twenty_expired) is None
    assert incomplete(planned, {**whole, "0": Found(120, 149, 29)}, twenty_expired) is not None
    assert incomplete([], {}, nothing_expired) is None
