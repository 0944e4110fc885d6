"""The spool between the receivers and the streaming source, and the ownership file beside it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from hubshift.consumer.spark import spool
from hubshift.consumer.spark.offsets import SourcePartition, SpoolExtent
from hubshift.consumer.spark.ownership_file import EMPTY, OwnershipView, read_ownership, write_ownership
from hubshift.eventhubs.rows import EVENT_ARROW_SCHEMA


def events(partition: str, first: int, count: int) -> pa.RecordBatch:
    now = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    return pa.RecordBatch.from_pydict(
        {
            "partition": [partition] * count,
            "sequence_number": list(range(first, first + count)),
            "offset": [str(8 * n) for n in range(first, first + count)],
            "enqueued_time": [now] * count,
            "partition_key": ["home-1"] * count,
            "body": [b"{}"] * count,
            "properties": [[("k", "v")]] * count,
        },
        schema=EVENT_ARROW_SCHEMA,
    )


def test_arrow_schema_is_the_one_spark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        BinaryType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    kinds = {
        "string": StringType(),
        "bigint": LongType(),
        "timestamp": TimestampType(),
        "binary": BinaryType(),
        "map<string,string>": MapType(StringType(), StringType()),
    }
    from hubshift.eventhubs.rows import EVENT_COLUMNS

    spark_schema = StructType([StructField(name, kinds[kind]) for name, kind in EVENT_COLUMNS])
    assert to_arrow_schema(spark_schema, timezone="UTC").equals(EVENT_ARROW_SCHEMA)


def read(root: Path, start: int, end: int, partition: str = "3", level: int = 2) -> list[int]:
    batches = spool.read_range(root, partition, level, start, end)
    return [n for b in batches for n in b.column("sequence_number").to_pylist()]


def test_ranges_cross_segments_and_a_range_with_a_hole_fails_whole(tmp_path: Path) -> None:
    spool.write_segment(tmp_path, "3", 2, events("3", 0, 10))
    middle = spool.write_segment(tmp_path, "3", 2, events("3", 10, 10), after=10)
    last = spool.write_segment(tmp_path, "3", 2, events("3", 20, 5), after=20)
    assert spool.extent(tmp_path, "3", 2) == SpoolExtent(0, 25)
    assert spool.extent(tmp_path, "3", 1) is None
    assert read(tmp_path, 5, 22) == list(range(5, 22))
    assert read(tmp_path, 25, 25) == []
    with pytest.raises(spool.SpoolGap, match="25 to 29"):
        read(tmp_path, 25, 30)  # not spooled yet: never planned, and never handed on part of it

    # A segment gone under a read (a removal racing it, a lost file): the read fails, it never skips it.
    middle.path.unlink()
    assert spool.extent(tmp_path, "3", 2) == SpoolExtent(0, 10)  # what follows without a hole
    with pytest.raises(spool.SpoolGap, match="sequence numbers 10 to 21"):
        read(tmp_path, 5, 22)
    assert read(tmp_path, 2, 10) == list(range(2, 10))
    last.path.unlink()
    with pytest.raises(spool.SpoolGap):
        read(tmp_path, 18, 25)


def test_a_segment_that_does_not_follow_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    spool.write_segment(tmp_path, "0", 1, events("0", 0, 10))
    with pytest.raises(spool.SpoolGap, match="from sequence number 12"):
        spool.write_segment(tmp_path, "0", 1, events("0", 12, 5), after=10)
    holed = (
        pa.concat_tables(
            [pa.Table.from_batches([events("0", 10, 3)]), pa.Table.from_batches([events("0", 14, 3)])]
        )
        .combine_chunks()
        .to_batches()[0]
    )
    with pytest.raises(spool.SpoolGap, match="not contiguous"):
        spool.write_segment(tmp_path, "0", 1, holed, after=10)
    assert [s.first for s in spool.segments(tmp_path, "0", 1)] == [0]


def test_expired_events_are_accounted_for_without_rows(tmp_path: Path) -> None:
    # Asked from 100 on, the hub had only 130 and later: 100-129 expired before they were read.
    spool.write_expired(tmp_path, "4", 7, 100, 129)
    spool.write_segment(tmp_path, "4", 7, events("4", 130, 20), after=130)
    assert spool.extent(tmp_path, "4", 7) == SpoolExtent(100, 150)
    assert read(tmp_path, 100, 150, "4", 7) == list(range(130, 150))
    assert read(tmp_path, 110, 135, "4", 7) == list(range(130, 135))
    assert spool.expired_within(tmp_path, "4", 7, 110, 135) == 20
    assert spool.expired_within(tmp_path, "4", 7, 130, 150) == 0
    assert spool.trim(tmp_path, "4", 7, 140) == 1  # the stretch wholly before goes like a segment
    assert spool.extent(tmp_path, "4", 7) == SpoolExtent(130, 150)


def last_before(root: Path, partition: str, owner_level: int, next_sequence: int) -> tuple[str, int] | None:
    """The last spooled event before `next_sequence`: its offset and sequence number (None: there is none)."""
    held = spool.extent(root, partition, owner_level)
    if held is None or next_sequence <= held.first:
        return None
    spooled = [
        (str(offset), int(sequence))
        for batch in spool.read_range(root, partition, owner_level, held.first, next_sequence)
        for offset, sequence in zip(
            batch.column("offset").to_pylist(), batch.column("sequence_number").to_pylist(), strict=True
        )
    ]
    return spooled[-1] if spooled else None


def test_checkpoint_position_and_trimming(tmp_path: Path) -> None:
    for first in (0, 10, 20):
        spool.write_segment(tmp_path, "0", 1, events("0", first, 10))
    assert last_before(tmp_path, "0", 1, 15) == ("112", 14)
    assert last_before(tmp_path, "0", 1, 0) is None
    # Committed up to 20 (next): the segment holding event 19 stays, for the checkpoint's offset.
    assert spool.trim(tmp_path, "0", 1, 20) == 1
    assert last_before(tmp_path, "0", 1, 20) == ("152", 19)
    assert spool.extent(tmp_path, "0", 1) == SpoolExtent(10, 30)
    spool.remove_epoch(tmp_path, "0", 1)
    assert spool.extent(tmp_path, "0", 1) is None


def test_ownership_file_round_trip_and_absence(tmp_path: Path) -> None:
    assert read_ownership(tmp_path / "nothing") == EMPTY
    view = OwnershipView(7, {"10": SourcePartition(3, 41), "2": SourcePartition(1, None, draining=True)})
    write_ownership(tmp_path, view)
    assert read_ownership(tmp_path) == view
    assert [p.name for p in tmp_path.iterdir()] == ["ownership.json"]
