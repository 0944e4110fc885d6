"""Membership deadlines: renew before expiry, stop before the store could let the lease go."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from hubshift.ownership.membership import join_pool, renew
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import BlobNotFound, LeaseLost
from hubshift.ownership.timing import Timing

SCOPE = Scope("ns", "hub", "cg")


@dataclass
class LeaseRecorder:
    """Just enough of a store for membership: records lease calls, fails renewals on demand."""

    lost: bool = False
    created: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def create(self, name: str, metadata: Mapping[str, str]) -> bool:
        self.created.add(name)
        return True

    def acquire_lease(self, name: str, lease_id: str, duration: int) -> None:
        if name not in self.created:
            raise BlobNotFound(name)
        self.calls.append(("acquire", name))

    def renew_lease(self, name: str, lease_id: str) -> None:
        self.calls.append(("renew", name))
        if self.lost:
            raise LeaseLost(name)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_deadline_counts_from_before_the_request() -> None:
    store, clock = LeaseRecorder(), Clock()
    timing = Timing(membership_lease_seconds=30, renew_interval_seconds=15, safety_margin_seconds=5)
    member = join_pool(store, SCOPE, "c-0", clock=clock, timing=timing)  # type: ignore[arg-type]
    assert store.calls == [("acquire", SCOPE.member_blob("c-0"))]
    assert (member.renewed_at, member.renew_due, member.safe_until) == (1000, 1015, 1025)
    assert member.is_safe(1024.9) and not member.is_safe(1025)

    clock.now = 1016
    renewed = renew(store, member, clock=clock)  # type: ignore[arg-type]
    assert (renewed.renewed_at, renewed.safe_until, renewed.lapsed) == (1016, 1041, False)


def test_a_renewal_after_the_deadline_or_a_lost_lease_is_lapsed() -> None:
    store, clock = LeaseRecorder(), Clock()
    member = join_pool(store, SCOPE, "c-0", clock=clock)  # type: ignore[arg-type]
    clock.now = member.safe_until + 1  # renewals failed for a while
    assert renew(store, member, clock=clock).lapsed  # type: ignore[arg-type]

    store.lost = True
    clock.now = member.renew_due
    again = renew(store, member, clock=clock)  # type: ignore[arg-type]
    assert again.lapsed and store.calls[-1][0] == "acquire"


@pytest.mark.parametrize("renew_every", [5.0, 10.0, 15.0])
def test_one_failed_renewal_still_leaves_a_retry_before_the_deadline(renew_every: float) -> None:
    timing = Timing(membership_lease_seconds=30, renew_interval_seconds=renew_every)
    member = join_pool(LeaseRecorder(), SCOPE, "c-0", clock=Clock(), timing=timing)  # type: ignore[arg-type]
    assert member.renew_due + renew_every <= member.safe_until + timing.safety_margin_seconds
