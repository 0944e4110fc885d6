"""The consumer's Prometheus metrics, as one object the consumer's parts call.

Names follow Prometheus practice: the `hubshift_consumer_`
prefix, base units, `_total` on counters (prometheus-client appends it), and bounded labels only:
`partition` (an Event Hubs partition id: at most a few thousand), `output` (a pipeline's output names),
`result` and `how` (fixed sets below). Sums over `partition` make sense across the pool. The series a
person filters by hub (the info series and those per partition) also carry `hub` and `consumer_group`:
one value each per consumer, so they add no series.

docs/observability.md has the table of every metric, the operator's and the consumer's.

Every counter exists at 0 from the start (a query for lease losses says 0 before the first, not nothing).
Gauges of a partition this consumer no longer owns are removed, so a `sum` over the pool counts each
partition once. Each `ConsumerMetrics` owns its registry (tests make fresh ones); the process's own
`process_*`/`python_*` metrics are added to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from threading import Lock
from typing import TYPE_CHECKING

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from hubshift import __version__

if TYPE_CHECKING:
    from hubshift.sinks.commits import BatchSummary

PREFIX = "hubshift_consumer"
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 300, 900, 3600)
EVENT_COUNT_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
CHECKPOINT_RESULTS = ("ok", "failed", "fenced")
RENEWAL_RESULTS = ("ok", "failed")
ACQUIRED_HOW = ("released", "broken", "expired", "own")
HANDOFF_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300)
HUB_LABELS = ("hub", "consumer_group")
PARTITION_LABELS = [*HUB_LABELS, "partition"]


class ConsumerMetrics:
    def __init__(
        self,
        consumer_id: str,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        process_metrics: bool = True,
        hub: str = "",
        consumer_group: str = "",
    ) -> None:
        # No `_created` series beside each counter and histogram (prometheus-client's default): they would
        # double the counters' series, and nothing reads them (docs/observability.md, "How many series").
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        self.clock = clock
        self._hub = (hub, consumer_group)  # the first label values of every per-partition series
        r = self.registry
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            r.register(GC_COLLECTOR)
        # `consumer_id`, not `consumer`: scrapes label every series with the PartitionedConsumer's name
        # (`consumer`) and the pod's (`pod`), and this must not clash with them.
        info = Gauge(
            f"{PREFIX}_info",
            "This consumer, its version, and the hub and consumer group it reads.",
            ["consumer_id", "version", *HUB_LABELS],
            registry=r,
        )
        info.labels(consumer_id, __version__, *self._hub).set(1)
        started = Gauge(
            f"{PREFIX}_start_time_seconds", "When this consumer process started (Unix seconds).", registry=r
        )
        started.set(clock())
        self._declare_batches(r)
        self._declare_ownership(r)
        for result in ("ok", "failed"):
            self.batches.labels(result)
        for result in CHECKPOINT_RESULTS:
            self.checkpoints.labels(result)
        for result in RENEWAL_RESULTS:
            self.lease_renewals.labels(result)
        for how in ACQUIRED_HOW:
            self.acquired.labels(how)
        self._lock = Lock()
        self._owned: set[str] = set()
        self._checkpointed_at: dict[str, float] = {}
        r.register(_CheckpointAge(self))
        self.jvm: JvmFigures | None = None
        self.spark_batch_duration: Histogram | None = None

    @property
    def hub_labels(self) -> tuple[str, str]:
        """The hub and consumer group this consumer reads: the first labels of every partition's series."""
        return self._hub

    # --- Spark and its JVM --------------------------------------------------------------------------

    def enable_spark(self) -> None:
        """The Spark engine's own figures: the driver JVM's memory and garbage collections, and Spark's
        micro-batches. Registered when a Spark engine starts, so an SDK consumer exports none of them."""
        if self.spark_batch_duration is not None:
            return
        r = self.registry
        self.spark_batch_duration = Histogram(
            f"{PREFIX}_spark_batch_duration_seconds",
            "A micro-batch as Spark measures it (its batchDuration: planning, reading the source, "
            "foreachBatch, committing the offsets).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.spark_input_rate = Gauge(
            f"{PREFIX}_spark_input_rows_per_second",
            "Spark's input rate over its last micro-batch (rows arriving per second).",
            registry=r,
        )
        self.spark_processed_rate = Gauge(
            f"{PREFIX}_spark_processed_rows_per_second",
            "Spark's processing rate over its last micro-batch (rows processed per second).",
            registry=r,
        )
        r.register(_Jvm(self))

    def spark_batch(self, duration_seconds: float, input_rate: float, processed_rate: float) -> None:
        """One micro-batch's progress as Spark reported it."""
        if self.spark_batch_duration is None:
            return
        self.spark_batch_duration.observe(max(0.0, duration_seconds))
        self.spark_input_rate.set(max(0.0, input_rate))
        self.spark_processed_rate.set(max(0.0, processed_rate))

    def jvm_sampled(self, figures: JvmFigures) -> None:
        self.jvm = figures

    def _declare_batches(self, r: CollectorRegistry) -> None:
        """What the engine reports of each batch."""
        self.events = Counter(
            f"{PREFIX}_events", "Events processed and committed to the sink.", PARTITION_LABELS, registry=r
        )
        self.output_rows = Counter(
            f"{PREFIX}_output_rows", "Result rows written to the sink.", ["output"], registry=r
        )
        self.dead_letters = Counter(
            f"{PREFIX}_dead_letters", "Events sent to the dead-letter location.", registry=r
        )
        self.restore_seconds = Gauge(
            f"{PREFIX}_state_restore_seconds",
            "A streaming job's partition: from its query's start to its first committed batch (its state "
            "restored from the partition's checkpoint).",
            PARTITION_LABELS,
            registry=r,
        )
        self.restoring = Gauge(
            f"{PREFIX}_state_restoring_since_seconds",
            "A streaming job's partition whose query has not committed its first batch yet (its state being "
            "restored from the partition's checkpoint): when that query started, as a Unix time.",
            PARTITION_LABELS,
            registry=r,
        )
        self.state_rows = Gauge(
            f"{PREFIX}_state_rows",
            "A streaming job's partition: the rows its stateful operators hold.",
            PARTITION_LABELS,
            registry=r,
        )
        self.state_bytes = Gauge(
            f"{PREFIX}_state_bytes",
            "A streaming job's partition: the memory its state store reports.",
            PARTITION_LABELS,
            registry=r,
        )
        self.expired = Counter(
            f"{PREFIX}_events_expired",
            "Events that expired from the hub before they were read (its retention passed the checkpoint).",
            PARTITION_LABELS,
            registry=r,
        )
        self.batches = Counter(
            f"{PREFIX}_batches", "Batches, by result (ok, failed).", ["result"], registry=r
        )
        self.batch_duration = Histogram(
            f"{PREFIX}_batch_duration_seconds",
            "One batch: a Spark micro-batch (prepare, write, commit) or the SDK handler.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_events = Histogram(
            f"{PREFIX}_batch_events", "Events in one batch.", buckets=EVENT_COUNT_BUCKETS, registry=r
        )
        self.enqueue_to_sink = Histogram(
            f"{PREFIX}_enqueue_to_sink_seconds",
            "Per partition and batch: from the enqueue of its oldest event to the batch's commit.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.last_batch = Gauge(
            f"{PREFIX}_last_batch_timestamp_seconds", "When the last batch committed.", registry=r
        )

    def _declare_ownership(self, r: CollectorRegistry) -> None:
        """What the ownership agent reports: partitions, checkpoints, leases, handoffs."""
        self.backlog = Gauge(
            f"{PREFIX}_backlog_events",
            "Last enqueued minus last processed sequence number, per owned partition.",
            PARTITION_LABELS,
            registry=r,
        )
        self.lag = Gauge(
            f"{PREFIX}_lag_seconds",
            "Age of an owned partition's oldest unprocessed event, as this consumer knows it (0 when caught "
            "up; absent while unknown).",
            PARTITION_LABELS,
            registry=r,
        )
        self.owned = Gauge(f"{PREFIX}_owned_partitions", "Partitions this consumer owns now.", registry=r)
        self.checkpoints = Counter(
            f"{PREFIX}_checkpoints",
            "Checkpoint writes, by result (ok, failed, fenced).",
            ["result"],
            registry=r,
        )
        self.lease_renewals = Counter(
            f"{PREFIX}_lease_renewals",
            "Membership lease renewals, by result (ok, failed).",
            ["result"],
            registry=r,
        )
        self.lease_lost = Counter(
            f"{PREFIX}_lease_lost", "Partition leases lost (broken, expired or stolen).", registry=r
        )
        self.acquired = Counter(
            f"{PREFIX}_partitions_acquired",
            "Partitions taken, by how (released, broken, expired, own).",
            ["how"],
            registry=r,
        )
        self.released = Counter(
            f"{PREFIX}_partitions_released", "Partitions handed off gracefully.", registry=r
        )
        self.handoff_duration = Histogram(
            f"{PREFIX}_handoff_duration_seconds",
            "A partition handed off: from the start of its drain to its release.",
            buckets=HANDOFF_BUCKETS,
            registry=r,
        )
        self.spool = Gauge(
            f"{PREFIX}_spool_events",
            "Events received and spooled but not yet committed, over the partitions owned.",
            registry=r,
        )
        self.nudges = Counter(
            f"{PREFIX}_nudges", "The operator's nudges taken: re-read the assignment now.", registry=r
        )

    # --- ownership ----------------------------------------------------------------------------------

    def partitions_owned(self, partitions: Collection[str]) -> None:
        """The partitions owned now; gauges of the others stop being exported."""
        self._update_owned(lambda _: set(partitions))

    def partition_acquired(self, partition: str, how: str = "released") -> None:
        if how not in ACQUIRED_HOW:
            raise ValueError(f"how must be one of {ACQUIRED_HOW}")
        self.acquired.labels(how).inc()
        self._update_owned(lambda owned: owned | {partition})

    def partition_released(self, partition: str, drain_seconds: float | None = None) -> None:
        self.released.inc()
        if drain_seconds is not None:
            self.handoff_duration.observe(max(0.0, drain_seconds))
        self._update_owned(lambda owned: owned - {partition})

    def lease_renewed(self, ok: bool = True) -> None:
        self.lease_renewals.labels("ok" if ok else "failed").inc()

    def partition_lost(self, partition: str) -> None:
        """A lease broken, expired or stolen under this consumer: the partition is gone at once."""
        self.lease_lost.inc()
        self._update_owned(lambda owned: owned - {partition})

    def _update_owned(self, change: Callable[[set[str]], set[str]]) -> None:
        with self._lock:
            new = change(set(self._owned))
            for partition in self._owned - new:
                self._checkpointed_at.pop(partition, None)
                _remove(self.backlog, *self._hub, partition)
                _remove(self.lag, *self._hub, partition)
            for partition in new - self._owned:
                # at 0 from the start, so `increase()` sees the first expiry and alerts can tell "none
                # expired" from "not exported"
                self.expired.labels(*self._hub, partition)
            self._owned = new
            self.owned.set(len(new))

    # --- progress -----------------------------------------------------------------------------------

    def checkpoint_written(self, partition: str, at: float | None = None) -> None:
        self.checkpoints.labels("ok").inc()
        with self._lock:
            self._checkpointed_at[partition] = self.clock() if at is None else at

    def checkpoint_failed(self, fenced: bool = False) -> None:
        """A checkpoint write refused (`fenced`: the lease was no longer ours) or failing."""
        self.checkpoints.labels("fenced" if fenced else "failed").inc()

    def set_backlog(self, partition: str, events: int) -> None:
        self.backlog.labels(*self._hub, partition).set(max(0, events))

    def set_lag(self, partition: str, seconds: float | None) -> None:
        """An owned partition's lag in seconds; None (unknown) stops exporting it rather than guess."""
        if seconds is None:
            _remove(self.lag, *self._hub, partition)
        else:
            self.lag.labels(*self._hub, partition).set(max(0.0, seconds))

    def batch_processed(self, summary: BatchSummary) -> None:
        """Called by `process_batch` once a batch is committed to the sink."""
        now = self._batch_done(summary.duration_seconds, summary.events)
        for partition, done in summary.partitions.items():
            self._partition_done(partition, done.events, done.first_enqueued_time, now)
        for output, rows in summary.outputs.items():
            self.output_rows.labels(output).inc(rows)
        self.dead_letters.inc(summary.dead_letters)

    def handled(
        self, partition: str, events: int, duration_seconds: float, first_enqueued: datetime | None
    ) -> None:
        """A batch of one partition handled without Spark (the SDK engine): the same counters as
        `batch_processed`."""
        now = self._batch_done(duration_seconds, events)
        self._partition_done(partition, events, first_enqueued, now)

    def _batch_done(self, duration_seconds: float, events: int) -> float:
        now = self.clock()
        self.batches.labels("ok").inc()
        self.batch_duration.observe(duration_seconds)
        self.batch_events.observe(events)
        self.last_batch.set(now)
        return now

    def _partition_done(
        self, partition: str, events: int, first_enqueued: datetime | None, now: float
    ) -> None:
        self.events.labels(*self._hub, partition).inc(events)
        if first_enqueued is not None:
            self.enqueue_to_sink.observe(max(0.0, now - first_enqueued.timestamp()))

    def state_restoring(self, partition: str) -> None:
        """A streaming job's partition query starts: its state is restored until its first batch commits."""
        self.restoring.labels(*self._hub, partition).set(self.clock())

    def state_restored(self, partition: str, seconds: float | None) -> None:
        """A streaming job's partition query committed its first batch this long after it started (its
        state restored from the checkpoint, and a batch's work); None: it stopped before that."""
        _remove(self.restoring, *self._hub, partition)
        if seconds is not None:
            self.restore_seconds.labels(*self._hub, partition).set(max(0.0, seconds))

    def state_size(self, partition: str, rows: int, size: int) -> None:
        self.state_rows.labels(*self._hub, partition).set(rows)
        self.state_bytes.labels(*self._hub, partition).set(size)

    def events_expired(self, partition: str, events: int) -> None:
        self.expired.labels(*self._hub, partition).inc(events)

    def spool_depth(self, depth: Callable[[], int]) -> None:
        """The spool's depth is `depth()`, asked when the metrics are read (not at every delivery)."""
        self.spool.set_function(lambda: max(0, depth()))

    def batch_failed(self, duration_seconds: float | None = None) -> None:
        self.batches.labels("failed").inc()
        if duration_seconds is not None:
            self.batch_duration.observe(duration_seconds)

    # --- exposition ---------------------------------------------------------------------------------

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition for a scrape (OpenMetrics when the scraper asks for it) and its content type."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def checkpoint_ages(self) -> dict[str, float]:
        with self._lock:
            now = self.clock()
            return {p: max(0.0, now - at) for p, at in self._checkpointed_at.items() if p in self._owned}


class _CheckpointAge:
    """Computed at scrape time, from the clock the metrics were given."""

    def __init__(self, metrics: ConsumerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            f"{PREFIX}_checkpoint_age_seconds",
            "Seconds since the partition's last checkpoint was written.",
            labels=PARTITION_LABELS,
        )
        for partition, age in sorted(self.metrics.checkpoint_ages().items()):
            family.add_metric([*self.metrics.hub_labels, partition], age)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(f"{PREFIX}_checkpoint_age_seconds", "", labels=PARTITION_LABELS)


@dataclass(frozen=True)
class JvmFigures:
    """What the Spark driver's JVM says of itself (java.lang.management): heap and non-heap memory in
    bytes (`heap_max` -1 when unbounded), and per garbage collector its collections and the seconds they
    took, since the JVM started."""

    heap_used: float
    heap_committed: float
    heap_max: float
    nonheap_used: float
    nonheap_committed: float
    collectors: dict[str, tuple[int, float]] = field(default_factory=dict)


class _Jvm:
    """The last `JvmFigures` sampled, at scrape time (the families exist, empty, before the first)."""

    def __init__(self, metrics: ConsumerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        figures = self.metrics.jvm
        memory = {
            kind: GaugeMetricFamily(
                f"{PREFIX}_jvm_memory_{kind}_bytes",
                f"The Spark driver JVM's {kind} memory, by area (heap, nonheap).",
                labels=["area"],
            )
            for kind in ("used", "committed", "max")
        }
        collections = CounterMetricFamily(
            f"{PREFIX}_jvm_gc_collections",
            "Garbage collections of the Spark driver JVM, by collector.",
            labels=["gc"],
        )
        seconds = CounterMetricFamily(
            f"{PREFIX}_jvm_gc_collection_seconds",
            "Time the Spark driver JVM spent in garbage collections, by collector.",
            labels=["gc"],
        )
        if figures is not None:
            memory["used"].add_metric(["heap"], figures.heap_used)
            memory["used"].add_metric(["nonheap"], figures.nonheap_used)
            memory["committed"].add_metric(["heap"], figures.heap_committed)
            memory["committed"].add_metric(["nonheap"], figures.nonheap_committed)
            if figures.heap_max >= 0:
                memory["max"].add_metric(["heap"], figures.heap_max)
            for name, (count, spent) in sorted(figures.collectors.items()):
                collections.add_metric([name], count)
                seconds.add_metric([name], spent)
        yield from memory.values()
        yield collections
        yield seconds

    def describe(self) -> Iterator[Metric]:
        return self.collect()


def _remove(metric: Gauge, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
