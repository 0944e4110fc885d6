"""`spec.replicas` (the scale subresource: kubectl scale, an HPA, KEDA) fixes the pool's size instead of the
autoscaler: exactly that many, never more than the partitions; unset, the autoscaler decides."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hubshift.operator.autoscaler import (
    NO_PAUSE,
    Pause,
    ScalingDecision,
    ScalingObservation,
    ScalingState,
    decide_replicas,
)
from hubshift.spec import ScalingSpec


def size(
    requested: int | None,
    backlog: int | None = 0,
    *,
    partitions: int = 32,
    current: int = 2,
    scaling: ScalingSpec | None = None,
    state: ScalingState | None = None,
    pause: Pause = NO_PAUSE,
    now: float = 1000.0,
) -> ScalingDecision:
    observation = ScalingObservation(backlog, partitions, current, created_at=0.0)
    return decide_replicas(
        scaling or ScalingSpec(), state or ScalingState(replicas=current), observation, now, pause, requested
    )


def test_unset_leaves_the_decision_to_the_autoscaler() -> None:
    observation = ScalingObservation(50_000, 32, 2, created_at=0.0)
    expected = decide_replicas(ScalingSpec(), ScalingState(replicas=2), observation, 1000.0)
    decision = size(None, 50_000)
    assert decision == expected
    assert not decision.manual


def test_set_is_exactly_that_many_whatever_the_backlog() -> None:
    for backlog in (0, 10, 1_000_000, None):
        decision = size(5, backlog)
        assert decision.replicas == 5
        assert decision.manual
        assert "spec.replicas 5" in decision.reason


def test_never_more_than_the_partitions() -> None:
    decision = size(40, partitions=8)
    assert decision.replicas == 8
    assert "at most the hub's 8 partitions" in decision.reason


def test_scaling_bounds_and_behaviour_do_not_hold_it_back() -> None:
    bounded = ScalingSpec(min_replicas=1, max_replicas=2)
    assert size(6, scaling=bounded, current=1).replicas == 6  # above max, and more than +4 pods at once
    assert size(0, scaling=bounded).replicas == 0  # below min: a manual stop
    assert size(3, current=16).replicas == 3  # no scale-down stabilisation window


def test_zero_goes_from_a_running_pool_to_zero_and_back_at_once() -> None:
    stopped = size(0, 5000, current=4)
    assert stopped.replicas == 0
    again = size(4, 0, current=0, state=stopped.state, now=1001.0)
    assert again.replicas == 4  # no activation threshold between


def test_pause_annotations_still_win() -> None:
    assert size(5, pause=Pause(replicas=1)).replicas == 1
    paused = size(5, pause=Pause(paused=True), current=2)
    assert paused.replicas == 2
    assert paused.paused and not paused.manual


def test_the_history_follows_so_the_autoscaler_takes_over_from_the_manual_count() -> None:
    manual = size(8, 0, current=2)
    assert manual.state.replicas == 8
    assert manual.state.scale_events[-1].change == 6
    # spec.replicas unset again: the autoscaler starts from 8, and its scale-down window keeps it there.
    back = size(None, 0, current=8, state=manual.state, now=1015.0)
    assert back.replicas == 8
    assert not back.manual


@given(
    requested=st.integers(min_value=0, max_value=2000),
    partitions=st.integers(min_value=1, max_value=1024),
    current=st.integers(min_value=0, max_value=64),
    backlog=st.one_of(st.none(), st.integers(min_value=0, max_value=10**9)),
)
def test_the_manual_count_is_the_request_bounded_by_the_partitions(
    requested: int, partitions: int, current: int, backlog: int | None
) -> None:
    decision = size(requested, backlog, partitions=partitions, current=current)
    assert decision.replicas == min(requested, partitions)
    assert decision.state.replicas == decision.replicas
