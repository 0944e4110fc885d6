"""One resource drives a scope: the assignment record names it, a second resource on the same hub and
consumer group is refused, and the scope is free again when its driver is deleted."""

from __future__ import annotations

from hubshift.operator.reservations import driving_refusal
from hubshift.operator.status import READY, PartitionedConsumerStatus, ResourcePhase, failed_cycle_status
from hubshift.ownership.model import Driver

TEAM = Driver("uid-1", "PartitionedConsumer team/homes")


def test_a_scope_nobody_drives_or_this_resource_drives_may_be_driven() -> None:
    assert driving_refusal(None, TEAM, "ns/hub/$default") is None
    assert driving_refusal(TEAM, TEAM, "ns/hub/$default") is None
    # The same resource created again (a new uid): it takes its scope back.
    assert driving_refusal(Driver("uid-0", TEAM.resource), TEAM, "ns/hub/$default") is None


def test_another_resource_on_the_same_scope_is_refused_naming_the_driver() -> None:
    other = Driver("uid-2", "PartitionedConsumer other/steal")
    refusal = driving_refusal(TEAM, other, "ns/hub/$default")
    assert refusal is not None
    assert refusal.startswith(
        "the assignment of ns/hub/$default is published by PartitionedConsumer team/homes"
    )
    local = Driver("local:team/homes", "hubshift run team/homes")
    assert driving_refusal(TEAM, local, "ns/hub/$default") is not None  # a local run never steals a pool


def test_a_failed_cycle_keeps_the_figures_and_makes_ready_false() -> None:
    last = PartitionedConsumerStatus(phase=ResourcePhase.READY, total_backlog=7, partition_count=4)
    previous = [{"type": READY, "status": "True", "lastTransitionTime": "2026-11-25T10:00:00Z"}]
    status = failed_cycle_status(last, previous, "the store refused the token", 1795600000.0)
    ready = [c for c in status.conditions if c.type == READY]
    assert [(c.status, c.reason, c.message) for c in ready] == [
        ("False", "CycleFailed", "the store refused the token")
    ]
    assert (status.total_backlog, status.partition_count, status.message) == (
        7,
        4,
        "the store refused the token",
    )
    assert failed_cycle_status(None, None, "x", 0.0).conditions[0].status == "False"
