"""The Spark engine's own figures for the consumer's metrics (`ConsumerMetrics.enable_spark`): the driver
JVM's memory and garbage collections, read through the py4j gateway from java.lang.management (no agent,
no exporter jar), and each micro-batch's progress as Spark reports it to a streaming query listener.

PySpark is imported only inside `add_listener`, which a running Spark engine calls.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from hubshift.consumer.metrics import JvmFigures
from hubshift.ownership.timing import epoch_seconds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from hubshift.consumer.metrics import ConsumerMetrics


log = logging.getLogger(__name__)

# How often the driver JVM's memory and collectors are read for the metrics.
JVM_SAMPLE_SECONDS = 5.0


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


class ProgressListener:
    """Each micro-batch's progress into `metrics`, as a py4j callback implementing Spark's Python listener
    interface. PySpark's own `StreamingQueryListener` turns every progress into Python objects field by
    field, one py4j round trip each (bench/throughput.py measures what that costs); this one reads the
    progress as one JSON string.

    `rows_of(batch_id)`: the events the consumer's own batch counted, for a batch whose events a task read
    from the spool (Spark then saw no input rows, `consumer/spark/batch.py`)."""

    def __init__(self, metrics: ConsumerMetrics, rows_of: Callable[[int], int | None] | None = None) -> None:
        self.metrics = metrics
        self.rows_of = rows_of or (lambda batch_id: None)
        self._previous_trigger: float | None = None
        self._java: Any = None

    def onQueryStarted(self, event: Any) -> None:
        self._previous_trigger = None

    def onQueryProgress(self, event: Any) -> None:
        self.progress(json.loads(event.progress().json()))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def progress(self, document: dict[str, Any]) -> None:
        """One progress, as `StreamingQueryProgress.json()` writes it."""
        seconds = max(0.0, float(document.get("batchDuration") or 0) / 1000)
        input_rate = _rate(document.get("inputRowsPerSecond"))
        processed_rate = _rate(document.get("processedRowsPerSecond"))
        trigger = epoch_seconds(document.get("timestamp"))
        rows = self.rows_of(int(document.get("batchId", -1)))
        if not int(document.get("numInputRows") or 0) and rows:
            since = (
                None
                if trigger is None or self._previous_trigger is None
                else trigger - self._previous_trigger
            )
            processed_rate = rows / seconds if seconds > 0 else 0.0
            input_rate = rows / since if since else processed_rate
        if trigger is not None:
            self._previous_trigger = trigger
        self.metrics.spark_batch(seconds, input_rate, processed_rate)

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class Listener(Protocol):
    """A Python implementation of Spark's streaming query listener (its `Java` class says which)."""

    _java: Any


def add_listener(spark: SparkSession, listener: Listener) -> None:
    """Register `listener` with the session's streaming queries (what PySpark's `addListener` does, with
    our listener in place of its converting one)."""
    from pyspark.java_gateway import ensure_callback_server_started

    context: Any = spark.sparkContext
    ensure_callback_server_started(context._gateway)  # type: ignore[no-untyped-call]
    listener._java = context._jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(listener)
    spark._jsparkSession.streams().addListener(listener._java)


def remove_listener(spark: SparkSession, listener: Listener) -> None:
    if listener._java is not None:
        spark._jsparkSession.streams().removeListener(listener._java)
        listener._java = None


def release_session(spark: SparkSession | None, listener: Listener | None, *, stop: bool) -> None:
    """At an engine's end: its progress listener off the session (a session shared with others, a session
    builder's, keeps no listener of ours), and the session stopped when it is the engine's own (`stop`)."""
    if listener is not None and spark is not None:
        try:
            remove_listener(spark, listener)
        except Exception as exc:
            log.debug("removing the progress listener: %r", exc)
    if spark is not None and stop:
        spark.stop()
