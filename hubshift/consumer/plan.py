"""The consumer's ownership decisions, as pure functions of plain data and a time passed in.

- `plan_ownership`: what to claim (and whether by force) and what to drain, from one ownership snapshot:
  follow the operator's assignment record while it is current, else balance with the fallback balancer.
  A consumer reads the record's `partitions`. Its `planned` entries (a planned change: partitions planned
  for a consumer not ready yet) that someone reads stay with that reader until the operator's next
  generation moves them into `partitions` for their planned owner (a graceful handoff), so a partition
  never has two readers and is never left unread for a pod's start-up time. Those nobody reads (a cold
  start) the planned owner claims itself, without force, as soon as it has joined: no operator round trip
  (docs/decisions.md, "Planned changes"). The plan reports the rest (`OwnershipPlan.planned`).
- `checkpoint_due`: the checkpoint cadence (events and seconds) of one partition.

The agent (`agent.py`) does the I/O these decide.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from hubshift.ownership.balancer import balance
from hubshift.ownership.model import Assignment, Checkpoint, OwnershipSnapshot


class ClaimReason(enum.StrEnum):
    """Why a partition is claimed."""

    FREE = "free"  # nobody holds it (never claimed, released, broken or expired)
    MINE = "mine"  # its lease is still ours (a restart with the same identity)
    ORPHANED = "orphaned"  # its holder is no longer alive
    OWNER_GONE = "owner gone"  # the operator saw its holder go (the record's `forced`)
    HANDOFF_DEADLINE = "handoff deadline passed"  # its holder did not release it in time
    STEAL = "steal"  # fallback balancing: from the biggest owner

    @property
    def metric_label(self) -> str:
        """`how` in `hubshift_consumer_partitions_acquired_total`: released, own, expired or broken."""
        return {ClaimReason.FREE: "released", ClaimReason.MINE: "own", ClaimReason.ORPHANED: "expired"}.get(
            self, "broken"
        )


@dataclass(frozen=True)
class ClaimPlan:
    partition: str
    force: bool
    reason: ClaimReason
    holder: str | None = None  # who holds it now, when it is taken from someone

    def describe(self) -> str:
        """For a log line: the reason, and from whom."""
        return self.reason.value if self.holder is None else f"{self.reason.value} from {self.holder}"


@dataclass(frozen=True)
class OwnershipPlan:
    mode: Literal["assignment", "fallback", "stopping"]
    claims: tuple[ClaimPlan, ...] = ()
    drains: tuple[str, ...] = ()
    # Assigned to me, still held by a live owner that has until `handoff_deadline` to release them.
    waiting: tuple[str, ...] = ()
    handoff_deadline: datetime | None = None
    # Planned for me by a planned change, not handed over yet: the operator moves them to me once I am ready.
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


def plan_ownership(
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
    stopping: bool = False,
) -> OwnershipPlan:
    """One decision cycle of consumer `me`.

    `active` are the partitions it reads now, `draining` those being handed off. A partition whose lease
    this consumer still holds in the store (a restart with the same identity) is re-claimed without force.
    `unhealthy_since`: when this consumer first saw the record's generation name a consumer not alive.
    """
    if stopping:
        return OwnershipPlan("stopping", drains=tuple(sorted(active)))
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
) -> OwnershipPlan:
    known = set(partitions)
    mine = {p for p in assignment.partitions_of(me) if p in known}
    planned = [p for p in assignment.planned_for(me) if p in known and p not in mine]
    # Planned for me and read by nobody (a cold start, a reader that left): read it now that I have joined,
    # if its lease is free, instead of a listing after the operator's next generation. Held by anyone else,
    # it stays the operator's to move.
    unread = {p for p in planned if assignment.assignee_of(p) is None}
    drains = tuple(sorted(active - mine - unread))
    handoff = assignment.max_handoff_seconds if assignment.max_handoff_seconds is not None else None
    deadline_seconds = handoff if handoff is not None else max_handoff_seconds
    deadline = assignment.updated_at.timestamp() + deadline_seconds
    # The operator saw the old owner go (pod deleted, process gone): no release will come.
    forced = assignment.forced
    claims: list[ClaimPlan] = []
    waiting: list[str] = []
    for partition in sorted((mine | unread) - held):
        row = snapshot.partition(partition)
        if row is None or row.free:
            claims.append(ClaimPlan(partition, False, ClaimReason.FREE))
        elif row.owner == me:
            claims.append(ClaimPlan(partition, False, ClaimReason.MINE))
        elif partition in unread:
            continue  # someone reads it after all: the operator's to move
        elif not row.owner_alive:
            claims.append(ClaimPlan(partition, True, ClaimReason.ORPHANED, row.owner))
        elif partition in forced:
            claims.append(ClaimPlan(partition, True, ClaimReason.OWNER_GONE, row.owner))
        elif now.timestamp() >= deadline:
            claims.append(ClaimPlan(partition, True, ClaimReason.HANDOFF_DEADLINE, row.owner))
        else:
            waiting.append(partition)
    reading = held | {c.partition for c in claims}
    return OwnershipPlan(
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
) -> OwnershipPlan:
    owners: dict[str, str | None] = {p: None for p in partitions}
    claims: list[ClaimPlan] = []
    for row in snapshot.partitions:
        if row.partition in owners and not row.free:
            owners[row.partition] = row.owner
        if row.owner == me and row.partition not in held and row.partition in owners:
            claims.append(ClaimPlan(row.partition, False, ClaimReason.MINE))
    for partition in held:
        owners[partition] = me
    for partition in (c.partition for c in claims):
        owners[partition] = me
    for claim in balance(me, partitions, owners, live):
        if claim.steal:
            claims.append(ClaimPlan(claim.partition, True, ClaimReason.STEAL, claim.previous_owner))
        elif claim.previous_owner is not None and claim.previous_owner != me:
            claims.append(ClaimPlan(claim.partition, True, ClaimReason.ORPHANED, claim.previous_owner))
        else:
            claims.append(ClaimPlan(claim.partition, False, ClaimReason.FREE))
    return OwnershipPlan("fallback", claims=tuple(claims))


def checkpoint_due(
    committed: Checkpoint | None,
    checkpointed: Checkpoint,
    events_since: int,
    last_written: float,
    now: float,
    *,
    every_events: int,
    every_seconds: float,
) -> bool:
    """Write a partition's checkpoint when it moved and enough events or enough time went by."""
    if committed is None or committed.sequence_number <= checkpointed.sequence_number:
        return False
    return events_since >= every_events or now - last_written >= every_seconds
