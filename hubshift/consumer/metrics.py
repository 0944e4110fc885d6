"""The consumer's Prometheus metrics, as one object the consumer's parts call.

Names follow Prometheus practice: the `hubshift_consumer_`
prefix, base units, `_total` on counters (prometheus-client appends it), and bounded labels only:
`partition` (an Event Hubs partition id: at most a few thousand), `output` (a pipeline's output names),
`result` and `how` (fixed sets below). Sums over `partition` make sense across the pool.

docs/observability.md has the table of every metric, the operator's and the consumer's.

Every counter exists at 0 from the start (a query for lease losses says 0 before the first, not nothing).
Gauges of a partition this consumer no longer owns are removed, so a `sum` over the pool counts each
partition once. Each `ConsumerMetrics` owns its registry (tests make fresh ones); the process's own
`process_*`/`python_*` metrics are added to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
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
)
from prometheus_client.core import GaugeMetricFamily, Metric
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


class ConsumerMetrics:
    def __init__(
        self,
        consumer_id: str,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        process_metrics: bool = True,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.clock = clock
        r = self.registry
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            r.register(GC_COLLECTOR)
        # `consumer_id`, not `consumer`: scrapes label every series with the PartitionedConsumer's name
        # (`consumer`) and the pod's (`pod`), and this must not clash with them.
        info = Gauge(
            f"{PREFIX}_info", "This consumer and its version.", ["consumer_id", "version"], registry=r
        )
        info.labels(consumer_id, __version__).set(1)
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

    def _declare_batches(self, r: CollectorRegistry) -> None:
        """What the engine reports of each batch."""
        self.events = Counter(
            f"{PREFIX}_events", "Events processed and committed to the sink.", ["partition"], registry=r
        )
        self.output_rows = Counter(
            f"{PREFIX}_output_rows", "Result rows written to the sink.", ["output"], registry=r
        )
        self.dead_letters = Counter(
            f"{PREFIX}_dead_letters", "Events sent to the dead-letter location.", registry=r
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
            ["partition"],
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
                _remove(self.backlog, partition)
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
        self.backlog.labels(partition).set(max(0, events))

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
        self.events.labels(partition).inc(events)
        if first_enqueued is not None:
            self.enqueue_to_sink.observe(max(0.0, now - first_enqueued.timestamp()))

    def set_spool(self, events: int) -> None:
        self.spool.set(max(0, events))

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
            labels=["partition"],
        )
        for partition, age in sorted(self.metrics.checkpoint_ages().items()):
            family.add_metric([partition], age)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(f"{PREFIX}_checkpoint_age_seconds", "", labels=["partition"])


def _remove(metric: Gauge, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
