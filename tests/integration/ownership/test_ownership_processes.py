"""Ownership across processes, on both backends: fencing, same-identity restart, assignment CAS.

The other consumer is a real child process (tests/integration/ownership/worker.py) with its own store
client; SQLite children share the file, Azurite children the server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from hubshift.ownership.assignment import publish_assignment, read_assignment
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition
from hubshift.ownership.model import Assignment, Checkpoint, Phase
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseConflict
from tests.fixtures.ownership import StoreUnderTest, Worker
from tests.harness.ownership import owned_by, read_checkpoint

# The scope tests/integration/ownership/worker.py uses.
SCOPE = Scope("test.servicebus.windows.net", "hub", "$default")


@pytest.fixture
def workers(lease_store: StoreUnderTest) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()


def spawn(lease_store: StoreUnderTest, workers: list[Worker]) -> Worker:
    worker = lease_store.worker()
    workers.append(worker)
    return worker


def ok(reply: dict[str, object]) -> dict[str, object]:
    assert reply["ok"], reply
    return reply


def test_a_broken_lease_cannot_move_the_checkpoint(
    lease_store: StoreUnderTest, workers: list[Worker]
) -> None:
    a = spawn(lease_store, workers)
    ok(a.call("claim", partition="0", consumer="c-a"))
    ok(a.call("checkpoint", partition="0", offset="1000", sequence_number=10))

    b = claim_partition(lease_store.store, SCOPE, "0", "c-b", force=True)
    assert b.checkpoint == Checkpoint("1000", 10)

    for offset, sequence in (("2000", 20), ("500", 5)):  # neither forwards nor backwards
        reply = a.call("checkpoint", partition="0", offset=offset, sequence_number=sequence)
        assert reply["error"] == "LeaseLost"
    assert read_checkpoint(lease_store.store, SCOPE, "0") == Checkpoint("1000", 10)
    write_checkpoint(lease_store.store, b, Checkpoint("3000", 30))
    assert read_checkpoint(lease_store.store, SCOPE, "0") == Checkpoint("3000", 30)


def test_an_expired_owner_cannot_move_the_checkpoint(
    lease_store: StoreUnderTest, workers: list[Worker]
) -> None:
    """A hangs (stops renewing); once its 15 s membership lapses, B takes its partition and A is fenced."""
    a = spawn(lease_store, workers)
    ok(a.call("join", consumer="c-a", lease_seconds=15))
    ok(a.call("claim", partition="0", consumer="c-a"))
    ok(a.call("checkpoint", partition="0", offset="100", sequence_number=1))

    before = take_snapshot(lease_store.store, SCOPE).partition("0")
    assert before is not None and before.owner_alive and not before.orphaned
    lease_store.advance(16)

    row = take_snapshot(lease_store.store, SCOPE).partition("0")
    assert row is not None and row.orphaned and row.owner == "c-a"
    b = claim_partition(lease_store.store, SCOPE, "0", "c-b", force=True)
    assert (b.owner_level, b.checkpoint) == (2, Checkpoint("100", 1))
    assert a.call("checkpoint", partition="0", offset="200", sequence_number=2)["error"] == "LeaseLost"
    assert read_checkpoint(lease_store.store, SCOPE, "0") == Checkpoint("100", 1)


def test_a_restart_with_the_same_identity_gets_its_leases_back_at_once(
    lease_store: StoreUnderTest, workers: list[Worker]
) -> None:
    first = spawn(lease_store, workers)
    ok(first.call("join", consumer="c-a"))
    for p in ("0", "1", "2"):
        ok(first.call("claim", partition=p, consumer="c-a"))
    ok(first.call("checkpoint", partition="1", offset="64", sequence_number=8))
    first.kill()  # no release: a crash

    restarted = spawn(lease_store, workers)
    ok(restarted.call("ping"))  # the process is up: time only the restart itself
    started = time.monotonic()
    ok(restarted.call("join", consumer="c-a"))
    claims = [ok(restarted.call("claim", partition=p, consumer="c-a")) for p in ("0", "1", "2")]
    assert time.monotonic() - started < 5  # no waiting for any expiry
    assert [c["owner_level"] for c in claims] == [2, 2, 2]
    assert (claims[1]["offset"], claims[1]["sequence_number"]) == ("64", 8)
    ok(restarted.call("checkpoint", partition="1", offset="128", sequence_number=16))

    other = spawn(lease_store, workers)
    for p in ("0", "1", "2"):
        assert other.call("claim", partition=p, consumer="c-b")["error"] == "LeaseConflict"
    with pytest.raises(LeaseConflict):  # nor can it take c-a's membership
        lease_store.store.acquire_lease(SCOPE.member_blob("c-a"), SCOPE.lease_id("c-b"), 30)
    snap = take_snapshot(lease_store.store, SCOPE)
    assert owned_by(snap, "c-a") == ["0", "1", "2"] and snap.live_members == ["c-a"]


def test_two_concurrent_assignment_writers_never_both_win(
    lease_store: StoreUnderTest, workers: list[Worker]
) -> None:
    base = Assignment(0, {"0": "c-0"}, Phase.READY, 1, datetime.now(UTC))
    publish_assignment(lease_store.store, SCOPE, base, etag=None)
    writers = [spawn(lease_store, workers), spawn(lease_store, workers)]
    for generation in range(1, 11):
        etags = [ok(w.call("read_assignment"))["etag"] for w in writers]
        assert etags[0] == etags[1]
        for i, w in enumerate(writers):  # both send before either answer is read
            w.send("publish", generation=generation, etag=etags[i], partitions={"0": f"c-{i}"})
        replies = [w.receive() for w in writers]
        assert sorted(r["ok"] for r in replies) == [False, True], replies
        assert [r.get("error") for r in replies if not r["ok"]] == ["WriteConflict"]
        record = read_assignment(lease_store.store, SCOPE)
        winner = next(i for i, r in enumerate(replies) if r["ok"])
        assert record is not None and record.etag == replies[winner]["etag"]
        assert record.assignment.generation == generation
        assert record.assignment.partitions == {"0": f"c-{winner}"}
