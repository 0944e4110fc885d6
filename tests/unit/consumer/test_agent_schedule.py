"""When the ownership agent lists the scope, reads the hub's partition ids, renews its membership, stops,
and wakes: `consumer/schedule.py`."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubshift.consumer.schedule import (
    AFTER_RELEASE_SECONDS,
    FIRST_RETRIES_SECONDS,
    IDLE_SECONDS,
    NUDGE_FLOOR_SECONDS,
    RETRY_SECONDS,
    AgentSchedule,
    StopOutcome,
)


def schedule() -> AgentSchedule:
    return AgentSchedule(list_interval=20.0, claim_retry=0.2, partition_refresh=300.0)


def test_the_first_turn_lists_then_every_interval() -> None:
    timers = schedule()
    assert timers.listing_due(0.0, nudged=False, waiting=False)
    timers.listing_started(0.0)
    timers.listed(0.0, waiting=False)
    assert not timers.listing_due(19.9, nudged=False, waiting=False)
    assert timers.listing_due(20.0, nudged=False, waiting=False)


def test_a_nudge_lists_at_once_but_at_most_once_per_floor() -> None:
    timers = schedule()
    timers.listed(9.0, waiting=False)
    timers.listing_started(10.0, nudged=True)  # nothing else was due: the nudge made it
    timers.listed(10.0, waiting=False)
    assert not timers.listing_due(10.0 + NUDGE_FLOOR_SECONDS - 0.01, nudged=True, waiting=False)
    assert timers.listing_due(10.0 + NUDGE_FLOOR_SECONDS, nudged=True, waiting=False)
    assert not timers.listing_due(10.0 + NUDGE_FLOOR_SECONDS, nudged=False, waiting=False)


@given(
    st.lists(st.tuples(st.floats(0.0, 2.0), st.booleans(), st.booleans()), min_size=1, max_size=60),
)
def test_nudges_never_list_more_often_than_the_floor(turns: list[tuple[float, bool, bool]]) -> None:
    """Whoever reaches the HTTP port can only make the consumer read the store so often: the listings
    nothing but a nudge made are at least the floor apart, whatever the other listings do."""
    timers = schedule()
    timers.listing_started(0.0)
    timers.listed(0.0, waiting=False)
    now, by_nudges = 0.0, []
    for gap, nudged, waiting in turns:
        now += gap
        if timers.listing_due(now, nudged=nudged, waiting=waiting):
            if not timers.scheduled(now, waiting=waiting):
                by_nudges.append(now)
            timers.listing_started(now, nudged=nudged, waiting=waiting)
            timers.listed(now, waiting=waiting)
    # As the schedule compares (b >= a + floor): `b - a` may round a hair below the floor.
    assert all(b >= a + NUDGE_FLOOR_SECONDS for a, b in itertools.pairwise(by_nudges))


def test_a_consumer_listing_at_the_claim_retry_takes_a_nudge_at_once() -> None:
    """A consumer waiting for a release (or following the operator through a stop) lists every 0.2 s; the
    operator's nudge for a new generation used to wait for the next of those (the floor counted from any
    listing), now it lists at once, and a held-back nudge wakes the loop when the floor ends."""
    timers = schedule()
    for now in (5.0, 5.2):  # the claim retry's listings
        assert timers.listing_due(now, nudged=False, waiting=True)
        timers.listing_started(now, waiting=True)
        timers.listed(now, waiting=True)
    assert not timers.listing_due(5.25, nudged=False, waiting=True)
    assert timers.listing_due(5.25, nudged=True, waiting=True)  # before: not until 5.7
    timers.listing_started(5.25, nudged=True, waiting=True)
    timers.listed(5.25, waiting=True)
    # Another nudge within the floor of the one that listed waits; the loop wakes at the claim retry.
    assert not timers.listing_due(5.3, nudged=True, waiting=True)
    assert timers.wake_at(5.3, renew_due=None, waiting=True, nudged=True) == pytest.approx(5.45)
    # Not waiting: a held-back nudge wakes the loop when the floor ends.
    timers.listed(5.3, waiting=False)
    assert timers.wake_at(5.3, renew_due=None, waiting=False, nudged=True) == pytest.approx(5.75)


def test_waiting_for_a_release_lists_at_the_claim_retry() -> None:
    timers = schedule()
    timers.listing_started(5.0)
    timers.listed(5.0, waiting=True)
    assert timers.next_list == 5.2
    assert not timers.listing_due(5.1, nudged=False, waiting=True)
    assert timers.listing_due(5.2, nudged=False, waiting=True)
    timers.listing_started(5.2)
    timers.listed(5.2, waiting=False)  # claimed: back to the interval
    assert timers.next_list == 25.2


def test_a_wait_is_retried_quickly_at_first_then_at_the_claim_retry() -> None:
    timers = AgentSchedule(
        list_interval=20.0, claim_retry=0.2, partition_refresh=300.0, first_claim_retry=0.05
    )
    now, listings = 10.0, [10.0]
    timers.listed(now, waiting=True)
    while now < 11.5:
        now = timers.next_list
        assert timers.listing_due(now, nudged=False, waiting=True)
        timers.listing_started(now)
        timers.listed(now, waiting=True)
        listings.append(now)
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(listings)]
    early = [g for a, g in zip(listings, gaps, strict=False) if a - 10.0 < FIRST_RETRIES_SECONDS]
    assert early and set(early) == {0.05}
    assert set(gaps[len(early) :]) == {0.2}
    # Claimed: back to the interval; the next wait starts quick again.
    timers.listed(now, waiting=False)
    assert timers.next_list == now + 20.0
    timers.listed(now + 30.0, waiting=True)
    assert timers.next_list == pytest.approx(now + 30.05)


def test_a_release_or_a_failed_listing_lists_again_soon() -> None:
    timers = schedule()
    timers.listed(0.0, waiting=False)
    timers.released(3.0)
    assert timers.next_list == 3.0 + AFTER_RELEASE_SECONDS
    timers.released(19.9)  # never later than it was
    assert timers.next_list == 3.0 + AFTER_RELEASE_SECONDS
    timers.listing_failed(4.0)
    assert timers.next_list == 4.0 + RETRY_SECONDS


def test_partition_ids_are_read_when_none_are_known_and_then_every_refresh() -> None:
    timers = schedule()
    assert timers.partitions_due(0.0, known=False)
    timers.partitions_read(0.0)
    assert timers.partitions_due(1.0, known=False)
    assert not timers.partitions_due(299.0, known=True)
    assert timers.partitions_due(300.0, known=True)


def test_a_failed_renewal_is_retried_after_a_second_not_every_turn() -> None:
    timers = schedule()
    assert not timers.renewal_due(14.9, renew_due=15.0)
    assert timers.renewal_due(15.0, renew_due=15.0)
    timers.renewal_failed(15.0)
    assert not timers.renewal_due(15.5, renew_due=15.0)
    assert timers.renewal_due(15.0 + RETRY_SECONDS, renew_due=15.0)


def test_a_stop_hands_off_within_the_grace_period() -> None:
    timers = schedule()
    assert timers.stop_outcome(0.0, owned=3) is StopOutcome.RUNNING  # no stop asked
    assert timers.stop(10.0, 25.0)
    assert not timers.stop(11.0, 25.0)  # asked again: the deadline stays
    assert timers.stop_deadline == 35.0
    assert timers.stop_outcome(20.0, owned=3) is StopOutcome.RUNNING
    assert timers.stop_outcome(20.0, owned=0) is StopOutcome.DONE
    assert timers.stop_outcome(35.0, owned=1) is StopOutcome.OUT_OF_TIME


def test_a_stop_follows_the_operator_for_its_follow_time_within_the_grace_period() -> None:
    timers = schedule()
    assert not timers.following(0.0)  # no stop asked
    timers.stop(10.0, 25.0, follow_seconds=5.0)
    assert timers.following(10.0) and timers.following(14.9) and not timers.following(15.0)
    assert timers.wake_at(11.0, renew_due=None, waiting=False) <= 12.0
    short = schedule()
    short.stop(0.0, 2.0, follow_seconds=5.0)  # never beyond the grace period
    assert not short.following(2.0)
    assert short.stop_outcome(2.0, owned=1) is StopOutcome.OUT_OF_TIME


def test_the_loop_wakes_at_the_earliest_timer_and_at_least_every_idle_period() -> None:
    timers = schedule()
    timers.listed(0.0, waiting=False)
    assert timers.wake_at(0.0, renew_due=None, waiting=False) == IDLE_SECONDS
    assert timers.wake_at(0.0, renew_due=0.5, waiting=False) == 0.5
    timers.renewal_failed(0.5)
    assert timers.wake_at(0.6, renew_due=0.5, waiting=False) == 0.5 + RETRY_SECONDS  # not before the retry
    timers.listed(1.0, waiting=True)
    assert timers.wake_at(1.0, renew_due=None, waiting=True) == 1.2
    timers.stop(1.0, 0.1)
    assert math.isclose(timers.wake_at(1.0, renew_due=None, waiting=False), 1.1)
