"""Each micro-batch's progress, read as Spark's JSON, into the consumer's Spark figures; a batch whose task
read the spool itself counts the consumer's own events (Spark saw no input rows)."""

from __future__ import annotations

from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.consumer.spark.telemetry import ProgressListener
from tests.integration.consumer.test_spark_telemetry import samples


def progress(batch: int, at: str, rows: int, millis: int, **rates: float) -> dict[str, object]:
    return {"batchId": batch, "timestamp": at, "numInputRows": rows, "batchDuration": millis, **rates}


def figures(metrics: ConsumerMetrics) -> dict[str, float]:
    return {
        name.removeprefix("hubshift_consumer_spark_"): v
        for (name, _), v in samples(metrics, "hubshift_consumer_spark_").items()
    }


def test_spark_s_own_rates_when_spark_read_the_rows() -> None:
    metrics = ConsumerMetrics("c-0", process_metrics=False)
    metrics.enable_spark()
    listener = ProgressListener(metrics, {4: 999}.get)
    listener.progress(
        progress(
            4, "2026-11-27T09:10:00.000Z", 500, 250, inputRowsPerSecond=400.0, processedRowsPerSecond=2000.0
        )
    )
    got = figures(metrics)
    assert got["input_rows_per_second"] == 400.0 and got["processed_rows_per_second"] == 2000.0
    assert got["batch_duration_seconds_sum"] == 0.25


def test_a_batch_read_from_the_spool_counts_the_consumer_s_events() -> None:
    metrics = ConsumerMetrics("c-0", process_metrics=False)
    metrics.enable_spark()
    listener = ProgressListener(metrics, {7: 3000, 8: 1000}.get)
    listener.progress(progress(7, "2026-11-27T09:10:00.000Z", 0, 500, inputRowsPerSecond=0.0))
    assert figures(metrics)["processed_rows_per_second"] == 6000.0  # 3,000 events in 0.5 s
    listener.progress(progress(8, "2026-11-27T09:10:02.000Z", 0, 250, inputRowsPerSecond=0.0))
    got = figures(metrics)
    assert got["input_rows_per_second"] == 500.0  # 1,000 events since the trigger 2 s before
    assert got["processed_rows_per_second"] == 4000.0
    listener.progress(progress(9, "2026-11-27T09:10:03.000Z", 0, 0, inputRowsPerSecond="NaN"))  # type: ignore[arg-type]
    assert figures(metrics)["input_rows_per_second"] == 0.0  # an empty batch (a handoff's)
