"""One micro-batch, end to end: what the consumer calls inside Spark's `foreachBatch`.

    summary = process_batch(events, batch_id, consumer_id, pipeline, sink, metrics=metrics)
    for partition, done in summary.partitions.items():
        checkpoint(partition, done.last_sequence_number, done.last_offset)

The pipeline's prepared frame (events parsed once) is cached for the batch and read by two Spark jobs:
one small aggregation for each partition's sequence range, then one job that writes every output and the
dead letters. The commit record goes last. When `process_batch` returns, everything it reports is durable
in the sink, so the consumer may checkpoint exactly `summary.partitions`; if it raises, nothing of the batch
counts (files without a commit record are ignored) and the batch can run again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from hubshift.spark_app.pipelines.base import DEAD_LETTER_REASON, Pipeline
from hubshift.spark_app.sinks.base import Sink, sink_summary
from hubshift.spark_app.sinks.commits import BatchRecord, PartitionRange, WrittenFile
from hubshift.spark_app.sinks.layout import batch_stem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from hubshift.spark_app.metrics import ConsumerMetrics


@dataclass(frozen=True)
class BatchSummary:
    consumer_id: str
    batch_id: int
    # Per Event Hubs partition: first/last sequence number, the last event's offset, event count.
    partitions: Mapping[str, PartitionRange]
    outputs: Mapping[str, int] = field(default_factory=dict)  # rows written per output
    dead_letters: int = 0
    files: tuple[WrittenFile, ...] = ()
    stem: str | None = None  # None: an empty batch, nothing written or committed
    duration_seconds: float = 0.0

    @property
    def events(self) -> int:
        return sum(p.events for p in self.partitions.values())


def process_batch(
    events: DataFrame,
    batch_id: int,
    consumer_id: str,
    pipeline: Pipeline,
    sink: Sink,
    *,
    metrics: ConsumerMetrics | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    clock: Callable[[], float] = time.monotonic,
) -> BatchSummary:
    from pyspark import StorageLevel

    started = clock()
    prepared = pipeline.prepare(events).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        ranges, rejected = partition_ranges(prepared)
        if not ranges:
            return BatchSummary(consumer_id, batch_id, {}, duration_seconds=clock() - started)
        stem = batch_stem(consumer_id, sink.run, batch_id)
        result = pipeline.transform(prepared)
        if rejected == 0:
            result = replace(result, dead_letters=None)  # skip an empty branch of the write job
        moment = now()
        files = sink.write(result, stem, moment)
        sink.commit(
            BatchRecord(
                consumer_id=consumer_id,
                run=sink.run,
                batch_id=batch_id,
                stem=stem,
                pipeline=pipeline.name,
                committed_at=moment,
                partitions=tuple(ranges[p] for p in sorted(ranges, key=_partition_order)),
                files=tuple(files),
            )
        )
    finally:
        prepared.unpersist(blocking=False)
    outputs, dead_letters = sink_summary(files)
    summary = BatchSummary(
        consumer_id=consumer_id,
        batch_id=batch_id,
        partitions=ranges,
        outputs=outputs,
        dead_letters=dead_letters,
        files=tuple(files),
        stem=stem,
        duration_seconds=clock() - started,
    )
    if metrics is not None:
        metrics.batch_processed(summary)
    return summary


def partition_ranges(prepared: DataFrame) -> tuple[dict[str, PartitionRange], int | None]:
    """Each partition's range in the batch (one small Spark job), and how many events the pipeline
    rejected while preparing them (None when it does not say)."""
    from pyspark.sql import functions as F

    counts_rejected = DEAD_LETTER_REASON in prepared.columns
    aggregates = [
        F.min("sequence_number").alias("first"),
        F.max("sequence_number").alias("last"),
        F.max_by("offset", "sequence_number").alias("last_offset"),
        F.count(F.lit(1)).alias("events"),
        F.unix_micros(F.min("enqueued_time")).alias("first_enqueued"),
        F.unix_micros(F.max("enqueued_time")).alias("last_enqueued"),
    ]
    if counts_rejected:
        aggregates.append(F.count(DEAD_LETTER_REASON).alias("rejected"))
    rows = prepared.groupBy("partition").agg(*aggregates).collect()
    ranges = {
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
    rejected = sum(int(row["rejected"]) for row in rows) if counts_rejected else None
    return ranges, rejected


def _from_micros(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=int(micros))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _partition_order(partition: str) -> tuple[int, str]:
    return (int(partition), "") if partition.isdigit() else (1 << 62, partition)
