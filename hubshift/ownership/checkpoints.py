"""Checkpoints in the Azure SDKs' layout, written only under the partition's lease.

A checkpoint blob's metadata: `offset` and `sequencenumber` (what the SDK's `BlobCheckpointStore` reads),
`ownerid` and `ownerlevel` (the ownership table and the Event Hubs epoch), `hubshiftstart` for a
partition that starts at an enqueued time, and `hubshiftnextenqueued`: when the event after the checkpoint
was enqueued, when the owner had received it (the control loop's lag in seconds).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from hubshift.ownership.model import Checkpoint, PartitionLease
from hubshift.ownership.records import checkpoint_metadata, parse_checkpoint
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseStore


def write_checkpoint(
    store: LeaseStore,
    lease: PartitionLease,
    checkpoint: Checkpoint,
    *,
    next_enqueued: datetime | None = None,
) -> PartitionLease:
    """Move the partition's position, fenced by the lease: `LeaseLost` once it was broken, released or
    expired. `next_enqueued`: when the event after `checkpoint` was enqueued, if known."""
    store.set_metadata(
        lease.scope.checkpoint_blob(lease.partition),
        checkpoint_metadata(
            checkpoint, owner=lease.consumer, owner_level=lease.owner_level, next_enqueued=next_enqueued
        ),
        lease_id=lease.lease_id,
    )
    return replace(lease, checkpoint=checkpoint)


def list_checkpoints(store: LeaseStore, scope: Scope) -> dict[str, Checkpoint]:
    """Every partition's position, in one request."""
    found: dict[str, Checkpoint] = {}
    for entry in store.list(scope.checkpoint_prefix):
        checkpoint = parse_checkpoint(entry.metadata)
        if checkpoint is not None:
            found[entry.name[len(scope.checkpoint_prefix) :]] = checkpoint
    return found
