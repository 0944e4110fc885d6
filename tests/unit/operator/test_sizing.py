"""The lag target: the fewest consumers whose busiest one stays under 80 % of a consumer's capacity, as few
as keep 60 % on the way down; the partition that no assignment can help."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift.operator.autoscaler import ScalingObservation, ScalingState, decide_replicas
from hubshift.operator.sizing import (
    SCALE_IN_UTILISATION,
    SCALE_OUT_UTILISATION,
    LoadFigures,
    size_for_lag,
)
from hubshift.ownership.packing import SLACK, PackingRules, pack_assignment
from hubshift.spec import RebalanceStrategy, ScalingGoalSpec, ScalingSpec


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


def test_a_partition_over_capacity_gets_a_consumer_and_the_others_still_keep_up() -> None:
    rates = {str(p): 150.0 if p == 0 else 30.0 for p in range(8)}  # partition 0 alone is 1.5 consumers
    sizing = size_for_lag(LoadFigures(rates, {}, 100.0, "loadAware"), 5.0, 2, 1, 8)
    # Partition 0 on one consumer; 210/s on the rest at most 80/s each: two partitions a consumer, 1 + 4
    # (not 1 + 2, as if the others could carry 150/s too).
    assert sizing.replicas == 5
    assert sizing.busiest == (("0", 150.0),) and sizing.over_capacity == (("0", 150.0),)


# --- properties ------------------------------------------------------------------------------------------


def shares(demand: dict[str, float], count: int, strategy: RebalanceStrategy) -> list[list[float]]:
    """What each consumer carries over `count`: the packing's consumers, or count-balanced's worst grouping
    (any ceil(P / n) partitions may share a consumer: the heaviest together)."""
    if strategy == "balanced":
        return [sorted(demand.values(), reverse=True)[: math.ceil(len(demand) / count)]]
    names = [f"c{i}" for i in range(count)]
    plan = pack_assignment(demand, names, {}, demand, PackingRules())
    return [[demand[p] for p in plan.partitions_of(c)] for c in names]


def keeps_up(demand: dict[str, float], count: int, strategy: RebalanceStrategy, limit: float) -> bool:
    """Every consumer carries at most `limit`, or a partition heavier than that alone plus nothing more."""
    return all(
        sum(held) <= max(limit, max(held, default=0.0)) * (1 + SLACK)
        for held in shares(demand, count, strategy)
    )


@st.composite
def figures(draw: st.DrawFn) -> tuple[LoadFigures, float, int, int, int]:
    """Skewed rates and backlogs over up to 16 partitions, a capacity, a target, current and bounds."""
    partitions = draw(st.integers(1, 16))
    rates = {str(p): float(draw(st.integers(0, 400))) for p in range(partitions)}
    backlog = {str(p): draw(st.integers(0, 2000)) for p in range(partitions) if draw(st.booleans())}
    capacity = float(draw(st.integers(20, 500)))
    strategy: RebalanceStrategy = draw(st.sampled_from(["balanced", "loadAware"]))
    low = draw(st.integers(0, partitions))
    high = draw(st.integers(max(low, 1), partitions))
    current = draw(st.integers(0, partitions))
    target = draw(st.sampled_from([1.0, 5.0, 30.0]))
    return LoadFigures(rates, backlog, capacity, strategy), target, current, low, high


@settings(max_examples=300, deadline=None)
@given(figures())
def test_the_count_is_the_fewest_that_keep_up_and_shrinks_only_with_headroom(
    case: tuple[LoadFigures, float, int, int, int],
) -> None:
    load, target, current, low, high = case
    sizing = size_for_lag(load, target, current, low, high)
    n = sizing.replicas
    assert max(low, 1) <= n <= high
    demand = {p: load.rates.get(p, 0.0) + load.backlog.get(p, 0) / target for p in load.rates}
    capacity = load.capacity or 0.0
    out, within = capacity * SCALE_OUT_UTILISATION, capacity * SCALE_IN_UTILISATION
    if n > max(current, max(low, 1)):  # a scale-out: to the fewest that keep up (or as many as allowed)
        assert n == high or keeps_up(demand, n, load.strategy, out)
        assert not keeps_up(demand, n - 1, load.strategy, out)
    if n < min(current, high):  # a scale-in (not max's): to the fewest that keep the headroom
        assert keeps_up(demand, n, load.strategy, within)
        assert not any(keeps_up(demand, m, load.strategy, within) for m in range(max(low, 1), n))
    assert sizing.over_capacity == tuple((p, r) for p, r in sorted(load.rates.items()) if r > capacity)


@settings(max_examples=200, deadline=None)
@given(figures(), st.randoms(use_true_random=False))
def test_the_same_figures_in_any_order_give_the_same_count(
    case: tuple[LoadFigures, float, int, int, int], rng: random.Random
) -> None:
    load, target, current, low, high = case
    shuffled = LoadFigures(
        dict(rng.sample(sorted(load.rates.items()), len(load.rates))),
        dict(rng.sample(sorted(load.backlog.items()), len(load.backlog))),
        load.capacity,
        load.strategy,
    )
    sizing = size_for_lag(load, target, current, low, high)
    assert size_for_lag(shuffled, target, current, low, high) == sizing
