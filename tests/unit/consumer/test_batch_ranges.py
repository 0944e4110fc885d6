"""A task's partition ranges from Arrow rows, and merging the ranges of several tasks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa

from hubshift.consumer.spark.batch import merge_ranges, task_ranges
from hubshift.sinks.commits import PartitionRange

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def rows(partitions: list[str], sequences: list[int]) -> pa.Table:
    return pa.table(
        {
            "partition": partitions,
            "sequence_number": pa.array(sequences, pa.int64()),
            "offset": [str(s * 100) for s in sequences],
            "enqueued_time": pa.array(
                [T0 + timedelta(seconds=s) for s in sequences], pa.timestamp("us", "UTC")
            ),
        }
    )


def test_one_partition() -> None:
    (found,) = task_ranges(rows(["3"] * 4, [12, 10, 13, 11]))
    assert found == PartitionRange(
        "3", 10, 13, "1300", 4, T0 + timedelta(seconds=10), T0 + timedelta(seconds=13)
    )


def test_several_partitions_and_merging() -> None:
    first = task_ranges(rows(["0", "1", "0"], [5, 7, 6]))
    second = task_ranges(rows(["0"], [9]))
    merged = merge_ranges([*first, *second])
    assert merged["0"].first_sequence_number == 5
    assert merged["0"].last_sequence_number == 9
    assert merged["0"].last_offset == "900"
    assert merged["0"].events == 3
    assert merged["0"].last_enqueued_time == T0 + timedelta(seconds=9)
    assert merged["1"] == PartitionRange(
        "1", 7, 7, "700", 1, T0 + timedelta(seconds=7), T0 + timedelta(seconds=7)
    )
