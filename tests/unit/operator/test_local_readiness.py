"""The local runtime's readiness of a consumer, as a pod's readiness probe with a failure threshold: one
probe left unanswered on a busy machine is no change of the pool (it once started a holddown and cancelled
it a moment later); an answer is taken at its word."""

from __future__ import annotations

from hubshift.operator.local.processes import UNANSWERED_SECONDS, readiness


def test_an_unanswered_probe_changes_nothing_until_the_consumer_has_been_silent_for_a_while() -> None:
    assert readiness(True, None, None, 100.0)  # the first probe left unanswered
    assert readiness(True, None, 100.0, 100.0 + UNANSWERED_SECONDS - 0.1)
    assert not readiness(True, None, 100.0, 100.0 + UNANSWERED_SECONDS)
    assert not readiness(False, None, None, 100.0)  # never ready: nothing to keep


def test_an_answer_is_taken_at_its_word() -> None:
    assert not readiness(True, False, None, 100.0)  # "not ready": stopping, or lost its membership
    assert readiness(False, True, 50.0, 100.0)
