"""The ownership state as the tests and benchmarks read and judge it from outside the consumers: one
partition's checkpoint, who owns what in a snapshot, the planner's properties (balance, the fewest moves)
and the crash failover the timings allow."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from hubshift.ownership.model import Checkpoint, OwnershipSnapshot
from hubshift.ownership.planner import Assignees, fair_shares
from hubshift.ownership.records import parse_checkpoint
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import BlobNotFound, LeaseStore
from hubshift.ownership.timing import Timing


def read_checkpoint(store: LeaseStore, scope: Scope, partition: str) -> Checkpoint | None:
    """One partition's checkpoint as its blob holds it (None: no checkpoint blob)."""
    try:
        entry = store.properties(scope.checkpoint_blob(partition))
    except BlobNotFound:
        return None
    return parse_checkpoint(entry.metadata)


def owned_by(snapshot: OwnershipSnapshot, consumer: str) -> list[str]:
    """The partitions whose lease `consumer` holds in `snapshot`."""
    return [p.partition for p in snapshot.partitions if p.owner == consumer and not p.free]


def minimum_moves(partitions: Iterable[str], consumers: Sequence[str], current: Assignees) -> int:
    """The fewest moves any balanced assignment needs from `current`, by formula (without building one):
    the consumers holding the most keep at most their fair shares, biggest share to the biggest holder."""
    parts = set(partitions)
    members = list(dict.fromkeys(consumers))
    if not members or not parts:
        return 0
    held = Counter(current.get(p) for p in parts)
    counts = sorted((held[c] for c in members), reverse=True)
    shares = fair_shares(len(parts), len(members))
    kept = sum(min(count, cap) for count, cap in zip(counts, shares, strict=False))
    return len(parts) - kept


def is_balanced(assignment: Assignees, consumers: Sequence[str]) -> bool:
    """Every partition assigned to one of `consumers`, `min(consumers, partitions)` of them active, ±1."""
    members = set(consumers)
    if not assignment:
        return True
    if not members:
        return all(assignee is None for assignee in assignment.values())
    counts: dict[str, int] = {}
    for assignee in assignment.values():
        if assignee is None or assignee not in members:
            return False
        counts[assignee] = counts.get(assignee, 0) + 1
    if len(counts) != min(len(members), len(assignment)):
        return False
    return max(counts.values()) - min(counts.values()) <= 1


def failover_seconds(timing: Timing) -> float:
    """Worst case from a consumer's crash until a survivor may take its partitions without an operator: its
    membership lease runs out (at most one lease after its last renewal), then a survivor's next listing
    sees it."""
    return timing.membership_lease_seconds + timing.list_interval_seconds
