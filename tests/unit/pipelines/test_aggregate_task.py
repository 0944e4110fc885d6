"""The aggregate's per-task counting on prepared Arrow rows (what each Spark task runs after reading the
bodies), without Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from hubshift.pipelines.aggregate import count_prepared

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def prepared(events: list[tuple[str, str, float | None, str | None]], width: int = 60) -> pa.Table:
    """(home, sensor type, seconds after T0 or None when not counted, dead-letter line)"""

    def micros(seconds: float) -> int:
        return (T0 + timedelta(seconds=seconds) - EPOCH) // timedelta(microseconds=1)

    return pa.table(
        {
            "partition": ["2"] * len(events),
            "sequence_number": pa.array(range(len(events)), pa.int64()),
            "offset": [str(n) for n in range(len(events))],
            "enqueued_time": pa.array([T0] * len(events), pa.timestamp("us", "UTC")),
            "homeId": [home for home, _, _, _ in events],
            "sensorType": [kind for _, kind, _, _ in events],
            "window_start": pa.array(
                [None if at is None else micros(at) // 1_000_000 // width * width for _, _, at, _ in events],
                pa.int64(),
            ),
            "event_time_us": pa.array(
                [None if at is None else micros(at) for _, _, at, _ in events], pa.int64()
            ),
            "dead_letter_line": [line for _, _, _, line in events],
        }
    )


@pytest.mark.parametrize("home", ["h1", 'h"1\\x'])
def test_counts_per_window_home_and_sensor_type(home: str) -> None:
    rows = prepared(
        [
            (home, "motion", 1.0, None),
            (home, "motion", 59.5, None),
            (home, "motion", 61.25, None),
            (home, "door", 2.0, None),
            (home, "door", None, None),  # filtered out
            ("", "", None, '{"reason":"body is empty"}'),
        ]
    )
    result = count_prepared(rows, 60)
    assert result.dead_letters == ['{"reason":"body is empty"}']
    assert set(result.outputs) == {
        ("aggregates", "window=20261121T100000Z"),
        ("aggregates", "window=20261121T100100Z"),
    }
    first = sorted(
        (json.loads(line) for line in result.outputs[("aggregates", "window=20261121T100000Z")]),
        key=lambda r: r["sensorType"],
    )
    assert first == [
        {
            "windowStart": "2026-11-21T10:00:00.000Z",
            "windowEnd": "2026-11-21T10:01:00.000Z",
            "homeId": home,
            "sensorType": "door",
            "partition": "2",
            "count": 1,
            "lastEventTime": "2026-11-21T10:00:02.000Z",
        },
        {
            "windowStart": "2026-11-21T10:00:00.000Z",
            "windowEnd": "2026-11-21T10:01:00.000Z",
            "homeId": home,
            "sensorType": "motion",
            "partition": "2",
            "count": 2,
            "lastEventTime": "2026-11-21T10:00:59.500Z",
        },
    ]
    (second,) = [json.loads(line) for line in result.outputs[("aggregates", "window=20261121T100100Z")]]
    assert (second["count"], second["lastEventTime"]) == (1, "2026-11-21T10:01:01.250Z")


def test_nothing_counted() -> None:
    result = count_prepared(prepared([("h", "door", None, None)]), 60)
    assert result.outputs == {} and result.dead_letters == []
