"""Checkpoints in the Azure SDKs' layout, written only under the partition's lease.

A checkpoint blob's metadata: `offset` and `sequencenumber` (what the SDK's `BlobCheckpointStore` reads),
`ownerid` and `ownerlevel` (the ownership table and the Event Hubs epoch), and `hubshiftstart` for a
partition that starts at an enqueued time.
"""

from __future__ import annotations

from dataclasses import replace

from hubshift.ownership.model import Checkpoint, PartitionLease
from hubshift.ownership.records import checkpoint_metadata, parse_checkpoint
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import BlobNotFound, LeaseStore


def write_checkpoint(store: LeaseStore, lease: PartitionLease, checkpoint: Checkpoint) -> PartitionLease:
    """Move the partition's position, fenced by the lease: `LeaseLost` once it was broken, changed or
    expired."""
    store.set_metadata(
        lease.scope.checkpoint_blob(lease.partition),
        checkpoint_metadata(checkpoint, owner=lease.consumer, owner_level=lease.owner_level),
        lease_id=lease.lease_id,
    )
    return replace(lease, checkpoint=checkpoint)


def read_checkpoint(store: LeaseStore, scope: Scope, partition: str) -> Checkpoint | None:
    try:
        entry = store.properties(scope.checkpoint_blob(partition))
    except BlobNotFound:
        return None
    return parse_checkpoint(entry.metadata)


def list_checkpoints(store: LeaseStore, scope: Scope) -> dict[str, Checkpoint]:
    """Every partition's position, in one request."""
    found: dict[str, Checkpoint] = {}
    for entry in store.list(scope.checkpoint_prefix):
        checkpoint = parse_checkpoint(entry.metadata)
        if checkpoint is not None:
            found[entry.name[len(scope.checkpoint_prefix) :]] = checkpoint
    return found
