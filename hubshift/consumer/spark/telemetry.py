"""The Spark engine's own figures for the consumer's metrics (`ConsumerMetrics.enable_spark`): the driver
JVM's memory and garbage collections, read through the py4j gateway from java.lang.management (no agent,
no exporter jar), and each micro-batch's progress as Spark reports it to a StreamingQueryListener.

PySpark is imported only inside `progress_listener`, which a running Spark engine calls.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hubshift.consumer.metrics import JvmFigures

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from hubshift.consumer.metrics import ConsumerMetrics


def read_jvm(spark: SparkSession) -> JvmFigures:
    """The driver JVM's memory and collectors now (a handful of py4j calls)."""
    jvm: Any = spark.sparkContext._jvm
    management = jvm.java.lang.management.ManagementFactory
    memory = management.getMemoryMXBean()
    heap, nonheap = memory.getHeapMemoryUsage(), memory.getNonHeapMemoryUsage()
    collectors = {
        str(bean.getName()): (max(0, int(bean.getCollectionCount())), max(0, bean.getCollectionTime()) / 1000)
        for bean in management.getGarbageCollectorMXBeans()
    }
    return JvmFigures(
        heap_used=float(heap.getUsed()),
        heap_committed=float(heap.getCommitted()),
        heap_max=float(heap.getMax()),
        nonheap_used=float(nonheap.getUsed()),
        nonheap_committed=float(nonheap.getCommitted()),
        collectors=collectors,
    )


def _rate(value: Any) -> float:
    """Spark's rows per second, 0 where it reports none (NaN for a batch of no time)."""
    try:
        rate = float(value)
    except (TypeError, ValueError):
        return 0.0
    return rate if math.isfinite(rate) else 0.0


def progress_listener(metrics: ConsumerMetrics) -> Any:
    """A StreamingQueryListener that gives each micro-batch's progress to `metrics`."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            metrics.spark_batch(
                progress.batchDuration / 1000,
                _rate(progress.inputRowsPerSecond),
                _rate(progress.processedRowsPerSecond),
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return Progress()
