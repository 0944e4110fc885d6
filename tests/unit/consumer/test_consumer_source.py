"""The streaming source's driver-side methods, called as Spark's source runner calls them: the initial
offset reads nothing, the read limit is obeyed (and `ReadAllAvailable` overrides it), ranges and `read()`."""

from __future__ import annotations

import datetime as dt
import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from hubshift.consumer.spark import spool
from hubshift.consumer.spark.offsets import SourcePartition
from hubshift.consumer.spark.ownership_file import OwnershipView, write_ownership
from hubshift.consumer.spark.source import EventHubsDataSource, EventHubsStreamReader, EventRange
from hubshift.eventhubs.rows import EVENT_ARROW_SCHEMA, RECEIVED_ARROW_SCHEMA


def fill(scratch: Path, partition: str, level: int, first: int, count: int) -> None:
    rows = {
        "partition": [partition] * count,
        "sequence_number": list(range(first, first + count)),
        "offset": [str(n) for n in range(first, first + count)],
        "enqueued_time": [dt.datetime(2026, 11, 21, tzinfo=dt.UTC)] * count,
        "partition_key": ["k"] * count,
        "body": [b"{}"] * count,
        "properties": [None] * count,
    }
    batch = pa.RecordBatch.from_pydict(rows, schema=EVENT_ARROW_SCHEMA)
    spool.write_segment(scratch / "spool", partition, level, batch)


def runner_round_trip(document: dict[str, object]) -> dict[str, object]:
    """What crossing to the JVM and back does to an offset."""
    decoded: dict[str, object] = json.loads(json.dumps(document))
    return decoded


def test_the_source_reads_what_it_owns_within_the_limit(tmp_path: Path) -> None:
    write_ownership(tmp_path, OwnershipView(1, {"0": SourcePartition(1, 0), "1": SourcePartition(2, 5)}))
    fill(tmp_path, "0", 1, 0, 30)
    fill(tmp_path, "1", 2, 5, 10)
    reader = EventHubsStreamReader({"scratch": str(tmp_path), "maxEventsPerTrigger": "20"})
    pickle.dumps(reader)  # Spark pickles it: plain options only
    assert reader.getDefaultReadLimit() == ReadMaxRows(20)

    initial = runner_round_trip(reader.initialOffset())
    # Spark never reads what lies before the initial offset: it must not have advanced.
    assert initial["p"] == {"0": {"e": 1, "f": 0, "s": 0}, "1": {"e": 2, "f": 5, "s": 5}}
    end = runner_round_trip(reader.latestOffset(initial, ReadMaxRows(20)))
    ranges = reader.partitions(initial, end)
    assert [(r.partition, r.start, r.end) for r in ranges] == [("0", 0, 10), ("1", 5, 15)]
    rows = [
        n for r in ranges for b in reader.read(pickle.loads(pickle.dumps(r))) for n in b.column(1).to_pylist()
    ]
    assert rows == [*range(10), *range(5, 15)]

    everything = runner_round_trip(reader.latestOffset(end, ReadAllAvailable()))
    assert [(r.partition, r.start, r.end) for r in reader.partitions(end, everything)] == [("0", 10, 30)]
    assert reader.latestOffset(everything, ReadMaxRows(20)) == everything
    assert reader.partitions(everything, everything) == []


def test_a_read_of_a_range_the_spool_no_longer_holds_fails(tmp_path: Path) -> None:
    fill(tmp_path, "3", 1, 0, 10)
    reader = EventHubsStreamReader({"scratch": str(tmp_path)})
    spool.remove_epoch(tmp_path / "spool", "3", 1)
    with pytest.raises(spool.SpoolGap, match="0 to 9"):
        list(reader.read(EventRange(str(tmp_path / "spool"), "3", 1, 0, 10)))


def test_the_system_properties_column_is_read_only_when_asked_for(tmp_path: Path) -> None:
    """A segment spooled before the system properties were kept (the event schema alone) and one with them
    (the received schema) are read in one range: without the option the batches are in the event schema;
    with it the column comes along, empty for the older segment."""
    write_ownership(tmp_path, OwnershipView(1, {"0": SourcePartition(1, 0)}))
    fill(tmp_path, "0", 1, 0, 3)
    newer = pa.RecordBatch.from_pylist(
        [
            {
                "partition": "0",
                "sequence_number": n,
                "offset": str(n),
                "enqueued_time": dt.datetime(2026, 11, 21, tzinfo=dt.UTC),
                "partition_key": None,
                "body": b"{}",
                "properties": None,
                "system_properties": [("message-id", f"m{n}")],
            }
            for n in range(3, 5)
        ],
        schema=RECEIVED_ARROW_SCHEMA,
    )
    spool.write_segment(tmp_path / "spool", "0", 1, newer, after=3)

    def read(options: dict[str, str]) -> list[pa.RecordBatch]:
        reader = EventHubsStreamReader({"scratch": str(tmp_path), **options})
        initial = reader.initialOffset()
        (whole,) = reader.partitions(initial, reader.latestOffset(initial, ReadAllAvailable()))
        return list(reader.read(pickle.loads(pickle.dumps(whole))))

    plain = read({})
    assert all(batch.schema.equals(EVENT_ARROW_SCHEMA) for batch in plain)
    assert [n for batch in plain for n in batch.column("sequence_number").to_pylist()] == [0, 1, 2, 3, 4]
    (batch,) = read({"includeSystemProperties": "true"})
    assert batch.schema.equals(RECEIVED_ARROW_SCHEMA)
    found = [None if v is None else dict(v) for v in batch.column("system_properties").to_pylist()]
    assert found == [None, None, None, {"message-id": "m3"}, {"message-id": "m4"}]
    assert (
        EventHubsDataSource({"includeSystemProperties": "true"})
        .schema()
        .endswith("system_properties map<string,string>")
    )
    assert "system_properties" not in EventHubsDataSource({}).schema()
