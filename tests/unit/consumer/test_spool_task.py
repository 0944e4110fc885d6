"""A task pipeline's batch read from the spool by its own task (`SpoolTask`) is the batch the source's
`read()` gives Spark: the same rows, ranges and lines, segments gone with their epoch skipped alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from hubshift.consumer.spark import spool
from hubshift.consumer.spark.batch import BatchTask, SpoolTask
from hubshift.consumer.spark.offsets import ReadRange
from hubshift.pipelines.base import TaskResult
from tests.unit.consumer.test_consumer_spool import events


class Counting:
    """A task pipeline that writes one line per event: the sequence numbers it saw, in order."""

    name = "counting"

    def prepare(self, events: Any) -> Any:
        return events

    def process_task(self, rows: pa.Table) -> TaskResult:
        lines = [
            f"{p}:{s}"
            for p, s in zip(
                rows.column("partition").to_pylist(), rows.column("sequence_number").to_pylist(), strict=True
            )
        ]
        return TaskResult(outputs={"seen": lines})


class Keeping:
    """A task writer that keeps what it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, outputs: Any, dead_letters: list[str], task: int) -> list[Any]:
        for group in outputs.values():
            self.lines.extend(group)
        return []


def ranges_batch(ranges: list[ReadRange]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {"partition": r.partition, "owner_level": r.owner_level, "start": r.start, "end": r.end}
            for r in ranges
        ]
    )


def source_read(root: Path, ranges: list[ReadRange]) -> Iterator[pa.RecordBatch]:
    """What the source's `read()` gives Spark for these ranges, one input partition after the other."""
    for r in ranges:
        yield from spool.read_range(root, r.partition, r.owner_level, r.start, r.end)


def test_the_spool_task_sees_what_the_source_would_have_given_spark(tmp_path: Path) -> None:
    for first in (0, 100, 250):
        spool.write_segment(tmp_path, "0", 3, events("0", first, 100 if first < 250 else 50))
    spool.write_segment(tmp_path, "5", 1, events("5", 40, 60))
    spool.write_segment(tmp_path, "7", 2, events("7", 0, 10))
    spool.remove_epoch(tmp_path, "7", 2)  # stopped under the batch: read() skips what is gone
    ranges = [ReadRange("0", 3, 50, 260), ReadRange("5", 1, 40, 90), ReadRange("7", 2, 0, 10)]

    through_spark, ours = Keeping(), Keeping()
    expected = list(BatchTask(Counting(), through_spark)(source_read(tmp_path, ranges)))
    got = list(SpoolTask(str(tmp_path), BatchTask(Counting(), ours))(iter([ranges_batch(ranges)])))

    assert got == expected
    assert ours.lines == through_spark.lines
    assert ours.lines[0] == "0:50" and ours.lines[-1] == "5:89" and len(ours.lines) == 160 + 50
    reported = {row["partition"]: row for row in got[0].to_pylist() if row["kind"] == "range"}
    assert {p: (r["first_sequence"], r["last_sequence"], r["events"]) for p, r in reported.items()} == {
        "0": (50, 259, 160),  # 50-199 and 250-259: 200-249 was never received
        "5": (40, 89, 50),
    }


def test_a_batch_of_nothing_but_gone_segments_reports_nothing(tmp_path: Path) -> None:
    got = list(
        SpoolTask(str(tmp_path), BatchTask(Counting(), Keeping()))(
            iter([ranges_batch([ReadRange("1", 1, 0, 5)])])
        )
    )
    assert got == []
