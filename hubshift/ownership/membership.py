"""Membership: one short lease per consumer that says it is alive, and the deadline its reading must keep.

Partition leases are infinite; a partition's ownership lives exactly as long as its owner's membership.
A consumer renews every `renew_interval_seconds`; if renewals fail it stops reading and checkpointing at
`safe_until`, which is before the store can let the lease expire (the deadline counts from the moment the
last successful renewal was *sent*, and the store starts the lease later than that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from hubshift.ownership.records import OWNER
from hubshift.ownership.scope import Scope, consumer_id
from hubshift.ownership.store import BlobNotFound, LeaseLost, LeaseStore
from hubshift.ownership.timing import DEFAULT_TIMING, Timing


@dataclass(frozen=True)
class Membership:
    """A consumer's registration. `renewed_at` is `clock()` just before its last successful renewal.

    `lapsed` is True when this renewal came after the previous `safe_until` (or had to re-acquire a lost
    lease): the consumer's partitions may have been taken meanwhile, so it must re-claim each (without
    `force`) before reading it again.
    """

    scope: Scope
    consumer: str
    lease_id: str
    timing: Timing
    renewed_at: float
    lapsed: bool = False

    @property
    def safe_until(self) -> float:
        """Read and checkpoint only before this (same clock as `renewed_at`)."""
        return self.renewed_at + self.timing.membership_lease_seconds - self.timing.safety_margin_seconds

    @property
    def renew_due(self) -> float:
        return self.renewed_at + self.timing.renew_interval_seconds

    def is_safe(self, now: float) -> bool:
        return now < self.safe_until


def join_pool(
    store: LeaseStore,
    scope: Scope,
    consumer: str,
    *,
    clock: Callable[[], float],
    timing: Timing = DEFAULT_TIMING,
) -> Membership:
    """Register (or, after a restart with the same identity, re-register at once)."""
    consumer = consumer_id(consumer)
    name, lease_id = scope.member_blob(consumer), scope.lease_id(consumer)
    started = clock()
    try:
        store.acquire_lease(name, lease_id, timing.membership_lease_seconds)
    except BlobNotFound:
        store.create(name, {OWNER: consumer})
        started = clock()
        store.acquire_lease(name, lease_id, timing.membership_lease_seconds)
    return Membership(scope, consumer, lease_id, timing, renewed_at=started)


def renew(store: LeaseStore, membership: Membership, *, clock: Callable[[], float]) -> Membership:
    """Extend the membership lease; joins again if it was lost or deleted (then `lapsed` is True)."""
    name = membership.scope.member_blob(membership.consumer)
    started = clock()
    lapsed = started >= membership.safe_until
    try:
        store.renew_lease(name, membership.lease_id)
    except (LeaseLost, BlobNotFound):
        rejoined = join_pool(
            store, membership.scope, membership.consumer, clock=clock, timing=membership.timing
        )
        return replace(rejoined, lapsed=True)
    return Membership(
        membership.scope,
        membership.consumer,
        membership.lease_id,
        membership.timing,
        renewed_at=started,
        lapsed=lapsed,
    )


def leave(store: LeaseStore, membership: Membership) -> None:
    """Deregister (after releasing the partitions): survivors may take what is left at once."""
    try:
        store.release_lease(membership.scope.member_blob(membership.consumer), membership.lease_id)
    except (LeaseLost, BlobNotFound):
        pass


def expel(store: LeaseStore, scope: Scope, consumer: str) -> None:
    """End another consumer's membership now (the operator, for a pod gone for good): its partitions
    become orphans that their new owners may break and claim without waiting for expiry."""
    try:
        store.break_lease(scope.member_blob(consumer))
    except BlobNotFound:
        pass
