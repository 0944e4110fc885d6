"""The Spark engine: receivers fill the spool, a Structured Streaming query over the `hubshift_eventhubs`
source reads it, and `foreachBatch` runs the pipeline and the sink (`batch.process_batch`).

Across processes:
- this (main) process runs the receivers, writes the ownership file, and gets each batch in
  `foreachBatch` (a py4j callback thread);
- Spark's source runner plans batches from the ownership file and the spool (`source.py`);
- executor Python workers slice the spool.

A batch's end offset (Spark's offset log, `<checkpoint>/offsets/<batch id>`, written before the batch runs)
says under which owner level each partition was read and which version of the ownership file planned it. Once
`process_batch` returned, the batch is in the sink: each partition's last event is reported `Committed`,
and a partition drained at version G is `Drained` after the first batch planned at G or later (no later
batch reads it). Spark's checkpoint folder is scratch, new for every query start; if the query fails it is
started again from what was committed.

A batch is committed only whole: `process_batch` checks that it holds every event of the ranges the offset
log planned (`offsets.incomplete`), and the spool's read fails rather than hand on a range with a hole. So
an epoch's spool folder is removed only once no batch can read it any more: a drained or stopped
partition's when the first batch planned after the change is done (or the query starts again), never under
a batch in flight (a stop removing it at once once let a batch commit a partition's range with the
segments a concurrent removal had taken already missing, and the sink's high-water mark moved past them).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hubshift.consumer.engine import Committed, Drained, EngineFailed, Notify
from hubshift.consumer.spark import spool
from hubshift.consumer.spark.batch import SpoolRead, process_batch
from hubshift.consumer.spark.offsets import SourceOffset, offset_log_end, plan_ranges
from hubshift.consumer.spark.ownership_file import read_planned
from hubshift.consumer.spark.session import build_session
from hubshift.consumer.spark.source import EventHubsDataSource, read_events
from hubshift.consumer.spark.spooling import Reading, SpooledPartitions
from hubshift.consumer.spark.telemetry import (
    JVM_SAMPLE_SECONDS,
    ProgressListener,
    add_listener,
    read_jvm,
    release_session,
)
from hubshift.errors import one_line
from hubshift.ownership.model import Checkpoint
from hubshift.pipelines import build_pipeline
from hubshift.sinks import build_sink, build_store
from hubshift.sinks.commits import BatchSummary

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from hubshift.pipelines.base import Pipeline
    from hubshift.sinks.base import Sink

log = logging.getLogger(__name__)

# A failed query is started again this many times in a row before the consumer gives up.
MAX_RESTARTS = 5
# How often the query is watched: its failure, and drains the source's planning has finished.
WATCH_SECONDS = 0.25


def offset_of_batch(checkpoint_dir: Path, batch_id: int) -> SourceOffset | None:
    """The source's end offset of a batch from Spark's offset log."""
    try:
        return offset_log_end((checkpoint_dir / "offsets" / str(batch_id)).read_text())
    except FileNotFoundError:
        return None


class SparkEngine(SpooledPartitions):
    name = "spark"

    def __init__(
        self,
        reading: Reading,
        *,
        pipeline: Pipeline | None = None,
        sink: Sink | None = None,
        session_builder: Callable[[], SparkSession] | None = None,
        handled: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(reading)
        self.pipeline = pipeline
        self.sink = sink
        # After a failover: per partition, the old hub's checkpoint (pipelines/failover.py).
        self.handled = dict(handled or {})
        self._session_builder = session_builder
        self._spark: SparkSession | None = None
        self._query: StreamingQuery | None = None
        self._checkpoint_dir: Path | None = None
        self._monitor: threading.Thread | None = None
        self._closing = threading.Event()
        self._restarts = 0
        # A query's batch ids start at 0 again (each query has a new checkpoint), but a batch's number names
        # what it writes (`batch_stem`): the batches of earlier queries of this run come first, so no two
        # batches of a run share a name (a sink took a name it had as "written already").
        self._numbered_before = 0
        self._query_batches = 0
        # Events of the last few batches by id, for their progress (a task may read the spool itself).
        self._rows_by_batch: dict[int, int] = {}
        # The ownership version the batch running now was planned with (None: no batch runs).
        self._in_flight: int | None = None
        self._listener: ProgressListener | None = None

    # --- life cycle --------------------------------------------------------------------------------

    def start(self, notify: Notify) -> None:
        self.open_spool(notify)
        if self.sink is None:
            self.sink = build_sink(self.spec.sink, scope=self.scope)
        self._spark = (
            self._session_builder()
            if self._session_builder
            else build_session(self.spec.spark, self.scratch, self.consumer_id, self.sink)
        )
        if self.metrics is not None:
            self.metrics.enable_spark()
            self._listener = ProgressListener(self.metrics, self._rows_by_batch.get)
            add_listener(self._spark, self._listener)

        self._spark.dataSource.register(EventHubsDataSource)
        self.sink.check(self._spark)
        if self.pipeline is None:
            # Editor steps keep their state across batches beside the results (`_state/`).
            state = None if self.sink.lines is None else build_store(self.spec.sink)
            self.pipeline = build_pipeline(self.spec.pipeline, state=state)
        self._start_query()
        self._monitor = threading.Thread(target=self._watch_query, name="spark-query-monitor", daemon=True)
        self._monitor.start()

    def _start_query(self) -> None:
        assert self._spark is not None
        self._checkpoint_dir = self.scratch / f"spark-checkpoint-{time.time_ns()}"
        events = read_events(self._spark, self.scratch, self.spool_root, self.spec.spark)
        interval = self.spec.spark.trigger_interval_seconds
        self._query = (
            events.writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", str(self._checkpoint_dir))
            .trigger(processingTime=f"{interval} seconds")
            .queryName(f"hubshift_{self.consumer_id.replace('-', '_').replace('.', '_')}")
            .start()
        )

    def _watch_query(self) -> None:
        sampled = 0.0
        while not self._closing.is_set():
            if time.monotonic() - sampled >= JVM_SAMPLE_SECONDS:
                sampled = time.monotonic()
                self._sample_jvm()
            query = self._query
            if query is None:
                return
            self._finish_drains()
            try:
                finished = query.awaitTermination(WATCH_SECONDS)  # type: ignore[arg-type]  # seconds, float taken
            except Exception as exc:  # the query failed: its exception surfaces here
                finished = True
                reason = one_line(exc)
            else:
                reason = "the streaming query stopped"
            if not finished or self._closing.is_set():
                continue
            self._restarts += 1
            if self._restarts > MAX_RESTARTS:
                self.notify(EngineFailed(f"the streaming query failed {MAX_RESTARTS} times: {reason}"))
                return
            log.warning("the streaming query failed (%s); starting it again from what was committed", reason)
            self._restart_from_committed()
            time.sleep(min(10.0, 1.0 * self._restarts))
            try:
                self._start_query()
            except Exception as exc:
                self.notify(EngineFailed(f"the streaming query could not start: {one_line(exc)}"))
                return

    def _sample_jvm(self) -> None:
        """The driver JVM's memory and collectors into the metrics (between polls of the query)."""
        if self.metrics is None or self._spark is None:
            return
        try:
            self.metrics.jvm_sampled(read_jvm(self._spark))
        except Exception as exc:  # a JVM going away or busy: only a metric misses a sample
            log.debug("reading the JVM's figures: %r", exc)

    def _restart_from_committed(self) -> None:
        """A new query reads each partition from its first uncommitted event; drains are complete. An
        epoch whose spool can no longer give that whole (the batch failed on a hole) is received again."""
        drained = []
        with self._lock:
            for partition, state in list(self._partitions.items()):
                if state.draining_since is not None:
                    drained.append((partition, state))
                    del self._partitions[partition]
                elif state.committed_next is not None:
                    state.next_sequence = state.committed_next
            broken = [(p, s) for p, s in self._partitions.items() if not self._spool_whole(p, s)]
        for partition, state in broken:
            self._respool(partition, state)
        with self._lock:
            self._ownership_version += 1
            self._write_ownership()
            self._numbered_before += self._query_batches  # the next query's batch 0 follows them
            self._query_batches = 0
        for partition, state in drained:
            spool.remove_epoch(self.spool_root, partition, state.owner_level)
            self.notify(Drained(partition, state.owner_level, state.committed))
        self._remove_retired(None)  # the query is gone: no batch reads them
        if self._checkpoint_dir is not None:
            shutil.rmtree(self._checkpoint_dir, ignore_errors=True)

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            self._partitions.clear()
        self._pool.close()
        # A batch cut short by the stop (after a grace period ran out) is not news: keep py4j quiet.
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        if self._query is not None:
            try:
                self._query.stop()
            except Exception as exc:
                log.debug("stopping the query: %r", exc)
        release_session(self._spark, self._listener, stop=self._session_builder is None)
        if self._monitor is not None:
            self._monitor.join(timeout=5)

    # --- batches (py4j callback thread) -----------------------------------------------------------

    def _reads(self, batch_id: int, end: SourceOffset | None) -> SpoolRead | None:
        """The batch's reads of the spool, as the source plans them: from the previous batch's end offset
        (the first batch of a query starts where each epoch began, as its initial offset does) to `end`.
        None when Spark's offset log does not tell them."""
        assert self._checkpoint_dir is not None
        if end is None:
            return None
        start = offset_of_batch(self._checkpoint_dir, batch_id - 1) if batch_id > 0 else None
        if batch_id > 0 and start is None:
            return None
        return SpoolRead(str(self.spool_root), tuple(plan_ranges(start, end)))

    def _on_batch(self, events: DataFrame, batch_id: int) -> None:

        assert self.pipeline is not None and self.sink is not None and self._checkpoint_dir is not None
        end = offset_of_batch(self._checkpoint_dir, batch_id)
        started = time.monotonic()
        try:
            reads = self._reads(batch_id, end)
            if end is None or reads is None:
                # Without its plan a batch cannot be checked whole: it is not written, and is read again.
                raise RuntimeError(f"batch {batch_id}: Spark's offset log does not say what it read")
            with self._lock:
                self._in_flight = end.ownership_version
                self._query_batches = max(self._query_batches, batch_id + 1)
            summary = process_batch(
                events,
                self._numbered_before + batch_id,
                self.consumer_id,
                self.pipeline,
                self.sink,
                handled=self.handled,
                reads=reads,
            )
        except Exception:
            with self._lock:
                self._in_flight = None
            if self.metrics is not None:
                self.metrics.batch_failed(time.monotonic() - started)
            raise
        if self.metrics is not None:
            self.metrics.batch_processed(summary)
        self._rows_by_batch[batch_id] = sum(done.events for done in summary.partitions.values())
        for old in [b for b in self._rows_by_batch if b < batch_id - 8]:
            del self._rows_by_batch[old]
        self._restarts = 0
        self._batch_done(end, summary)
        with self._lock:
            self._in_flight = None
        self._finish_drains()

    def _finish_drains(self) -> None:
        """Drains and retired epochs no batch reads any more, known before the next batch runs: once the
        source has planned with the version that stopped them (a batch planned then or later does not read
        them) and no batch planned before that runs. A drain then waits for the batch in flight only, not
        for the next one's work too (a second batch's time that made handoffs under load miss their
        deadline)."""
        planned = read_planned(self.scratch)
        drained = []
        with self._lock:
            in_flight = self._in_flight
            safe = planned if in_flight is None else min(planned, in_flight)
            for partition, state in list(self._partitions.items()):
                if state.draining_since is not None and state.draining_since <= safe:
                    del self._partitions[partition]
                    drained.append((partition, state))
        for partition, state in drained:
            spool.remove_epoch(self.spool_root, partition, state.owner_level)
            self.notify(Drained(partition, state.owner_level, state.committed))
        self._remove_retired(safe)

    def _batch_done(self, end: SourceOffset, summary: BatchSummary) -> None:
        """A batch is in the sink: its partitions' positions are committed (and reported), drains planned
        before it are done, the spool is trimmed, and epochs no batch reads any more are removed."""
        committed = []
        drained = []
        with self._lock:
            for partition, done in summary.partitions.items():
                position = end.partitions.get(partition)
                state = self._partitions.get(partition)
                if position is None or state is None or state.owner_level != position.owner_level:
                    continue
                checkpoint = Checkpoint(offset=done.last_offset, sequence_number=done.last_sequence_number)
                state.committed = checkpoint
                committed.append(Committed(partition, position.owner_level, checkpoint, done.events))
            for partition, position in end.partitions.items():
                state = self._partitions.get(partition)
                if state is not None and state.owner_level == position.owner_level:
                    state.committed_next = position.next_sequence
                    spool.trim(self.spool_root, partition, position.owner_level, position.next_sequence)
            for partition, state in list(self._partitions.items()):
                if state.draining_since is not None and end.ownership_version >= state.draining_since:
                    del self._partitions[partition]
                    drained.append((partition, state))
        for event in committed:
            self.notify(event)
        for partition, state in drained:
            spool.remove_epoch(self.spool_root, partition, state.owner_level)
            self.notify(Drained(partition, state.owner_level, state.committed))
        self._remove_retired(end.ownership_version)
