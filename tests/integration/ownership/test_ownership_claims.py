"""Claims, checkpoints, membership and the snapshot over a real store (both backends)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from hubshift.ownership.assignment import publish_assignment, read_assignment
from hubshift.ownership.checkpoints import list_checkpoints, write_checkpoint
from hubshift.ownership.leases import claim_partition, release_partition
from hubshift.ownership.membership import expel, join_pool, leave, renew
from hubshift.ownership.model import EARLIEST, Assignment, Checkpoint, Phase
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseConflict, LeaseLost, LeaseState, WriteConflict
from tests.fixtures.ownership import StoreUnderTest
from tests.harness.ownership import owned_by, read_checkpoint

SCOPE = Scope("NS.servicebus.windows.net", "Hub", "$Default")


def test_a_claim_creates_the_checkpoint_and_raises_the_owner_level(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    lease = claim_partition(store, SCOPE, "3", "c-0")
    assert (lease.owner_level, lease.checkpoint) == (1, EARLIEST)
    assert lease.lease_id == SCOPE.lease_id("c-0")
    assert read_checkpoint(store, SCOPE, "3") == EARLIEST
    entry = store.properties("ns.servicebus.windows.net/hub/$default/checkpoint/3")
    assert entry.metadata == {"offset": "-1", "sequencenumber": "-1", "ownerid": "c-0", "ownerlevel": "1"}
    assert entry.lease_state is LeaseState.LEASED and entry.lease_infinite

    lease = write_checkpoint(store, lease, Checkpoint("4096", 41))
    again = claim_partition(lease_store.another(), SCOPE, "3", "c-0")  # same identity: at once
    assert (again.owner_level, again.checkpoint) == (2, Checkpoint("4096", 41))
    with pytest.raises(LeaseConflict):
        claim_partition(store, SCOPE, "3", "c-1")


def test_a_forced_claim_fences_the_old_owner(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    old = write_checkpoint(store, claim_partition(store, SCOPE, "0", "c-0"), Checkpoint("100", 10))
    new = claim_partition(lease_store.another(), SCOPE, "0", "c-1", force=True)
    assert (new.owner_level, new.checkpoint) == (2, Checkpoint("100", 10))
    with pytest.raises(LeaseLost):
        write_checkpoint(store, old, Checkpoint("50", 5))  # backwards
    with pytest.raises(LeaseLost):
        write_checkpoint(store, old, Checkpoint("500", 50))  # forwards
    assert not release_partition(store, old)
    write_checkpoint(store, new, Checkpoint("200", 20))
    assert read_checkpoint(store, SCOPE, "0") == Checkpoint("200", 20)


def test_a_graceful_handoff_resumes_exactly_at_the_final_checkpoint(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    start = datetime(2026, 1, 1, tzinfo=UTC)
    lease = claim_partition(store, SCOPE, "1", "c-0", initial=Checkpoint("-1", -1, start=start))
    assert lease.checkpoint.start == start and lease.checkpoint.consumed_nothing
    assert release_partition(store, lease, final=Checkpoint("777", 77))
    assert store.properties(SCOPE.checkpoint_blob("1")).lease_state is LeaseState.AVAILABLE

    taken = claim_partition(lease_store.another(), SCOPE, "1", "c-1")
    assert (taken.owner_level, taken.checkpoint) == (2, Checkpoint("777", 77))
    assert list_checkpoints(store, SCOPE) == {"1": Checkpoint("777", 77)}


def test_membership_and_the_snapshot(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    clock = time.monotonic
    m0 = join_pool(store, SCOPE, "c-0", clock=clock)
    join_pool(store, SCOPE, "c-1", clock=clock)
    assert m0.is_safe(clock()) and not m0.lapsed
    assert m0.safe_until == pytest.approx(m0.renewed_at + 25)
    for p in ("0", "1", "2"):
        claim_partition(store, SCOPE, p, "c-0")
    claim_partition(store, SCOPE, "3", "c-1")
    release_partition(store, claim_partition(store, SCOPE, "10", "c-1"))

    snap = take_snapshot(store, SCOPE)
    assert [p.partition for p in snap.partitions] == ["0", "1", "2", "3", "10"]
    assert snap.live_members == ["c-0", "c-1"]
    assert owned_by(snap, "c-0") == ["0", "1", "2"]
    assert snap.owners == {"0": "c-0", "1": "c-0", "2": "c-0", "3": "c-1"}
    ten = snap.partition("10")
    assert ten is not None and ten.free and ten.owner is None and ten.last_owner == "c-1"
    assert snap.assignment is None and snap.assignment_etag is None

    renewed = renew(store, m0, clock=clock)
    assert renewed.renewed_at >= m0.renewed_at and not renewed.lapsed

    expel(store, SCOPE, "c-1")  # the operator: c-1's pod is gone for good
    snap = take_snapshot(store, SCOPE)
    three = snap.partition("3")
    assert snap.live_members == ["c-0"]
    assert three is not None and three.orphaned and three.owner == "c-1"
    taken = claim_partition(store, SCOPE, "3", "c-0", force=True)
    assert taken.owner_level == 2

    leave(store, renewed)
    assert take_snapshot(store, SCOPE).live_members == []
    # A consumer whose membership was ended re-joins with its own id; its renewal says it lapsed.
    back = renew(store, renewed, clock=clock)
    assert back.lapsed


def test_the_snapshot_reads_the_assignment_only_when_it_changed(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    now = datetime(2026, 11, 21, 8, 0, tzinfo=UTC)
    first = Assignment(
        generation=1,
        partitions={"0": "c-0", "1": "c-1"},
        phase=Phase.HOLDDOWN,
        replicas=2,
        updated_at=now,
        holddown_until=now + timedelta(seconds=5),
        max_handoff_seconds=10,
        consumers=("c-0", "c-1"),
    )
    etag = publish_assignment(store, SCOPE, first, etag=None)
    with pytest.raises(WriteConflict):
        publish_assignment(store, SCOPE, first, etag=None)
    record = read_assignment(store, SCOPE)
    assert record is not None and record.assignment == first and record.etag == etag

    counting = Counting(store)
    snap = take_snapshot(counting, SCOPE)  # type: ignore[arg-type]
    assert snap.assignment == first and snap.assignment_etag == etag
    assert counting.calls == ["list", "read"]
    counting.calls.clear()
    again = take_snapshot(counting, SCOPE, previous=snap)  # type: ignore[arg-type]
    assert again.assignment == first and counting.calls == ["list"]

    second = Assignment(2, {"0": "c-0", "1": "c-0"}, Phase.REBALANCING, 1, now)
    new_etag = publish_assignment(store, SCOPE, second, etag=etag)
    with pytest.raises(WriteConflict):
        publish_assignment(store, SCOPE, second, etag=etag)
    counting.calls.clear()
    third = take_snapshot(counting, SCOPE, previous=again)  # type: ignore[arg-type]
    assert third.assignment == second and third.assignment_etag == new_etag
    assert counting.calls == ["list", "read"]


class Counting:
    """Records which store methods a domain function calls (each is one request on Azure)."""

    def __init__(self, store: object) -> None:
        self._store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> object:
        self.calls.append(name)
        return getattr(self._store, name)
