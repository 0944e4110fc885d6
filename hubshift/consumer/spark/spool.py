"""The spool: events received from one partition under one ownership epoch, as Arrow segment files in the
consumer's scratch folder, between the receiver (which writes them) and the streaming source (whose
`latestOffset` lists them and whose `read()` slices them).

`<root>/<partition>/<owner level>/<first seq>-<last seq>.arrow`, each an Arrow IPC file in the received
schema (the event columns and the system properties), written to a temporary name and renamed, so a reader
never sees half a segment; and
`<first seq>-<last seq>.expired`, an empty file that stands for events the hub no longer had when they were
asked for (its retention passed them). Pod-local scratch, never a source of truth: the store's checkpoints
are.

Event Hubs sequence numbers are contiguous within a partition, and an epoch's segments and expired
stretches follow each other without a hole (`write_segment` refuses anything else). So a read of
`[start, end)` is complete exactly when it holds `end - start` events less those expired: `read_range`
returns that or raises `SpoolGap`, never a range with events missing (a batch committed over a range
with a hole would move the sink's high-water mark past events it never wrote).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from hubshift.consumer.spark.offsets import SpoolExtent
from hubshift.eventhubs.rows import as_received

SEQUENCE_COLUMN = "sequence_number"
SUFFIX = ".arrow"
EXPIRED = ".expired"


class SpoolGap(RuntimeError):
    """A read or a write that would leave a hole in a partition epoch's events."""


@dataclass(frozen=True)
class Segment:
    """`[first, last]` of one epoch: events in an Arrow file, or (`expired`) events the hub no longer had."""

    path: Path
    first: int
    last: int
    expired: bool = False


def epoch_dir(root: str | os.PathLike[str], partition: str, owner_level: int) -> Path:
    return Path(root) / partition / str(owner_level)


def segments(root: str | os.PathLike[str], partition: str, owner_level: int) -> list[Segment]:
    """The epoch's segments and expired stretches in sequence order (none when the folder does not
    exist)."""
    folder = epoch_dir(root, partition, owner_level)
    found = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue
        for suffix in (SUFFIX, EXPIRED):
            if name.endswith(suffix):
                first, _, last = name.removesuffix(suffix).partition("-")
                found.append(Segment(Path(entry.path), int(first), int(last), suffix == EXPIRED))
    found.sort(key=lambda s: (s.first, s.last))
    return found


def contiguous(found: list[Segment]) -> list[Segment]:
    """The run of segments from the first on that follow each other without a hole."""
    run: list[Segment] = []
    for segment in found:
        if run and segment.first != run[-1].last + 1:
            break
        run.append(segment)
    return run


def extent(root: str | os.PathLike[str], partition: str, owner_level: int) -> SpoolExtent | None:
    """What the epoch holds without a hole, from its first segment on (None: nothing yet)."""
    run = contiguous(segments(root, partition, owner_level))
    if not run:
        return None
    return SpoolExtent(first=run[0].first, next=run[-1].last + 1)


def _write_atomically(folder: Path, target: Path, batch: pa.RecordBatch | None) -> None:
    """`batch` as an Arrow file at `target` (an empty file for None), which appears whole or not at all."""
    fd, temporary = tempfile.mkstemp(prefix=".segment-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            if batch is not None:
                with pa.ipc.new_file(handle, batch.schema) as writer:
                    writer.write_batch(batch)
        Path(temporary).replace(target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _check_follows(partition: str, owner_level: int, first: int, after: int | None) -> None:
    if after is not None and first != after:
        raise SpoolGap(
            f"partition {partition} (owner level {owner_level}): a segment from sequence number {first} "
            f"does not follow the spool, which ends before {after}"
        )


def write_segment(
    root: str | os.PathLike[str],
    partition: str,
    owner_level: int,
    batch: pa.RecordBatch,
    *,
    after: int | None = None,
) -> Segment:
    """Add one segment: events in rising, contiguous sequence order, in the received schema. `after`: the
    sequence number the spool ends before (the next one expected); a batch that starts elsewhere or has a
    hole is refused with `SpoolGap`, nothing written."""
    if batch.num_rows == 0:
        raise ValueError("a segment holds at least one event")
    sequence = batch.column(SEQUENCE_COLUMN)
    first, last = int(sequence[0].as_py()), int(sequence[batch.num_rows - 1].as_py())
    _check_follows(partition, owner_level, first, after)
    if last - first + 1 != batch.num_rows:
        raise SpoolGap(
            f"partition {partition} (owner level {owner_level}): a batch of {batch.num_rows} events from "
            f"{first} to {last} is not contiguous"
        )
    folder = epoch_dir(root, partition, owner_level)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{first:020d}-{last:020d}{SUFFIX}"
    _write_atomically(folder, target, batch)
    return Segment(target, first, last)


def write_expired(
    root: str | os.PathLike[str], partition: str, owner_level: int, first: int, last: int
) -> Segment:
    """Record that `[first, last]` expired from the hub before they were read: the spool goes on past them,
    and a read counts them as complete without rows."""
    if last < first:
        raise ValueError("an expired stretch holds at least one sequence number")
    folder = epoch_dir(root, partition, owner_level)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{first:020d}-{last:020d}{EXPIRED}"
    _write_atomically(folder, target, None)
    return Segment(target, first, last, expired=True)


def _load(segment: Segment) -> pa.Table | None:
    try:
        with pa.memory_map(str(segment.path)) as source:
            return as_received(pa.ipc.open_file(source).read_all())
    except FileNotFoundError:
        return None


def expired_within(
    root: str | os.PathLike[str], partition: str, owner_level: int, start: int, end: int
) -> int:
    """How many of `[start, end)` the epoch records as expired from the hub."""
    return sum(
        max(0, min(s.last + 1, end) - max(s.first, start))
        for s in segments(root, partition, owner_level)
        if s.expired
    )


def read_range(
    root: str | os.PathLike[str],
    partition: str,
    owner_level: int,
    start: int,
    end: int,
    *,
    rows_per_batch: int = 10_000,
) -> Iterator[pa.RecordBatch]:
    """Events with `start <= sequence number < end`, in order, as record batches in the received schema
    (segments merged into batches of up to `rows_per_batch` rows: fewer, larger Arrow batches cost Spark
    less per event).

    Every sequence number of the range is accounted for, by an event or an expired stretch, or `SpoolGap`
    is raised before the last batch: a segment gone (its epoch was stopped under this read, or its file was
    lost) fails the read, and with it the micro-batch, which is then planned and read again; a range is
    never handed on with events missing.
    """
    pending: list[pa.Table] = []
    rows = 0
    covered = start  # every sequence number before this is accounted for
    for segment in segments(root, partition, owner_level):
        if segment.last < covered or segment.first >= end:
            continue
        if segment.first > covered:
            break  # a hole: reported below
        if segment.expired:
            covered = min(segment.last + 1, end)
            continue
        table = _load(segment)
        if table is None:
            break  # gone under this read
        sequence = table.column(SEQUENCE_COLUMN).to_numpy()
        low = int(sequence.searchsorted(covered, side="left"))
        high = int(sequence.searchsorted(end, side="left"))
        if high > low:
            pending.append(table.slice(low, high - low))
            rows += high - low
        covered = min(segment.last + 1, end)
        if rows >= rows_per_batch:
            yield from _merged(pending, rows_per_batch)
            pending, rows = [], 0
    if covered < end:
        raise SpoolGap(
            f"partition {partition} (owner level {owner_level}): sequence numbers {covered} to {end - 1} of "
            f"the range {start}-{end - 1} are not in the spool; the batch is read again"
        )
    if pending:
        yield from _merged(pending, rows_per_batch)


def _merged(tables: list[pa.Table], rows_per_batch: int) -> Iterator[pa.RecordBatch]:
    merged = pa.concat_tables(tables).combine_chunks()
    yield from merged.to_batches(max_chunksize=rows_per_batch)


def trim(root: str | os.PathLike[str], partition: str, owner_level: int, committed_next: int) -> int:
    """Delete segments wholly before the committed position, keeping the one holding its last event (the
    checkpoint's offset is read from it). Returns how many were deleted."""
    deleted = 0
    for segment in segments(root, partition, owner_level):
        if segment.last < committed_next - 1:
            segment.path.unlink(missing_ok=True)
            deleted += 1
    return deleted


def remove_epoch(root: str | os.PathLike[str], partition: str, owner_level: int) -> None:
    shutil.rmtree(epoch_dir(root, partition, owner_level), ignore_errors=True)


def event_at(
    root: str | os.PathLike[str], partition: str, owner_level: int, sequence_number: int
) -> str | None:
    """The offset of one spooled event (None when the spool no longer holds it, or it expired)."""
    for segment in segments(root, partition, owner_level):
        if segment.expired or not segment.first <= sequence_number <= segment.last:
            continue
        table = _load(segment)
        if table is None:
            return None
        index = sequence_number - segment.first
        return str(table.column("offset")[index].as_py())
    return None
