"""The lag target: the fewest consumers whose busiest one stays under 80 % of a consumer's capacity, as few
as keep 60 % on the way down; the partition that no assignment can help."""

from __future__ import annotations

from hubshift.operator.autoscaler import ScalingObservation, ScalingState, decide_replicas
from hubshift.operator.sizing import (
    SCALE_IN_UTILISATION,
    LoadFigures,
    size_for_lag,
)
from hubshift.spec import ScalingGoalSpec, ScalingSpec


def zipf(partitions: int = 32, total: float = 1000.0) -> dict[str, float]:
    weights = [1 / (i + 1) for i in range(partitions)]
    return {str(p): total * w / sum(weights) for p, w in enumerate(weights)}


def test_packing_needs_fewer_consumers_than_the_worst_count_balanced_grouping() -> None:
    rates = zipf()
    packed = size_for_lag(LoadFigures(rates, {}, 300.0, "loadAware"), 5.0, 1, 1, 32)
    counted = size_for_lag(LoadFigures(rates, {}, 300.0, "balanced"), 5.0, 1, 1, 32)
    # 1000 events/s at 80 % of 300 a consumer: 4.2 consumers; partition 0 alone is 246/s, a consumer's.
    assert packed.replicas == 5
    assert packed.busiest == (("0", rates["0"]),)
    # Count-balanced may put any two of them together: the two heaviest (369/s) do not fit one consumer.
    assert counted.replicas == 32
    bigger = size_for_lag(LoadFigures(rates, {}, 500.0, "balanced"), 5.0, 1, 1, 32)
    assert bigger.replicas == 16 and sum(d for _, d in bigger.busiest) <= 400  # the two heaviest: 369/s


def test_backlog_adds_what_must_be_read_within_the_target() -> None:
    rates = {str(p): 50.0 for p in range(8)}
    calm = size_for_lag(LoadFigures(rates, {}, 200.0, "loadAware"), 10.0, 1, 1, 8)
    behind = size_for_lag(LoadFigures(rates, {"0": 1000}, 200.0, "loadAware"), 10.0, 1, 1, 8)
    assert calm.replicas == 3 and calm.demand == 400.0  # three partitions (150/s) a consumer, <= 160
    assert behind.replicas == 4 and behind.demand == 500.0  # partition 0 needs 150/s for ten seconds


def test_scale_in_only_to_a_count_with_headroom() -> None:
    rates = {str(p): 40.0 for p in range(16)}  # 640 events/s, 200 per consumer
    up = size_for_lag(LoadFigures(rates, {}, 200.0, "loadAware"), 5.0, 2, 1, 16)
    assert up.replicas == 4  # 160 a consumer <= 80 %
    down = size_for_lag(LoadFigures(rates, {}, 200.0, "loadAware"), 5.0, 8, 1, 16)
    assert down.replicas == 6  # 4 would do at 80 %, but a scale-in keeps 60 %: 120/s a consumer, 6 of them
    assert 200 * SCALE_IN_UTILISATION >= 640 / 6


def test_a_partition_over_one_consumer_capacity_is_named() -> None:
    rates = {"0": 500.0, "1": 10.0}
    sizing = size_for_lag(LoadFigures(rates, {}, 200.0, "loadAware"), 5.0, 1, 1, 2)
    assert sizing.over_capacity == (("0", 500.0),)
    assert sizing.replicas == 2


def test_the_autoscaler_uses_the_lag_target_once_capacity_is_measured() -> None:
    config = ScalingSpec(target=ScalingGoalSpec(unprocessed_events_per_replica=1000, lag_seconds=5))
    rates = {str(p): 40.0 for p in range(16)}
    waiting = ScalingObservation(0, 16, 2, load=LoadFigures(rates, {}, None, "loadAware"))
    decision = decide_replicas(config, ScalingState(replicas=2), waiting, now=100.0)
    assert decision.sizing is None and decision.reason.startswith("backlog 0")
    measured = ScalingObservation(0, 16, 2, load=LoadFigures(rates, {}, 200.0, "loadAware"))
    decision = decide_replicas(config, ScalingState(replicas=2), measured, now=100.0)
    assert decision.sizing is not None and decision.replicas == 4
    assert decision.reason.startswith("lag target 5s: 640 events/s to process, 200/s per consumer")
