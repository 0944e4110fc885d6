"""What a person does to a consumer group's records by hand, fenced as the consumers are: move checkpoints
(`move_checkpoint`, `hubshift checkpoints reset`) and end hubshift's ownership so another reader (the Azure
SDK's processor, Azure Functions) can take the group over (`release_ownership`, `hubshift release`).

Neither touches a partition a live consumer owns (`live_owners`): a consumer would write its next checkpoint
over a moved one, and would go on reading a released one. A partition whose owner is gone (its membership
lapsed: it no longer reads nor checkpoints) has its lease broken. A move takes the checkpoint blob's lease
itself, for `MIN_LEASE_SECONDS` (a move cut short frees the blob by itself), so a consumer claiming the
partition meanwhile either waits for the move or makes it fail; it never reads the old position after the
new one was written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hubshift.ownership.model import Checkpoint, OwnershipSnapshot, PartitionOwnership
from hubshift.ownership.records import checkpoint_metadata, moved_metadata, parse_owner_level
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import (
    MIN_LEASE_SECONDS,
    BlobNotFound,
    LeaseConflict,
    LeaseLost,
    LeaseStore,
)

# The identity the tools hold a checkpoint blob's lease under while they move it; the dot keeps it apart
# from every consumer's (a pod's name has none).
TOOL = "hubshift.tool"


class TakenMeanwhile(Exception):
    """A consumer claimed the partition while it was being changed: nothing was written."""


def live_owners(snapshot: OwnershipSnapshot, partitions: Iterable[str]) -> dict[str, str]:
    """Of `partitions`, those a live consumer owns (partition -> owner): a consumer reads them now and
    would write its next checkpoint over a moved one."""
    rows = {row.partition: row for row in snapshot.partitions}
    found: dict[str, str] = {}
    for partition in partitions:
        row = rows.get(partition)
        if row is not None and row.owner is not None and row.owner_alive:
            found[partition] = row.owner
    return found


@dataclass(frozen=True)
class Moved:
    """A checkpoint moved by hand: where it was (None: no checkpoint blob yet) and where it is now."""

    partition: str
    before: Checkpoint | None
    after: Checkpoint
    broke_lease_of: str | None = None  # the gone owner whose lease was broken


def move_checkpoint(
    store: LeaseStore, scope: Scope, row: PartitionOwnership | None, partition: str, checkpoint: Checkpoint
) -> Moved:
    """Write `checkpoint` as `partition`'s position under the tool's own lease (`row`: the partition as the
    last listing showed it; its owner must not be alive). `TakenMeanwhile` when a consumer claimed it
    meanwhile; the caller checked `live_owners` first."""
    name = scope.checkpoint_blob(partition)
    if row is None and store.create(name, checkpoint_metadata(checkpoint)):
        return Moved(partition, None, checkpoint)
    broke = _break_gone_owner(store, scope, row) if row is not None else None
    lease_id = scope.lease_id(TOOL)
    try:
        store.acquire_lease(name, lease_id, MIN_LEASE_SECONDS)
    except LeaseConflict:
        raise TakenMeanwhile(f"partition {partition} was claimed by a consumer meanwhile") from None
    try:
        entry = store.properties(name)
        store.set_metadata(name, moved_metadata(entry.metadata, checkpoint), lease_id=lease_id)
    except (LeaseLost, BlobNotFound):
        raise TakenMeanwhile(f"partition {partition} was claimed by a consumer meanwhile") from None
    finally:
        try:
            store.release_lease(name, lease_id)
        except (LeaseLost, BlobNotFound):
            pass  # broken by a forced claim: the claimer holds it now
    return Moved(partition, row.checkpoint if row is not None else None, checkpoint, broke)


def release_ownership(store: LeaseStore, scope: Scope, row: PartitionOwnership) -> str | None:
    """End hubshift's hold on the partition: its checkpoint blob's lease is broken (its owner must be gone,
    `live_owners`), so a reader that writes checkpoints without a lease (the Azure SDK's
    `BlobCheckpointStore`) can move it. Returns the owner whose lease was broken (None: it was free)."""
    return _break_gone_owner(store, scope, row)


def _break_gone_owner(store: LeaseStore, scope: Scope, row: PartitionOwnership) -> str | None:
    """Break the lease of the owner `row` names, gone (it can no longer checkpoint: `live_owners`), unless the
    partition was claimed again since the listing (`TakenMeanwhile`). Returns that owner (None: free)."""
    if row.owner is None:
        return None
    name = scope.checkpoint_blob(row.partition)
    now = store.properties(name)
    if now.leased and parse_owner_level(now.metadata) != row.owner_level:
        raise TakenMeanwhile(f"partition {row.partition} was claimed by a consumer meanwhile")
    store.break_lease(name)
    return row.owner
