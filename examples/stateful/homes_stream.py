"""A Spark team's streaming job on hubshift (examples/stateful.yaml): the home-security readings parsed
from their JSON bodies, a reading sent twice (a sensor's retry) dropped, and every home's readings per
sensor type counted in 10-second windows of event time, each window written once when the watermark
(30 seconds behind the newest reading) has passed it. hubshift runs `windows` on each partition's events as
a streaming DataFrame, keeps its state (the windows still open, the readings seen) in that partition's
checkpoint, and moves it with the partition."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

BODY = "homeId string, sensorId string, sensorType string, eventType string, eventTime timestamp"
WINDOW = "10 seconds"
LATENESS = "30 seconds"


def windows(events: DataFrame) -> DataFrame:
    """One row per home, sensor type and 10-second window: how many distinct readings it had."""
    readings = events.select(F.from_json(F.col("body").cast("string"), BODY).alias("r")).select("r.*")
    readings = readings.where(F.col("homeId").isNotNull() & F.col("eventTime").isNotNull())
    unique = readings.withWatermark("eventTime", LATENESS).dropDuplicatesWithinWatermark(
        ["sensorId", "eventTime"]
    )
    counts = unique.groupBy(F.window("eventTime", WINDOW), "homeId", "sensorType").count()
    return counts.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.col("homeId").alias("home_id"),
        F.col("sensorType").alias("sensor_type"),
        "count",
        F.to_date("window.start").alias("date"),
    )
