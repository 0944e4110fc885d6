"""The ownership table: everything about a scope from one listing of it."""

from __future__ import annotations

from hubshift.ownership.assignment import read_assignment
from hubshift.ownership.model import (
    EARLIEST,
    Member,
    OwnershipSnapshot,
    PartitionOwnership,
    partition_sort_key,
)
from hubshift.ownership.records import OWNER, parse_checkpoint, parse_next_enqueued, parse_owner_level
from hubshift.ownership.scope import ASSIGNMENT, CHECKPOINT, MEMBERS, Scope
from hubshift.ownership.store import BlobEntry, LeaseState, LeaseStore


def take_snapshot(
    store: LeaseStore, scope: Scope, *, previous: OwnershipSnapshot | None = None
) -> OwnershipSnapshot:
    """One list request; plus one read of the assignment record when its ETag differs from `previous`."""
    entries = store.list(scope.prefix)
    snapshot = snapshot_from_entries(scope, entries)
    if snapshot.assignment_etag is None:
        return snapshot
    if previous is not None and previous.assignment_etag == snapshot.assignment_etag:
        assignment = previous.assignment
        etag: str | None = previous.assignment_etag
    else:
        record = read_assignment(store, scope)
        assignment = None if record is None else record.assignment
        etag = None if record is None else record.etag
    return OwnershipSnapshot(scope, snapshot.partitions, snapshot.members, assignment, etag)


def snapshot_from_entries(scope: Scope, entries: list[BlobEntry]) -> OwnershipSnapshot:
    """The table a listing describes (pure); the assignment's content is left for the caller to read."""
    members: list[Member] = []
    checkpoints: list[tuple[str, BlobEntry]] = []
    assignment_etag: str | None = None
    for entry in entries:
        relative = entry.name[len(scope.prefix) :]
        if relative.startswith(CHECKPOINT):
            checkpoints.append((relative[len(CHECKPOINT) :], entry))
        elif relative.startswith(MEMBERS):
            members.append(Member(relative[len(MEMBERS) :], entry.leased, entry.last_modified))
        elif relative == ASSIGNMENT:
            assignment_etag = entry.etag
    alive = {m.consumer for m in members if m.alive}
    partitions = []
    for partition, entry in sorted(checkpoints, key=lambda item: partition_sort_key(item[0])):
        last_owner = entry.metadata.get(OWNER) or None
        owner = (last_owner or "?") if entry.lease_state is LeaseState.LEASED else None
        partitions.append(
            PartitionOwnership(
                partition=partition,
                owner=owner,
                owner_alive=owner is not None and owner in alive,
                lease_state=entry.lease_state,
                owner_level=parse_owner_level(entry.metadata),
                last_modified=entry.last_modified,
                checkpoint=parse_checkpoint(entry.metadata) or EARLIEST,
                last_owner=last_owner,
                next_enqueued=parse_next_enqueued(entry.metadata),
            )
        )
    members.sort(key=lambda m: m.consumer)
    return OwnershipSnapshot(scope, tuple(partitions), tuple(members), None, assignment_etag)
