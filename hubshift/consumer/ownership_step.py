"""A consumer's ownership step: what it claims and drains after one listing of the scope, as pure functions
of plain data and a time passed in.

- `ownership_step`: the claims (and whether by force) and the drains that move this consumer towards its
  assignment: follow the operator's assignment record while it is current, else balance with the fallback
  balancer. A consumer follows the record's `partitions`. Its `planned` entries (a planned change:
  partitions planned for a consumer not ready yet) that have an assignee stay with it until the operator's
  next generation moves them into `partitions` for their planned owner (a graceful handoff), so a
  partition never has two owners and is never left unread for a pod's start-up time. Those without an
  assignee (a cold start) the planned owner claims itself, without force, as soon as it has joined: no
  operator round trip (docs/decisions.md, "Planned changes"). The step reports the rest
  (`OwnershipStep.planned`).
- `track_unhealthy`: since when the record has named a consumer that is not alive.
- `lost_partitions`: the partitions whose lease the listing shows is no longer this consumer's.

The agent (`agent.py`) does the I/O these decide.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from hubshift.ownership.balancer import balance
from hubshift.ownership.model import Assignment, Claim, ClaimReason, OwnershipSnapshot


@dataclass(frozen=True)
class OwnershipStep:
    """One listing's decision of a consumer: what to claim and drain, and what it waits for.

    In Kafka's terms the assignment record is the target assignment and the leases this consumer holds its
    current one; a step moves it towards the target: `drains` are given up, `claims` taken, `waiting` are
    assigned here but still owned by a live consumer that has until `handoff_deadline` to release them,
    `planned` are planned here by a planned change and not handed over yet.
    """

    mode: Literal["assignment", "fallback"]
    claims: tuple[Claim, ...] = ()
    drains: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    handoff_deadline: datetime | None = None
    planned: tuple[str, ...] = ()


def assignment_is_healthy(assignment: Assignment, partitions: Collection[str], live: Collection[str]) -> bool:
    """Every partition is assigned to a live consumer."""
    alive = set(live)
    return all(assignment.assignee_of(p) in alive for p in partitions)


def assignment_is_current(
    assignment: Assignment | None,
    partitions: Collection[str],
    live: Collection[str],
    now: datetime,
    stale_after_seconds: float,
    unhealthy_since: datetime | None = None,
) -> bool:
    """Follow the operator's record unless it cannot be followed and the operator had time to fix it.

    A record that gives every partition to a live consumer is followed however old it is (the operator
    only republishes on a change). One that leaves a partition to nobody alive (or that misses a partition)
    is followed for `stale_after_seconds` after the latest of: its publication, the end of the holddown it
    announces (the operator saw the change and holds the partitions for a consumer that may come back),
    the end of its wait for planned consumers (`planned_until`), and `unhealthy_since` (when this consumer
    first saw it so); that is the time the operator needs to see the change and publish a new generation.
    After that the consumers balance themselves.
    """
    if assignment is None:
        return False
    if assignment_is_healthy(assignment, partitions, live):
        return True
    since = assignment.updated_at
    for later in (assignment.holddown_until, assignment.planned_until, unhealthy_since):
        if later is not None and later > since:
            since = later
    return (now - since).total_seconds() < stale_after_seconds


def track_unhealthy(
    previous: tuple[int, datetime] | None,
    assignment: Assignment | None,
    partitions: Collection[str],
    live: Collection[str],
    now: datetime,
) -> tuple[int, datetime] | None:
    """(generation, when first seen) of a record that assigns a partition to a consumer not alive (a pod
    gone, maybe coming back within the operator's holddown); None while it does not. The record is followed
    for `stale_after_seconds` from then, not from its publication, which may be long past."""
    if assignment is None or assignment_is_healthy(assignment, partitions, live):
        return None
    if previous is None or previous[0] != assignment.generation:
        return (assignment.generation, now)
    return previous


def lost_partitions(me: str, owned: Mapping[str, int], snapshot: OwnershipSnapshot) -> list[tuple[str, str]]:
    """(partition, why) for each partition `me` owns (partition -> owner level) whose lease the listing
    shows is someone else's or was claimed again since: it was taken (broken)."""
    lost = []
    for partition, level in owned.items():
        row = snapshot.partition(partition)
        if row is None or row.free or row.owner != me:
            lost.append((partition, "its lease is held by someone else"))
        elif row.owner_level > level:
            lost.append((partition, f"it was claimed again at owner level {row.owner_level}"))
    return lost


def ownership_step(
    me: str,
    partitions: Sequence[str],
    snapshot: OwnershipSnapshot,
    active: Collection[str],
    draining: Collection[str],
    now: datetime,
    *,
    max_handoff_seconds: float,
    stale_after_seconds: float,
    unhealthy_since: datetime | None = None,
) -> OwnershipStep:
    """The step of consumer `me` after one listing (`snapshot`).

    `active` are the partitions it reads now, `draining` those being handed off. A partition whose lease
    this consumer still holds in the store (a restart with the same identity) is re-claimed without force.
    `unhealthy_since`: when this consumer first saw the record's generation name a consumer not alive.
    """
    held = set(active) | set(draining)
    live = set(snapshot.live_members) | {me}
    assignment = snapshot.assignment
    if assignment is not None and assignment_is_current(
        assignment, partitions, live, now, stale_after_seconds, unhealthy_since
    ):
        return _follow(me, partitions, snapshot, assignment, set(active), held, now, max_handoff_seconds)
    return _fallback(me, partitions, snapshot, held, live)


def _follow(
    me: str,
    partitions: Sequence[str],
    snapshot: OwnershipSnapshot,
    assignment: Assignment,
    active: set[str],
    held: set[str],
    now: datetime,
    max_handoff_seconds: float,
) -> OwnershipStep:
    known = set(partitions)
    mine = {p for p in assignment.partitions_of(me) if p in known}
    planned = [p for p in assignment.planned_for(me) if p in known and p not in mine]
    # Planned for me and without an assignee (a cold start, an assignee that left): read it now that I have
    # joined, if its lease is free, instead of a listing after the operator's next generation. Owned by
    # anyone else, it stays the operator's to move.
    unread = {p for p in planned if assignment.assignee_of(p) is None}
    drains = tuple(sorted(active - mine - unread))
    handoff = assignment.max_handoff_seconds if assignment.max_handoff_seconds is not None else None
    deadline_seconds = handoff if handoff is not None else max_handoff_seconds
    deadline = assignment.updated_at.timestamp() + deadline_seconds
    # The operator saw the old owner go (pod deleted, process gone): no release will come.
    forced = assignment.forced
    claims: list[Claim] = []
    waiting: list[str] = []
    for partition in sorted((mine | unread) - held):
        row = snapshot.partition(partition)
        if row is None or row.free:
            claims.append(Claim(partition, False, ClaimReason.FREE))
        elif row.owner == me:
            claims.append(Claim(partition, False, ClaimReason.MINE))
        elif partition in unread:
            continue  # someone owns it after all: the operator's to move
        elif row.orphaned:
            claims.append(Claim(partition, True, ClaimReason.ORPHANED, row.owner))
        elif partition in forced:
            claims.append(Claim(partition, True, ClaimReason.OWNER_GONE, row.owner))
        elif now.timestamp() >= deadline:
            claims.append(Claim(partition, True, ClaimReason.HANDOFF_DEADLINE, row.owner))
        else:
            waiting.append(partition)
    reading = held | {c.partition for c in claims}
    return OwnershipStep(
        "assignment",
        claims=tuple(claims),
        drains=drains,
        waiting=tuple(waiting),
        handoff_deadline=datetime.fromtimestamp(deadline, tz=assignment.updated_at.tzinfo)
        if waiting
        else None,
        planned=tuple(p for p in planned if p not in reading),
    )


def _fallback(
    me: str, partitions: Sequence[str], snapshot: OwnershipSnapshot, held: set[str], live: set[str]
) -> OwnershipStep:
    owners: dict[str, str | None] = {p: None for p in partitions}
    claims: list[Claim] = []
    for row in snapshot.partitions:
        if row.partition in owners and not row.free:
            owners[row.partition] = row.owner
        if row.owner == me and row.partition not in held and row.partition in owners:
            claims.append(Claim(row.partition, False, ClaimReason.MINE))
    for partition in held:
        owners[partition] = me
    for partition in (c.partition for c in claims):
        owners[partition] = me
    claims.extend(balance(me, partitions, owners, live))
    return OwnershipStep("fallback", claims=tuple(claims))
