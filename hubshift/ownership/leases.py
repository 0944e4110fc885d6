"""Partition ownership: claim (acquire an infinite lease on the checkpoint blob) and release.

The lease id is the consumer's own (`Scope.lease_id`), so a restarted consumer re-acquires its partitions
at once and anybody else is refused. Every claim writes `ownerlevel + 1` under the new lease: the owner
opens its Event Hubs receiver with it and the service disconnects any older receiver.
"""

from __future__ import annotations

from datetime import datetime

from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.model import EARLIEST, Checkpoint, PartitionLease
from hubshift.ownership.records import (
    checkpoint_metadata,
    parse_checkpoint,
    parse_next_enqueued,
    parse_owner_level,
)
from hubshift.ownership.scope import Scope, consumer_id, partition_id
from hubshift.ownership.store import INFINITE, BlobNotFound, LeaseConflict, LeaseLost, LeaseStore


def claim_partition(
    store: LeaseStore,
    scope: Scope,
    partition: str,
    consumer: str,
    *,
    force: bool = False,
    initial: Checkpoint = EARLIEST,
) -> PartitionLease:
    """Take `partition` for `consumer`; `LeaseConflict` if somebody else holds it.

    `force` breaks the current lease first (an orphan, or a handoff past its deadline). `initial` is the
    position written when the partition has no checkpoint blob yet ("nothing consumed" for the configured
    start). Costs 3 requests (acquire, read, write), 5 the first time, 4 when forced.
    """
    partition, consumer = partition_id(partition), consumer_id(consumer)
    name = scope.checkpoint_blob(partition)
    lease_id = scope.lease_id(consumer)
    if force:
        try:
            store.break_lease(name)
        except BlobNotFound:
            pass
    try:
        store.acquire_lease(name, lease_id, INFINITE)
    except BlobNotFound:
        store.create(name, checkpoint_metadata(initial))
        store.acquire_lease(name, lease_id, INFINITE)
    entry = store.properties(name)
    lease = PartitionLease(
        scope=scope,
        partition=partition,
        consumer=consumer,
        lease_id=lease_id,
        owner_level=parse_owner_level(entry.metadata) + 1,
        checkpoint=parse_checkpoint(entry.metadata) or initial,
    )
    try:
        # The position is unchanged, and so is when the event after it was enqueued.
        return write_checkpoint(
            store, lease, lease.checkpoint, next_enqueued=parse_next_enqueued(entry.metadata)
        )
    except LeaseLost:
        # Broken by a forced claim between our acquire and this write: the other claimer won.
        raise LeaseConflict(f"{name} was taken while it was being claimed") from None


def release_partition(
    store: LeaseStore,
    lease: PartitionLease,
    *,
    final: Checkpoint | None = None,
    next_enqueued: datetime | None = None,
) -> bool:
    """Give the partition up, after writing `final` (the handoff's last checkpoint) if given, with when the
    event after it was enqueued (`next_enqueued`) if known.

    False when the lease was already lost (the final checkpoint was then not written either).
    """
    try:
        if final is not None:
            write_checkpoint(store, lease, final, next_enqueued=next_enqueued)
        store.release_lease(lease.scope.checkpoint_blob(lease.partition), lease.lease_id)
    except (LeaseLost, BlobNotFound):
        return False
    return True
