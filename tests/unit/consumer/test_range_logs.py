"""Counting what SDK-engine consumers processed, and what they processed twice, from their range logs."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from hubshift.consumer.ranges import Costly, RangeLog
from hubshift.eventhubs.rows import EVENT_ARROW_SCHEMA
from tests.harness.ranges import (
    count_replays,
    event_latencies,
    handoff_gaps,
    percentile,
    read_range_logs,
    worst_wait,
)


def test_overlaps_count_as_replays_per_partition() -> None:
    lines = [
        {"partition": "0", "first": 0, "last": 9},
        {"partition": "0", "first": 5, "last": 14},  # 5..9 again: 5 replays
        {"partition": "0", "first": 20, "last": 20},  # a gap is not a replay
        {"partition": "1", "first": 0, "last": 0},
    ]
    assert count_replays(lines) == (17, 5)


def test_logs_are_read_across_consumers_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "c-0.jsonl").write_text(json.dumps({"partition": "0", "first": 0, "last": 3}) + "\n")
    (tmp_path / "c-1.jsonl").write_text(
        json.dumps({"partition": "0", "first": 4, "last": 7}) + '\n{"partition": "0", "fir'
    )
    lines = read_range_logs(tmp_path)
    assert len(lines) == 2
    assert count_replays(lines) == (8, 0)


def test_a_batch_line_says_when_its_first_event_was_enqueued(tmp_path: Path) -> None:
    enqueued = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    columns = {
        "partition": ["3", "3"],
        "sequence_number": [7, 8],
        "offset": ["70", "80"],
        "enqueued_time": [enqueued, enqueued],
        "partition_key": [None, None],
        "body": [b"{}", b"{}"],
        "properties": [[], []],
    }
    batch = pa.RecordBatch.from_pydict(columns, schema=EVENT_ARROW_SCHEMA)
    RangeLog(tmp_path / "c-0.jsonl", "c-0")("3", 2, batch)
    (line,) = read_range_logs(tmp_path)
    assert (line["first"], line["last"], line["ownerLevel"]) == (7, 8, 2)
    assert line["firstEnqueued"] == enqueued.timestamp()
    assert worst_wait([line], 0, float("inf")) == line["at"] - enqueued.timestamp()


def test_handoffs_are_the_gaps_where_a_partition_changes_owner() -> None:
    def batch(partition: str, consumer: str, level: int, at: float) -> dict[str, object]:
        return {
            "partition": partition,
            "consumer": consumer,
            "ownerLevel": level,
            "at": at,
            "firstEnqueued": at,
        }

    lines = [
        batch("0", "a", 1, 10.0),
        batch("0", "a", 1, 11.0),
        batch("0", "b", 2, 11.4),  # a -> b: 0.4 s unread
        batch("0", "b", 3, 13.0),  # b again, after a restart (a new owner level): 1.6 s
        batch("1", "a", 1, 5.0),
        batch("1", "a", 1, 12.0),  # the same owner: no handoff, however long the pause
    ]
    gaps = handoff_gaps(lines)
    assert [round(g, 1) for g in gaps] == [0.4, 1.6]
    assert [round(g, 1) for g in handoff_gaps(lines, since=12.0)] == [1.6]
    assert percentile(gaps, 0.5) == gaps[0] and percentile(gaps, 0.99) == gaps[1]
    assert percentile([], 0.5) is None


def test_a_line_says_when_the_batch_was_enqueued_and_costly_work_takes_its_time(tmp_path: Path) -> None:
    enqueued = [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (1, 2, 4)]
    batch = pa.record_batch(
        {
            "sequence_number": pa.array([7, 8, 9], pa.int64()),
            "enqueued_time": pa.array(enqueued, pa.timestamp("ms", tz="UTC")),
        }
    )
    log = RangeLog(tmp_path / "c-0.jsonl", "c-0")
    started = time.monotonic()
    Costly(log, 0.02)("3", 2, batch)
    assert time.monotonic() - started >= 0.06  # three events, 20 ms each
    (line,) = read_range_logs(tmp_path)
    assert (line["first"], line["last"], line["events"], line["ownerLevel"]) == (7, 9, 3, 2)
    assert (line["firstEnqueued"], line["lastEnqueued"]) == (enqueued[0].timestamp(), enqueued[2].timestamp())


def test_event_latencies_spread_a_batch_and_keep_each_events_first_processing() -> None:
    lines = [
        # events 0..4 enqueued 100.0..104.0, handled at 105: 5, 4, 3, 2, 1 s
        {"partition": "0", "first": 0, "last": 4, "firstEnqueued": 100.0, "lastEnqueued": 104.0, "at": 105.0},
        # 3..4 again later (a replay): their first processing counts
        {"partition": "0", "first": 3, "last": 4, "firstEnqueued": 103.0, "lastEnqueued": 104.0, "at": 110.0},
        # one event, enqueued after the window
        {"partition": "1", "first": 0, "last": 0, "firstEnqueued": 120.0, "lastEnqueued": 120.0, "at": 121.0},
        {"kind": "open", "partition": "2"},
    ]
    assert sorted(event_latencies(lines, 101.0, 120.0)) == [1.0, 2.0, 3.0, 4.0]
    assert event_latencies(lines, 0.0, 1.0) == []
