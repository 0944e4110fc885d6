"""A Spark team's job on hubshift (examples/delta.yaml): the home-security events parsed from their JSON
bodies, enriched with each home's site from a lookup file (broadcast to every task), and written to a Delta
table partitioned by date. hubshift puts this folder on the consumers' PYTHONPATH (a ConfigMap in a cluster:
`kubectl create configmap homes-job --from-file=examples/delta/`), calls `transform` on each micro-batch's
events, and commits its rows to the table exactly once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

SITES = Path(__file__).with_name("sites.json")
BODY = "homeId string, sensorId string, sensorType string, eventType string, eventTime timestamp"


def transform(events: DataFrame) -> DataFrame:
    """One row per event: its coordinates (partition, sequence_number: which event it is), the reading, the
    home's site, and the date it happened (the table's partition column). A body that is not a reading
    becomes a dead letter with the reason (the `dead_letter_reason` column)."""
    spark = events.sparkSession
    sites = spark.createDataFrame(_sites(), "homeId string, city string, region string")
    parsed = events.withColumn("reading", F.from_json(F.col("body").cast("string"), BODY))
    rows = parsed.select(
        "partition",
        "sequence_number",
        "enqueued_time",
        F.col("reading.homeId").alias("home_id"),
        F.col("reading.sensorType").alias("sensor_type"),
        F.col("reading.eventType").alias("event_type"),
        F.col("reading.eventTime").alias("event_time"),
        F.to_date("reading.eventTime").alias("date"),
        F.when(F.col("reading.homeId").isNull(), F.lit("not a home-security reading")).alias(
            "dead_letter_reason"
        ),
    )
    enriched = rows.join(F.broadcast(sites), rows.home_id == sites.homeId, "left").drop("homeId")
    return enriched.withColumn("city", F.coalesce("city", F.lit("unknown")))


def _sites() -> list[tuple[str, str, str]]:
    table: dict[str, Any] = json.loads(SITES.read_text())
    return [(home, site["city"], site["region"]) for home, site in sorted(table.items())]
