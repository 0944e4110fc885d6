"""The consumer's metrics: the names the docs list, bounded labels, gauges of partitions
no longer owned removed, checkpoint age from the clock."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.sinks.commits import BatchSummary, PartitionRange


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def samples(metrics: ConsumerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample by name and labels; an empty label value is no label (as Prometheus stores it)."""
    text = metrics.render()[0].decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_documented_table_is_what_a_consumer_exports() -> None:
    """docs/observability.md's table of a consumer's metrics names exactly what `ConsumerMetrics` exports
    (test_chart.py checks the chart's dashboards and alerts against the exports)."""
    metrics = ConsumerMetrics("homes-0", process_metrics=False)
    metrics.enable_spark()  # the Spark engine's figures are in the table too
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in metrics.registry.collect()}
    table = (Path(__file__).parents[3] / "docs" / "observability.md").read_text()
    documented = set(re.findall(r"^\| `(hubshift_consumer_[a-z_]+)`", table, re.MULTILINE))
    assert exported == documented


def test_counters_that_matter_before_the_first_failure_exist_from_the_start() -> None:
    got = samples(ConsumerMetrics("homes-0", process_metrics=False))
    for name, labels in [
        ("hubshift_consumer_lease_lost_total", ()),
        ("hubshift_consumer_lease_renewals_total", (("result", "failed"),)),
        ("hubshift_consumer_checkpoints_total", (("result", "failed"),)),
        ("hubshift_consumer_batches_total", (("result", "failed"),)),
        ("hubshift_consumer_handoff_duration_seconds_count", ()),
        ("hubshift_consumer_spool_events", ()),
    ]:
        assert got[(name, labels)] == 0, name


def test_the_sdk_engine_counts_events_as_spark_does() -> None:
    clock = Clock(2_000.0)
    metrics = ConsumerMetrics("homes-0", clock=clock, process_metrics=False)
    metrics.handled("4", 25, 0.2, datetime.fromtimestamp(1_990.0, UTC))
    got = samples(metrics)
    assert got[("hubshift_consumer_events_total", (("partition", "4"),))] == 25
    assert got[("hubshift_consumer_batches_total", (("result", "ok"),))] == 1
    assert got[("hubshift_consumer_enqueue_to_sink_seconds_sum", ())] == pytest.approx(10.0)
    metrics.partition_acquired("4")
    metrics.partition_released("4", drain_seconds=1.5)
    assert samples(metrics)[("hubshift_consumer_handoff_duration_seconds_sum", ())] == 1.5


def test_a_batch_moves_the_counters() -> None:
    clock = Clock(1_000_000.0)
    metrics = ConsumerMetrics("homes-0", clock=clock, process_metrics=False)
    enqueued = datetime.fromtimestamp(clock.now - 2.5, UTC)
    summary = BatchSummary(
        consumer_id="homes-0",
        batch_id=3,
        partitions={
            "0": PartitionRange("0", 10, 19, "190", 10, enqueued, enqueued + timedelta(seconds=1)),
            "1": PartitionRange("1", 0, 4, "40", 5, enqueued, enqueued),
        },
        outputs={"aggregates": 7},
        dead_letters=2,
        duration_seconds=0.4,
    )
    metrics.batch_processed(summary)
    got = samples(metrics)
    assert got[("hubshift_consumer_events_total", (("partition", "0"),))] == 10
    assert got[("hubshift_consumer_events_total", (("partition", "1"),))] == 5
    assert got[("hubshift_consumer_output_rows_total", (("output", "aggregates"),))] == 7
    assert got[("hubshift_consumer_dead_letters_total", ())] == 2
    assert got[("hubshift_consumer_batches_total", (("result", "ok"),))] == 1
    assert got[("hubshift_consumer_batch_duration_seconds_count", ())] == 1
    assert got[("hubshift_consumer_batch_duration_seconds_sum", ())] == pytest.approx(0.4)
    assert got[("hubshift_consumer_batch_events_sum", ())] == 15
    assert got[("hubshift_consumer_enqueue_to_sink_seconds_sum", ())] == pytest.approx(5.0)
    assert got[("hubshift_consumer_last_batch_timestamp_seconds", ())] == clock.now
    metrics.batch_failed(1.0)
    assert samples(metrics)[("hubshift_consumer_batches_total", (("result", "failed"),))] == 1


def test_ownership_gauges_follow_the_partitions_owned() -> None:
    clock = Clock(500.0)
    metrics = ConsumerMetrics("homes-0", clock=clock, process_metrics=False)
    metrics.partition_acquired("0", how="own")
    metrics.partition_acquired("1", how="broken")
    metrics.set_backlog("0", 40)
    metrics.set_backlog("1", -3)
    metrics.checkpoint_written("0", at=480.0)
    metrics.checkpoint_written("1")
    clock.now = 510.0
    got = samples(metrics)
    assert got[("hubshift_consumer_owned_partitions", ())] == 2
    assert got[("hubshift_consumer_backlog_events", (("partition", "0"),))] == 40
    assert got[("hubshift_consumer_backlog_events", (("partition", "1"),))] == 0
    assert got[("hubshift_consumer_checkpoint_age_seconds", (("partition", "0"),))] == 30
    assert got[("hubshift_consumer_checkpoint_age_seconds", (("partition", "1"),))] == 10
    assert got[("hubshift_consumer_partitions_acquired_total", (("how", "broken"),))] == 1

    metrics.partition_released("0")
    metrics.partition_lost("1")
    got = samples(metrics)
    assert got[("hubshift_consumer_owned_partitions", ())] == 0
    assert not any(name == "hubshift_consumer_backlog_events" for name, _ in got)
    assert not any(name == "hubshift_consumer_checkpoint_age_seconds" for name, _ in got)
    assert got[("hubshift_consumer_partitions_released_total", ())] == 1
    assert got[("hubshift_consumer_lease_lost_total", ())] == 1


def test_lease_and_checkpoint_results() -> None:
    metrics = ConsumerMetrics("c", process_metrics=False)
    metrics.lease_renewed()
    metrics.lease_renewed(ok=False)
    metrics.checkpoint_failed(fenced=True)
    metrics.checkpoint_failed()
    got = samples(metrics)
    assert got[("hubshift_consumer_lease_renewals_total", (("result", "ok"),))] == 1
    assert got[("hubshift_consumer_lease_renewals_total", (("result", "failed"),))] == 1
    assert got[("hubshift_consumer_checkpoints_total", (("result", "fenced"),))] == 1
    assert got[("hubshift_consumer_checkpoints_total", (("result", "failed"),))] == 1
    with pytest.raises(ValueError):
        metrics.partition_acquired("0", how="magic")


def test_info_and_process_metrics_and_openmetrics() -> None:
    metrics = ConsumerMetrics("homes-7")
    got = samples(metrics)
    assert any(
        name == "hubshift_consumer_info" and ("consumer_id", "homes-7") in labels for name, labels in got
    )
    assert any(name.startswith("process_") for name, _ in got)
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
