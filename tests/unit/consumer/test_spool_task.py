"""A task pipeline's batch read from the spool by its own task (`SpoolTask`) is the batch the source's
`read()` gives Spark: the same rows, ranges and lines; a range with a segment gone fails alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

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
    for first in (0, 100, 200):
        spool.write_segment(tmp_path, "0", 3, events("0", first, 100 if first < 200 else 60))
    spool.write_segment(tmp_path, "5", 1, events("5", 40, 60))
    ranges = [ReadRange("0", 3, 50, 260), ReadRange("5", 1, 40, 90)]

    through_spark, ours = Keeping(), Keeping()
    expected = list(BatchTask(Counting(), through_spark)(source_read(tmp_path, ranges)))
    got = list(SpoolTask(str(tmp_path), BatchTask(Counting(), ours))(iter([ranges_batch(ranges)])))

    assert got == expected
    assert ours.lines == through_spark.lines
    assert ours.lines[0] == "0:50" and ours.lines[-1] == "5:89" and len(ours.lines) == 210 + 50
    reported = {row["partition"]: row for row in got[0].to_pylist() if row["kind"] == "range"}
    assert {p: (r["first_sequence"], r["last_sequence"], r["events"]) for p, r in reported.items()} == {
        "0": (50, 259, 210),
        "5": (40, 89, 50),
    }


def test_a_batch_whose_segments_are_gone_fails_in_its_task(tmp_path: Path) -> None:
    for first in (0, 10, 20):
        spool.write_segment(tmp_path, "1", 1, events("1", first, 10))
    next(p for p in (tmp_path / "1" / "1").iterdir() if p.name.startswith("00000000000000000010")).unlink()
    ours = Keeping()
    with pytest.raises(spool.SpoolGap, match="10 to 29"):
        list(
            SpoolTask(str(tmp_path), BatchTask(Counting(), ours))(
                iter([ranges_batch([ReadRange("1", 1, 0, 30)])])
            )
        )
    with pytest.raises(spool.SpoolGap):
        list(
            SpoolTask(str(tmp_path), BatchTask(Counting(), Keeping()))(
                iter([ranges_batch([ReadRange("2", 1, 0, 5)])])
            )
        )
    assert ours.lines == []  # nothing of the batch was written
