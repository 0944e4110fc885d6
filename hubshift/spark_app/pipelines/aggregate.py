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

Spark parses and validates the bodies (`prepare`, in the JVM); each Spark task then counts its own rows
with Arrow (`process_task`): the partition key is the home, so one home's events are all in one Event Hubs
partition, hence in one task, and no shuffle is needed. Events that cannot be read (not JSON, a required
field missing, a bad `eventTime`) become dead letters with the reason; events of other sensor or event
types than the manifest asks for are skipped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hubshift.spark_app import events as ev
from hubshift.spark_app.pipelines.base import DEAD_LETTER_LINE, TaskResult
from hubshift.spec import AggregatePipeline as AggregateSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

OUTPUT = "aggregates"
WINDOW_DIRECTORY = "window"
_CORRUPT = "_corrupt_record"
_WINDOW = "window_start"  # epoch seconds; null when the event is not counted
_EVENT_TIME_US = "event_time_us"


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
        self._expressions: dict[tuple[str, ...], tuple[list[Column], list[Column]]] = {}

    @classmethod
    def from_spec(cls, spec: AggregateSpec) -> AggregatePipeline:
        return cls(spec.window_seconds, spec.sensor_types, spec.event_types)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to Spark's Python workers: the JVM expressions stay on the driver.
        return {**self.__dict__, "_expressions": {}}

    def prepare(self, events: DataFrame) -> DataFrame:
        """Per event: its coordinates, home, sensor type, window (null when not counted) and, for a bad
        event, its dead-letter line."""
        key = tuple(events.columns)
        expressions = self._expressions.get(key)
        if expressions is None:
            # Built once per batch schema: each expression is a round trip to the JVM.
            expressions = self._expressions[key] = self._build_expressions(events)
        parse, project = expressions
        return events.select(*parse).select(*project)

    def _build_expressions(self, events: DataFrame) -> tuple[list[Column], list[Column]]:
        from pyspark.sql import functions as F

        from hubshift.spark_app.sinks.base import dead_letter_json

        body = F.from_json(
            F.col("body").cast("string"),
            f"{ev.BODY_SCHEMA_DDL}, {_CORRUPT} string",
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT},
        )
        parse = [*(F.col(name) for name in events.columns), body.alias("_event")]
        field = {name: F.col(f"_event.{name}") for name in ev.REQUIRED_TEXT_FIELDS}
        event_time = _parse_event_time(F.col(f"_event.{ev.EVENT_TIME}"))
        reason = F.when(F.col("body").isNull() | (F.length("body") == 0), F.lit(ev.REASON_EMPTY)).when(
            F.col(f"_event.{_CORRUPT}").isNotNull(), F.lit(ev.REASON_NOT_JSON_OBJECT)
        )
        for name in ev.REQUIRED_TEXT_FIELDS:
            reason = reason.when(field[name].isNull() | (field[name] == ""), F.lit(ev.reason_missing(name)))
        reason = reason.when(event_time.isNull(), F.lit(ev.REASON_EVENT_TIME))
        counted = reason.isNull()
        if self.sensor_types:
            counted = counted & field[ev.SENSOR_TYPE].isin(list(self.sensor_types))
        if self.event_types:
            counted = counted & field[ev.EVENT_TYPE].isin(list(self.event_types))
        width = self.window_seconds
        window = F.floor(F.unix_micros(event_time) / F.lit(width * 1_000_000)) * F.lit(width)
        types = {f.name: f.dataType for f in events.schema.fields}
        project = [
            F.col("partition"),
            F.col("sequence_number"),
            F.col("offset"),
            F.col("enqueued_time"),
            field[ev.HOME_ID].alias(ev.HOME_ID),
            field[ev.SENSOR_TYPE].alias(ev.SENSOR_TYPE),
            F.when(counted, window).alias(_WINDOW),
            F.unix_micros(event_time).alias(_EVENT_TIME_US),
            F.when(reason.isNotNull(), dead_letter_json(types, reason)).alias(DEAD_LETTER_LINE),
        ]
        return parse, project

    def process_task(self, rows: pa.Table) -> TaskResult:
        """Partial counts of this task's rows, one group of lines per window."""
        import pyarrow.compute as pc

        result = TaskResult(dead_letters=rows.column(DEAD_LETTER_LINE).drop_null().to_pylist())
        good = rows.filter(pc.is_valid(rows.column(_WINDOW)))
        if good.num_rows == 0:
            return result
        counts = good.group_by([_WINDOW, ev.HOME_ID, ev.SENSOR_TYPE, "partition"]).aggregate(
            [(_EVENT_TIME_US, "count"), (_EVENT_TIME_US, "max")]
        )
        lines = _count_lines(counts, self.window_seconds)
        starts = counts.column(_WINDOW)
        windows = pc.unique(starts).to_pylist()
        for start in windows:
            chosen = lines if len(windows) == 1 else lines.filter(pc.equal(starts, start))
            result.outputs[(OUTPUT, f"{WINDOW_DIRECTORY}={_stamp(start)}")] = chosen.to_pylist()
        return result


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


def _parse_event_time(raw: Column) -> Column:
    """ISO 8601 text to a timestamp; without a zone it is UTC whatever the Spark session's time zone."""
    from pyspark.sql import functions as F

    zoned = F.try_to_timestamp(raw)
    unzoned = F.try_to_timestamp(F.concat(raw, F.lit("Z")))
    return F.when(~raw.rlike(ev.EVENT_TIME_PATTERN), F.lit(None).cast("timestamp")).otherwise(
        F.when(raw.rlike(ev.ZONED_PATTERN), zoned).otherwise(unzoned)
    )


def _stamp(epoch_seconds: int) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch_seconds))


def _iso_seconds(epoch_seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(epoch_seconds))


def _iso_micros(micros: int) -> str:
    seconds, rest = divmod(micros, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:03d}Z"
