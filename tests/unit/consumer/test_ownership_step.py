"""A consumer's ownership step: following the assignment, handoff deadlines, orphans, the fallback balancer
when there is no current record, since when a record names a dead consumer, and leases lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from hubshift.consumer.ownership_step import (
    OwnershipStep,
    assignment_is_current,
    lost_partitions,
    ownership_step,
    track_unhealthy,
)
from hubshift.ownership.model import (
    EARLIEST,
    Assignment,
    Claim,
    ClaimReason,
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


def step(
    me: str,
    snap: OwnershipSnapshot,
    active: list[str],
    now: datetime = T0,
    *,
    draining: tuple[str, ...] = (),
) -> OwnershipStep:
    return ownership_step(
        me, PARTITIONS, snap, active, draining, now, max_handoff_seconds=15, stale_after_seconds=60
    )


def test_moving_away_drains_and_moving_here_waits_for_the_release() -> None:
    snap = snapshot(
        {"0": "a", "1": "a", "2": "b", "3": "b"}, ["a", "b"], {"0": "a", "1": "b", "2": "b", "3": "b"}
    )
    a = step("a", snap, ["0", "1"])
    assert a.mode == "assignment" and a.drains == ("1",) and a.claims == ()
    b = step("b", snap, ["2", "3"])
    assert b.waiting == ("1",) and b.claims == ()
    assert b.handoff_deadline == T0 + timedelta(seconds=15)


def test_released_partition_is_claimed_without_force_and_late_ones_by_force() -> None:
    released = snapshot({"1": None}, ["a", "b"], {"0": "a", "1": "b", "2": "b", "3": "b"})
    assert step("b", released, []).claims[0] == Claim("1", False, ClaimReason.FREE)
    held = snapshot({"1": "a"}, ["a", "b"], {"0": "a", "1": "b", "2": "b", "3": "b"})
    late = step("b", held, [], now=T0 + timedelta(seconds=16))
    assert Claim("1", True, ClaimReason.HANDOFF_DEADLINE, "a") in late.claims


def test_a_partition_the_operator_forced_is_broken_at_once_while_others_wait() -> None:
    # The operator saw "a" go for good; its membership lease has not run out yet, so it still looks alive.
    snap = snapshot({"0": "a", "1": "a"}, ["a", "b"], {"0": "b", "1": "b"}, forced=("0",))
    b = step("b", snap, [])
    assert b.claims == (Claim("0", True, ClaimReason.OWNER_GONE, "a"),)
    assert b.waiting == ("1",)


def test_an_orphan_is_taken_at_once_and_my_own_lease_without_force() -> None:
    snap = snapshot(
        {"0": "a", "1": "gone", "2": "b", "3": "b"},
        ["a", "b", "gone"],
        {"0": "b", "1": "b", "2": "b", "3": "a"},
        dead=("gone",),
    )
    claims = {c.partition: c for c in step("b", snap, []).claims}
    assert claims["1"].force and claims["1"].reason == "orphaned"
    assert claims["2"] == Claim("2", False, ClaimReason.MINE)  # a restart with the same identity
    assert "0" not in claims  # a live owner within the deadline


def test_a_draining_partition_is_not_claimed_again_until_it_is_released() -> None:
    snap = snapshot({"0": "a"}, ["a"], {"0": "a", "1": "a", "2": "a", "3": "a"})
    result = step("a", snap, [], draining=("0",))
    assert "0" not in {c.partition for c in result.claims}


def test_without_a_record_the_fallback_balancer_claims_free_and_steals_one() -> None:
    free = step("a", snapshot({}, ["a", "b"]), [])
    assert free.mode == "fallback" and {c.partition for c in free.claims} == {"0", "1"}
    crowded = snapshot({p: "b" for p in PARTITIONS}, ["a", "b"])
    steal = step("a", crowded, [])
    assert (
        len(steal.claims) == 1
        and steal.claims[0].force
        and steal.claims[0].reason == "steal"
        and steal.claims[0].owner == "b"
    )


def test_a_stale_record_that_names_a_dead_consumer_falls_back() -> None:
    assignment = Assignment(2, {p: "dead" for p in PARTITIONS}, Phase.READY, 1, T0)
    assert assignment_is_current(assignment, PARTITIONS, ["a"], T0 + timedelta(seconds=30), 60)
    assert not assignment_is_current(assignment, PARTITIONS, ["a"], T0 + timedelta(seconds=61), 60)
    healthy = Assignment(2, {p: "a" for p in PARTITIONS}, Phase.READY, 1, T0)
    assert assignment_is_current(healthy, PARTITIONS, ["a"], T0 + timedelta(days=3), 60)
    snap = snapshot({}, ["a"], {p: "dead" for p in PARTITIONS}, published=T0 - timedelta(minutes=5))
    assert step("a", snap, []).mode == "fallback"


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
    held = ownership_step(
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
    assert step("a", snap, ["1"], T0).mode == "fallback"


def planned_snapshot(owners: dict[str, str | None], members: list[str]) -> OwnershipSnapshot:
    """A planned scale-out 1 -> 2 under way: "b" is planned to take 2 and 3, which "a" keeps until then."""
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


def test_the_assignee_of_a_planned_partition_keeps_it_and_its_planned_owner_waits_for_the_operator() -> None:
    snap = planned_snapshot({p: "a" for p in PARTITIONS}, ["a", "b"])
    a = step("a", snap, PARTITIONS)
    assert a.mode == "assignment" and a.drains == () and a.claims == () and a.planned == ()
    b = step("b", snap, [], now=T0 + timedelta(hours=1))  # long past any handoff deadline
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
    b = step("b", snap, [], now=T0 + timedelta(seconds=1))
    # 2 is free: claimed at once without force; 3 is someone else's: the operator moves it, b waits for that.
    assert b.mode == "assignment" and b.waiting == () and b.drains == ()
    assert b.claims == (Claim("2", False, ClaimReason.FREE),) and b.planned == ("3",)
    # Once b reads 2, it keeps it until the operator's hand-over moves it into `partitions` for b.
    kept = step("b", snap, ["2"], now=T0 + timedelta(seconds=2))
    assert kept.drains == () and kept.claims == () and kept.planned == ("3",)
    # A planned partition that has an assignee is never taken by its planned owner.
    assert step("a", snap, [], now=T0 + timedelta(seconds=1)).claims == (
        Claim("0", False, ClaimReason.FREE),
        Claim("1", False, ClaimReason.FREE),
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
    b = step("b", snap, ["2"], now=T0 + timedelta(seconds=1))
    assert b.drains == ("2",) and b.claims == ()


# --- since when a record names a dead consumer ----------------------------------------------------------


def test_a_record_naming_a_dead_consumer_is_unhealthy_from_when_this_generation_was_first_seen() -> None:
    dead = Assignment(2, {p: "gone" for p in PARTITIONS}, Phase.READY, 1, T0)
    first = track_unhealthy(None, dead, PARTITIONS, ["a"], T0)
    assert first == (2, T0)
    # Seen again later: still since the first sighting.
    assert track_unhealthy(first, dead, PARTITIONS, ["a"], T0 + timedelta(seconds=30)) == (2, T0)
    # A new generation that is still unhealthy starts its own clock.
    newer = Assignment(3, {p: "gone" for p in PARTITIONS}, Phase.READY, 1, T0)
    later = T0 + timedelta(seconds=40)
    assert track_unhealthy(first, newer, PARTITIONS, ["a"], later) == (3, later)
    # Healthy, or no record at all: nothing to track.
    healthy = Assignment(3, {p: "a" for p in PARTITIONS}, Phase.READY, 1, T0)
    assert track_unhealthy(first, healthy, PARTITIONS, ["a"], later) is None
    assert track_unhealthy(first, None, PARTITIONS, ["a"], later) is None


# --- leases lost -------------------------------------------------------------------------------------------


def test_a_lease_held_by_another_or_claimed_again_is_lost() -> None:
    rows = (row("0", "a", level=3), row("1", "x", level=2), row("2", None), row("3", "a", level=5))
    snap = OwnershipSnapshot(SCOPE, rows, (Member("a", True, T0),), None, None)
    owned = {"0": 3, "1": 1, "2": 1, "3": 4, "4": 1}
    lost = dict(lost_partitions("a", owned, snap))
    assert set(lost) == {"1", "2", "3", "4"}  # 0 is still ours at our level
    assert lost["3"] == "it was claimed again at owner level 5"
    assert lost["1"] == lost["2"] == lost["4"] == "its lease is held by someone else"


# --- properties of every step -----------------------------------------------------------------------------

CONSUMERS = ["a", "b", "c"]
OWNERS = st.sampled_from([None, "a", "b", "c", "gone"])


@given(
    st.fixed_dictionaries({p: OWNERS for p in PARTITIONS}),
    st.one_of(st.none(), st.fixed_dictionaries({p: st.sampled_from(CONSUMERS) for p in PARTITIONS})),
    st.sets(st.sampled_from(PARTITIONS)),
    st.integers(0, 60),
)
def test_a_step_never_claims_what_it_holds_and_forces_only_a_live_owner_past_the_deadline(
    owners: dict[str, str | None], assigned: dict[str, str] | None, mine: set[str], seconds: int
) -> None:
    """Whatever the listing says: no partition is both claimed and drained, or claimed twice; nothing held
    here is claimed again; a claim is forced exactly when someone else holds the lease, and a live owner's
    lease only by the record's `forced` or past the handoff deadline."""
    owners = {p: ("a" if p in mine else o if o != "a" else None) for p, o in owners.items()}
    snap = snapshot(owners, [*CONSUMERS, "gone"], assigned, dead=("gone",))
    now = T0 + timedelta(seconds=seconds)
    result = step("a", snap, sorted(mine), now)
    claimed = [c.partition for c in result.claims]
    assert len(claimed) == len(set(claimed))
    assert not set(claimed) & (set(result.drains) | mine | set(result.waiting))
    assert set(result.drains) <= mine
    for claim in result.claims:
        holder = owners.get(claim.partition)
        assert claim.force == (holder not in (None, "a")), claim
        assert claim.owner == (holder if claim.force else None), claim
        if claim.reason is ClaimReason.HANDOFF_DEADLINE:
            assert seconds >= 15
    if result.waiting:
        assert result.mode == "assignment" and seconds < 15
