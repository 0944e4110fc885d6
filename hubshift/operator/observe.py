"""What a control-loop cycle reads from its observations: pure functions of the ownership snapshot, the
hub's partitions and the consumers the runtime reports (no I/O, no clock of their own)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hubshift.eventhubs.model import PartitionInfo
from hubshift.operator.autoscaler import partition_backlog
from hubshift.operator.rebalance import PublishAssignment, RebalanceState
from hubshift.operator.runtime import ConsumerInstance
from hubshift.ownership.model import Assignment, OwnershipSnapshot, Phase
from hubshift.ownership.planner import consumer_sort_key
from hubshift.ownership.records import encode_assignment
from hubshift.spec import StartPosition

# While a holddown runs or handoffs are pending, cycles come this often (the state machine's clock).
BUSY_CYCLE_SECONDS = 1.0


def lease_holders(snapshot: OwnershipSnapshot, partitions: Iterable[str]) -> dict[str, str | None]:
    """Who holds each partition's lease now, alive or not; None when nobody does."""
    rows = {row.partition: row for row in snapshot.partitions}
    holders: dict[str, str | None] = {}
    for partition in partitions:
        row = rows.get(partition)
        holders[partition] = None if row is None or row.free else row.owner
    return holders


def backlog_per_partition(
    partitions: Mapping[str, PartitionInfo], snapshot: OwnershipSnapshot, start: StartPosition
) -> dict[str, int]:
    """Last enqueued - checkpoint for every partition; a missing checkpoint counts from the start position."""
    rows = {row.partition: row for row in snapshot.partitions}
    backlog = {}
    for partition, info in partitions.items():
        row = rows.get(partition)
        checkpoint = None if row is None else row.checkpoint.sequence_number
        backlog[partition] = partition_backlog(
            last_enqueued=info.last_enqueued,
            checkpoint=checkpoint,
            beginning=info.beginning,
            empty=info.empty,
            start="latest" if start.type == "latest" else "earliest",
        )
    return backlog


def present_consumers(instances: Iterable[ConsumerInstance]) -> tuple[str, ...]:
    """The consumers that may own partitions: ready and not being stopped."""
    return tuple(sorted((i.name for i in instances if i.ready and not i.terminating), key=consumer_sort_key))


def record_changed(new: Assignment, old: Assignment | None) -> bool:
    """Whether the record must be written: what the consumers would read differs."""
    return old is None or encode_assignment(new) != encode_assignment(old)


def holders_to_expel(
    published: PublishAssignment, holders: Mapping[str, str | None], spared: Iterable[str]
) -> list[str]:
    """The holders of forced partitions to expel: ending their membership lets the new owners take those
    partitions at once (an orphan is claimed by force) instead of after the membership lease. `spared`
    are the consumers present or still handing off after SIGTERM (they release on their own)."""
    keep = set(spared)
    gone = {holders.get(p) for p in published.forced}
    return sorted((c for c in gone if c is not None and c not in keep and c != "?"), key=consumer_sort_key)


def next_cycle_in(state: RebalanceState, now: float, polling_interval: float) -> float:
    """Seconds until the next cycle: the polling interval, sooner while a holddown or handoff runs, and at the
    end of the wait for planned consumers. (A planned consumer getting ready wakes the loop at once.)"""
    wait = polling_interval
    if state.phase is not Phase.READY:
        wait = min(wait, BUSY_CYCLE_SECONDS)
    for deadline in (state.holddown_until, state.planned_until):
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - now))
    return wait
