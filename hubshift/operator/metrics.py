"""The operator's own Prometheus metrics, as objects the control loop sets.

Names follow one scheme for the operator and the consumers (docs/observability.md has the table): the
`hubshift_` prefix, base units, `_total` on counters (prometheus-client appends it), bounded labels only
(`namespace`, `consumer` = the PartitionedConsumer's name, `partition` = an Event Hubs partition id, at
most a few thousand, and small fixed sets). The series about the hub's partitions and backlog also carry
`hub` and `consumer_group` (one value each per resource: no more series, and a person filters by them).
The counters that matter before the first failure exist from the start (`initialise`, called when a
control loop is set up). `OperatorMetrics` owns its registry, so a test makes a fresh one; the operator
process uses `METRICS`. `serve` answers `GET /metrics` in the background (`hubshift.webserver`).

The consumers export their own metrics, named in `hubshift/consumer/metrics.py` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder

from hubshift import __version__
from hubshift.operator.rebalance import PublishReason
from hubshift.operator.status import ResourcePhase
from hubshift.webserver import BackgroundServer

PREFIX = "hubshift"
METRICS_PATH = "/metrics"
LABELS = ("namespace", "consumer")
HUB_LABELS = (*LABELS, "hub", "consumer_group")

LAG_READ_RESULTS = ("ok", "failed")

HANDOFF_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600)
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # As the consumer's: no `_created` series beside each counter and histogram.
        disable_created_metrics()  # type: ignore[no-untyped-call]
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
        self.partitions = Gauge(
            f"{PREFIX}_partitions", "Partitions of the Event Hub.", HUB_LABELS, registry=r
        )
        self.backlog = Gauge(
            f"{PREFIX}_backlog_events", "Unprocessed events over all partitions.", HUB_LABELS, registry=r
        )
        self.partition_backlog = Gauge(
            f"{PREFIX}_partition_backlog_events",
            "Unprocessed events of one partition (last enqueued minus checkpoint).",
            [*HUB_LABELS, "partition"],
            registry=r,
        )
        self.partition_lag = Gauge(
            f"{PREFIX}_partition_lag_seconds",
            "Age of one partition's oldest unprocessed event (0 when caught up; absent while unknown).",
            [*HUB_LABELS, "partition"],
            registry=r,
        )
        self.lag = Gauge(
            f"{PREFIX}_lag_seconds",
            "Age of the oldest unprocessed event over all partitions (the worst partition's lag).",
            HUB_LABELS,
            registry=r,
        )
        self.lag_unknown = Gauge(
            f"{PREFIX}_lag_unknown_partitions",
            "Partitions with a backlog whose oldest unprocessed event's enqueued time is not known yet.",
            HUB_LABELS,
            registry=r,
        )
        self.lag_reads = Counter(
            f"{PREFIX}_lag_event_reads",
            "Events the control loop read itself to learn an enqueued time, by result (ok, failed).",
            [*LABELS, "result"],
            registry=r,
        )
        self.partition_owner = Gauge(
            f"{PREFIX}_partition_owner",
            "1 for the consumer (pod) holding the partition's lease now; absent while nobody does.",
            [*LABELS, "partition", "owner"],
            registry=r,
        )
        self.unowned = Gauge(
            f"{PREFIX}_unowned_partitions",
            "Partitions no live consumer holds (nobody reads them).",
            LABELS,
            registry=r,
        )
        self.expired_unread = Gauge(
            f"{PREFIX}_expired_unread_events",
            "Events that expired from the hub before they were read, over the partitions whose checkpoint "
            "the hub's retention passed (as the last probe saw them; 0: none).",
            LABELS,
            registry=r,
        )
        self._define_loop_metrics(r)
        self._hubs: dict[tuple[str, str], tuple[str, str]] = {}  # resource -> (hub, consumer group)
        self._define_load_metrics(r)
        self._partitions_seen: dict[tuple[str, str], set[str]] = {}
        self._lag_seen: dict[tuple[str, str], set[str]] = {}
        self._owners_seen: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._load_seen: dict[tuple[str, str], set[str]] = {}

    def _define_load_metrics(self, r: CollectorRegistry) -> None:
        """What load-aware assignment and the lag target measure."""
        self.partition_load = Gauge(
            f"{PREFIX}_partition_load_events_per_second",
            "Events enqueued per second on one partition (its load: the median over the load window, or the "
            "last two probes when they agree).",
            [*LABELS, "partition"],
            registry=r,
        )
        self.capacity = Gauge(
            f"{PREFIX}_pool_consumer_capacity_events_per_second",
            "Events one consumer processes per second of work (absent until measured).",
            LABELS,
            registry=r,
        )

    def _define_loop_metrics(self, r: CollectorRegistry) -> None:
        """The phase, rebalance, scaling and cycle metrics."""
        self.phase_duration = Gauge(
            f"{PREFIX}_phase_duration_seconds", "Seconds since the phase last changed.", LABELS, registry=r
        )
        self.phase_bound = Gauge(
            f"{PREFIX}_phase_bound_seconds",
            "How long the current phase may last (Holddown: the delay; Rebalancing: the handoff deadline "
            "plus a membership lease; Ready: +Inf).",
            LABELS,
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

    def initialise(self, namespace: str, consumer: str) -> None:
        """Every counter and histogram of one PartitionedConsumer at 0, so their series exist before the
        first event they count (a query for errors or moves then says 0, not nothing)."""
        self.cycle_errors.labels(namespace, consumer)
        self.cycle_duration.labels(namespace, consumer)
        self.moves.labels(namespace, consumer)
        self.handoff_duration.labels(namespace, consumer)
        for reason in PublishReason:
            self.rebalances.labels(namespace, consumer, reason.value)
        for direction in ("up", "down"):
            self.scale_events.labels(namespace, consumer, direction)
        for result in LAG_READ_RESULTS:
            self.lag_reads.labels(namespace, consumer, result)

    # helpers for the label sets that must be replaced, not just set

    def set_phase(self, namespace: str, consumer: str, phase: ResourcePhase) -> None:
        for candidate in ResourcePhase:
            self.phase.labels(namespace, consumer, candidate).set(1 if candidate == phase else 0)

    def set_hub(self, namespace: str, consumer: str, hub: str, consumer_group: str) -> None:
        """The hub and consumer group the resource reads now; a changed one replaces the series about the
        old one's partitions and backlog (set again by the next `set_backlog`, `set_lag`...)."""
        key = (namespace, consumer)
        before = self._hubs.get(key)
        if before is not None and before != (hub, consumer_group):
            self._forget_hub(key, before)
        self._hubs[key] = (hub, consumer_group)

    def _hub_labels(self, namespace: str, consumer: str) -> tuple[str, str, str, str]:
        hub, group = self._hubs.get((namespace, consumer), ("", ""))
        return (namespace, consumer, hub, group)

    def set_partitions(self, namespace: str, consumer: str, count: int) -> None:
        self.partitions.labels(*self._hub_labels(namespace, consumer)).set(count)

    def set_backlog(self, namespace: str, consumer: str, per_partition: Mapping[str, int]) -> None:
        """Per-partition backlog and its total; partitions that disappeared stop being exported."""
        key, labels = (namespace, consumer), self._hub_labels(namespace, consumer)
        for gone in self._partitions_seen.get(key, set()) - set(per_partition):
            self.partition_backlog.remove(*labels, gone)
        for partition, value in per_partition.items():
            self.partition_backlog.labels(*labels, partition).set(value)
        self._partitions_seen[key] = set(per_partition)
        self.backlog.labels(*labels).set(sum(per_partition.values()))

    def set_lag(self, namespace: str, consumer: str, per_partition: Mapping[str, float | None]) -> None:
        """Per-partition lag in seconds and the worst; a partition whose lag is unknown is not exported
        (rather than a guess), and counted in `hubshift_lag_unknown_partitions`."""
        key, labels = (namespace, consumer), self._hub_labels(namespace, consumer)
        known = {p: v for p, v in per_partition.items() if v is not None}
        for gone in self._lag_seen.get(key, set()) - set(known):
            self.partition_lag.remove(*labels, gone)
        for partition, value in known.items():
            self.partition_lag.labels(*labels, partition).set(value)
        self._lag_seen[key] = set(known)
        self.lag.labels(*labels).set(max(known.values(), default=0.0))
        self.lag_unknown.labels(*labels).set(len(per_partition) - len(known))

    def _forget_hub(self, key: tuple[str, str], hub: tuple[str, str]) -> None:
        """Stop exporting the series about one hub's partitions and backlog."""
        labels = (*key, *hub)
        for metric in (self.partitions, self.backlog, self.lag, self.lag_unknown):
            _remove(metric, labels)
        for partition in self._partitions_seen.pop(key, set()):
            _remove(self.partition_backlog, (*labels, partition))
        for partition in self._lag_seen.pop(key, set()):
            _remove(self.partition_lag, (*labels, partition))

    def set_owners(self, namespace: str, consumer: str, owners: Mapping[str, str | None]) -> None:
        """Who holds each partition now (`hubshift_partition_owner`): a changed owner replaces the series."""
        key = (namespace, consumer)
        now = {(p, owner) for p, owner in owners.items() if owner is not None}
        for partition, owner in self._owners_seen.get(key, set()) - now:
            self.partition_owner.remove(namespace, consumer, partition, owner)
        for partition, owner in now:
            self.partition_owner.labels(namespace, consumer, partition, owner).set(1)
        self._owners_seen[key] = now

    def set_load(
        self, namespace: str, consumer: str, load: Mapping[str, float] | None, capacity: float | None
    ) -> None:
        """Each partition's incoming rate and the consumers' capacity, when measured."""
        key = (namespace, consumer)
        rates = load or {}
        for gone in self._load_seen.get(key, set()) - set(rates):
            self.partition_load.remove(namespace, consumer, gone)
        for partition, rate in rates.items():
            self.partition_load.labels(namespace, consumer, partition).set(rate)
        self._load_seen[key] = set(rates)
        if capacity is not None:
            self.capacity.labels(namespace, consumer).set(capacity)

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
            self.moves,
            self.handoff_duration,
            self.cycle_duration,
            self.cycle_errors,
            self.paused,
            self.fallback_active,
            self.unowned,
            self.expired_unread,
            self.phase_duration,
            self.phase_bound,
            self.capacity,
        ):
            _remove(metric, (namespace, consumer))
        hub = self._hubs.pop((namespace, consumer), None)
        self._forget_hub((namespace, consumer), hub or ("", ""))
        for partition in self._load_seen.pop((namespace, consumer), set()):
            _remove(self.partition_load, (namespace, consumer, partition))
        for result in LAG_READ_RESULTS:
            _remove(self.lag_reads, (namespace, consumer, result))
        for partition, owner in self._owners_seen.pop((namespace, consumer), set()):
            _remove(self.partition_owner, (namespace, consumer, partition, owner))
        for phase in ResourcePhase:
            _remove(self.phase, (namespace, consumer, phase))
        for direction in ("up", "down"):
            _remove(self.scale_events, (namespace, consumer, direction))
        for labels in [
            labels for labels in _label_sets(self.rebalances) if labels[:2] == (namespace, consumer)
        ]:
            _remove(self.rebalances, labels)

    def serve(self, port: int, address: str = "0.0.0.0") -> BackgroundServer:
        """`/metrics` on `port`, on an event loop and a thread of their own (the operator's event loop never
        waits on a scrape); an `OSError` when the port cannot be bound."""
        return BackgroundServer(self._scrape, host=address, port=port, name="hubshift-metrics").start()

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition for a scrape (OpenMetrics when the scraper asks for it) and its content type."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    async def _scrape(self, request: web.BaseRequest) -> web.StreamResponse:
        """GET or HEAD `/metrics`: the exposition, gzipped when the scraper takes it."""
        if request.path != METRICS_PATH:
            return web.Response(status=HTTPStatus.NOT_FOUND, text="not found\n")
        if request.method not in ("GET", "HEAD"):
            return web.Response(
                status=HTTPStatus.METHOD_NOT_ALLOWED,
                text="method not allowed\n",
                headers={"Allow": "GET, HEAD"},
            )
        body, content_type = self.render(request.headers.get("Accept"))
        response = web.Response(body=body, headers={"Content-Type": content_type})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            response.enable_compression(web.ContentCoding.gzip)
        return response


def _label_sets(metric: Any) -> list[tuple[str, ...]]:
    return list(metric._metrics)  # prometheus_client keeps children by label values


def _remove(metric: Any, labels: tuple[str, ...]) -> None:
    if labels in _label_sets(metric):
        metric.remove(*labels)


METRICS = OperatorMetrics()
