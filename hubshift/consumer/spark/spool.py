"""The spool: events received from one partition under one ownership epoch, as Arrow segment files in the
consumer's scratch folder, between the receiver (which writes them) and the streaming source (whose
`latestOffset` lists them and whose `read()` slices them).

`<root>/<partition>/<owner level>/<first seq>-<last seq>.arrow`, each an Arrow IPC file in the event row
schema, written to a temporary name and renamed, so a reader never sees half a segment. Sequence numbers
rise within a partition; segments of one epoch never overlap. Pod-local scratch, never a source of truth:
the store's checkpoints are.
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
from hubshift.eventhubs.rows import EVENT_ARROW_SCHEMA

SEQUENCE_COLUMN = "sequence_number"
SUFFIX = ".arrow"


@dataclass(frozen=True)
class Segment:
    path: Path
    first: int
    last: int


def epoch_dir(root: str | os.PathLike[str], partition: str, owner_level: int) -> Path:
    return Path(root) / partition / str(owner_level)


def segments(root: str | os.PathLike[str], partition: str, owner_level: int) -> list[Segment]:
    """The epoch's segments in sequence order (none when the folder does not exist)."""
    folder = epoch_dir(root, partition, owner_level)
    found = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for entry in entries:
        name = entry.name
        if name.startswith(".") or not name.endswith(SUFFIX):
            continue
        first, _, last = name.removesuffix(SUFFIX).partition("-")
        found.append(Segment(Path(entry.path), int(first), int(last)))
    found.sort(key=lambda s: s.first)
    return found


def extent(root: str | os.PathLike[str], partition: str, owner_level: int) -> SpoolExtent | None:
    found = segments(root, partition, owner_level)
    if not found:
        return None
    return SpoolExtent(first=found[0].first, next=found[-1].last + 1)


def write_segment(
    root: str | os.PathLike[str], partition: str, owner_level: int, batch: pa.RecordBatch
) -> Segment:
    """Add one segment (events in rising sequence order, in the event schema)."""
    if batch.num_rows == 0:
        raise ValueError("a segment holds at least one event")
    sequence = batch.column(SEQUENCE_COLUMN)
    first, last = int(sequence[0].as_py()), int(sequence[batch.num_rows - 1].as_py())
    folder = epoch_dir(root, partition, owner_level)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{first:020d}-{last:020d}{SUFFIX}"
    fd, temporary = tempfile.mkstemp(prefix=".segment-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle, pa.ipc.new_file(handle, EVENT_ARROW_SCHEMA) as writer:
            writer.write_batch(batch)
        Path(temporary).replace(target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Segment(target, first, last)


def _load(segment: Segment) -> pa.Table | None:
    try:
        with pa.memory_map(str(segment.path)) as source:
            return pa.ipc.open_file(source).read_all()
    except FileNotFoundError:
        return None


def read_range(
    root: str | os.PathLike[str],
    partition: str,
    owner_level: int,
    start: int,
    end: int,
    *,
    rows_per_batch: int = 10_000,
) -> Iterator[pa.RecordBatch]:
    """Events with `start <= sequence number < end`, in order, as record batches in the event schema
    (segments merged into batches of up to `rows_per_batch` rows: fewer, larger Arrow batches cost Spark
    less per event).

    Segments that are gone (the epoch was stopped under this read) are skipped: a read never fails the
    query for a partition this consumer no longer owns.
    """
    pending: list[pa.Table] = []
    rows = 0
    for segment in segments(root, partition, owner_level):
        if segment.last < start or segment.first >= end:
            continue
        table = _load(segment)
        if table is None:
            continue
        sequence = table.column(SEQUENCE_COLUMN).to_numpy()
        low = int(sequence.searchsorted(start, side="left"))
        high = int(sequence.searchsorted(end, side="left"))
        if high <= low:
            continue
        pending.append(table.slice(low, high - low))
        rows += high - low
        if rows >= rows_per_batch:
            yield from _merged(pending, rows_per_batch)
            pending, rows = [], 0
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
