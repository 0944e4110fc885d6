"""How many series hubshift gives Prometheus, counted from the real registries with every series a running
pool sets, at 1,024 partitions: the figures docs/observability.md states ("How many series")."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hubshift.consumer.metrics import ConsumerMetrics, JvmFigures
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.status import ResourcePhase

DOCS = Path(__file__).resolve().parents[3] / "docs" / "observability.md"
PARTITIONS = 1024
SCRAPE_SERIES = (
    5  # up, scrape_duration_seconds, scrape_samples_scraped, ..._post_metric_relabeling, scrape_series_added
)


def series(registry: CollectorRegistry, prefix: str = "hubshift_") -> int:
    text = generate_latest(registry).decode()
    return sum(
        1 for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith(prefix)
    )


def operator(partitions: int) -> OperatorMetrics:
    """One PartitionedConsumer as a control loop reports it after a cycle."""
    metrics = OperatorMetrics()
    metrics.initialise("ns", "homes")
    metrics.set_hub("ns", "homes", "telemetry", "$Default")
    metrics.set_partitions("ns", "homes", partitions)
    for gauge in (
        metrics.desired_replicas, metrics.current_replicas, metrics.ready_replicas, metrics.paused,
        metrics.fallback_active, metrics.unowned, metrics.phase_duration, metrics.phase_bound,
    ):  # fmt: skip
        gauge.labels("ns", "homes").set(1)
    metrics.set_phase("ns", "homes", ResourcePhase.READY)
    ids = [str(p) for p in range(partitions)]
    metrics.set_backlog("ns", "homes", dict.fromkeys(ids, 5))
    metrics.set_lag("ns", "homes", dict.fromkeys(ids, 1.5))
    metrics.set_owners("ns", "homes", {p: f"homes-{int(p) % 100}" for p in ids})
    return metrics


def consumer(owned: int) -> ConsumerMetrics:
    """A Spark consumer pod owning `owned` partitions (a JVM with two collectors, one pipeline output)."""
    metrics = ConsumerMetrics("homes-0", process_metrics=False, hub="telemetry", consumer_group="$Default")
    metrics.enable_spark()
    metrics.jvm_sampled(
        JvmFigures(1e8, 2e8, 5e8, 5e7, 6e7, {"G1 Young Generation": (3, 0.1), "G1 Old Generation": (0, 0.0)})
    )
    metrics.output_rows.labels("aggregates").inc()
    for p in map(str, range(owned)):
        metrics.partition_acquired(p)
        metrics.set_backlog(p, 1)
        metrics.set_lag(p, 0.5)
        metrics.checkpoint_written(p)
        metrics.events.labels(*metrics.hub_labels, p).inc()
    return metrics


def test_the_documented_series_counts_are_what_the_registries_export() -> None:
    per_pool = series(operator(0).registry)
    per_partition = (series(operator(PARTITIONS).registry) - per_pool) / PARTITIONS
    build_info = 1
    pod = series(consumer(0).registry)
    per_owned = series(consumer(1).registry) - pod
    process = series(ConsumerMetrics("homes-0").registry, "process_") + series(
        ConsumerMetrics("homes-1").registry, "python_"
    )
    assert per_partition == 3
    assert per_owned == 5
    figures = {
        "operator per partition": per_partition,
        "operator per resource": per_pool - build_info,
        "consumer per partition": per_owned,
        "consumer pod": pod,
        "process": process,
    }
    text = DOCS.read_text()
    table = dict(
        re.findall(
            r"^\| (the operator, per partition|the operator, per PartitionedConsumer|"
            r"a consumer, per partition it owns|a consumer pod, whatever it owns) \| (\d+)",
            text,
            re.M,
        )
    )
    assert table == {
        "the operator, per partition": str(int(figures["operator per partition"])),
        "the operator, per PartitionedConsumer": str(figures["operator per resource"]),
        "a consumer, per partition it owns": str(figures["consumer per partition"]),
        "a consumer pod, whatever it owns": str(figures["consumer pod"]),
    }, figures
    prose = " ".join(text.split())  # the page wraps its lines
    assert f"{process} `process_*`/`python_*`" in prose
    # The totals the page works out at 1,024 partitions, with 100 and 10 consumers.
    operator_total = series(operator(PARTITIONS).registry)
    pod_total = pod + process + SCRAPE_SERIES
    for pods in (100, 10):
        total = operator_total + per_owned * PARTITIONS + pods * pod_total
        assert f"{total:,} series with {pods} consumers" in prose, (pods, total)
    assert f"{operator_total:,} series from the operator" in prose
