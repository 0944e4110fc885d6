"""The Spark engine's own figures (`consumer/spark/telemetry.py`) from a real SparkSession: the driver JVM's
memory and collectors read through py4j, and Spark's micro-batch progress from a StreamingQueryListener on
a running streaming query, as a consumer's /metrics shows them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.consumer.spark.telemetry import ProgressListener, add_listener, read_jvm, remove_listener

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def samples(metrics: ConsumerMetrics, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render()[0].decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefix)
    }


def test_the_driver_jvm_tells_its_memory_and_collectors(spark: SparkSession) -> None:
    metrics = ConsumerMetrics("homes-0", process_metrics=False)
    metrics.enable_spark()
    assert samples(metrics, "hubshift_consumer_jvm_") == {}  # nothing before the first sample
    figures = read_jvm(spark)
    assert 0 < figures.heap_used <= figures.heap_committed
    assert figures.heap_max >= figures.heap_committed  # spark.driver.memory bounds it
    assert figures.nonheap_used > 0
    assert figures.collectors and all(
        count >= 0 and spent >= 0 for count, spent in figures.collectors.values()
    )
    metrics.jvm_sampled(figures)
    got = samples(metrics, "hubshift_consumer_jvm_")
    assert got[("hubshift_consumer_jvm_memory_used_bytes", (("area", "heap"),))] == figures.heap_used
    assert got[("hubshift_consumer_jvm_memory_max_bytes", (("area", "heap"),))] == figures.heap_max
    collectors = {
        dict(labels)["gc"] for name, labels in got if name == "hubshift_consumer_jvm_gc_collections_total"
    }
    assert collectors == set(figures.collectors)


@pytest.mark.timeout(120)
def test_each_micro_batch_reaches_the_histogram_and_the_rates(spark: SparkSession, tmp_path: Any) -> None:
    metrics = ConsumerMetrics("homes-0", process_metrics=False)
    metrics.enable_spark()
    listener = ProgressListener(metrics)
    add_listener(spark, listener)
    counted: list[int] = []
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 200)
        .load()
        .writeStream.foreachBatch(lambda frame, _: counted.append(frame.count()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        deadline = time.monotonic() + 90
        batches = "hubshift_consumer_spark_batch_duration_seconds_count"
        while samples(metrics, batches).get((batches, ()), 0) < 3 or sum(counted) == 0:
            assert time.monotonic() < deadline, f"no micro-batch progress: {samples(metrics, 'hubshift')}"
            time.sleep(0.5)
    finally:
        query.stop()
        remove_listener(spark, listener)
    got = samples(metrics, "hubshift_consumer_spark_")
    assert got[("hubshift_consumer_spark_batch_duration_seconds_sum", ())] > 0
    assert got[("hubshift_consumer_spark_input_rows_per_second", ())] >= 0
    assert got[("hubshift_consumer_spark_processed_rows_per_second", ())] > 0 or sum(counted) > 0


def test_an_sdk_consumer_exports_no_spark_figures() -> None:
    metrics = ConsumerMetrics("homes-0", process_metrics=False)
    metrics.spark_batch(1.0, 10.0, 10.0)  # ignored: no Spark engine enabled them
    assert samples(metrics, "hubshift_consumer_spark_") == {}
    assert samples(metrics, "hubshift_consumer_jvm_") == {}
