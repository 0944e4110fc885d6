"""The replica decision: backlog, alignment, activation and scale to zero, HPA behaviour, fallback, pauses."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift import spec
from hubshift.operator.autoscaler import (
    NO_PAUSE,
    Pause,
    ScalingDecision,
    ScalingObservation,
    ScalingState,
    aligned_counts,
    decide_replicas,
    parse_pause,
    partition_backlog,
    recommend_replicas,
)
from hubshift.spec import (
    ActivationSpec,
    FallbackSpec,
    ScalingBehaviorSpec,
    ScalingGoalSpec,
    ScalingPolicySpec,
    ScalingRulesSpec,
    ScalingSpec,
)


def policy(kind: str, value: int, period: int) -> ScalingPolicySpec:
    return ScalingPolicySpec(type=kind, value=value, period_seconds=period)  # type: ignore[arg-type]


def rules(window: int, select: str = "Max", *policies: ScalingPolicySpec) -> ScalingRulesSpec:
    return ScalingRulesSpec(
        stabilization_window_seconds=window,
        select_policy=select,  # type: ignore[arg-type]
        policies=list(policies),
    )


def with_(
    base: ScalingSpec,
    *,
    scale_up: ScalingRulesSpec | None = None,
    scale_down: ScalingRulesSpec | None = None,
    **fields: object,
) -> ScalingSpec:
    """`base` with some fields (and scaling rules) changed."""
    changed = {k: v for k, v in (("scale_up", scale_up), ("scale_down", scale_down)) if v is not None}
    return base.model_copy(update={"behavior": base.behavior.model_copy(update=changed), **fields})


NO_LIMITS = rules(0)
FREE = with_(ScalingSpec(), scale_up=NO_LIMITS, scale_down=NO_LIMITS)  # behaviour out of the way


def step(
    config: ScalingSpec,
    state: ScalingState,
    backlog: int | None,
    now: float,
    *,
    partitions: int = 32,
    current: int = 1,
    pause: Pause = NO_PAUSE,
) -> ScalingDecision:
    observation = ScalingObservation(backlog, partitions, current, created_at=0.0)
    return decide_replicas(config, state, observation, now, pause)


def run(
    config: ScalingSpec, backlogs: Sequence[int | None], *, every: float = 15.0, start: int = 1
) -> list[ScalingDecision]:
    state = ScalingState(replicas=start)
    decisions = []
    for i, backlog in enumerate(backlogs):
        decision = step(config, state, backlog, 1000.0 + i * every)
        decisions.append(decision)
        state = decision.state
    return decisions


# --- backlog -------------------------------------------------------------------------------------------


def test_backlog_is_last_enqueued_minus_checkpoint() -> None:
    assert partition_backlog(last_enqueued=1500, checkpoint=1000) == 500
    assert partition_backlog(last_enqueued=1000, checkpoint=1000) == 0


def test_a_missing_checkpoint_counts_from_the_start_position_not_infinity() -> None:
    assert partition_backlog(last_enqueued=99, checkpoint=None, beginning=0) == 100
    assert partition_backlog(last_enqueued=99, checkpoint=-1, beginning=0) == 100
    assert partition_backlog(last_enqueued=99, checkpoint=None, start="latest") == 0
    assert partition_backlog(last_enqueued=99, checkpoint=None, start_sequence_number=90) == 10


def test_empty_partitions_have_no_backlog() -> None:
    assert partition_backlog(last_enqueued=-1, checkpoint=None) == 0
    assert partition_backlog(last_enqueued=50, checkpoint=None, empty=True) == 0


def test_events_removed_by_retention_are_not_backlog() -> None:
    assert partition_backlog(last_enqueued=1000, checkpoint=10, beginning=900) == 101
    assert partition_backlog(last_enqueued=1000, checkpoint=None, beginning=900) == 101


def test_a_checkpoint_ahead_of_the_last_event_is_no_backlog() -> None:
    assert partition_backlog(last_enqueued=10, checkpoint=12) == 0


# --- recommendation and alignment ------------------------------------------------------------------------


def test_aligned_counts_for_32_partitions() -> None:
    assert aligned_counts(32) == (1, 2, 3, 4, 5, 6, 7, 8, 11, 16, 32)
    assert aligned_counts(4) == (1, 2, 4)


@pytest.mark.parametrize(
    ("backlog", "expected"),
    [(0, 1), (1, 1), (8_000, 8), (9_000, 11), (12_000, 16), (17_000, 32), (10**9, 32)],
)
def test_recommendation_snaps_up_to_an_aligned_count(backlog: int, expected: int) -> None:
    assert recommend_replicas(backlog, 32, FREE) == expected


def test_snaps_down_when_max_forbids_the_next_aligned_count() -> None:
    assert recommend_replicas(9_000, 32, with_(FREE, max_replicas=10)) == 8


def test_never_more_replicas_than_partitions() -> None:
    assert recommend_replicas(10**9, 4, with_(FREE, max_replicas=100)) == 4


def test_alignment_can_be_switched_off() -> None:
    assert recommend_replicas(9_000, 32, with_(FREE, align_to_partitions=False)) == 9


def test_an_unaligned_min_is_still_honoured() -> None:
    assert recommend_replicas(0, 32, with_(FREE, min_replicas=9, max_replicas=10)) == 9


# --- activation and scale to zero -----------------------------------------------------------------------


ZERO = with_(
    FREE, min_replicas=0, activation=ActivationSpec(unprocessed_events=100), cooldown_period_seconds=300
)


def test_stays_at_zero_until_the_activation_threshold() -> None:
    decision = step(ZERO, ScalingState(replicas=0), 100, 10.0)
    assert decision.replicas == 0
    assert not decision.active


def test_activation_goes_straight_to_the_recommendation() -> None:
    decision = step(ZERO, ScalingState(replicas=0), 8_000, 10.0)
    assert decision.replicas == 8
    assert decision.active


def test_force_activation_scales_from_zero_without_backlog() -> None:
    decision = step(ZERO, ScalingState(replicas=0), 0, 10.0, pause=Pause(force_activation=True))
    assert decision.replicas == 1
    assert decision.active


def test_scales_to_zero_only_after_the_cooldown() -> None:
    state = ScalingState(replicas=2, last_active_at=1000.0)
    assert step(ZERO, state, 0, 1299.0).replicas == 1  # HPA keeps at least one while cooling down
    assert step(ZERO, state, 0, 1300.0).replicas == 0


def test_never_active_counts_idle_from_creation_and_waits_the_initial_cooldown() -> None:
    config = with_(ZERO, initial_cooldown_period_seconds=600)
    state = ScalingState(replicas=1, created_at=0.0)
    assert step(config, state, 0, 599.0).replicas == 1
    assert step(config, state, 0, 600.0).replicas == 0


def test_idle_replicas_zero_allows_zero_with_min_one() -> None:
    config = with_(ZERO, min_replicas=1, idle_replicas=0)
    assert step(config, ScalingState(replicas=1, last_active_at=0.0), 0, 400.0).replicas == 0
    assert step(config, ScalingState(replicas=0), 5_000, 400.0).replicas == 5


def test_min_above_zero_never_scales_to_zero() -> None:
    config = with_(ZERO, min_replicas=1)
    assert step(config, ScalingState(replicas=1, last_active_at=0.0), 0, 10_000.0).replicas == 1


# --- HPA behaviour --------------------------------------------------------------------------------------


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    config = with_(FREE, scale_down=rules(300))
    decisions = run(config, [16_000] + [0] * 25)
    replicas = [d.replicas for d in decisions]
    assert replicas[0] == 16
    # recommendations of 16 stay in the window until 300 s after the last one (15 s apart)
    assert replicas[1:20] == [16] * 19
    assert replicas[20] == 1


def test_scale_up_stabilisation_takes_the_lowest_recent_recommendation() -> None:
    config = with_(FREE, scale_up=rules(60))
    replicas = [d.replicas for d in run(config, [4_000, 16_000, 16_000, 16_000, 16_000, 16_000])]
    assert replicas == [4, 4, 4, 4, 16, 16]  # the 4 leaves the window 60 s after it was made


def test_stabilisation_prevents_flapping() -> None:
    backlogs: list[int | None] = [16_000 if i % 2 else 2_000 for i in range(40)]
    replicas = [d.replicas for d in run(with_(FREE, scale_down=rules(300)), backlogs)]
    changes = sum(1 for a, b in itertools.pairwise(replicas) if a != b)
    assert changes == 1  # up once, then held


def test_scale_up_pods_policy_limits_per_period() -> None:
    config = with_(FREE, scale_up=rules(0, "Max", policy("Pods", 2, 60)))
    replicas = [d.replicas for d in run(config, [32_000] * 13)]
    # +2 per 60 s, re-aligned inside the limit: 1 -> 3 -> 5 -> 7 (8 needs 4 more) ...
    assert replicas[0] == 3
    assert replicas[4] == 5
    assert replicas[8] == 7
    assert replicas[12] == 8


def test_scale_up_select_min_takes_the_smaller_policy() -> None:
    limits = rules(0, "Min", policy("Pods", 4, 60), policy("Percent", 100, 60))
    decision = run(with_(FREE, scale_up=limits), [32_000], start=2)[0]
    assert decision.replicas == 4  # min(2 + 4, 2 * 2)


def test_scale_up_disabled_holds() -> None:
    decision = run(with_(FREE, scale_up=rules(0, "Disabled")), [32_000], start=2)[0]
    assert decision.replicas == 2


def test_scale_down_percent_policy() -> None:
    limits = rules(0, "Max", policy("Percent", 50, 60))
    replicas = [d.replicas for d in run(with_(FREE, scale_down=limits), [0] * 9, start=32)]
    assert replicas[0] == 16
    assert replicas[1:4] == [16, 16, 16]  # the period still counts the 16 removed
    assert replicas[4] == 8


def test_rate_limited_scale_down_progresses_through_unaligned_counts() -> None:
    limits = rules(0, "Max", policy("Pods", 1, 15))
    replicas = [d.replicas for d in run(with_(FREE, scale_down=limits), [0] * 4, start=16)]
    assert replicas == [15, 14, 13, 12]


def test_scale_events_round_trip_through_a_dict() -> None:
    decisions = run(ScalingSpec(), [16_000, 2_000, None, 16_000])
    state = decisions[-1].state
    assert ScalingState.from_dict(state.to_dict()) == state


# --- fallback and pauses --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("behavior", "current", "expected"),
    [
        ("static", 8, 2),
        ("currentReplicas", 8, 8),
        ("currentReplicasIfHigher", 8, 8),
        ("currentReplicasIfHigher", 1, 2),
        ("currentReplicasIfLower", 8, 2),
        ("currentReplicasIfLower", 1, 1),
    ],
)
def test_fallback_after_the_failure_threshold(behavior: str, current: int, expected: int) -> None:
    config = with_(FREE, fallback=FallbackSpec(failure_threshold=3, replicas=2, behavior=behavior))  # type: ignore[arg-type]
    decisions = run(config, [None, None, None], start=current)
    assert [d.replicas for d in decisions[:2]] == [current, current]
    assert not decisions[1].fallback
    assert decisions[2].fallback
    assert decisions[2].replicas == expected


def test_a_good_read_ends_the_fallback() -> None:
    config = with_(FREE, fallback=FallbackSpec(failure_threshold=1, replicas=4))
    decisions = run(config, [None, 1_000], start=8)
    assert decisions[0].fallback
    assert decisions[1].state.failures == 0
    assert not decisions[1].fallback


def test_no_fallback_configured_keeps_the_current_count() -> None:
    decisions = run(FREE, [None] * 5, start=5)
    assert [d.replicas for d in decisions] == [5] * 5
    assert decisions[-1].state.failures == 5


def test_paused_keeps_current_and_paused_replicas_forces() -> None:
    assert step(FREE, ScalingState(replicas=5), 32_000, 1.0, pause=Pause(paused=True)).replicas == 5
    decision = step(FREE, ScalingState(replicas=5), 32_000, 1.0, pause=Pause(replicas=2))
    assert (decision.replicas, decision.paused) == (2, True)
    assert step(FREE, ScalingState(replicas=5), 0, 1.0, pause=Pause(replicas=100), partitions=4).replicas == 4


def test_paused_scale_in_and_out_block_one_direction() -> None:
    state = ScalingState(replicas=4)
    assert step(FREE, state, 0, 1.0, pause=Pause(scale_in=True)).replicas == 4
    assert step(FREE, state, 32_000, 1.0, pause=Pause(scale_in=True)).replicas == 32
    assert step(FREE, state, 32_000, 1.0, pause=Pause(scale_out=True)).replicas == 4
    assert step(FREE, state, 0, 1.0, pause=Pause(scale_out=True)).replicas == 1


def test_parse_pause_reads_the_spec_annotations() -> None:
    annotations = {
        spec.PAUSED_ANNOTATION: "true",
        spec.PAUSED_REPLICAS_ANNOTATION: "3",
        spec.PAUSED_SCALE_IN_ANNOTATION: "TRUE",
        spec.PAUSED_SCALE_OUT_ANNOTATION: "false",
        spec.FORCE_ACTIVATION_ANNOTATION: "true",
    }
    assert parse_pause(annotations) == Pause(True, 3, True, False, True)
    bad = parse_pause({spec.PAUSED_REPLICAS_ANNOTATION: "many"})
    assert bad.replicas is None
    assert "paused-replicas" in bad.problems[0]


# --- properties -------------------------------------------------------------------------------------------


configs = st.builds(
    ScalingSpec,
    min_replicas=st.integers(0, 4),
    max_replicas=st.integers(4, 40),
    target=st.builds(ScalingGoalSpec, unprocessed_events_per_replica=st.integers(1, 5_000)),
    activation=st.builds(ActivationSpec, unprocessed_events=st.integers(0, 100)),
    cooldown_period_seconds=st.sampled_from([0, 60, 300]),
    behavior=st.builds(
        ScalingBehaviorSpec,
        scale_up=st.sampled_from([NO_LIMITS, ScalingBehaviorSpec().scale_up, rules(30, "Min")]),
        scale_down=st.sampled_from([NO_LIMITS, ScalingBehaviorSpec().scale_down]),
    ),
    fallback=st.none()
    | st.builds(FallbackSpec, failure_threshold=st.integers(1, 3), replicas=st.integers(0, 8)),
    align_to_partitions=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(
    configs,
    st.integers(1, 40),
    st.lists(st.none() | st.integers(0, 100_000), min_size=1, max_size=30),
    st.integers(0, 40),
)
def test_bounds_hold_whatever_the_backlog(
    config: ScalingSpec, partitions: int, backlogs: list[int | None], start: int
) -> None:
    state = ScalingState(replicas=start)
    high = min(config.max_replicas, partitions)
    for i, backlog in enumerate(backlogs):
        decision = step(config, state, backlog, 15.0 * i, partitions=partitions)
        assert 0 <= decision.replicas <= high
        if decision.replicas < min(config.min_replicas, high):
            assert decision.replicas == 0
        if decision.replicas == 0:
            assert config.min_replicas == 0
        state = decision.state


@settings(max_examples=150)
@given(configs, st.integers(1, 64), st.integers(0, 200_000), st.integers(0, 200_000))
def test_recommendation_is_monotone_in_backlog(config: ScalingSpec, partitions: int, a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert recommend_replicas(low, partitions, config) <= recommend_replicas(high, partitions, config)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 64_000), min_size=2, max_size=40), st.sampled_from([60, 120, 300]))
def test_no_scale_down_below_a_recommendation_inside_the_window(backlogs: list[int], window: int) -> None:
    config = with_(FREE, scale_down=rules(window))
    history: list[tuple[float, int]] = []
    state = ScalingState(replicas=1)
    for i, backlog in enumerate(backlogs):
        now = 15.0 * i
        decision = step(config, state, backlog, now)
        history.append((now, recommend_replicas(backlog, 32, config)))
        before = state.replicas or 0
        if decision.replicas < before:
            recent = [n for at, n in history if at > now - window]
            assert decision.replicas >= min(before, max(recent))
        state = decision.state
