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

Events that cannot be read (not JSON, a required field missing, a bad `eventTime`) become dead letters with
the reason; events of other sensor or event types than the manifest asks for are skipped silently.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from hubshift.spark_app import events as ev
from hubshift.spark_app.pipelines.base import DEAD_LETTER_REASON, Output, PipelineResult
from hubshift.spec import AggregatePipeline as AggregateSpec

OUTPUT = "aggregates"
WINDOW_DIRECTORY = "window"
_CORRUPT = "_corrupt_record"
_EVENT_COORDINATES = ("partition", "sequence_number", "offset", "enqueued_time", "partition_key", "body")


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
        """The event rows plus the body's fields and `dead_letter_reason` (null for a good event)."""
        body = F.from_json(
            F.col("body").cast("string"),
            f"{ev.BODY_SCHEMA_DDL}, {_CORRUPT} string",
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT},
        )
        parsed = events.select(*events.columns, body.alias("_event"))
        field = {name: F.col(f"_event.{name}") for name in (*ev.REQUIRED_TEXT_FIELDS, ev.SENSOR_ID)}
        raw_time = F.col(f"_event.{ev.EVENT_TIME}")
        event_time = _parse_event_time(raw_time)
        reason = F.when(F.col("body").isNull() | (F.length("body") == 0), F.lit(ev.REASON_EMPTY)).when(
            F.col(f"_event.{_CORRUPT}").isNotNull(), F.lit(ev.REASON_NOT_JSON_OBJECT)
        )
        for name in ev.REQUIRED_TEXT_FIELDS:
            reason = reason.when(field[name].isNull() | (field[name] == ""), F.lit(ev.reason_missing(name)))
        reason = reason.when(event_time.isNull(), F.lit(ev.REASON_EVENT_TIME))
        return parsed.select(
            *events.columns,
            *(column.alias(name) for name, column in field.items()),
            event_time.alias(ev.EVENT_TIME),
            reason.alias(DEAD_LETTER_REASON),
        )

    def transform(self, prepared: DataFrame) -> PipelineResult:
        good = prepared.where(F.col(DEAD_LETTER_REASON).isNull())
        if self.sensor_types:
            good = good.where(F.col(ev.SENSOR_TYPE).isin(list(self.sensor_types)))
        if self.event_types:
            good = good.where(F.col(ev.EVENT_TYPE).isin(list(self.event_types)))
        width = self.window_seconds
        window_start = F.floor(F.unix_micros(ev.EVENT_TIME) / F.lit(width * 1_000_000)) * F.lit(width)
        counts = (
            good.groupBy(window_start.alias("_window"), ev.HOME_ID, ev.SENSOR_TYPE, "partition")
            .agg(F.count(F.lit(1)).alias("count"), F.max(ev.EVENT_TIME).alias("lastEventTime"))
            .select(
                F.timestamp_seconds("_window").alias("windowStart"),
                F.timestamp_seconds(F.col("_window") + F.lit(width)).alias("windowEnd"),
                ev.HOME_ID,
                ev.SENSOR_TYPE,
                "partition",
                "count",
                "lastEventTime",
            )
        )
        directory = F.concat(F.lit(f"{WINDOW_DIRECTORY}="), utc_stamp(F.unix_seconds(F.col("windowStart"))))
        dead = prepared.where(F.col(DEAD_LETTER_REASON).isNotNull()).select(
            *_EVENT_COORDINATES, DEAD_LETTER_REASON
        )
        return PipelineResult(outputs={OUTPUT: Output(counts, directory)}, dead_letters=dead)


def _parse_event_time(raw: Column) -> Column:
    """ISO 8601 text to a timestamp; without a zone it is UTC whatever the Spark session's time zone."""
    zoned = F.try_to_timestamp(raw)
    unzoned = F.try_to_timestamp(F.concat(raw, F.lit("Z")))
    return F.when(~raw.rlike(ev.EVENT_TIME_PATTERN), F.lit(None).cast("timestamp")).otherwise(
        F.when(raw.rlike(ev.ZONED_PATTERN), zoned).otherwise(unzoned)
    )


def utc_stamp(epoch_seconds: Column) -> Column:
    """`yyyymmddThhmmssZ` for epoch seconds, computed without the session time zone (dates have none)."""
    days = F.floor(epoch_seconds / F.lit(86_400))
    second_of_day = epoch_seconds - days * F.lit(86_400)
    return F.format_string(
        "%sT%02d%02d%02dZ",
        F.date_format(F.date_from_unix_date(days.cast("int")), "yyyyMMdd"),
        F.floor(second_of_day / F.lit(3600)).cast("int"),
        F.floor((second_of_day % F.lit(3600)) / F.lit(60)).cast("int"),
        (second_of_day % F.lit(60)).cast("int"),
    )
