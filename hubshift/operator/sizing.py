"""How many consumers the lag target asks for: pure, from each partition's incoming rate and backlog, the
consumers' measured capacity and how partitions will be assigned (docs/decisions.md, "Lag target").

A partition's demand is its incoming rate plus its backlog over the target (what must be processed for
its oldest event to be read within the target). The pool needs the fewest consumers whose busiest one,
with partitions assigned as the strategy would, carries at most `SCALE_OUT_UTILISATION` of a consumer's
capacity; it shrinks only to a count whose busiest consumer carries at most `SCALE_IN_UTILISATION` (the
headroom that keeps a scale-in from being undone by the next small rise). A partition whose demand alone
is more than that limit is one consumer's whatever the count: that consumer may carry its demand (more
consumers cannot help it), every other consumer still the limit (`over_capacity` names the partitions
whose rate exceeds a consumer's capacity, for a condition). `loadAware` packs the demands
(`ownership.packing`); `balanced` cannot choose which partitions share a consumer, so it is sized for the
worst grouping: the heaviest `ceil(P / n)` partitions together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hubshift.ownership.packing import SLACK, PackingRules, pack_assignment
from hubshift.spec import RebalanceStrategy

SCALE_OUT_UTILISATION = 0.8
SCALE_IN_UTILISATION = 0.6


@dataclass(frozen=True)
class LoadFigures:
    """What the lag target sizes the pool from, as the control loop measured it."""

    rates: Mapping[str, float]  # each partition's incoming events per second (`operator.load`)
    backlog: Mapping[str, int]  # each partition's unprocessed events
    capacity: float | None  # events one consumer processes per second; None: not measured yet
    strategy: RebalanceStrategy = "balanced"


@dataclass(frozen=True)
class LagSizing:
    """The consumers the lag target asks for, and why."""

    replicas: int
    demand: float  # events per second over every partition: incoming plus backlog within the target
    capacity: float  # events per second one consumer processes
    busiest: tuple[tuple[str, float], ...]  # the busiest consumer's partitions at `replicas`, with demand
    over_capacity: tuple[tuple[str, float], ...]  # partitions whose incoming rate alone exceeds capacity

    def describe(self) -> str:
        """For the decision's reason: the demand against the capacity, and what the busiest consumer reads."""
        heaviest = ", ".join(f"{p} ({rate:.0f}/s)" for p, rate in self.busiest[:3]) or "none"
        return (
            f"{self.demand:.0f} events/s to process, {self.capacity:.0f}/s per consumer; "
            f"busiest consumer: partitions {heaviest}"
        )


def size_for_lag(figures: LoadFigures, target_seconds: float, current: int, low: int, high: int) -> LagSizing:
    """The replica count in [low, high] for the lag target (`figures.capacity` must be known)."""
    capacity = figures.capacity or 0.0
    partitions = sorted(set(figures.rates) | set(figures.backlog))
    demand = {p: figures.rates.get(p, 0.0) + figures.backlog.get(p, 0) / target_seconds for p in partitions}

    def fits(count: int, utilisation: float) -> bool:
        # A partition heavier than the limit is one consumer's whatever the count: more cannot help that
        # consumer, the others must still keep up.
        limit = capacity * utilisation
        return all(
            sum(d for _, d in held) <= max(limit, held[0][1]) * (1 + SLACK)
            for held in _shares(demand, count, figures.strategy)
            if held
        )

    up = next((n for n in range(max(low, 1), high + 1) if fits(n, SCALE_OUT_UTILISATION)), high)
    replicas = up
    if up < current:  # fewer would do: only as few as keep the headroom
        replicas = next((n for n in range(up, current) if fits(n, SCALE_IN_UTILISATION)), current)
    replicas = min(max(replicas, low), high)
    held = _shares(demand, max(replicas, 1), figures.strategy)
    busiest = max(held, key=lambda share: sum(d for _, d in share), default=())
    over = tuple((p, r) for p, r in sorted(figures.rates.items()) if r > capacity)
    return LagSizing(replicas, sum(demand.values()), capacity, busiest, over)


Share = tuple[tuple[str, float], ...]


def _shares(demand: Mapping[str, float], count: int, strategy: RebalanceStrategy) -> list[Share]:
    """What consumers carry over `count` of them, each its partitions with their demand, heaviest first:
    the packing's consumers (`loadAware`), or the worst grouping (`balanced`: the heaviest `ceil(P / n)`)."""
    heaviest = sorted(demand.items(), key=lambda item: (-item[1], item[0]))
    if strategy == "balanced" or not demand:
        return [tuple(heaviest[: math.ceil(len(demand) / max(count, 1))])]
    names = [f"consumer-{i}" for i in range(count)]
    plan = pack_assignment(demand, names, {}, demand, PackingRules())
    order = {p: i for i, (p, _) in enumerate(heaviest)}
    return [
        tuple((p, demand[p]) for p in sorted(plan.partitions_of(c), key=order.__getitem__)) for c in names
    ]
