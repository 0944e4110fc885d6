"""One micro-batch, end to end: what the consumer calls inside Spark's `foreachBatch`.

    summary = process_batch(events, batch_id, consumer_id, pipeline, sink)
    for partition, done in summary.partitions.items():
        checkpoint(partition, done.last_sequence_number, done.last_offset)

A `TaskPipeline` (the aggregate) costs one Spark job that reads each event once: its task reads the
batch's events, parses and counts them and writes its files (Arrow, in the task's Python worker) and
reports the partitions' sequence ranges. When the driver knows the batch's reads (`SpoolRead`: from Spark's
offset log) and the pipeline takes the events as they are, the task reads them from the spool itself:
the same segments the source's `read()` would have given Spark, without their trip through the JVM
(Arrow to rows and back, the largest cost per event; bench/throughput.py measures it).
A `FramePipeline` (a user's function) caches the batch, reads the ranges (one small job), then the sink
writes the function's result (a second job). The commit record goes last, from the driver. When
`process_batch` returns, everything it reports is durable in the sink, so the consumer may checkpoint
exactly `summary.partitions`; if it raises, nothing of the batch counts (files without a commit record are
ignored) and the batch can run again.

With the batch's plan (`SpoolRead`: the ranges Spark's offset log says it read), every path checks that the
batch holds every event of those ranges before anything is committed (`offsets.incomplete`): a batch with
a hole raises `IncompleteBatch` and is read again, so no sink's high-water mark or commit record ever
passes an event it did not write.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from hubshift.consumer.spark import spool
from hubshift.consumer.spark.offsets import Found, ReadRange, incomplete
from hubshift.consumer.spark.poison import Key, evaluate, find_poison_events, keys_where
from hubshift.pipelines.base import (
    DEAD_LETTER_REASON,
    EditingPipeline,
    FramePipeline,
    Pipeline,
    PipelineResult,
    TaskPipeline,
    TaskResult,
)
from hubshift.pipelines.failover import already_handled, handled_condition
from hubshift.sinks.base import (
    Sink,
    TaskWriter,
    Transform,
    WriterBatch,
    commit_record,
    files_from_rows,
    sink_summary,
    written_batch,
)
from hubshift.sinks.commits import BatchSummary, PartitionRange, WrittenFile
from hubshift.sinks.layout import batch_stem

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

Verify = Callable[[Mapping[str, PartitionRange]], None]


class IncompleteBatch(RuntimeError):
    """A micro-batch that does not hold every event its plan read: nothing of it is committed."""


def verifier(batch_id: int, reads: SpoolRead | None) -> Verify:
    """The check of a batch's ranges against its plan (nothing to check without one)."""

    def verify(ranges: Mapping[str, PartitionRange]) -> None:
        if reads is None:
            return
        found = {
            p: Found(r.first_sequence_number, r.last_sequence_number, r.events) for p, r in ranges.items()
        }

        def expired(r: ReadRange) -> int:
            return spool.expired_within(reads.root, r.partition, r.owner_level, r.start, r.end)

        reason = incomplete(reads.ranges, found, expired)
        if reason is not None:
            raise IncompleteBatch(f"batch {batch_id} is not written: {reason}; it is read again")

    return verify


def process_batch(
    events: DataFrame,
    batch_id: int,
    consumer_id: str,
    pipeline: Pipeline,
    sink: Sink,
    *,
    handled: Mapping[str, int] | None = None,
    reads: SpoolRead | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    clock: Callable[[], float] = time.monotonic,
) -> BatchSummary:
    """`handled`: after a failover, per partition the old hub's checkpoint; events replicated from at or
    before it are skipped by the pipeline and still count as processed (`pipelines/failover.py`).
    `reads`: the batch's reads of the spool, when known; a task pipeline then reads them itself."""
    started = clock()
    moment = now()
    handled = dict(handled or {})
    verify = verifier(batch_id, reads)
    stem = batch_stem(consumer_id, sink.run, batch_id)
    start = WriterBatch(batch_id, consumer_id, stem, moment, {}, pipeline.name)
    if isinstance(pipeline, FramePipeline):  # rows: every sink writes them
        ranges, files = _run_frames(pipeline, events, sink, start, handled, verify)
        return _summary(consumer_id, batch_id, ranges, files, stem, clock() - started)
    lines = sink.lines
    if lines is None:
        raise TypeError(f"sink {sink.name} takes a DataFrame pipeline's rows; {pipeline.name} writes lines")
    if isinstance(pipeline, EditingPipeline):
        ranges, files = _run_edited(pipeline, events, lines.task_writer(stem, moment), handled, verify)
    elif isinstance(pipeline, TaskPipeline):
        ranges, files = _run_in_tasks(pipeline, events, lines.task_writer(stem, moment), handled, reads)
        verify(ranges)  # the tasks' files are not committed yet: the commit record below does that
    else:
        raise TypeError(f"{type(pipeline).__name__} has neither process_task nor transform")
    if not ranges:
        return BatchSummary(consumer_id, batch_id, {}, duration_seconds=clock() - started)
    lines.commit(commit_record(replace(start, ranges=ranges), sink.run, files))
    return _summary(consumer_id, batch_id, ranges, files, stem, clock() - started)


def _summary(
    consumer_id: str,
    batch_id: int,
    ranges: dict[str, PartitionRange],
    files: list[WrittenFile],
    stem: str,
    duration: float,
) -> BatchSummary:
    if not ranges:
        return BatchSummary(consumer_id, batch_id, {}, duration_seconds=duration)
    outputs, dead_letters = sink_summary(files)
    return BatchSummary(
        consumer_id=consumer_id,
        batch_id=batch_id,
        partitions=ranges,
        outputs=outputs,
        dead_letters=dead_letters,
        files=tuple(files),
        stem=stem,
        duration_seconds=duration,
    )


# --- TaskPipeline: one job ----------------------------------------------------------------------------

TASK_RESULT_SCHEMA = (
    "kind string, partition string, first_sequence long, last_sequence long, last_offset string, "
    "events long, first_enqueued long, last_enqueued long, "
    "destination string, output string, name string, rows long"
)


@dataclass(frozen=True)
class SpoolRead:
    """What one micro-batch reads: `ranges` of the spool under `root`, as the source's `partitions()`
    plans them from the batch's start and end offsets."""

    root: str
    ranges: tuple[ReadRange, ...]


_RANGES_DDL = "partition string, owner_level int, start long, end long"


def _run_in_tasks(
    pipeline: TaskPipeline,
    events: DataFrame,
    writer: TaskWriter,
    handled: Mapping[str, int],
    reads: SpoolRead | None = None,
) -> tuple[dict[str, PartitionRange], list[WrittenFile]]:
    task = BatchTask(pipeline, writer, handled)
    prepared = pipeline.prepare(events)
    if reads is None or prepared is not events:
        return _task_job(prepared, task)
    if not reads.ranges:
        return {}, []  # a batch that only moves ownership (a handoff's): no job at all
    session = events.sparkSession
    wanted = session.createDataFrame(
        [(r.partition, r.owner_level, r.start, r.end) for r in reads.ranges], _RANGES_DDL
    )
    return _task_job(wanted, SpoolTask(reads.root, task))


def _task_job(
    prepared: DataFrame, task: BatchTask | SpoolTask
) -> tuple[dict[str, PartitionRange], list[WrittenFile]]:
    # One task counts the whole batch: the source still reads each partition on its own (one input
    # partition each), but every further task is one more round trip to a Python worker with its fixed
    # cost (bench/throughput.py measures it). A partition's rows stay in one task either way.
    rows = prepared.coalesce(1).mapInArrow(task, TASK_RESULT_SCHEMA).collect()
    ranges = merge_ranges(
        PartitionRange(
            partition=r["partition"],
            first_sequence_number=r["first_sequence"],
            last_sequence_number=r["last_sequence"],
            last_offset=r["last_offset"],
            events=r["events"],
            first_enqueued_time=_from_micros(r["first_enqueued"]),
            last_enqueued_time=_from_micros(r["last_enqueued"]),
        )
        for r in rows
        if r["kind"] == "range"
    )
    files = sorted(files_from_rows(r for r in rows if r["kind"] == "file"), key=_file_order)
    return ranges, files


class BatchTask:
    """One Spark task of a TaskPipeline's batch: its ranges, its lines, its files (pickled to workers).
    `ranges`: report the ranges of the rows it gets (not when they are an EditingPipeline's edited rows);
    `handled`: partition -> the old hub's checkpoint (failover): those events skip the pipeline."""

    def __init__(
        self,
        pipeline: TaskPipeline,
        writer: TaskWriter,
        handled: Mapping[str, int] | None = None,
        *,
        ranges: bool = True,
    ) -> None:
        self.pipeline = pipeline
        self.writer = writer
        self.handled = dict(handled or {})
        self.ranges = ranges

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        received = list(batches)
        rows = pa.Table.from_batches(received) if received else None
        if rows is None or rows.num_rows == 0:
            return
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        ranges = task_ranges(rows) if self.ranges else []
        if self.handled:
            rows = without_handled(rows, self.handled)
        result = self.pipeline.process_task(rows) if rows.num_rows else TaskResult()
        files = self.writer.write(result.outputs, result.dead_letters, task)
        columns: dict[str, list[Any]] = {name: [] for name in _TASK_COLUMNS}
        for part in ranges:
            _append(columns, kind="range", **_range_columns(part))
        for file in written_batch(files).to_pylist():
            _append(columns, kind="file", **file)
        yield pa.RecordBatch.from_pydict(columns, schema=_task_schema())


class SpoolTask:
    """A `BatchTask` over the batch's reads of the spool (rows of `_RANGES_DDL`): the events come from the
    segments, as the source's `read()` gives them (a segment gone with its epoch is skipped alike)."""

    def __init__(self, root: str, task: BatchTask) -> None:
        self.root = root
        self.task = task

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        wanted = [row for batch in batches for row in batch.to_pylist()]
        events = (
            segment
            for row in wanted
            for segment in spool.read_range(
                self.root, row["partition"], row["owner_level"], row["start"], row["end"]
            )
        )
        yield from self.task(events)


_TASK_COLUMNS = [part.split(" ")[0] for part in TASK_RESULT_SCHEMA.split(", ")]


def _task_schema() -> pa.Schema:
    import pyarrow as pa

    kinds = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(n, kinds[t]) for n, t in (part.split(" ") for part in TASK_RESULT_SCHEMA.split(", "))])


def _append(columns: dict[str, list[Any]], **values: Any) -> None:
    for name, column in columns.items():
        column.append(values.get(name))


def _range_columns(part: PartitionRange) -> dict[str, Any]:
    return {
        "partition": part.partition,
        "first_sequence": part.first_sequence_number,
        "last_sequence": part.last_sequence_number,
        "last_offset": part.last_offset,
        "events": part.events,
        "first_enqueued": _to_micros(part.first_enqueued_time),
        "last_enqueued": _to_micros(part.last_enqueued_time),
    }


def without_handled(rows: pa.Table, handled: Mapping[str, int]) -> pa.Table:
    """The rows the old hub's consumers did not handle (`pipelines/failover.py`)."""
    import pyarrow as pa

    keep = [not already_handled(row, handled) for row in rows.select(["partition", "properties"]).to_pylist()]
    return rows if all(keep) else rows.filter(pa.array(keep, pa.bool_()))


def task_ranges(rows: pa.Table) -> list[PartitionRange]:
    """Each partition's range among a task's rows (normally one partition per task)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found = []
    partitions = pc.unique(rows.column("partition")).to_pylist()
    for partition in partitions:
        part = rows if len(partitions) == 1 else rows.filter(pc.equal(rows.column("partition"), partition))
        sequence = part.column("sequence_number")
        bounds = pc.min_max(sequence)
        last = bounds["max"].as_py()
        enqueued = pc.min_max(pc.cast(part.column("enqueued_time"), pa.int64()))
        found.append(
            PartitionRange(
                partition=str(partition),
                first_sequence_number=int(bounds["min"].as_py()),
                last_sequence_number=int(last),
                last_offset=str(part.column("offset")[pc.index(sequence, last).as_py()].as_py()),
                events=part.num_rows,
                first_enqueued_time=_from_micros(enqueued["min"].as_py()),
                last_enqueued_time=_from_micros(enqueued["max"].as_py()),
            )
        )
    return found


def merge_ranges(parts: Iterable[PartitionRange]) -> dict[str, PartitionRange]:
    """One range per partition, should a partition's events have been split over several tasks."""
    merged: dict[str, PartitionRange] = {}
    for part in parts:
        known = merged.get(part.partition)
        if known is None:
            merged[part.partition] = part
            continue
        later = part if part.last_sequence_number > known.last_sequence_number else known
        merged[part.partition] = PartitionRange(
            partition=part.partition,
            first_sequence_number=min(known.first_sequence_number, part.first_sequence_number),
            last_sequence_number=later.last_sequence_number,
            last_offset=later.last_offset,
            events=known.events + part.events,
            first_enqueued_time=_earliest(known.first_enqueued_time, part.first_enqueued_time),
            last_enqueued_time=_latest(known.last_enqueued_time, part.last_enqueued_time),
        )
    return merged


# --- FramePipeline: cache, ranges, write ----------------------------------------------------------------


def _without_poison(pipeline: FramePipeline, frame: DataFrame, poison: dict[Key, str]) -> PipelineResult:
    """The pipeline's result over the frame without its poison events, which join the dead letters with
    their own error as the reason."""
    where = keys_where(sorted(poison))
    result = pipeline.transform(frame.where(~where))
    dead = poison_letters(frame, where, poison)
    letters = (
        dead
        if result.dead_letters is None
        else result.dead_letters.unionByName(dead, allowMissingColumns=True)
    )
    return PipelineResult(outputs=result.outputs, dead_letters=letters)


def _run_frames(
    pipeline: FramePipeline,
    events: DataFrame,
    sink: Sink,
    start: WriterBatch,
    handled: Mapping[str, int],
    verify: Verify,
) -> tuple[dict[str, PartitionRange], list[WrittenFile]]:
    """A DataFrame pipeline's batch: cached, its ranges read (and checked against its plan), then the sink
    writes the transform's rows and commits; an event the transform fails on every time is a dead letter."""

    def poison_free(poison: dict[Key, str]) -> Transform:
        return lambda frame: _without_poison(pipeline, frame, poison)

    with _cached(pipeline.prepare(events)) as prepared:
        ranges = partition_ranges(prepared)
        verify(ranges)
        if not ranges:
            return {}, []
        batch = replace(start, ranges=ranges)
        live = _not_handled(prepared, handled)
        pipeline.transform(live)  # a function broken for every batch fails here, as itself
        files = _isolating_poison(
            pipeline.name,
            lambda: sink.write_batch(live, pipeline.transform, batch),
            lambda frame: evaluate(pipeline.transform(frame)),
            live,
            lambda poison: sink.write_batch(live, poison_free(poison), batch),
        )
        return ranges, files


# --- EditingPipeline: cache, ranges, edit, tasks --------------------------------------------------------


def _run_edited(
    pipeline: EditingPipeline,
    events: DataFrame,
    writer: TaskWriter,
    handled: Mapping[str, int],
    verify: Verify,
) -> tuple[dict[str, PartitionRange], list[WrittenFile]]:
    def poison_free(live: DataFrame, poison: dict[Key, str]) -> list[WrittenFile]:
        where = keys_where(sorted(poison))
        edited = pipeline.edit(live.where(~where))
        dead = poison_letters(live, where, poison)
        return _task_job(edited.unionByName(dead, allowMissingColumns=True), task)[1]

    task = BatchTask(pipeline, writer, ranges=False)
    with _cached(events) as prepared:
        ranges = partition_ranges(prepared)
        verify(ranges)
        if not ranges:
            return {}, []
        live = _not_handled(prepared, handled)
        files = _isolating_poison(
            pipeline.name,
            lambda: _task_job(pipeline.edit(live), task)[1],
            lambda frame: evaluate_frame(pipeline.edit(frame, trial=True)),
            live,
            lambda poison: poison_free(live, poison),
        )
        return ranges, files


def evaluate_frame(frame: DataFrame) -> None:
    evaluate(PipelineResult(outputs={}, dead_letters=frame))


# --- shared by both: the batch read once, failover, poison events ------------------------------------------


class _cached:
    """The batch kept in memory (spilling to disk) while both its ranges and the pipeline read it."""

    def __init__(self, frame: DataFrame) -> None:
        from pyspark import StorageLevel

        self.frame = frame.persist(StorageLevel.MEMORY_AND_DISK)

    def __enter__(self) -> DataFrame:
        return self.frame

    def __exit__(self, *_: object) -> None:
        self.frame.unpersist(blocking=False)


def _not_handled(prepared: DataFrame, handled: Mapping[str, int]) -> DataFrame:
    if not handled:
        return prepared

    return prepared.where(~handled_condition(handled))


def _isolating_poison(
    name: str,
    write: Callable[[], list[WrittenFile]],
    trial: Callable[[DataFrame], None],
    live: DataFrame,
    write_without: Callable[[dict[Key, str]], list[WrittenFile]],
) -> list[WrittenFile]:
    """`write()`; when it fails because of events (the pipeline alone fails on them: `trial`), those become
    dead letters and the rest is written (`write_without`); any other failure is raised."""
    try:
        return write()
    except Exception as failure:
        try:
            poison = find_poison_events(name, trial, live)
        except ValueError:
            raise failure from None
        if not poison:
            raise  # the pipeline alone succeeds: the sink (or a target) failed, not an event
        return write_without(poison)


def poison_letters(prepared: DataFrame, where: Column, poison: dict[Key, str]) -> DataFrame:
    """The poison events' rows with their own errors as reasons."""
    from pyspark.sql import functions as F

    reasons = prepared.sparkSession.createDataFrame(
        [(p, s, reason) for (p, s), reason in poison.items()],
        f"partition string, sequence_number bigint, {DEAD_LETTER_REASON} string",
    )
    poisoned = prepared.where(where).join(reasons, ["partition", "sequence_number"])
    return poisoned.select(
        *(
            F.col(c)
            for c in (
                "partition",
                "sequence_number",
                "offset",
                "enqueued_time",
                "partition_key",
                "body",
                "properties",
            )
            if c in prepared.columns
        ),
        F.concat(F.lit("the pipeline fails on this event: "), F.col(DEAD_LETTER_REASON)).alias(
            DEAD_LETTER_REASON
        ),
    )


def partition_ranges(prepared: DataFrame) -> dict[str, PartitionRange]:
    """Each partition's range in the batch (one small Spark job)."""
    from pyspark.sql import functions as F

    rows = (
        prepared.groupBy("partition")
        .agg(
            F.min("sequence_number").alias("first"),
            F.max("sequence_number").alias("last"),
            F.max_by("offset", "sequence_number").alias("last_offset"),
            F.count(F.lit(1)).alias("events"),
            F.unix_micros(F.min("enqueued_time")).alias("first_enqueued"),
            F.unix_micros(F.max("enqueued_time")).alias("last_enqueued"),
        )
        .collect()
    )
    return {
        str(row["partition"]): PartitionRange(
            partition=str(row["partition"]),
            first_sequence_number=int(row["first"]),
            last_sequence_number=int(row["last"]),
            last_offset=str(row["last_offset"]),
            events=int(row["events"]),
            first_enqueued_time=_from_micros(row["first_enqueued"]),
            last_enqueued_time=_from_micros(row["last_enqueued"]),
        )
        for row in rows
    }


# --- helpers ------------------------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _from_micros(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=int(micros))


def _to_micros(moment: datetime | None) -> int | None:
    return None if moment is None else (moment - _EPOCH) // timedelta(microseconds=1)


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else max(a, b)


def _file_order(file: WrittenFile) -> tuple[str, str, str]:
    return (file.destination, file.output, file.name)
