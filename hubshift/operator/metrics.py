"""The operator's own Prometheus metrics, as objects the control loop sets.

Names follow Prometheus practice: one application prefix (`hubshift_`), base units, `_total` on counters,
bounded labels only (`namespace`, `consumer` = the PartitionedConsumer's name, `partition` = an Event Hubs
partition id, at most a few thousand). `OperatorMetrics` owns its registry, so a test makes a fresh one;
the operator process uses `METRICS`.

The consumer pods export their own metrics (hubshift/spark_app); the names the chart's dashboards and
alerts read from them are listed in `CONSUMER_METRICS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from threading import Thread
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.exposition import generate_latest

from hubshift import __version__
from hubshift.operator.status import PHASES

PREFIX = "hubshift"
LABELS = ("namespace", "consumer")

# What the dashboards and alert rules expect the consumer pods to export (hubshift/spark_app's contract).
CONSUMER_METRICS = {
    "events": f"{PREFIX}_consumer_events_total",  # counter, labels partition
    "checkpoint_age": f"{PREFIX}_consumer_checkpoint_age_seconds",  # gauge, labels partition
    "lease_lost": f"{PREFIX}_consumer_lease_lost_total",  # counter, labels partition
}

HANDOFF_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600)
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.build_info = Gauge(
            f"{PREFIX}_operator_build_info", "The operator's version.", ["version"], registry=r
        )
        self.build_info.labels(__version__).set(1)
        self.desired_replicas = Gauge(
            f"{PREFIX}_desired_replicas", "Consumer replicas the control loop wants.", LABELS, registry=r
        )
        self.current_replicas = Gauge(
            f"{PREFIX}_current_replicas", "Consumer replicas asked of the runtime now.", LABELS, registry=r
        )
        self.ready_replicas = Gauge(
            f"{PREFIX}_ready_replicas", "Consumer pods passing readiness.", LABELS, registry=r
        )
        self.partitions = Gauge(f"{PREFIX}_partitions", "Partitions of the Event Hub.", LABELS, registry=r)
        self.backlog = Gauge(
            f"{PREFIX}_backlog_events", "Unprocessed events over all partitions.", LABELS, registry=r
        )
        self.partition_backlog = Gauge(
            f"{PREFIX}_partition_backlog_events",
            "Unprocessed events of one partition (last enqueued minus checkpoint).",
            [*LABELS, "partition"],
            registry=r,
        )
        self.phase = Gauge(
            f"{PREFIX}_phase", "1 for the current phase, 0 for the others.", [*LABELS, "phase"], registry=r
        )
        self.moves = Counter(
            f"{PREFIX}_partition_moves", "Partitions handed from one consumer to another.", LABELS, registry=r
        )
        self.rebalances = Counter(
            f"{PREFIX}_rebalances", "Assignments published, by reason.", [*LABELS, "reason"], registry=r
        )
        self.handoff_duration = Histogram(
            f"{PREFIX}_handoff_duration_seconds",
            "From publishing a move to the new owner holding the partition.",
            LABELS,
            buckets=HANDOFF_BUCKETS,
            registry=r,
        )
        self.scale_events = Counter(
            f"{PREFIX}_scale_events",
            "Replica count changes, by direction (up, down).",
            [*LABELS, "direction"],
            registry=r,
        )
        self.cycle_duration = Histogram(
            f"{PREFIX}_cycle_duration_seconds",
            "One control-loop cycle.",
            LABELS,
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.cycle_errors = Counter(
            f"{PREFIX}_cycle_errors", "Control-loop cycles that raised.", LABELS, registry=r
        )
        self.paused = Gauge(
            f"{PREFIX}_paused", "1 while a pause annotation holds scaling.", LABELS, registry=r
        )
        self.fallback_active = Gauge(
            f"{PREFIX}_fallback_active",
            "1 while the backlog cannot be read and fallback replicas apply.",
            LABELS,
            registry=r,
        )
        self._partitions_seen: dict[tuple[str, str], set[str]] = {}

    # helpers for the label sets that must be replaced, not just set

    def set_phase(self, namespace: str, consumer: str, phase: str) -> None:
        for candidate in PHASES:
            self.phase.labels(namespace, consumer, candidate).set(1 if candidate == phase else 0)

    def set_backlog(self, namespace: str, consumer: str, per_partition: Mapping[str, int]) -> None:
        """Per-partition backlog and its total; partitions that disappeared stop being exported."""
        key = (namespace, consumer)
        for gone in self._partitions_seen.get(key, set()) - set(per_partition):
            self.partition_backlog.remove(namespace, consumer, gone)
        for partition, value in per_partition.items():
            self.partition_backlog.labels(namespace, consumer, partition).set(value)
        self._partitions_seen[key] = set(per_partition)
        self.backlog.labels(namespace, consumer).set(sum(per_partition.values()))

    def record_scale(self, namespace: str, consumer: str, before: int, after: int) -> None:
        if after != before:
            direction = "up" if after > before else "down"
            self.scale_events.labels(namespace, consumer, direction).inc()

    def forget(self, namespace: str, consumer: str) -> None:
        """Stop exporting a deleted PartitionedConsumer's series."""
        for metric in (
            self.desired_replicas,
            self.current_replicas,
            self.ready_replicas,
            self.partitions,
            self.backlog,
            self.moves,
            self.handoff_duration,
            self.cycle_duration,
            self.cycle_errors,
            self.paused,
            self.fallback_active,
        ):
            _remove(metric, (namespace, consumer))
        for partition in self._partitions_seen.pop((namespace, consumer), set()):
            _remove(self.partition_backlog, (namespace, consumer, partition))
        for phase in PHASES:
            _remove(self.phase, (namespace, consumer, phase))
        for direction in ("up", "down"):
            _remove(self.scale_events, (namespace, consumer, direction))
        for labels in [
            labels for labels in _label_sets(self.rebalances) if labels[:2] == (namespace, consumer)
        ]:
            _remove(self.rebalances, labels)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, address: str = "0.0.0.0") -> Thread:
        """`/metrics` on `port`, in a daemon thread (the operator's event loop never waits on a scrape)."""
        _, thread = start_http_server(port, addr=address, registry=self.registry)
        return thread


def _label_sets(metric: Any) -> list[tuple[str, ...]]:
    return list(metric._metrics)  # prometheus_client keeps children by label values


def _remove(metric: Any, labels: tuple[str, ...]) -> None:
    if labels in _label_sets(metric):
        metric.remove(*labels)


METRICS = OperatorMetrics()
