"""What a control-loop cycle reads from what it observed: each partition's lease owner and backlog from the
ownership snapshot and the hub's partitions, the consumers the runtime reports present, and the partitions
nobody reads. Pure functions of plain data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hubshift.eventhubs.model import PartitionInfo
from hubshift.operator.autoscaler import partition_backlog
from hubshift.operator.runtime import ConsumerInstance
from hubshift.ownership.model import OwnershipSnapshot
from hubshift.ownership.planner import consumer_sort_key
from hubshift.spec import StartPositionSpec


def lease_owners(snapshot: OwnershipSnapshot, partitions: Iterable[str]) -> dict[str, str | None]:
    """Each partition's lease owner now, alive or not; None when nobody holds the lease."""
    rows = {row.partition: row for row in snapshot.partitions}
    owners: dict[str, str | None] = {}
    for partition in partitions:
        row = rows.get(partition)
        owners[partition] = None if row is None or row.free else row.owner
    return owners


def backlog_per_partition(
    partitions: Mapping[str, PartitionInfo], snapshot: OwnershipSnapshot, start: StartPositionSpec
) -> dict[str, int]:
    """Last enqueued - checkpoint for every partition; a missing checkpoint counts from the partition's start
    position."""
    rows = {row.partition: row for row in snapshot.partitions}
    backlog = {}
    for partition, info in partitions.items():
        row = rows.get(partition)
        checkpoint = None if row is None else row.checkpoint.sequence_number
        chosen = start.of(partition)
        backlog[partition] = partition_backlog(
            last_enqueued=info.last_enqueued,
            checkpoint=checkpoint,
            beginning=info.beginning,
            empty=info.empty,
            start="latest" if chosen.type == "latest" else "earliest",
            start_sequence_number=chosen.sequence_number if chosen.type == "sequenceNumber" else None,
        )
    return backlog


def present_consumers(instances: Iterable[ConsumerInstance]) -> tuple[str, ...]:
    """The consumers that may own partitions: ready and not being stopped."""
    return tuple(sorted((i.name for i in instances if i.ready and not i.terminating), key=consumer_sort_key))


def unowned(owners: Mapping[str, str | None], alive: Iterable[str]) -> list[str]:
    """Partitions without a live owner: nobody reads them."""
    live = set(alive)
    return [p for p, owner in owners.items() if owner is None or owner not in live]
