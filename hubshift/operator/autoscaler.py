"""The replica decision: how many consumers the backlog asks for (KEDA ScaledObject + HPA behaviour).

Pure: a function of the spec's `scaling` block, the state kept from the previous cycle, what was observed and
`now`. The caller stores the returned state and passes it back next cycle (it round-trips through
`to_dict`/`from_dict`).

One cycle, in order (docs/decisions.md has the reasons):
1. Bookkeeping: count consecutive failed backlog reads; note the last time the backlog was above the
   activation threshold (or force-activation was set).
2. Pause annotations: `paused-replicas: N` forces N; `paused` keeps the current count.
   `spec.replicas` set (`requested`: kubectl scale, an HPA or KEDA through the scale subresource): exactly
   that many, at most the partitions; none of the rules below.
3. A failed read keeps the current count until `fallback.failureThreshold` consecutive failures, then
   the fallback count (static / currentReplicas / currentReplicasIfHigher / currentReplicasIfLower)
   replaces the backlog recommendation.
4. At zero: stay there until the backlog exceeds the activation threshold, then go straight to the
   recommendation (no rate limit: HPA does not run at zero, and going 0 -> 1 -> N would rebalance twice).
5. Scale to zero (when `minReplicas` or `idleReplicas` is 0) only after `cooldownPeriodSeconds` without
   activity and never before `initialCooldownPeriodSeconds` after creation; bypasses HPA behaviour.
6. Otherwise HPA: recommendation = ceil(backlog / target), clamped to [max(min, 1), min(max, partitions)]
   and aligned to the partition count (or, with a lag target, `target.lagSeconds`, and a measured
   consumer capacity, the count `sizing.size_for_lag` asks for); stabilised over the past
   recommendations (scale-up: the lowest in its window, scale-down: the highest in its window);
   rate-limited by the policies over the past scale events (Pods/Percent per period, selectPolicy
   Max/Min/Disabled); re-aligned inside the allowed range.
7. `paused-scale-in` / `paused-scale-out` block one direction (scale to zero counts as scale-in,
   activation from zero as scale-out).

Aligned counts are the fewest replicas for each possible busiest-pod load ``ceil(P / n)``: for 32
partitions {1,2,3,4,5,6,7,8,11,16,32}. Nine replicas would still leave some pod with four partitions,
like eight, so nine costs a pod for no gain; the recommendation snaps up to the next aligned count (the
busiest pod then really carries less), or down to the largest one allowed by max.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from hubshift.operator.sizing import LagSizing, LoadFigures, size_for_lag
from hubshift.spec import (
    FORCE_ACTIVATION_ANNOTATION,
    PAUSED_ANNOTATION,
    PAUSED_REPLICAS_ANNOTATION,
    PAUSED_SCALE_IN_ANNOTATION,
    PAUSED_SCALE_OUT_ANNOTATION,
    ScalingRulesSpec,
    ScalingSpec,
)

# What the decisions read is the manifest's own `spec.scaling` (`hubshift.spec.ScalingSpec`): its defaults
# and its validation live there, once.
BacklogStart = Literal["earliest", "latest"]


@dataclass(frozen=True)
class Pause:
    """The pause annotations, parsed (`parse_pause`)."""

    paused: bool = False
    replicas: int | None = None
    scale_in: bool = False
    scale_out: bool = False
    force_activation: bool = False
    problems: tuple[str, ...] = ()  # annotations ignored because their value is not understood


NO_PAUSE = Pause()


def parse_pause(annotations: Mapping[str, str]) -> Pause:
    """KEDA's annotations under our group (`hubshift.spec` names them): `paused`, `paused-replicas`,
    `paused-scale-in`, `paused-scale-out`, `force-activation`. Flags are on when the value is "true" (any
    case)."""

    def flag(name: str) -> bool:
        return annotations.get(name, "").strip().lower() == "true"

    replicas: int | None = None
    problems: list[str] = []
    raw = annotations.get(PAUSED_REPLICAS_ANNOTATION)
    if raw is not None:
        text = raw.strip()
        if text.isdigit():
            replicas = int(text)
        else:
            problems.append(f"{PAUSED_REPLICAS_ANNOTATION} must be a whole number >= 0, got {raw!r}")
    return Pause(
        paused=flag(PAUSED_ANNOTATION),
        replicas=replicas,
        scale_in=flag(PAUSED_SCALE_IN_ANNOTATION),
        scale_out=flag(PAUSED_SCALE_OUT_ANNOTATION),
        force_activation=flag(FORCE_ACTIVATION_ANNOTATION),
        problems=tuple(problems),
    )


# --- backlog --------------------------------------------------------------------------------------------


def partition_backlog(
    *,
    last_enqueued: int,
    checkpoint: int | None,
    beginning: int = 0,
    empty: bool = False,
    start: BacklogStart = "earliest",
    start_sequence_number: int | None = None,
) -> int:
    """Events of one partition not yet consumed: last enqueued sequence number - checkpoint.

    - An empty partition (or a fresh hub's `-1`) has no backlog.
    - No checkpoint (or the `-1` "nothing consumed yet" checkpoint) counts from where the consumer will
      start: the beginning for `earliest`, nothing for `latest`, or `start_sequence_number` (the first
      event at an enqueued time) when given. Never "infinite".
    - Events retention already removed (before `beginning`) are not backlog: nobody can read them.
    - A checkpoint beyond the last enqueued event (a stale read) is no backlog, not a negative one.
    """
    if empty or last_enqueued < 0:
        return 0
    if checkpoint is not None and checkpoint >= 0:
        consumed = checkpoint
    elif start_sequence_number is not None:
        consumed = start_sequence_number - 1
    elif start == "latest":
        consumed = last_enqueued
    else:
        consumed = beginning - 1
    return max(0, last_enqueued - max(consumed, beginning - 1))


def total_backlog(backlogs: Iterable[int]) -> int:
    return sum(backlogs)


# --- partition alignment ----------------------------------------------------------------------------------


def aligned_counts(partition_count: int) -> tuple[int, ...]:
    """The fewest replicas for each busiest-pod load ceil(P / n): 32 -> (1,2,3,4,5,6,7,8,11,16,32)."""
    counts: list[int] = []
    previous_load = 0
    for replicas in range(1, partition_count + 1):
        load = -(-partition_count // replicas)
        if load != previous_load:
            counts.append(replicas)
            previous_load = load
    return tuple(counts)


def align_replicas(replicas: int, partition_count: int, low: int, high: int) -> int:
    """Snap up to the next aligned count within [low, high]; if none is that high, the largest there;
    if there is no aligned count in the range at all, `replicas` unchanged."""
    candidates = [c for c in aligned_counts(partition_count) if low <= c <= high]
    if not candidates:
        return replicas
    return next((c for c in candidates if c >= replicas), candidates[-1])


def replica_bounds(scaling: ScalingSpec, partition_count: int) -> tuple[int, int]:
    """[low, high] for a running pool: at least max(min, 1), never above max or the partition count."""
    high = max(0, min(scaling.max_replicas, partition_count))
    return min(max(scaling.min_replicas, 1), high), high


def recommend_replicas(backlog: int, partition_count: int, scaling: ScalingSpec) -> int:
    """What the backlog alone asks of a running pool, before any behaviour: monotone in `backlog`."""
    low, high = replica_bounds(scaling, partition_count)
    wanted = math.ceil(max(backlog, 0) / scaling.target.unprocessed_events_per_replica)
    clamped = min(max(wanted, low), high)
    if scaling.align_to_partitions and clamped > 0:
        return align_replicas(clamped, partition_count, low, high)
    return clamped


# --- state kept between cycles ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int


@dataclass(frozen=True)
class ScaleEvent:
    at: float
    change: int  # +n pods added, -n removed


@dataclass(frozen=True)
class ScalingState:
    """Everything the decision needs from earlier cycles. The caller persists it (e.g. in status)."""

    replicas: int | None = None  # the count decided last cycle; None before the first decision
    created_at: float | None = None
    last_active_at: float | None = None
    failures: int = 0  # consecutive failed backlog reads
    recommendations: tuple[Recommendation, ...] = ()
    scale_events: tuple[ScaleEvent, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "createdAt": self.created_at,
            "lastActiveAt": self.last_active_at,
            "failures": self.failures,
            "recommendations": [[r.at, r.replicas] for r in self.recommendations],
            "scaleEvents": [[e.at, e.change] for e in self.scale_events],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScalingState:
        return cls(
            replicas=_optional_int(data.get("replicas")),
            created_at=_optional_float(data.get("createdAt")),
            last_active_at=_optional_float(data.get("lastActiveAt")),
            failures=int(data.get("failures", 0)),
            recommendations=tuple(
                Recommendation(float(at), int(n)) for at, n in data.get("recommendations", ())
            ),
            scale_events=tuple(ScaleEvent(float(at), int(n)) for at, n in data.get("scaleEvents", ())),
        )


@dataclass(frozen=True)
class ScalingObservation:
    backlog: int | None  # total backlog; None when it could not be read this cycle
    partition_count: int
    current_replicas: int  # the StatefulSet's replicas; used only before the first decision
    created_at: float | None = None  # the PartitionedConsumer's creation time
    load: LoadFigures | None = None  # rates, backlog and capacity, for a lag target


@dataclass(frozen=True)
class ScalingDecision:
    replicas: int
    reason: str
    active: bool  # the backlog is above the activation threshold (or force-activation)
    fallback: bool  # the backlog could not be read and the fallback count applies
    paused: bool  # a pause annotation fixes the count
    recommendation: int | None  # what the backlog alone asked for; None when not read
    state: ScalingState
    sizing: LagSizing | None = None  # what the lag target asked for, and why; None: the events target
    manual: bool = False  # `spec.replicas` fixed the count (kubectl scale, an HPA, KEDA), not the autoscaler


# --- the decision -----------------------------------------------------------------------------------------


def _booked(
    scaling: ScalingSpec, state: ScalingState, observation: ScalingObservation, now: float, pause: Pause
) -> tuple[ScalingState, bool]:
    """The history with this observation in it (when the pool was created, the probes failed in a row, when
    it was last active), and whether it is active now (the backlog above the activation threshold, or
    forced)."""
    backlog = observation.backlog
    active = pause.force_activation or (
        backlog is not None and backlog > scaling.activation.unprocessed_events
    )
    booked = replace(
        state,
        created_at=_first(state.created_at, observation.created_at, now),
        failures=0 if backlog is not None else state.failures + 1,
        last_active_at=now if active else state.last_active_at,
    )
    return booked, active


def decide_replicas(
    scaling: ScalingSpec,
    state: ScalingState,
    observation: ScalingObservation,
    now: float,
    pause: Pause = NO_PAUSE,
    requested: int | None = None,
) -> ScalingDecision:
    """How many consumers to run now. See the module docstring for the order of the rules. `requested`
    (`spec.replicas`, set through the scale subresource or the manifest) fixes the count when set; the
    pause annotations still win over it, as they do over the autoscaler."""
    partitions = observation.partition_count
    current = state.replicas if state.replicas is not None else observation.current_replicas
    backlog = observation.backlog
    booked, active = _booked(scaling, state, observation, now, pause)

    low, high = replica_bounds(scaling, partitions)

    def decided(replicas: int, reason: str, **flags: Any) -> ScalingDecision:
        # never more consumers than partitions or max, whichever rule decided
        return _finish(scaling, booked, current, min(replicas, high), reason, now, active=active, **flags)

    if pause.replicas is not None:
        forced = min(pause.replicas, high)
        return decided(forced, f"paused at {forced} replicas", paused=True, record=False)
    if pause.paused:
        return decided(current, f"paused at {min(current, high)} replicas", paused=True, record=False)
    if requested is not None:
        return _requested(scaling, booked, current, requested, observation, now, active)

    if backlog is None:
        return _unreadable(scaling, booked, current, partitions, now, pause)

    recommendation = recommend_replicas(backlog, partitions, scaling) if high > 0 else 0
    sizing = _lag_sizing(scaling, observation.load, current, low, high)
    goal = f"backlog {backlog}"
    if sizing is not None:
        recommendation = sizing.replicas
        goal = f"lag target {scaling.target.lag_seconds:g}s: {sizing.describe()}"
    if current == 0:
        if high == 0 or (scaling.may_scale_to_zero and not active):
            return decided(
                0, f"idle at zero: backlog {backlog} <= activation {scaling.activation.unprocessed_events}"
            )
        if pause.scale_out:
            return decided(0, "start from zero blocked by paused-scale-out")
        return decided(
            recommendation, f"from zero: {goal} -> {recommendation}", rec=recommendation, sizing=sizing
        )
    if scaling.may_scale_to_zero and not active and _cooled_down(scaling, booked, now):
        if pause.scale_in:
            return decided(current, "scale to zero blocked by paused-scale-in", rec=recommendation)
        return decided(0, f"idle for {scaling.cooldown_period_seconds:g}s: scaling to zero", rec=None)

    desired, why = _behave(scaling, booked, current, recommendation, low, high, partitions, now)
    desired, blocked = _directional_pause(current, desired, pause)
    reason = f"{goal} -> {recommendation}{why}{blocked}"
    return decided(desired, reason, rec=recommendation, sizing=sizing)


def _requested(
    scaling: ScalingSpec,
    booked: ScalingState,
    current: int,
    requested: int,
    observation: ScalingObservation,
    now: float,
    active: bool,
) -> ScalingDecision:
    """`spec.replicas` set: exactly that many, never more than the partitions, with neither scaling's bounds
    nor its behaviour in the way (an HPA or KEDA behind the scale subresource has its own). The count goes
    into the history as a recommendation, so a pool handed back to the autoscaler (`spec.replicas` unset)
    starts from it and scales down only after the scale-down window, as after a decision of its own."""
    partitions = observation.partition_count
    replicas = max(0, min(requested, partitions))
    reason = f"spec.replicas {requested}"
    if replicas != requested:
        reason += f", at most the hub's {partitions} partitions"
    reason += f" -> {replicas}"
    if observation.backlog is not None:
        reason += f" (backlog {observation.backlog})"
    decision = _finish(scaling, booked, current, replicas, reason, now, active=active, rec=replicas)
    return replace(decision, manual=True)


def _lag_sizing(
    scaling: ScalingSpec, load: LoadFigures | None, current: int, low: int, high: int
) -> LagSizing | None:
    """The lag target's count, once a consumer's capacity is measured; None: the events target decides."""
    target = scaling.target.lag_seconds
    if target is None or load is None or not load.capacity or high <= 0:
        return None
    return size_for_lag(load, target, current, low, high)


def _unreadable(
    scaling: ScalingSpec, booked: ScalingState, current: int, partitions: int, now: float, pause: Pause
) -> ScalingDecision:
    fallback = scaling.fallback
    failures = booked.failures
    low, high = replica_bounds(scaling, partitions)
    if fallback is None or failures < fallback.failure_threshold:
        kept = 0 if current <= 0 and scaling.may_scale_to_zero else min(max(current, low), high)
        limit = f" of {fallback.failure_threshold}" if fallback else ""
        reason = f"backlog unreadable ({failures}{limit} in a row): keeping {kept}"
        return _finish(scaling, booked, current, kept, reason, now, active=kept > 0)
    target = {
        "static": fallback.replicas,
        "currentReplicas": current,
        "currentReplicasIfHigher": max(current, fallback.replicas),
        "currentReplicasIfLower": min(current, fallback.replicas),
    }[fallback.behavior]
    if target <= 0 or high == 0:
        desired = 0 if scaling.may_scale_to_zero or high == 0 else low
    else:
        desired = min(max(target, low), high)
        if scaling.align_to_partitions:
            desired = align_replicas(desired, partitions, low, high)
    why = ""
    if current > 0 and desired > 0:
        desired, why = _behave(scaling, booked, current, desired, low, high, partitions, now)
    desired, blocked = _directional_pause(current, desired, pause)
    desired = min(desired, high)
    reason = (
        f"backlog unreadable ({failures} in a row): fallback {fallback.behavior} -> {desired}{why}{blocked}"
    )
    return _finish(
        scaling, booked, current, desired, reason, now, active=desired > 0, fallback=True, rec=desired
    )


def _behave(
    scaling: ScalingSpec,
    state: ScalingState,
    current: int,
    recommendation: int,
    low: int,
    high: int,
    partitions: int,
    now: float,
) -> tuple[int, str]:
    """HPA behaviour: stabilisation, then the policies' rate limit, then alignment inside the limit."""
    up, down = scaling.behavior.scale_up, scaling.behavior.scale_down
    stabilized = current
    up_floor = down_ceiling = recommendation
    for past in state.recommendations:
        if past.at > now - up.stabilization_window_seconds:
            up_floor = min(up_floor, past.replicas)
        if past.at > now - down.stabilization_window_seconds:
            down_ceiling = max(down_ceiling, past.replicas)
    stabilized = max(stabilized, up_floor)
    stabilized = min(stabilized, down_ceiling)
    why = f", stabilised at {stabilized}" if stabilized != recommendation else ""

    desired = stabilized
    if stabilized > current:
        limit = _scale_limit(current, state.scale_events, up, now, rising=True)
        if limit is not None and limit < stabilized:
            desired = max(limit, current)
            desired = _aligned_between(partitions, current + 1, desired, prefer="high", fallback=desired)
            why += f", scale-up limited to {desired}"
    elif stabilized < current:
        limit = _scale_limit(current, state.scale_events, down, now, rising=False)
        if limit is not None and limit > stabilized:
            desired = min(limit, current)
            desired = _aligned_between(partitions, desired, current - 1, prefer="low", fallback=desired)
            why += f", scale-down limited to {desired}"
    return min(max(desired, low), high), why


def _scale_limit(
    current: int, events: Iterable[ScaleEvent], rules: ScalingRulesSpec, now: float, *, rising: bool
) -> int | None:
    """How far HPA's policies let the count go up (`rising`) or down from `current` now: each policy's bound
    from the count before the changes its period holds; "Max" selects the policy allowing the biggest
    change (rising: the highest ceiling; falling: the lowest floor)."""
    if rules.select_policy == "Disabled":
        return current
    sign = 1 if rising else -1
    proposals = []
    for policy in rules.policies:
        moved = sum(
            abs(e.change) for e in events if e.change * sign > 0 and e.at > now - policy.period_seconds
        )
        start = current - sign * moved
        if policy.type == "Pods":
            proposals.append(start + sign * policy.value)
        elif rising:
            proposals.append(math.ceil(start * (1 + policy.value / 100)))
        else:
            proposals.append(int(start * (1 - policy.value / 100)))
    if not proposals:
        return None
    biggest = rules.select_policy == "Max"
    return max(proposals) if biggest == rising else min(proposals)


def _aligned_between(partitions: int, low: int, high: int, *, prefer: str, fallback: int) -> int:
    """An aligned count in [low, high], the highest or lowest; `fallback` when there is none, so a
    rate-limited pool still makes progress through unaligned counts."""
    inside = [c for c in aligned_counts(partitions) if low <= c <= high]
    if not inside:
        return fallback
    return inside[-1] if prefer == "high" else inside[0]


def _directional_pause(current: int, desired: int, pause: Pause) -> tuple[int, str]:
    if pause.scale_in and desired < current:
        return current, ", scale-in paused"
    if pause.scale_out and desired > current:
        return current, ", scale-out paused"
    return desired, ""


def _cooled_down(scaling: ScalingSpec, state: ScalingState, now: float) -> bool:
    created = state.created_at if state.created_at is not None else now
    idle_since = state.last_active_at if state.last_active_at is not None else created
    return (
        now >= created + scaling.initial_cooldown_period_seconds
        and now >= idle_since + scaling.cooldown_period_seconds
    )


def _finish(
    scaling: ScalingSpec,
    state: ScalingState,
    current: int,
    replicas: int,
    reason: str,
    now: float,
    *,
    active: bool,
    paused: bool = False,
    fallback: bool = False,
    record: bool = True,
    rec: int | None = None,
    sizing: LagSizing | None = None,
) -> ScalingDecision:
    recommendations = state.recommendations
    events = state.scale_events
    if record:
        horizon = _horizon(scaling)
        recommendations = tuple(r for r in recommendations if r.at > now - horizon)
        if rec is not None:
            recommendations += (Recommendation(now, rec),)
        events = tuple(e for e in events if e.at > now - horizon)
        if replicas != current:
            events += (ScaleEvent(now, replicas - current),)
    new_state = replace(state, replicas=replicas, recommendations=recommendations, scale_events=events)
    return ScalingDecision(replicas, reason, active, fallback, paused, rec, new_state, sizing)


def _horizon(scaling: ScalingSpec) -> float:
    """How far back any window or policy period looks: older history can be dropped."""
    rules = (scaling.behavior.scale_up, scaling.behavior.scale_down)
    periods = [p.period_seconds for r in rules for p in r.policies]
    return max([r.stabilization_window_seconds for r in rules] + periods)


def _first(*values: float | None) -> float:
    return next(v for v in values if v is not None)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
