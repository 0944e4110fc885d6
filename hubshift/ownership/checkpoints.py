"""Checkpoints in the Azure SDKs' layout, written only under the partition's lease.

A checkpoint blob's metadata: `offset` and `sequencenumber` (what the SDK's `BlobCheckpointStore` reads),
`ownerid` and `ownerlevel` (the ownership table and the Event Hubs epoch), and `hubshiftstart` for a
partition that starts at an enqueued time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from hubshift.ownership.model import Checkpoint, PartitionLease
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import BlobNotFound, LeaseStore

OFFSET = "offset"
SEQUENCE_NUMBER = "sequencenumber"
OWNER = "ownerid"
OWNER_LEVEL = "ownerlevel"
START = "hubshiftstart"


def checkpoint_metadata(
    checkpoint: Checkpoint, *, owner: str | None = None, owner_level: int | None = None
) -> dict[str, str]:
    metadata = {OFFSET: str(checkpoint.offset), SEQUENCE_NUMBER: str(checkpoint.sequence_number)}
    if checkpoint.start is not None:
        metadata[START] = checkpoint.start.isoformat()
    if owner is not None:
        metadata[OWNER] = owner
    if owner_level is not None:
        metadata[OWNER_LEVEL] = str(owner_level)
    return metadata


def parse_checkpoint(metadata: Mapping[str, str]) -> Checkpoint | None:
    """The position in a checkpoint blob's metadata; None when it carries none (or garbage)."""
    offset, sequence = metadata.get(OFFSET), metadata.get(SEQUENCE_NUMBER)
    if offset is None or sequence is None:
        return None
    try:
        sequence_number = int(sequence)
        start = datetime.fromisoformat(metadata[START]) if START in metadata else None
    except ValueError:
        return None
    return Checkpoint(offset=offset, sequence_number=sequence_number, start=start)


def parse_owner_level(metadata: Mapping[str, str]) -> int:
    try:
        return max(0, int(metadata.get(OWNER_LEVEL, "0")))
    except ValueError:
        return 0


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
