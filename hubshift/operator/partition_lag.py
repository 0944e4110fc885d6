"""Lag in seconds (docs/observability.md): how old each partition's oldest unprocessed event is, from what
is known without reading events (the times the owners write beside their checkpoints, the probe's last
enqueued time, the probes that saw the event enqueued), and the few events the control loop reads itself
where nobody reads the partition. Pure functions of plain data and a `now` passed in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hubshift.eventhubs.model import PartitionInfo
from hubshift.ownership.model import OwnershipSnapshot

# At most this many events read by the control loop per cycle, each (partition, sequence number) tried
# again at most this often.
LAG_READS_PER_CYCLE = 4
LAG_READ_RETRY_SECONDS = 60.0
# As a lower bound: per partition, at most this many probes remembered (position, when).
LAG_PROBES_KEPT = 32
# The sources whose time is not the event's own: the loop still reads such an event when it may.
UNSURE_SOURCES = frozenset({"unknown", "probe"})


@dataclass(frozen=True)
class PartitionLag:
    """How old one partition's oldest unprocessed event is. `seconds` is None while the enqueued time of
    that event (`first_unprocessed`) is not known; `source` says where it came from."""

    partition: str
    seconds: float | None
    # "caught-up", "checkpoint" (the owner wrote it), "last-enqueued", "read", "probe" (a lower bound: the
    # first probe that saw the event enqueued), "unknown"
    source: str
    first_unprocessed: int | None = None


Probes = Mapping[str, Sequence[tuple[int, float]]]


def remember_probes(
    probes: Probes,
    partitions: Mapping[str, PartitionInfo],
    backlog: Mapping[str, int],
    now: float,
    keep: int = LAG_PROBES_KEPT,
) -> dict[str, tuple[tuple[int, float], ...]]:
    """Per partition, the probes that can still bound its lag, oldest first, as (last enqueued sequence
    number, when the probe answered): those that saw the oldest unprocessed event enqueued already. A
    caught-up partition keeps none (its next event is not enqueued yet); a new position is added; over
    `keep`, the second oldest goes (the oldest bounds the longest stall; a dropped probe only weakens a
    bound, it never makes one wrong)."""
    kept: dict[str, tuple[tuple[int, float], ...]] = {}
    for partition, info in partitions.items():
        first = first_unprocessed(info, backlog.get(partition, 0))
        if first is None:
            continue
        seen = [probe for probe in probes.get(partition, ()) if probe[0] >= first]
        if not seen or info.last_enqueued > seen[-1][0]:
            seen.append((info.last_enqueued, now))
        while len(seen) > keep:
            del seen[1]
        kept[partition] = tuple(seen)
    return kept


def _first_probe_at(probes: Probes | None, partition: str, first: int) -> float | None:
    """When the earliest remembered probe that had `first` enqueued answered; None when none had. Probes
    from before it are skipped here (they are pruned only at the next probe)."""
    return next((when for position, when in (probes or {}).get(partition, ()) if position >= first), None)


def first_unprocessed(info: PartitionInfo, backlog: int) -> int | None:
    """The sequence number of the oldest event not yet processed; None when there is none."""
    if backlog <= 0 or info.last_enqueued < 0:
        return None
    return info.last_enqueued - backlog + 1


def lag_per_partition(
    partitions: Mapping[str, PartitionInfo],
    snapshot: OwnershipSnapshot,
    backlog: Mapping[str, int],
    read: Mapping[str, tuple[int, float]],
    now: float,
    probes: Probes | None = None,
) -> dict[str, PartitionLag]:
    """Now minus the enqueued time of each partition's oldest unprocessed event, 0 when caught up, from
    what is known without reading events: the time the owner wrote beside its checkpoint (the event after
    it), the probe's last enqueued time (when only that one event is unprocessed), or an event the control
    loop read itself (`read`: partition -> (sequence number, enqueued time)); failing those, a lower bound
    from the earliest remembered probe that saw the event enqueued (`probes`, `remember_probes`): a
    consumer stalled with its leases held still shows its lag growing."""
    rows = {row.partition: row for row in snapshot.partitions}
    lags: dict[str, PartitionLag] = {}
    for partition, info in partitions.items():
        first = first_unprocessed(info, backlog.get(partition, 0))
        if first is None:
            lags[partition] = PartitionLag(partition, 0.0, "caught-up")
            continue
        row = rows.get(partition)
        enqueued: float | None = None
        source = "unknown"
        if (
            row is not None
            and row.next_enqueued is not None
            and not row.checkpoint.consumed_nothing
            and row.checkpoint.sequence_number + 1 == first
        ):
            enqueued, source = row.next_enqueued.timestamp(), "checkpoint"
        elif first == info.last_enqueued and info.last_enqueued_time is not None:
            enqueued, source = info.last_enqueued_time, "last-enqueued"
        elif partition in read and read[partition][0] == first:
            enqueued, source = read[partition][1], "read"
        elif (seen := _first_probe_at(probes, partition, first)) is not None:
            enqueued, source = seen, "probe"
        seconds = None if enqueued is None else max(0.0, now - enqueued)
        lags[partition] = PartitionLag(partition, seconds, source, first)
    return lags


def lag_reads(
    lags: Mapping[str, PartitionLag],
    backlog: Mapping[str, int],
    owners: Mapping[str, str | None],
    alive: Iterable[str],
    tried: Mapping[str, tuple[int, float]],
    now: float,
    *,
    limit: int = LAG_READS_PER_CYCLE,
    retry_seconds: float = LAG_READ_RETRY_SECONDS,
) -> list[tuple[str, int]]:
    """The events the control loop reads itself this cycle, as (partition, sequence number): only where
    nobody reads the partition (no live owner: a live owner would write the time soon, and Event Hubs refuses
    a second receiver beside the owner's epoch receiver), the time is unknown or only bounded, and this
    event was not tried within `retry_seconds` (`tried`: partition -> (sequence number, when)); the largest
    backlog first, at most `limit`."""
    live = set(alive)
    wanted = []
    for partition, lag in lags.items():
        if lag.source not in UNSURE_SOURCES or lag.first_unprocessed is None:
            continue
        owner = owners.get(partition)
        if owner is not None and owner in live:
            continue
        last = tried.get(partition)
        if last is not None and last[0] == lag.first_unprocessed and now - last[1] < retry_seconds:
            continue
        wanted.append((partition, lag.first_unprocessed))
    wanted.sort(key=lambda item: (-backlog.get(item[0], 0), item[0]))
    return wanted[:limit]


def worst_lag(lags: Mapping[str, PartitionLag]) -> PartitionLag | None:
    """The partition whose oldest unprocessed event is oldest (among the known); None when none is known."""
    known = [lag for lag in lags.values() if lag.seconds is not None]
    if not known:
        return None
    return max(known, key=lambda lag: (lag.seconds or 0.0, lag.partition))
