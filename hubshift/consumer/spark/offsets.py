"""The streaming source's offsets and how one micro-batch is planned: pure functions of plain data.

Spark compares offsets as JSON strings (the runner does `json.dumps` without sorting), so every offset is
built canonically: string keys in sorted order at every level, equal content gives an equal string, and
"no new data" returns exactly the start offset (otherwise Spark runs an empty batch every trigger).

An offset is `{"g": ownership version, "p": {partition: {"e": level, "f": first, "s": next}}, "v": 1}`:
- `e`, the ownership epoch (the Event Hubs owner level of this ownership): a partition lost and regained
  comes back with a higher level, and its reading resumes at the position the agent hands over (its store
  checkpoint), never at a stale Spark offset;
- `f`, where this epoch's reading began, so the batch that brings a partition (or a new epoch of it) into
  the offsets already reads it: `[f, s)` when the start offset has no such epoch, `[start's s, s)` after;
- `g`, the version of the ownership file the batch was planned with: a change of ownership changes the
  offset, so Spark runs one batch for it, and that batch is the proof that no later batch reads a partition
  being handed off.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

OFFSET_VERSION = 1


class OffsetError(ValueError):
    """An offset that this version cannot read."""


@dataclass(frozen=True)
class PartitionPosition:
    """Where reading stands in one partition under one ownership epoch (`first`: where the epoch began)."""

    owner_level: int
    first_sequence: int
    next_sequence: int


@dataclass(frozen=True)
class SourceOffset:
    ownership_version: int
    partitions: Mapping[str, PartitionPosition] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON-ready dict: keys sorted at every level."""
        return {
            "g": self.ownership_version,
            "p": {
                p: {
                    "e": self.partitions[p].owner_level,
                    "f": self.partitions[p].first_sequence,
                    "s": self.partitions[p].next_sequence,
                }
                for p in sorted(self.partitions)
            },
            "v": OFFSET_VERSION,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> SourceOffset:
        try:
            version = document.get("v")
            if version != OFFSET_VERSION:
                raise OffsetError(f"offset version {version!r} is not {OFFSET_VERSION}")
            partitions = {
                str(p): PartitionPosition(int(pos["e"]), int(pos["f"]), int(pos["s"]))
                for p, pos in document["p"].items()
            }
            return cls(ownership_version=int(document["g"]), partitions=partitions)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, OffsetError):
                raise
            raise OffsetError(f"not a hubshift source offset: {document!r}") from None


# --- what the agent tells the source (the ownership file's content, as plain data) --------------------


@dataclass(frozen=True)
class SourcePartition:
    """One partition the consumer owns, as the streaming source sees it.

    `next_sequence` is where reading starts when this epoch first enters the offsets (the checkpoint's
    sequence number + 1); None means "wherever the spool starts" (earliest, latest or an enqueued time,
    resolved by the receiver). `draining` partitions are no longer planned.
    """

    owner_level: int
    next_sequence: int | None = None
    draining: bool = False


@dataclass(frozen=True)
class SpoolExtent:
    """What the receiver has spooled for one partition epoch: `[first, next)` sequence numbers."""

    first: int
    next: int


@dataclass(frozen=True)
class ReadRange:
    """One input partition: read `[start, end)` of `partition` under `owner_level`."""

    partition: str
    owner_level: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def split_budget(available: Mapping[str, int], max_rows: int | None) -> dict[str, int]:
    """Share `max_rows` between partitions: every partition gets an equal share, and what a partition
    does not need goes to the others (water filling). Deterministic; None means no limit."""
    wanted = {p: max(0, n) for p, n in available.items()}
    if max_rows is None or sum(wanted.values()) <= max_rows:
        return wanted
    granted = dict.fromkeys(wanted, 0)
    remaining = max(0, max_rows)
    open_partitions = sorted((p for p in wanted if wanted[p] > 0), key=lambda p: (wanted[p], p))
    while open_partitions and remaining > 0:
        share, extra = divmod(remaining, len(open_partitions))
        smallest = open_partitions[0]
        need = wanted[smallest] - granted[smallest]
        if need <= share:
            # The smallest needs less than an equal share: fill it, give the rest to the others.
            granted[smallest] += need
            remaining -= need
            open_partitions.pop(0)
            continue
        # Everybody left needs at least a share: split evenly, the remainder to the first in id order.
        for index, p in enumerate(sorted(open_partitions)):
            granted[p] += share + (1 if index < extra else 0)
        remaining = 0
    return granted


def plan_latest(
    start: SourceOffset | None,
    ownership_version: int,
    owned: Mapping[str, SourcePartition],
    spooled: Mapping[str, SpoolExtent],
    max_rows: int | None,
) -> SourceOffset:
    """The end offset of the next micro-batch (the body of `latestOffset`).

    `spooled` is keyed by partition and describes the epoch the ownership file names. Partitions that are
    draining or no longer owned leave the offset; a new epoch enters, once its receiver spooled events, at
    its start position (the handed-over one, else where its spool begins); every partition advances by its
    share of `max_rows`.
    """
    previous = start.partitions if start is not None else {}
    positions: dict[str, PartitionPosition] = {}
    available: dict[str, int] = {}
    for partition, entry in owned.items():
        if entry.draining:
            continue
        extent = spooled.get(partition)
        before = previous.get(partition)
        if before is not None and before.owner_level == entry.owner_level:
            position = before
        elif extent is None:
            continue  # a new epoch enters with its first events: no empty batch for a claim alone
        elif entry.next_sequence is not None:
            position = PartitionPosition(entry.owner_level, entry.next_sequence, entry.next_sequence)
        else:
            position = PartitionPosition(entry.owner_level, extent.first, extent.first)
        positions[partition] = position
        if extent is not None:
            available[partition] = extent.next - position.next_sequence
    for partition, count in split_budget(available, max_rows).items():
        if count > 0:
            p = positions[partition]
            positions[partition] = PartitionPosition(p.owner_level, p.first_sequence, p.next_sequence + count)
    return SourceOffset(ownership_version=ownership_version, partitions=positions)


def plan_ranges(start: SourceOffset | None, end: SourceOffset) -> list[ReadRange]:
    """The reads of one micro-batch (the body of `partitions`): from where the start offset left each
    partition's epoch, or from where the epoch began when it is new in this batch."""
    previous = start.partitions if start is not None else {}
    ranges = []
    for partition in sorted(end.partitions):
        after = end.partitions[partition]
        before = previous.get(partition)
        if before is not None and before.owner_level == after.owner_level:
            begin = before.next_sequence
        else:
            begin = after.first_sequence
        if after.next_sequence > begin:
            ranges.append(ReadRange(partition, after.owner_level, begin, after.next_sequence))
    return ranges


def offset_log_end(text: str | None) -> SourceOffset | None:
    """The source's end offset a batch's entry of Spark's offset log holds (`v1`, the batch's metadata, then
    one line per source: ours is the only one); None for no entry or another shape."""
    lines = [] if text is None else text.splitlines()
    if len(lines) < 3 or not lines[0].startswith("v"):
        return None
    return SourceOffset.from_json(json.loads(lines[2]))


def total(ranges: Iterable[ReadRange]) -> int:
    return sum(r.count for r in ranges)


@dataclass(frozen=True)
class Found:
    """What a batch holds of one partition: its first and last sequence numbers and how many events."""

    first: int
    last: int
    events: int


def incomplete(
    planned: Iterable[ReadRange], found: Mapping[str, Found], expired: Callable[[ReadRange], int]
) -> str | None:
    """Why a batch does not hold exactly the events its plan read, or None when it does.

    Sequence numbers are contiguous within a partition, so a range `[start, end)` holds `end - start`
    events, less those that expired from the hub before they were read (`expired(range)`, asked only when
    the count falls short). A batch with events of a partition its plan did not read is refused too."""
    ranges = {r.partition: r for r in planned}
    for partition in sorted(found):
        if partition not in ranges:
            return f"partition {partition}: {found[partition].events} events its plan did not read"
    for partition in sorted(ranges):
        r = ranges[partition]
        got = found.get(partition)
        events = 0 if got is None else got.events
        inside = got is None or (got.first >= r.start and got.last < r.end)
        if inside and events == r.count:
            continue
        wanted = r.count - (expired(r) if inside and events < r.count else 0)
        if inside and events == wanted:
            continue
        held = "none" if got is None else f"{events}, from {got.first} to {got.last}"
        return (
            f"partition {partition}: the plan read {wanted} events, sequence numbers {r.start} to "
            f"{r.end - 1}; the batch holds {held}"
        )
    return None


# --- a streaming job's query: one partition, its position carried by the query's own checkpoint ----------


def plan_partition(
    start: SourceOffset | None,
    partition: str,
    entry: SourcePartition | None,
    spooled: SpoolExtent | None,
    max_rows: int | None,
) -> SourceOffset:
    """The end offset of the next micro-batch of a query that reads one partition (a streaming job's).

    Its checkpoint, not the ownership epoch, says where reading stands: a new owner's query goes on from the
    start offset whatever owner level planned it (the level is that of the epoch now, which `read()` reads).
    A partition not owned here, or draining, plans nothing new: the start offset comes back unchanged."""
    before = None if start is None else start.partitions.get(partition)
    if entry is None or entry.draining:
        return start if start is not None else SourceOffset(0)
    if before is None:
        if spooled is None:
            return start if start is not None else SourceOffset(entry.owner_level)
        begin = entry.next_sequence if entry.next_sequence is not None else spooled.first
        before = PartitionPosition(entry.owner_level, begin, begin)
    available = 0 if spooled is None else spooled.next - before.next_sequence
    count = max(0, available if max_rows is None else min(available, max_rows))
    position = PartitionPosition(entry.owner_level, before.first_sequence, before.next_sequence + count)
    return SourceOffset(entry.owner_level, {partition: position})


def partition_range(
    start: SourceOffset | None, end: SourceOffset, partition: str, owner_level: int
) -> ReadRange | None:
    """The read of one micro-batch of a one-partition query, in the epoch `owner_level` receives now: a
    batch planned by a previous owner and run again here reads the same sequence numbers from this
    consumer's spool."""
    after = end.partitions.get(partition)
    if after is None:
        return None
    before = None if start is None else start.partitions.get(partition)
    begin = after.first_sequence if before is None else before.next_sequence
    return (
        ReadRange(partition, owner_level, begin, after.next_sequence) if after.next_sequence > begin else None
    )
