"""The `LeaseStore` contract: Azure Blob (on Azurite) and SQLite pass the same tests.

Semantics are Azure's (docs/ownership.md, hubshift/ownership/store.py). Expiry is checked once per backend:
SQLite advances an injected clock, Azurite really waits out a 15 s lease.
"""

from __future__ import annotations

import uuid

import pytest

from hubshift.ownership.store import (
    INFINITE,
    BlobNotFound,
    LeaseConflict,
    LeaseLost,
    LeaseState,
    StoreError,
    WriteConflict,
)
from tests.fixtures.ownership import StoreUnderTest

A = str(uuid.uuid4())
B = str(uuid.uuid4())


def test_create_is_create_only_and_lists_by_prefix(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    assert store.create("s/checkpoint/1", {"offset": "-1", "sequencenumber": "-1"})
    assert not store.create("s/checkpoint/1", {"offset": "7"})
    store.create("s/checkpoint/0", {"offset": "5"})
    store.create("t/checkpoint/0", {})

    listed = store.list("s/")
    assert [e.name for e in listed] == ["s/checkpoint/0", "s/checkpoint/1"]
    assert listed[1].metadata == {"offset": "-1", "sequencenumber": "-1"}
    assert listed[1].lease_state is LeaseState.AVAILABLE
    assert listed[1].etag == store.properties("s/checkpoint/1").etag
    assert store.list("nothing/") == []
    with pytest.raises(BlobNotFound):
        store.properties("s/checkpoint/9")


def test_write_is_compare_and_swap(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    first = store.write("s/doc", b"one", etag=None)
    with pytest.raises(WriteConflict):
        store.write("s/doc", b"again", etag=None)
    assert store.read("s/doc") == (b"one", first)

    second = store.write("s/doc", b"two", etag=first)
    assert second != first
    with pytest.raises(WriteConflict):
        store.write("s/doc", b"stale", etag=first)
    with pytest.raises(WriteConflict):
        store.write("s/missing", b"x", etag=first)
    assert store.read("s/doc") == (b"two", second)
    assert store.list("s/doc")[0].etag == second
    with pytest.raises(BlobNotFound):
        store.read("s/missing")


def test_a_leased_blob_takes_metadata_only_with_its_lease_id(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    store.create("b", {"offset": "1"})
    etag = store.set_metadata("b", {"offset": "2"}, lease_id=None)
    assert store.properties("b").etag == etag

    store.acquire_lease("b", A, INFINITE)
    with pytest.raises(LeaseLost):
        store.set_metadata("b", {"offset": "3"}, lease_id=None)
    with pytest.raises(LeaseLost):
        store.set_metadata("b", {"offset": "3"}, lease_id=B)
    written = store.set_metadata("b", {"offset": "4"}, lease_id=A)
    entry = store.properties("b")
    assert (entry.metadata, entry.etag) == ({"offset": "4"}, written)
    assert written != etag


def test_one_holder_at_a_time_and_the_holder_may_reacquire(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    store.create("b", {})
    store.acquire_lease("b", A, INFINITE)
    store.acquire_lease("b", A, INFINITE)  # a restart with the same id gets it back at once
    with pytest.raises(LeaseConflict):
        store.acquire_lease("b", B, INFINITE)
    with pytest.raises(LeaseConflict):
        lease_store.another().acquire_lease("b", B, 15)
    entry = store.list("b")[0]
    assert entry.lease_state is LeaseState.LEASED and entry.lease_infinite and entry.leased

    with pytest.raises(BlobNotFound):
        store.acquire_lease("missing", A, 15)


def test_release_frees_the_blob_and_fences_the_old_id(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    store.create("b", {})
    store.acquire_lease("b", A, 30)
    with pytest.raises(LeaseLost):
        store.release_lease("b", B)
    store.release_lease("b", A)
    assert store.properties("b").lease_state is LeaseState.AVAILABLE
    with pytest.raises(LeaseLost):
        store.set_metadata("b", {}, lease_id=A)
    store.acquire_lease("b", B, 30)
    with pytest.raises(LeaseLost):
        store.release_lease("b", A)
    with pytest.raises(LeaseLost):
        store.renew_lease("b", A)


def test_break_ends_the_lease_at_once(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    store.create("b", {})
    store.acquire_lease("b", A, INFINITE)
    lease_store.another().break_lease("b")
    assert store.properties("b").lease_state is LeaseState.BROKEN
    assert not store.properties("b").leased
    with pytest.raises(LeaseLost):
        store.set_metadata("b", {"offset": "9"}, lease_id=A)
    with pytest.raises(LeaseLost):
        store.renew_lease("b", A)
    store.break_lease("b")  # nothing left to break: a no-op

    store.acquire_lease("b", B, INFINITE)
    store.set_metadata("b", {"offset": "10"}, lease_id=B)
    with pytest.raises(LeaseLost):
        store.set_metadata("b", {"offset": "9"}, lease_id=A)

    store.create("free", {})
    store.break_lease("free")
    with pytest.raises(BlobNotFound):
        store.break_lease("missing")


def test_missing_blobs_are_reported(lease_store: StoreUnderTest) -> None:
    store = lease_store.store
    with pytest.raises(BlobNotFound):
        store.set_metadata("missing", {}, lease_id=None)
    with pytest.raises(BlobNotFound):
        store.read("missing")


def test_lease_duration_is_bounded(lease_store: StoreUnderTest) -> None:
    lease_store.store.create("b", {})
    with pytest.raises((ValueError, StoreError)):
        lease_store.store.acquire_lease("b", A, 10)


def test_finite_leases_expire_and_renewal_extends_them(lease_store: StoreUnderTest) -> None:
    """One real wait on Azurite (16 s) covers expiry, fencing after expiry, renewal and renew-after-expiry."""
    store = lease_store.store
    for name in ("written", "taken", "renewed-late", "renewed-early", "infinite"):
        store.create(name, {})
        store.acquire_lease(name, A, INFINITE if name == "infinite" else 15)

    lease_store.advance(9)
    store.renew_lease("renewed-early", A)
    lease_store.advance(7)  # 16 s after the first acquisitions, 7 s after the renewal

    states = {e.name: e.lease_state for e in store.list("")}
    assert states == {
        "written": LeaseState.EXPIRED,
        "taken": LeaseState.EXPIRED,
        "renewed-late": LeaseState.EXPIRED,
        "renewed-early": LeaseState.LEASED,
        "infinite": LeaseState.LEASED,
    }
    # An expired lease fences its holder's writes; anybody may write or take the blob.
    with pytest.raises(LeaseLost):
        store.set_metadata("written", {"offset": "1"}, lease_id=A)
    store.set_metadata("written", {"offset": "2"}, lease_id=None)
    store.acquire_lease("taken", B, 15)
    with pytest.raises(LeaseLost):
        store.renew_lease("taken", A)
    # Nobody touched it: its holder may still renew (Azure's rule), and it is leased again.
    store.renew_lease("renewed-late", A)
    assert store.properties("renewed-late").lease_state is LeaseState.LEASED
