"""Each partition's load (median rates over a window: a brief spike changes nothing), its weight in
events per second, and the consumers' measured capacity."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.operator.autoscaler import Pause, ScalingDecision, ScalingState
from hubshift.operator.consumer_http import parse_figures
from hubshift.operator.load import (
    HubSample,
    PartitionLoad,
    WorkSample,
    consumer_capacity,
    load_weights,
    partition_loads,
)
from hubshift.operator.rebalance import RebalanceState
from hubshift.operator.sizing import LoadFigures, size_for_lag
from hubshift.operator.status import build_status, restoring_partitions


def samples(rates: list[float], every: float = 5.0, start: float = 0.0) -> list[HubSample]:
    """Partition "0" receiving `rates[i]` events a second between sample i and i + 1 (100-byte events)."""
    out = [HubSample(start, {"0": (0, 0)})]
    sequence = 0
    for index, rate in enumerate(rates):
        sequence += round(rate * every)
        out.append(HubSample(start + (index + 1) * every, {"0": (sequence, sequence * 100)}))
    return out


def test_the_rate_is_the_median_of_the_intervals_of_the_window() -> None:
    loads = partition_loads(samples([10, 30, 20]), now=15, window=60)
    assert loads == {"0": PartitionLoad("0", 20.0, 2000.0)}


def test_samples_older_than_the_window_are_left_out() -> None:
    loads = partition_loads(samples([500, 10, 10, 10]), now=20, window=15)
    assert loads["0"].events_per_second == 10.0


def test_one_sample_says_nothing_yet() -> None:
    assert partition_loads(samples([]), now=0, window=60) == {}


def test_a_hub_created_again_or_a_partition_new_in_a_sample_gives_no_rate_for_that_interval() -> None:
    history = [
        HubSample(0, {"0": (100, None)}),
        HubSample(5, {"0": (5, None), "1": (0, None)}),
        HubSample(10, {"0": (55, None), "1": (50, None)}),
    ]
    loads = partition_loads(history, now=10, window=60)
    assert loads == {"0": PartitionLoad("0", 10.0, None), "1": PartitionLoad("1", 10.0, None)}


@settings(max_examples=200, deadline=None)
@given(
    st.integers(4, 16),
    st.floats(1, 1000),
    st.data(),
)
def test_a_burst_covering_fewer_than_half_of_the_intervals_and_not_the_last_two_changes_nothing(
    intervals: int, rate: float, data: st.DataObject
) -> None:
    burst = data.draw(st.lists(st.integers(0, intervals - 1), max_size=(intervals - 1) // 2, unique=True))
    assume(not {intervals - 2, intervals - 1} <= set(burst))  # the last interval or the one before, not both
    extra = data.draw(st.floats(1, 100_000))
    rates = [rate + (extra if i in burst else 0.0) for i in range(intervals)]
    steady = partition_loads(samples([rate] * intervals), now=intervals * 5, window=intervals * 5)
    spiked = partition_loads(samples(rates), now=intervals * 5, window=intervals * 5)
    assert abs(spiked["0"].events_per_second - steady["0"].events_per_second) <= 0.5 / 5


def test_a_change_the_last_two_intervals_agree_on_counts_at_once_at_the_nearer_of_them() -> None:
    risen = partition_loads(samples([10, 10, 10, 10, 40, 30]), now=30, window=60)
    assert risen["0"].events_per_second == 30.0  # the median (10) alone would see it after half the window
    assert risen["0"].bytes_per_second == 3000.0
    fallen = partition_loads(samples([40, 40, 40, 40, 10, 20]), now=30, window=60)
    assert fallen["0"].events_per_second == 20.0
    straddling = partition_loads(samples([10, 10, 10, 10, 40, 5]), now=30, window=60)
    assert straddling["0"].events_per_second == 10.0  # one interval alone moves nothing


def test_large_events_weigh_more_than_their_count() -> None:
    loads = {
        "0": PartitionLoad("0", 100.0, 10_000.0),  # 100-byte events
        "1": PartitionLoad("1", 100.0, 50_000.0),  # 500-byte events
        "2": PartitionLoad("2", 50.0, None),  # offsets that are not byte positions: events only
    }
    weights = load_weights(loads)
    assert weights == {"0": 100.0, "1": 100.0 * 500 / 300, "2": 50.0}


def test_capacity_is_events_per_busy_second_the_median_over_the_busy_consumers() -> None:
    history = [
        WorkSample(0, {"a": (0, 0.0), "b": (0, 0.0), "c": (0, 0.0), "d": (1000, 50.0)}),
        WorkSample(10, {"a": (1000, 4.0), "b": (900, 3.0), "c": (5, 0.01), "d": (10, 0.1)}),
        WorkSample(20, {"a": (2000, 8.0), "b": (1800, 6.0), "c": (10, 0.02), "d": (510, 2.1)}),
    ]
    # a: 250/s, b: 300/s; c was busy 0.02 s (not enough to tell); d restarted (its first interval is
    # left out): 500 events in 2 s, 250/s.
    assert consumer_capacity(history, now=20, window=60) == 250.0
    assert consumer_capacity(history[:1], now=20, window=60) is None


def test_the_operator_reads_a_consumers_work_from_its_own_exposition() -> None:
    metrics = ConsumerMetrics("homes-0", process_metrics=False)
    metrics.handled("0", 300, 1.5, None)
    metrics.handled("1", 100, 0.5, None)
    body, _ = metrics.render()
    assert parse_figures(body.decode()).work == (400.0, 2.0)
    assert parse_figures("# nothing here\n").work is None


def test_the_operator_reads_the_partitions_a_consumer_is_restoring_from_its_exposition() -> None:
    """A streaming job's partition is restoring from its query's start to its first committed batch; one
    that stops before that is no longer named."""
    now = [1_000.0]
    metrics = ConsumerMetrics("homes-0", process_metrics=False, clock=lambda: now[0])
    metrics.state_restoring("3")
    now[0] = 1_010.0
    metrics.state_restoring("5")
    assert parse_figures(metrics.render()[0].decode()).restoring == {"3": 1_000.0, "5": 1_010.0}
    metrics.state_restored("3", 12.5)
    metrics.state_restored("5", None)
    body = metrics.render()[0].decode()
    assert parse_figures(body).restoring == {}
    assert "hubshift_consumer_state_restore_seconds{" in body and "12.5" in body


def test_status_lists_the_partitions_being_restored_oldest_first() -> None:
    restoring = restoring_partitions({"7": ("homes-1", 1_000.0), "2": ("homes-0", 990.0)}, now=1_004.0)
    assert [(r.partition, r.consumer, r.seconds) for r in restoring] == [
        ("2", "homes-0", 14.0),
        ("7", "homes-1", 4.0),
    ]
    assert restoring[0].since.isoformat() == "1970-01-01T00:16:30+00:00"


def test_status_names_the_partitions_no_consumer_keeps_up_with() -> None:
    sizing = size_for_lag(LoadFigures({"0": 500.0, "1": 10.0}, {}, 200.0, "loadAware"), 5.0, 2, 1, 2)
    status = build_status(
        state=RebalanceState(generation=1, assignment={"0": "homes-0", "1": "homes-1"}),
        decision=ScalingDecision(2, "lag target", True, False, False, 2, ScalingState(), sizing),
        pause=Pause(),
        owners={},
        instances=[],
        current_replicas=2,
        partition_count=2,
        total_backlog=0,
        previous_conditions=[],
        observed_generation=1,
        now=1_800_000_000.0,
        last_scale_time=None,
        probe_error=None,
        load={"0": 500.0, "1": 10.0},
        capacity=200.0,
    )
    body = status.to_body()
    over = next(c for c in body["conditions"] if c["type"] == "PartitionOverCapacity")
    assert over["status"] == "True" and over["message"].startswith("partitions 0 (500/s) each receive more")
    assert body["consumerCapacityEventsPerSecond"] == 200.0 and body["incomingEventsPerSecond"] == 510.0
    assert body["lagTarget"] == {
        "replicas": 2,
        "demandEventsPerSecond": 510.0,
        "busiest": [{"partition": "0", "eventsPerSecond": 500.0}],
    }
    assert body["assignment"][0] == {"consumer": "homes-0", "partitions": ["0"], "eventsPerSecond": 500.0}
