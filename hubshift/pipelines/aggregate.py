"""The `aggregate` pipeline: home-security events counted per home and sensor type per time window.

Each micro-batch yields *partial* counts keyed by (window, home, sensor type, partition): how many of this
batch's events fell in that tumbling window. A window's total is the sum of its partials, so it stays
exact whichever consumer read which part of it. When a partition moves gracefully mid-window, the old
owner's partials cover the events up to its final checkpoint and the new owner's start right after it:
nothing is counted twice. (`aggregate_view` also removes the overlap a crash leaves behind.)

Rows (JSON lines under `aggregates/window=<yyyymmddThhmmssZ>/`):

    {"windowStart": "2026-11-21T10:00:00.000Z", "windowEnd": "2026-11-21T10:01:00.000Z",
     "homeId": "h000042", "sensorType": "motion", "partition": "3", "count": 4,
     "lastEventTime": "2026-11-21T10:00:41.207Z"}

Each Spark task reads its own events' bodies and counts them with Arrow (`process_task`; the bodies with
`bodies.read_bodies`, in C++ for the well-formed ones, `events.parse_event` for the rest): the partition key
is the home, so one home's events are all in one Event Hubs partition, hence in one task, and no shuffle is
needed. Spark's JVM only hands the event rows over: parsing in the JVM (`from_json`, two timestamp parses,
the dead-letter JSON) and one more row-to-Arrow conversion cost it ~3 us of CPU per event, Arrow reads the
bodies in under one. Events that cannot be read (not JSON, a required field missing, a bad
`eventTime`) become dead letters with the reason; events of other sensor or event types than the manifest
asks for are skipped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import Field

from hubshift.pipelines import sensor_events as ev
from hubshift.pipelines.base import DEAD_LETTER_LINE, BuildContext, PipelineKind, TaskResult
from hubshift.pipelines.bodies import EVENT_TIME_US, REASON, read_bodies
from hubshift.sinks.base import dead_letter_text
from hubshift.spec import Model

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

OUTPUT = "aggregates"
WINDOW_DIRECTORY = "window"
_WINDOW = "window_start"  # epoch seconds; null when the event is not counted
_EVENT_TIME_US = "event_time_us"


class AggregateSpec(Model):
    """Home-security events counted per home and sensor type per time window."""

    window_seconds: int = Field(default=60, ge=1, description="Tumbling window length.")
    sensor_types: list[str] = Field(
        default_factory=list, description="Keep only these sensor types (empty: all)."
    )
    event_types: list[str] = Field(
        default_factory=list, description="Keep only these event types (empty: all)."
    )


class AggregatePipeline:
    name = "aggregate"

    def __init__(
        self, window_seconds: int = 60, sensor_types: Sequence[str] = (), event_types: Sequence[str] = ()
    ) -> None:
        if window_seconds < 1:
            raise ValueError("window_seconds must be at least 1")
        self.window_seconds = window_seconds
        self.sensor_types = tuple(sensor_types)
        self.event_types = tuple(event_types)

    @classmethod
    def from_spec(cls, spec: AggregateSpec) -> AggregatePipeline:
        return cls(spec.window_seconds, spec.sensor_types, spec.event_types)

    def prepare(self, events: DataFrame) -> DataFrame:
        """The event rows as they are: each task reads the bodies itself (`process_task`), and a dead
        letter carries the event's coordinates, key, properties and body."""
        return events

    def prepare_rows(self, rows: pa.Table) -> pa.Table:
        """Per event: its coordinates, home, sensor type, window (null when not counted), the event time
        and, for a bad event, its dead-letter line (`parse_event`'s reason for every body)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        read = read_bodies(rows.column("body"))
        micros = read.column(EVENT_TIME_US)
        counted = pc.is_valid(micros)
        if self.sensor_types:
            counted = pc.and_(counted, pc.is_in(read.column(ev.SENSOR_TYPE), pa.array(self.sensor_types)))
        if self.event_types:
            counted = pc.and_(counted, pc.is_in(read.column(ev.EVENT_TYPE), pa.array(self.event_types)))
        counted = pc.fill_null(counted, False)
        width = self.window_seconds
        # Floor division (times before 1970 too), in whole seconds of the window's start.
        starts = np.floor_divide(pc.fill_null(micros, 0).to_numpy(), width * 1_000_000) * width
        window = pa.array(starts, pa.int64(), mask=~counted.to_numpy(zero_copy_only=False))
        reasons = read.column(REASON)
        return pa.table(
            {
                "partition": rows.column("partition"),
                "sequence_number": rows.column("sequence_number"),
                "offset": rows.column("offset"),
                "enqueued_time": rows.column("enqueued_time"),
                ev.HOME_ID: read.column(ev.HOME_ID),
                ev.SENSOR_TYPE: read.column(ev.SENSOR_TYPE),
                _WINDOW: window,
                _EVENT_TIME_US: micros,
                DEAD_LETTER_LINE: _dead_letter_lines(rows, reasons),
            }
        )

    def process_task(self, rows: pa.Table) -> TaskResult:
        """Partial counts of this task's event rows, one group of lines per window."""
        return count_prepared(self.prepare_rows(rows), self.window_seconds)


def count_prepared(rows: pa.Table, width: int) -> TaskResult:
    """The lines of `prepare_rows`'s rows: their dead letters, and per window the counts per home, sensor
    type and partition."""
    import pyarrow.compute as pc

    result = TaskResult(dead_letters=rows.column(DEAD_LETTER_LINE).drop_null().to_pylist())
    good = rows.filter(pc.is_valid(rows.column(_WINDOW)))
    if good.num_rows == 0:
        return result
    counts = good.group_by([_WINDOW, ev.HOME_ID, ev.SENSOR_TYPE, "partition"]).aggregate(
        [(_EVENT_TIME_US, "count"), (_EVENT_TIME_US, "max")]
    )
    lines = _count_lines(counts, width)
    starts = counts.column(_WINDOW)
    windows = pc.unique(starts).to_pylist()
    for start in windows:
        chosen = lines if len(windows) == 1 else lines.filter(pc.equal(starts, start))
        result.outputs[(OUTPUT, f"{WINDOW_DIRECTORY}={_stamp(start)}")] = chosen.to_pylist()
    return result


def _dead_letter_lines(rows: pa.Table, reasons: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The dead-letter line of each event with a reason (null for the others)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    bad = pc.is_valid(reasons)
    if not pc.any(bad).as_py():
        return pa.nulls(rows.num_rows, pa.string())
    where = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
    picked = pa.array(where)
    chosen = zip(where.tolist(), rows.take(picked).to_pylist(), reasons.take(picked).to_pylist(), strict=True)
    lines: list[str | None] = [None] * rows.num_rows
    for index, row, reason in chosen:
        lines[index] = dead_letter_text(row, reason)
    return pa.array(lines, pa.string())


def _count_lines(counts: pa.Table, width: int) -> pa.Array:
    """The JSON line of each count, built column-wise by Arrow (no Python loop per row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text_columns = [counts.column(name) for name in (ev.HOME_ID, ev.SENSOR_TYPE, "partition")]
    if any(pc.any(pc.match_substring_regex(column, _NEEDS_ESCAPING)).as_py() for column in text_columns):
        return _count_lines_escaped(counts, width)
    starts = counts.column(_WINDOW)
    # A batch touches few windows: format each once, then pick per row.
    windows = pc.unique(starts)
    where = pc.index_in(starts, value_set=windows)
    window_start = pa.array([_iso_seconds(w) for w in windows.to_pylist()], pa.string()).take(where)
    window_end = pa.array([_iso_seconds(w + width) for w in windows.to_pylist()], pa.string()).take(where)
    last = pc.cast(
        pc.cast(counts.column(f"{_EVENT_TIME_US}_max"), pa.timestamp("us", "UTC")),
        pa.timestamp("ms", "UTC"),
        safe=False,
    )
    home, sensor_type, partition = text_columns
    return pc.binary_join_element_wise(
        '{"windowStart":"',
        window_start,
        '","windowEnd":"',
        window_end,
        '","homeId":"',
        home,
        '","sensorType":"',
        sensor_type,
        '","partition":"',
        partition,
        '","count":',
        pc.cast(counts.column(f"{_EVENT_TIME_US}_count"), pa.string()),
        ',"lastEventTime":"',
        pc.strftime(last, format="%Y-%m-%dT%H:%M:%SZ"),
        '"}',
        "",
    )


# Text that JSON must escape: then the lines are built one by one.
_NEEDS_ESCAPING = r'["\\\x00-\x1f]'


def _count_lines_escaped(counts: pa.Table, width: int) -> pa.Array:
    import pyarrow as pa

    lines = [
        json.dumps(
            {
                "windowStart": _iso_seconds(start),
                "windowEnd": _iso_seconds(start + width),
                "homeId": home,
                "sensorType": sensor_type,
                "partition": partition,
                "count": count,
                "lastEventTime": _iso_micros(last),
            },
            separators=(",", ":"),
        )
        for start, home, sensor_type, partition, count, last in zip(
            counts.column(_WINDOW).to_pylist(),
            counts.column(ev.HOME_ID).to_pylist(),
            counts.column(ev.SENSOR_TYPE).to_pylist(),
            counts.column("partition").to_pylist(),
            counts.column(f"{_EVENT_TIME_US}_count").to_pylist(),
            counts.column(f"{_EVENT_TIME_US}_max").to_pylist(),
            strict=True,
        )
    ]
    return pa.array(lines, pa.string())


def _stamp(epoch_seconds: int) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch_seconds))


def _iso_seconds(epoch_seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(epoch_seconds))


def _iso_micros(micros: int) -> str:
    seconds, rest = divmod(micros, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:03d}Z"


def _build(block: AggregateSpec, context: BuildContext) -> AggregatePipeline:
    return AggregatePipeline.from_spec(block)


PIPELINE = PipelineKind[AggregateSpec](
    name="aggregate",
    annotation=AggregateSpec,
    field=Field(default_factory=AggregateSpec),
    build=_build,
)
