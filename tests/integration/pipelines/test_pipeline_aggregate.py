"""The aggregate pipeline on real PySpark: counts per home, sensor type and window; dead letters with the
reason; filters; exact totals when a window is split between batches and consumers."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hubshift.consumer.spark.batch import process_batch
from hubshift.pipelines import sensor_events as ev
from hubshift.pipelines.aggregate import AggregatePipeline
from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.pipelines.sensor_events import SensorEvent
from hubshift.sinks import FileSink, FolderStore
from tests.fixtures.spark import event_row

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def sensor(home: str, sensor_type: str, event_type: str, seconds: float) -> bytes:
    return SensorEvent(home, f"{home}-s1", sensor_type, event_type, T0 + timedelta(seconds=seconds)).to_json()


def folder_sink(root: Path) -> FileSink:
    return FileSink(FolderStore(root), FolderStore(root / "dead-letter"))


def read_lines(root: Path, pattern: str) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(root.glob(pattern)) for line in path.read_text().splitlines()]


def test_counts_per_home_sensor_type_and_window(event_frame: Callable[..., Any], tmp_path: Path) -> None:
    rows = [
        event_row("0", 1, sensor("h1", "motion", "detected", 1), partition_key="h1"),
        event_row("0", 2, sensor("h1", "motion", "detected", 59.9), partition_key="h1"),
        event_row("0", 3, sensor("h1", "motion", "detected", 60), partition_key="h1"),
        event_row("0", 4, sensor("h1", "door", "open", 5), partition_key="h1"),
        event_row("1", 7, sensor("h2", "motion", "detected", 10), partition_key="h2"),
    ]
    sink = folder_sink(tmp_path)
    summary = process_batch(event_frame(rows), 0, "homes-0", AggregatePipeline(60), sink)

    assert summary.events == 5
    assert summary.partitions["0"].first_sequence_number == 1
    assert summary.partitions["0"].last_sequence_number == 4
    assert summary.partitions["0"].last_offset == "400"
    assert summary.partitions["1"].events == 1
    assert summary.dead_letters == 0
    assert summary.outputs == {"aggregates": 4}

    lines = read_lines(tmp_path, "aggregates/window=*/*.jsonl")
    counts = {(r["windowStart"], r["homeId"], r["sensorType"]): r["count"] for r in lines}
    assert counts == {
        ("2026-11-21T10:00:00.000Z", "h1", "motion"): 2,
        ("2026-11-21T10:01:00.000Z", "h1", "motion"): 1,
        ("2026-11-21T10:00:00.000Z", "h1", "door"): 1,
        ("2026-11-21T10:00:00.000Z", "h2", "motion"): 1,
    }
    first = next(r for r in lines if r["homeId"] == "h1" and r["count"] == 2)
    assert first["windowEnd"] == "2026-11-21T10:01:00.000Z"
    assert first["lastEventTime"] == "2026-11-21T10:00:59.900Z"
    assert first["partition"] == "0"
    windows = sorted(p.name for p in (tmp_path / "aggregates").iterdir())
    assert windows == ["window=20261121T100000Z", "window=20261121T100100Z"]
    assert len(list((tmp_path / "_batches").iterdir())) == 1


def test_dead_letters_carry_the_reason_and_never_stop_the_batch(
    event_frame: Callable[..., Any], tmp_path: Path
) -> None:
    good = sensor("h1", "motion", "detected", 1)
    bodies: Sequence[tuple[bytes | None, str]] = [
        (b"not json", ev.REASON_NOT_JSON_OBJECT),
        (b"[1, 2]", ev.REASON_NOT_JSON_OBJECT),
        (b"\xff\xfe{}", ev.REASON_NOT_JSON_OBJECT),
        (b"", ev.REASON_EMPTY),
        (None, ev.REASON_EMPTY),
        (
            b'{"sensorType":"motion","eventType":"detected","eventTime":"2026-11-21T10:00:00Z"}',
            "homeId is missing",
        ),
        (
            b'{"homeId":"","sensorType":"motion","eventType":"x","eventTime":"2026-11-21T10:00:00Z"}',
            "homeId is missing",
        ),
        (b'{"homeId":"h1","eventType":"x","eventTime":"2026-11-21T10:00:00Z"}', "sensorType is missing"),
        (b'{"homeId":"h1","sensorType":"motion","eventTime":"2026-11-21T10:00:00Z"}', "eventType is missing"),
        (b'{"homeId":"h1","sensorType":"motion","eventType":"x"}', ev.REASON_EVENT_TIME),
        (
            b'{"homeId":"h1","sensorType":"motion","eventType":"x","eventTime":"yesterday"}',
            ev.REASON_EVENT_TIME,
        ),
        (
            b'{"homeId":"h1","sensorType":"motion","eventType":"x","eventTime":1700000000}',
            ev.REASON_EVENT_TIME,
        ),
    ]
    rows = [event_row("2", 10 + i, body, partition_key="k") for i, (body, _) in enumerate(bodies)]
    rows.append(event_row("2", 100, good, partition_key="h1"))
    sink = folder_sink(tmp_path)
    summary = process_batch(event_frame(rows), 3, "homes-1", AggregatePipeline(60), sink)

    assert summary.events == len(bodies) + 1
    assert summary.partitions["2"].last_sequence_number == 100
    assert summary.dead_letters == len(bodies)
    assert summary.outputs == {"aggregates": 1}
    letters = sorted(
        read_lines(tmp_path / "dead-letter", "date=*/*.jsonl"), key=lambda r: r["sequenceNumber"]
    )
    assert [r["reason"] for r in letters] == [reason for _, reason in bodies]
    assert letters[0]["body"] == "not json"
    assert letters[0]["partition"] == "2"
    assert letters[0]["offset"] == "1000"
    assert letters[0]["partitionKey"] == "k"
    assert letters[0]["enqueuedTime"] == "2026-11-21T10:00:00.000Z"
    assert "bodyBase64" not in letters[0]
    assert letters[2]["bodyBase64"] == "//57fQ=="
    assert "body" not in letters[2]
    # Python's reading of a body gives the same reason as Spark's.
    for body, reason in bodies:
        with pytest.raises(ev.InvalidEvent) as error:
            ev.parse_event(body)
        assert error.value.reason == reason


def test_filters_keep_only_the_asked_sensor_and_event_types(
    event_frame: Callable[..., Any], tmp_path: Path
) -> None:
    rows = [
        event_row("0", 1, sensor("h1", "motion", "detected", 1)),
        event_row("0", 2, sensor("h1", "motion", "heartbeat", 2)),
        event_row("0", 3, sensor("h1", "door", "open", 3)),
        event_row("0", 4, sensor("h1", "smoke", "alarm", 4)),
    ]
    pipeline = AggregatePipeline(60, sensor_types=["motion", "door"], event_types=["detected", "open"])
    summary = process_batch(event_frame(rows), 0, "c", pipeline, folder_sink(tmp_path))
    assert summary.events == 4
    lines = read_lines(tmp_path, "aggregates/*/*.jsonl")
    assert sorted((r["sensorType"], r["count"]) for r in lines) == [("door", 1), ("motion", 1)]


def test_window_split_between_batches_and_consumers_sums_exactly(
    event_frame: Callable[..., Any], tmp_path: Path
) -> None:
    """Partition 0 moves from consumer A to B mid-window (graceful: B starts right after A's last
    checkpoint). The partials of both sum to the window's true count."""
    all_rows = [
        event_row("0", n, sensor(f"h{n % 3}", "motion", "detected", n * 0.5), partition_key=f"h{n % 3}")
        for n in range(40)
    ]
    sink_a, sink_b = folder_sink(tmp_path), folder_sink(tmp_path)
    process_batch(event_frame(all_rows[:15]), 0, "homes-0", AggregatePipeline(60), sink_a)
    process_batch(event_frame(all_rows[15:25]), 1, "homes-0", AggregatePipeline(60), sink_a)
    process_batch(event_frame(all_rows[25:]), 0, "homes-1", AggregatePipeline(60), sink_b)

    view = AggregateView(FolderStore(tmp_path))
    view.refresh()
    expected = Counter(f"h{n % 3}" for n in range(40))
    window = T0
    assert {home: view.count(window, home, "motion") for home in expected} == dict(expected)
    assert view.total() == 40


def test_a_partition_spread_over_several_tasks_still_sums_exactly(
    event_frame: Callable[..., Any], tmp_path: Path
) -> None:
    """The source gives one task per partition, but nothing relies on it: partials and ranges merge."""
    rows = [
        event_row(str(n % 2), n, sensor(f"h{n % 5}", "door", "open", n), partition_key=f"h{n % 5}")
        for n in range(50)
    ]
    frame = event_frame(rows).repartition(3)  # round-robin: each partition's events in every task
    summary = process_batch(frame, 0, "c", AggregatePipeline(3600), folder_sink(tmp_path))
    assert summary.partitions["0"].first_sequence_number == 0
    assert summary.partitions["0"].last_sequence_number == 48
    assert summary.partitions["0"].last_offset == "4800"
    assert summary.partitions["0"].events == 25
    assert summary.partitions["1"].last_sequence_number == 49
    view = AggregateView(FolderStore(tmp_path))
    view.refresh()
    assert {home: view.count(T0, home, "door") for home in ("h0", "h1", "h2", "h3", "h4")} == dict.fromkeys(
        ("h0", "h1", "h2", "h3", "h4"), 10
    )


def test_dead_letter_lines_built_in_python_are_spark_s(event_frame: Callable[..., Any]) -> None:
    """The task builds a dead letter in Python (`dead_letter_text`); the FramePipeline's sink builds it in
    Spark's JVM (`dead_letter_json`): the same line for the same event."""
    from pyspark.sql import functions as F

    from hubshift.sinks.base import dead_letter_json, dead_letter_text

    rows = [
        event_row("0", 1, b"not json", partition_key="k", properties={"a": "1", "b\u00e9": 'x"y\n'}),
        event_row("0", 2, b"\xff\xfe{}"),
        event_row("0", 3, b""),
        event_row("0", 4, None, enqueued_time=datetime(2026, 11, 21, 10, 0, 1, 234567, tzinfo=UTC)),
        event_row("0", 5, '{"homeId":"h\u00e9\U0001f600\\u0000\t"}'.encode()),
    ]
    frame = event_frame(rows)
    types = {f.name: f.dataType for f in frame.schema.fields}
    spark_lines = {
        r["sequence_number"]: r["line"]
        for r in frame.select(
            "sequence_number", dead_letter_json(types, F.lit("why")).alias("line")
        ).collect()
    }
    for row in frame.collect():
        python_line = dead_letter_text(row.asDict(), "why")
        assert python_line == spark_lines[row["sequence_number"]]
