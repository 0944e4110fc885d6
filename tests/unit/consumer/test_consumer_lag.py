"""A consumer's own lag in events and seconds (`consumer/lag.py`): the rules the operator uses, from what the
receiver heard, and the gauges `hubshift_consumer_backlog_events` and `hubshift_consumer_lag_seconds` that
carry it while no operator does."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from hubshift.consumer.lag import ReadProgress, lag_seconds
from hubshift.consumer.metrics import ConsumerMetrics

NOW = 1_000_000.0


def at(seconds_ago: float) -> datetime:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC)


def test_caught_up_is_zero_whatever_is_known() -> None:
    assert lag_seconds(ReadProgress(41, 41, at(300)), lambda _: None, NOW) == 0.0
    assert ReadProgress(41, 41).backlog == 0


def test_the_oldest_unprocessed_event_begins_a_batch_the_receiver_delivered() -> None:
    starts = {42: at(12.5), 60: at(3.0)}
    progress = ReadProgress(41, 70, at(1.0))
    assert progress.backlog == 29
    assert lag_seconds(progress, starts.get, NOW) == 12.5


def test_only_the_last_event_left_is_the_last_enqueued_time() -> None:
    assert lag_seconds(ReadProgress(69, 70, at(4.0)), lambda _: None, NOW) == 4.0


def test_unknown_rather_than_a_guess() -> None:
    """The event after the last processed one is in the middle of a batch (or not received yet): neither
    the batch starts around it nor the last enqueued time is its own."""
    starts = {30: at(20.0), 50: at(10.0)}
    assert lag_seconds(ReadProgress(41, 70, at(1.0)), starts.get, NOW) is None
    assert lag_seconds(ReadProgress(-1, 5, None), lambda _: None, NOW) is None


@given(
    processed=st.integers(-1, 1_000),
    ahead=st.integers(0, 1_000),
    age=st.floats(0, 86_400, allow_nan=False),
    known=st.booleans(),
)
def test_never_negative_and_zero_only_when_caught_up(
    processed: int, ahead: int, age: float, known: bool
) -> None:
    progress = ReadProgress(processed, processed + ahead, at(age / 2))
    starts = {processed + 1: at(age)} if known else {}
    seconds = lag_seconds(progress, starts.get, NOW)
    if ahead == 0:
        assert seconds == 0.0
    elif known:
        assert seconds is not None and abs(seconds - age) < 1e-3
    elif ahead == 1:
        assert seconds is not None and abs(seconds - age / 2) < 1e-3
    else:
        assert seconds is None


def gauges(metrics: ConsumerMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = metrics.render()[0].decode()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_the_gauges_carry_the_hub_and_leave_out_what_is_unknown_or_no_longer_owned() -> None:
    metrics = ConsumerMetrics("homes-0", process_metrics=False, hub="telemetry", consumer_group="$Default")
    hub = (("consumer_group", "$Default"), ("hub", "telemetry"))
    metrics.partition_acquired("0")
    metrics.partition_acquired("1")
    metrics.set_lag("0", 7.5)
    metrics.set_lag("1", None)
    assert gauges(metrics, "hubshift_consumer_lag_seconds") == {(*hub, ("partition", "0")): 7.5}
    metrics.set_lag("0", None)  # no longer known: gone, not stale
    assert gauges(metrics, "hubshift_consumer_lag_seconds") == {}
    metrics.set_lag("1", 2.0)
    metrics.partition_released("1")
    assert gauges(metrics, "hubshift_consumer_lag_seconds") == {}
    info = gauges(metrics, "hubshift_consumer_info")
    assert [dict(labels)["hub"] for labels in info] == ["telemetry"]
