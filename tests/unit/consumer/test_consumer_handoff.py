"""The consumer's ownership decisions: following the assignment, handoff deadlines, orphans, the fallback
balancer when there is no current record, and the checkpoint cadence."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hubshift.consumer.plan import (
    ClaimPlan,
    ClaimReason,
    OwnershipPlan,
    assignment_is_current,
    checkpoint_due,
    plan_ownership,
)
from hubshift.ownership.model import (
    EARLIEST,
    Assignment,
    Checkpoint,
    Member,
    OwnershipSnapshot,
    PartitionOwnership,
    Phase,
)
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseState

SCOPE = Scope("ns.servicebus.windows.net", "hub", "$default")
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
PARTITIONS = ["0", "1", "2", "3"]


def row(partition: str, owner: str | None, *, alive: bool = True, level: int = 1) -> PartitionOwnership:
    return PartitionOwnership(
        partition=partition,
        owner=owner,
        owner_alive=owner is not None and alive,
        lease_state=LeaseState.LEASED if owner else LeaseState.AVAILABLE,
        owner_level=level,
        last_modified=T0,
        checkpoint=EARLIEST,
        last_owner=owner,
    )


def snapshot(
    owners: dict[str, str | None],
    members: list[str],
    assignment: dict[str, str] | None = None,
    *,
    dead: tuple[str, ...] = (),
    published: datetime = T0,
    forced: tuple[str, ...] = (),
) -> OwnershipSnapshot:
    rows = tuple(row(p, o, alive=o not in dead) for p, o in owners.items())
    record = None
    if assignment is not None:
        record = Assignment(
            generation=2,
            partitions=assignment,
            phase=Phase.REBALANCING,
            replicas=2,
            updated_at=published,
            forced=frozenset(forced),
        )
    return OwnershipSnapshot(
        SCOPE,
        rows,
        tuple(Member(m, m not in dead, T0) for m in members),
        record,
        "etag" if record else None,
    )


def plan(
    me: str,
    snap: OwnershipSnapshot,
    active: list[str],
    now: datetime = T0,
    *,
    draining: tuple[str, ...] = (),
    stopping: bool = False,
) -> OwnershipPlan:
    return plan_ownership(
        me,
        PARTITIONS,
        snap,
        active,
        draining,
        now,
        max_handoff_seconds=15,
        stale_after_seconds=60,
        stopping=stopping,
    )


def test_moving_away_drains_and_moving_here_waits_for_the_release() -> None:
    snap = snapshot(
        {"0": "a", "1": "a", "2": "b", "3": "b"}, ["a", "b"], {"0": "a", "1": "b", "2": "b", "3": "b"}
    )
    a = plan("a", snap, ["0", "1"])
    assert a.mode == "assignment" and a.drains == ("1",) and a.claims == ()
    b = plan("b", snap, ["2", "3"])
    assert b.waiting == ("1",) and b.claims == ()
    assert b.handoff_deadline == T0 + timedelta(seconds=15)


def test_released_partition_is_claimed_without_force_and_late_ones_by_force() -> None:
    released = snapshot({"1": None}, ["a", "b"], {"0": "a", "1": "b", "2": "b", "3": "b"})
    assert plan("b", released, []).claims[0] == ClaimPlan("1", False, ClaimReason.FREE)
    held = snapshot({"1": "a"}, ["a", "b"], {"0": "a", "1": "b", "2": "b", "3": "b"})
    late = plan("b", held, [], now=T0 + timedelta(seconds=16))
    assert ClaimPlan("1", True, ClaimReason.HANDOFF_DEADLINE, "a") in late.claims


def test_a_partition_the_operator_forced_is_broken_at_once_while_others_wait() -> None:
    # The operator saw "a" go for good; its membership lease has not run out yet, so it still looks alive.
    snap = snapshot({"0": "a", "1": "a"}, ["a", "b"], {"0": "b", "1": "b"}, forced=("0",))
    b = plan("b", snap, [])
    assert b.claims == (ClaimPlan("0", True, ClaimReason.OWNER_GONE, "a"),)
    assert b.waiting == ("1",)


def test_an_orphan_is_taken_at_once_and_my_own_lease_without_force() -> None:
    snap = snapshot(
        {"0": "a", "1": "gone", "2": "b", "3": "b"},
        ["a", "b", "gone"],
        {"0": "b", "1": "b", "2": "b", "3": "a"},
        dead=("gone",),
    )
    claims = {c.partition: c for c in plan("b", snap, []).claims}
    assert claims["1"].force and claims["1"].reason == "orphaned"
    assert claims["2"] == ClaimPlan("2", False, ClaimReason.MINE)  # a restart with the same identity
    assert "0" not in claims  # a live owner within the deadline


def test_a_draining_partition_is_not_claimed_again_until_it_is_released() -> None:
    snap = snapshot({"0": "a"}, ["a"], {"0": "a", "1": "a", "2": "a", "3": "a"})
    result = plan("a", snap, [], draining=("0",))
    assert "0" not in {c.partition for c in result.claims}


def test_stopping_drains_everything_and_claims_nothing() -> None:
    snap = snapshot({}, ["a"], None)
    result = plan("a", snap, ["0", "2"], stopping=True)
    assert result.mode == "stopping" and result.drains == ("0", "2") and result.claims == ()


def test_without_a_record_the_fallback_balancer_claims_free_and_steals_one() -> None:
    free = plan("a", snapshot({}, ["a", "b"]), [])
    assert free.mode == "fallback" and {c.partition for c in free.claims} == {"0", "1"}
    crowded = snapshot({p: "b" for p in PARTITIONS}, ["a", "b"])
    steal = plan("a", crowded, [])
    assert (
        len(steal.claims) == 1
        and steal.claims[0].force
        and steal.claims[0].reason == "steal"
        and steal.claims[0].holder == "b"
    )


def test_a_stale_record_that_names_a_dead_consumer_falls_back() -> None:
    assignment = Assignment(2, {p: "dead" for p in PARTITIONS}, Phase.READY, 1, T0)
    assert assignment_is_current(assignment, PARTITIONS, ["a"], T0 + timedelta(seconds=30), 60)
    assert not assignment_is_current(assignment, PARTITIONS, ["a"], T0 + timedelta(seconds=61), 60)
    healthy = Assignment(2, {p: "a" for p in PARTITIONS}, Phase.READY, 1, T0)
    assert assignment_is_current(healthy, PARTITIONS, ["a"], T0 + timedelta(days=3), 60)
    snap = snapshot({}, ["a"], {p: "dead" for p in PARTITIONS}, published=T0 - timedelta(minutes=5))
    assert plan("a", snap, []).mode == "fallback"


def test_a_record_naming_a_consumer_just_lost_is_followed_from_when_it_was_lost() -> None:
    """A pod restarting long after the last publication: the operator holds its partitions for it (the
    holddown); the others must not balance them away in the meantime, and only fall back once the
    operator had `stale_after_seconds` to react, from when the loss was seen or the holddown ends."""
    old = T0 - timedelta(hours=2)
    assignment = Assignment(2, {p: "gone" for p in PARTITIONS}, Phase.READY, 1, old)
    seen = T0
    assert assignment_is_current(assignment, PARTITIONS, ["a"], T0 + timedelta(seconds=59), 60, seen)
    assert not assignment_is_current(assignment, PARTITIONS, ["a"], T0 + timedelta(seconds=61), 60, seen)
    assert not assignment_is_current(assignment, PARTITIONS, ["a"], T0, 60)  # as before: from publication
    holding = Assignment(2, {p: "gone" for p in PARTITIONS}, Phase.HOLDDOWN, 1, old, holddown_until=T0)
    assert assignment_is_current(holding, PARTITIONS, ["a"], T0 + timedelta(seconds=59), 60)
    assert not assignment_is_current(holding, PARTITIONS, ["a"], T0 + timedelta(seconds=61), 60)
    snap = snapshot({"0": None, "1": "a"}, ["a"], {"0": "gone", "1": "a"}, published=old)
    held = plan_ownership(
        "a",
        ["0", "1"],
        snap,
        ["1"],
        (),
        T0,
        max_handoff_seconds=15,
        stale_after_seconds=60,
        unhealthy_since=T0,
    )
    assert held.mode == "assignment" and held.claims == ()
    assert plan("a", snap, ["1"], T0).mode == "fallback"


def test_checkpoint_cadence() -> None:
    written = Checkpoint("100", 10)
    moved = Checkpoint("200", 20)

    def due(committed: Checkpoint | None, events: int, now: float) -> bool:
        return checkpoint_due(committed, written, events, 0.0, now, every_events=100, every_seconds=5.0)

    assert not due(None, 0, 100.0)
    assert not due(written, 500, 100.0)  # nothing moved
    assert not due(moved, 10, 4.0)
    assert due(moved, 10, 5.0)  # time
    assert due(moved, 100, 0.1)  # events


def planned_snapshot(owners: dict[str, str | None], members: list[str]) -> OwnershipSnapshot:
    """A planned scale-out 1 -> 2 under way: "b" is planned to take 2 and 3, which "a" reads until then."""
    record = Assignment(
        generation=3,
        partitions={p: "a" for p in PARTITIONS},
        phase=Phase.READY,
        replicas=2,
        updated_at=T0,
        consumers=("a", "b"),
        planned={"2": "b", "3": "b"},
    )
    rows = tuple(row(p, o) for p, o in owners.items())
    return OwnershipSnapshot(SCOPE, rows, tuple(Member(m, True, T0) for m in members), record, "etag")


def test_the_reader_of_a_planned_partition_keeps_it_and_its_planned_owner_waits_for_the_operator() -> None:
    snap = planned_snapshot({p: "a" for p in PARTITIONS}, ["a", "b"])
    a = plan("a", snap, PARTITIONS)
    assert a.mode == "assignment" and a.drains == () and a.claims == () and a.planned == ()
    b = plan("b", snap, [], now=T0 + timedelta(hours=1))  # long past any handoff deadline
    assert b.claims == () and b.waiting == () and b.planned == ("2", "3")


def test_a_planned_partition_nobody_reads_is_claimed_by_its_planned_owner_once_it_has_joined() -> None:
    record = Assignment(
        generation=1,
        partitions={},
        phase=Phase.READY,
        replicas=2,
        updated_at=T0,
        planned={"0": "a", "1": "a", "2": "b", "3": "b"},
        planned_until=T0 + timedelta(seconds=10),
    )
    rows = (row("2", None), row("3", "c"))  # 3 is held by a consumer the record does not name
    snap = OwnershipSnapshot(SCOPE, rows, (Member("b", True, T0), Member("c", True, T0)), record, "etag")
    b = plan("b", snap, [], now=T0 + timedelta(seconds=1))
    # 2 is free: claimed at once without force; 3 is someone else's: the operator moves it, b waits for that.
    assert b.mode == "assignment" and b.waiting == () and b.drains == ()
    assert b.claims == (ClaimPlan("2", False, ClaimReason.FREE),) and b.planned == ("3",)
    # Once b reads 2, it keeps it until the operator's hand-over moves it into `partitions` for b.
    kept = plan("b", snap, ["2"], now=T0 + timedelta(seconds=2))
    assert kept.drains == () and kept.claims == () and kept.planned == ("3",)
    # A planned partition that has a reader is never taken by its planned owner.
    assert plan("a", snap, [], now=T0 + timedelta(seconds=1)).claims == (
        ClaimPlan("0", False, ClaimReason.FREE),
        ClaimPlan("1", False, ClaimReason.FREE),
    )
    assert not assignment_is_current(record, PARTITIONS, ["b"], T0 + timedelta(seconds=71), 60)


def test_a_planned_partition_taken_away_by_a_later_generation_is_drained() -> None:
    record = Assignment(
        generation=2,
        partitions={"2": "a"},
        phase=Phase.REBALANCING,
        replicas=2,
        updated_at=T0,
        planned={"3": "a"},
    )
    members = (Member("a", True, T0), Member("b", True, T0))
    snap = OwnershipSnapshot(SCOPE, (row("2", "b"),), members, record, "etag")
    b = plan("b", snap, ["2"], now=T0 + timedelta(seconds=1))
    assert b.drains == ("2",) and b.claims == ()
