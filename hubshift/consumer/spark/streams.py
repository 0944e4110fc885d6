"""The streaming job's engine: one Structured Streaming query per owned partition, each with its own Spark
checkpoint (offsets, commits, state) in durable storage, so that a partition's state follows the partition.

For each partition it owns, the consumer runs `stream(events)` (the user's function, `pipelines/stream.py`)
on a streaming DataFrame of that partition's events (the `hubshift_eventhubs` source with its `partition`
option, `offsets.plan_partition`) and writes the result with `foreachBatch` into the sink, each micro-batch
once (`Sink.write_stream_batch`: idempotent by the query's checkpoint and the batch id). The query's
checkpoint is `<state root>/<namespace>/<hub>/<consumer group>/<job name>/<partition>`:

- **A graceful handoff**: the partition is marked draining (its source plans nothing new), the batch in
  flight commits (`processAllAvailable`), the query stops, the final SDK checkpoint is written and the
  lease released; the next owner starts the query from the same checkpoint: Spark restores the state of
  the last committed batch (the RocksDB state store from its changelog and snapshots) and goes on.
- **A crash**: the next owner starts the query from the checkpoint; a batch the old owner had planned but
  not committed runs again with the same id over the same sequence numbers (read from the new owner's
  spool), and the sink's write finds it written if it was.
- The receiver starts where the checkpoint's last committed batch ended (not the SDK checkpoint, which is
  written from committed batches and may be behind), so every batch the query runs finds its events.

The SDK checkpoint blobs are written from each committed batch's end offset (never ahead of Spark's
commit): lag, KEDA and `hubshift status` read them as before. Restoration is measured per partition: the
seconds from a query's start to its first committed batch, and its state's size (metrics and status).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hubshift.consumer.engine import Committed, Drained, EngineFailed
from hubshift.consumer.spark import spool
from hubshift.consumer.spark.offsets import SourceOffset, offset_log_end
from hubshift.consumer.spark.session import build_session
from hubshift.consumer.spark.source import EventHubsDataSource, read_events
from hubshift.consumer.spark.spooling import Reading, SpooledPartitions
from hubshift.consumer.spark.telemetry import add_listener, read_jvm, release_session
from hubshift.errors import UserError, one_line
from hubshift.eventhubs.receiver import StartAt
from hubshift.ownership.model import Checkpoint
from hubshift.pipelines import build_pipeline
from hubshift.pipelines.stream import StateRoot, StreamPipeline
from hubshift.sinks import build_sink
from hubshift.sinks.base import StreamBatch
from hubshift.sinks.files import HadoopFolder

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from hubshift.sinks.base import Sink

log = logging.getLogger(__name__)

# Spark's state store for a streaming job: RocksDB, each batch's changes uploaded with the checkpoint (a
# changelog) and snapshots made in the background, so a partition's next owner restores from the last
# snapshot and the changes after it; a user's spark.conf may still set these.
STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # Every partition's query has its own RocksDB instances (one per stateful operator and shuffle
    # partition), each with 64 MB write buffers by default: unbounded, four partitions of a windowed dedupe
    # took a 1.5 GiB pod's memory and the kernel killed the JVM. One budget for all of them (`spark.conf`
    # may set another).
    "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
    "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": "256",
}
# A partition's query that fails is started again from its checkpoint this many times in a row before the
# consumer gives up (a query that fails for good stops the consumer with its reason).
MAX_RESTARTS = 5
WATCH_SECONDS = 1.0


def checkpoint_app_id(location: str) -> str:
    """The name of a partition's checkpoint in what the sink records (stable across the query's restarts
    and owners; a new job name or state path is a new one)."""
    return hashlib.sha256(location.encode()).hexdigest()[:32]


def committed_next(spark: SparkSession, location: str, partition: str) -> int | None:
    """Where a partition's checkpoint says reading goes on: the end of its last committed batch (None: no
    batch was committed there yet)."""
    folder = HadoopFolder(spark, location)
    commits = [int(name) for name in folder.names("commits") if name.isdigit()]
    if not commits:
        return None
    end = offset_log_end(folder.read_text(f"offsets/{max(commits)}"))
    position = None if end is None else end.partitions.get(partition)
    return None if position is None else position.next_sequence


@dataclass
class _Query:
    """A partition's running query: under which owner level, where its checkpoint is, since when."""

    owner_level: int
    location: str
    started: float
    query: StreamingQuery | None = None
    restored: bool = False  # its first batch committed since it started
    stopping: bool = False
    failures: int = 0


class StreamEngine(SpooledPartitions):
    """A consumer running a streaming job: a query per owned partition over its spool (module docstring)."""

    name = "spark"

    def __init__(
        self,
        reading: Reading,
        state: StateRoot,
        *,
        pipeline: StreamPipeline | None = None,
        sink: Sink | None = None,
        session_builder: Callable[[], SparkSession] | None = None,
        drain_seconds: float = 60.0,
    ) -> None:
        super().__init__(reading)
        self.state = state
        self.pipeline = pipeline
        self.sink = sink
        self.drain_seconds = drain_seconds
        self._session_builder = session_builder
        self._spark: SparkSession | None = None
        self._queries: dict[str, _Query] = {}
        self._closing = threading.Event()
        self._monitor: threading.Thread | None = None
        self._listener: _Progress | None = None

    # --- life cycle --------------------------------------------------------------------------------

    def start(self, notify: Any) -> None:
        self.open_spool(notify)
        if self.sink is None:
            self.sink = build_sink(self.spec.sink, scope=self.scope)
        engine_conf = {**STATE_CONF, **{f"spark.hadoop.{k}": v for k, v in self.state.settings.items()}}
        self._spark = (
            self._session_builder()
            if self._session_builder
            else build_session(self.spec.spark, self.scratch, self.consumer_id, self.sink, engine_conf)
        )
        self._spark.dataSource.register(EventHubsDataSource)
        self.sink.check(self._spark)
        if self.pipeline is None:
            built = build_pipeline(self.spec.pipeline)
            assert isinstance(built, StreamPipeline)
            self.pipeline = built
        self._check_job()
        if self.metrics is not None:
            self.metrics.enable_spark()
        self._listener = _Progress(self)
        add_listener(self._spark, self._listener)
        self._monitor = threading.Thread(target=self._watch, name="stream-queries", daemon=True)
        self._monitor.start()

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            queries = list(self._queries.values())
            self._queries.clear()
            self._partitions.clear()
        self._pool.close()
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        for running in queries:
            self._stop_query(running)
        release_session(self._spark, self._listener, stop=self._session_builder is None)
        if self._monitor is not None:
            self._monitor.join(timeout=5)

    # --- partitions --------------------------------------------------------------------------------

    def location(self, partition: str) -> str:
        assert self.pipeline is not None
        return self.state.of(self.scope, self.pipeline.block.name, partition)

    def start_partition(
        self, partition: str, owner_level: int, start: StartAt, next_sequence: int | None
    ) -> None:
        """Receive the partition from where its checkpoint's last committed batch ended (the SDK
        checkpoint's position when it has none yet), then start its query from that checkpoint."""
        assert self._spark is not None
        location = self.location(partition)
        resumed = committed_next(self._spark, location, partition)
        if resumed is not None:
            start, next_sequence = StartAt(sequence_number=resumed - 1), resumed
        super().start_partition(partition, owner_level, start, next_sequence)
        running = _Query(owner_level, location, time.monotonic())
        self._restore_begins(partition, running)
        with self._lock:
            previous = self._queries.pop(partition, None)
            self._queries[partition] = running
        if previous is not None:
            self._stop_query(previous)
            self._remove_retired(None, partition)
        log.info(
            "partition %s: its job's query starts from %s (%s)",
            partition,
            location,
            f"sequence number {resumed}" if resumed is not None else "no committed batch yet",
        )
        self._launch_thread(partition, running)

    def _launch_thread(self, partition: str, running: _Query, again: str | None = None) -> None:
        """`_launch` on a thread of its own (a query's start reads its checkpoint; a restart waits first)."""
        threading.Thread(
            target=self._launch, args=(partition, running, again), name=f"query-{partition}", daemon=True
        ).start()

    def _launch(self, partition: str, running: _Query, again: str | None = None) -> None:
        """Start a partition's query (Spark reads its checkpoint); `again`: why its last one ended, so it is
        started again after a pause (`_retry`). A query that cannot start is tried again the same way; a job
        that cannot run stops the consumer with one line that says why."""
        while again is None or self._retry(partition, running, again):
            try:
                query = self._start_query(partition, running)
            except UserError as error:
                self.notify(EngineFailed(str(error)))
                return
            except Exception as error:
                again = f"could not start ({one_line(error)})"
                continue
            with self._lock:
                current = self._queries.get(partition) is running and not running.stopping
                running.query = query
            if not current:
                self._stop_query(running)
            return

    def _retry(self, partition: str, running: _Query, why: str) -> bool:
        """Whether to start a partition's query again after it failed (`why`): after a pause, unless it failed
        `MAX_RESTARTS` times in a row (the consumer stops with the reason) or the partition is gone."""
        running.failures += 1
        if running.failures > MAX_RESTARTS:
            self.notify(EngineFailed(f"partition {partition}: its query failed {MAX_RESTARTS} times: {why}"))
            running.stopping = True
            return False
        log.warning("partition %s: its query %s; starting it again from its checkpoint", partition, why)
        time.sleep(min(10.0, running.failures))
        with self._lock:
            if self._queries.get(partition) is not running or running.stopping:
                return False
        self._restore_begins(partition, running)  # its state is restored again from the checkpoint
        return True

    def _check_job(self) -> None:
        """Before anything is claimed: the job's function returns a streaming DataFrame and Spark can run it
        in the job's output mode (a query of no partition's, started and stopped at once: Spark checks the
        output mode when a query starts). `UserError`, one line, otherwise."""
        assert self._spark is not None and self.pipeline is not None
        from pyspark.errors import AnalysisException

        probe = self.scratch / "job-check"
        mode = self.pipeline.block.output_mode
        try:
            query = (
                self.pipeline.stream(self._events("-"))  # no partition is named "-"
                .writeStream.format("noop")
                .outputMode(mode)
                .option("checkpointLocation", str(probe))
                .start()
            )
        except AnalysisException as error:
            raise UserError(self._mode_refused(error)) from None
        query.stop()

    def _mode_refused(self, error: BaseException) -> str:
        assert self.pipeline is not None
        job = self.pipeline.block
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (
            f"stream {job.function}: Spark cannot run it in outputMode {job.output_mode}: "
            f"{one_line(Exception(reason), limit=240).removeprefix('Exception: ')}"
        )

    def _events(self, partition: str) -> DataFrame:
        assert self._spark is not None
        return read_events(self._spark, self.scratch, self.spool_root, self.spec.spark, partition)

    def _start_query(self, partition: str, running: _Query) -> StreamingQuery:
        assert self._spark is not None and self.pipeline is not None and self.sink is not None
        from pyspark.errors import AnalysisException

        job = self.pipeline.block
        rows = self.pipeline.stream(self._events(partition))
        sink, app = self.sink, checkpoint_app_id(running.location)

        def write(frame: DataFrame, batch_id: int) -> None:
            batch = StreamBatch(
                app,
                batch_id,
                partition,
                self.consumer_id,
                datetime.now(UTC),
                job.output_mode,
                tuple(job.key_columns),
            )
            frame = frame.persist()  # written once: a stateful plan is not computed twice
            try:
                sink.write_stream_batch(frame, batch)
            finally:
                frame.unpersist()

        interval = self.spec.spark.trigger_interval_seconds
        try:
            return (
                rows.writeStream.outputMode(job.output_mode)
                .foreachBatch(write)
                .option("checkpointLocation", running.location)
                .trigger(processingTime=f"{interval} seconds")
                .queryName(self._query_name(partition))
                .start()
            )
        except AnalysisException as error:
            raise UserError(self._mode_refused(error)) from None

    def _query_name(self, partition: str) -> str:
        return f"hubshift_{self.consumer_id}_{partition}".replace("-", "_").replace(".", "_")

    def drain_partition(self, partition: str) -> None:
        """Plan nothing new for it, let the batch in flight commit, stop its query: `Drained` with the last
        committed position (its state is in the checkpoint for the next owner)."""
        super().drain_partition(partition)
        with self._lock:
            running = self._queries.get(partition)
            state = self._partitions.get(partition)
        if running is None or state is None:
            return

        def finish() -> None:
            query = running.query
            if query is not None:
                waiting = threading.Thread(target=_settle, args=(query,), daemon=True)
                waiting.start()
                waiting.join(self.drain_seconds)
                # Spark's listener may hear of the last batch after this: its commit log says it now
                assert self._spark is not None
                settled = committed_next(self._spark, running.location, partition)
                if settled is not None:
                    self._committed(partition, running, settled, 0)
            with self._lock:
                if self._queries.get(partition) is running:
                    del self._queries[partition]
                if self._partitions.get(partition) is state:
                    del self._partitions[partition]
            self._stop_query(running)
            self._restore_ended(partition, running)
            spool.remove_epoch(self.spool_root, partition, state.owner_level)
            self.notify(Drained(partition, state.owner_level, state.committed))

        threading.Thread(target=finish, name=f"drain-{partition}", daemon=True).start()

    def stop_partition(self, partition: str) -> None:
        super().stop_partition(partition)
        with self._lock:
            running = self._queries.pop(partition, None)

        def stop() -> None:
            if running is not None:
                self._stop_query(running)
                self._restore_ended(partition, running)
            self._remove_retired(None, partition)  # its query is stopped: nothing reads its spool

        threading.Thread(target=stop, name=f"stop-{partition}", daemon=True).start()

    def _stop_query(self, running: _Query) -> None:
        running.stopping = True
        query = running.query
        if query is None:
            return
        try:
            query.stop()
        except Exception as exc:
            log.debug("stopping a query: %r", exc)

    # --- batches committed (the listener's thread) -------------------------------------------------

    def progress_reported(self, document: Mapping[str, Any]) -> None:
        """One query's progress: its batch is committed (Spark's commit log written before the listener
        hears it), so its partition's position moves to the batch's end offset."""
        name = str(document.get("name") or "")
        with self._lock:
            found = [
                (p, q) for p, q in self._queries.items() if self._query_name(p) == name and not q.stopping
            ]
        if not found:
            return
        partition, running = found[0]
        sources = document.get("sources") or []
        if not sources:
            return
        end_text = sources[0].get("endOffset")
        end = SourceOffset.from_json(json.loads(end_text) if isinstance(end_text, str) else end_text)
        position = end.partitions.get(partition)
        events = int(document.get("numInputRows") or 0)
        self._restore_ended(partition, running, committed=True)
        if self.metrics is not None:
            rows, size = _state_size(document)
            self.metrics.state_size(partition, rows, size)
            seconds = float(document.get("batchDuration") or 0) / 1000
            self.metrics.handled(partition, events, seconds, None)
        if position is not None:
            self._committed(partition, running, position.next_sequence, events)

    def _committed(self, partition: str, running: _Query, next_sequence: int, events: int) -> None:
        """A partition's batch committed up to `next_sequence`: its position, the spool trimmed, and the
        checkpoint the agent writes (`Committed`); nothing when the position did not move."""
        with self._lock:
            state = self._partitions.get(partition)
            if state is None or state.owner_level != running.owner_level:
                return
            if state.committed_next is not None and next_sequence <= state.committed_next:
                return  # no events (a batch the watermark alone moved)
            state.committed_next = next_sequence
            level = state.owner_level
        last = next_sequence - 1
        offset = spool.event_at(self.spool_root, partition, level, last)
        spool.trim(self.spool_root, partition, level, next_sequence)
        if offset is None:
            return  # the last event expired or is no longer spooled: the next batch checkpoints
        checkpoint = Checkpoint(offset=offset, sequence_number=last)
        with self._lock:
            if state.owner_level == level:
                state.committed = checkpoint
        self.notify(Committed(partition, level, checkpoint, events))

    # --- the queries' health --------------------------------------------------------------------------

    def _watch(self) -> None:
        from py4j.protocol import Py4JNetworkError  # lazy: PySpark's gateway, as pyspark itself here

        sampled = 0.0
        while not self._closing.wait(WATCH_SECONDS):
            if self.metrics is not None and self._spark is not None and time.monotonic() - sampled > 5:
                sampled = time.monotonic()
                try:
                    self.metrics.jvm_sampled(read_jvm(self._spark))
                except Exception as exc:
                    log.debug("reading the JVM's figures: %r", exc)
            with self._lock:
                running = list(self._queries.items())
            try:
                for partition, query in running:
                    self._check(partition, query)
            except (Py4JNetworkError, ConnectionError) as exc:
                # The driver JVM is gone (killed for memory, most often): nothing can run any more; the
                # consumer stops and its pod starts again, every partition's state in its checkpoint.
                self.notify(EngineFailed(f"Spark's driver JVM is gone ({one_line(exc, limit=160)})"))
                return

    def _check(self, partition: str, running: _Query) -> None:
        """A partition's query that stopped on its own failed: started again from its checkpoint (`_launch`,
        on a thread of its own: the pause before it holds no other partition's check)."""
        query = running.query
        if query is None or running.stopping or query.isActive:
            return
        error = query.exception()
        running.query = None
        self._launch_thread(partition, running, f"failed ({one_line(error) if error else 'it stopped'})")

    def _restore_begins(self, partition: str, running: _Query) -> None:
        """Its query (re)starts: its state is restored from the checkpoint until its first batch commits."""
        running.started, running.restored = time.monotonic(), False
        if self.metrics is not None:
            self.metrics.state_restoring(partition)

    def _restore_ended(self, partition: str, running: _Query, committed: bool = False) -> None:
        """Its first batch committed (`committed`: the restore's time is reported) or its query stopped
        before that; nothing once already ended."""
        if committed:
            running.failures = 0  # "in a row": a committed batch ends the run of failures
        if running.restored:
            return
        running.restored = True
        if self.metrics is not None:
            self.metrics.state_restored(partition, time.monotonic() - running.started if committed else None)


def _settle(query: StreamingQuery) -> None:
    """Wait until the query has committed what its source made available (nothing more, once draining)."""
    try:
        query.processAllAvailable()
    except Exception as exc:  # a query failing meanwhile: its checkpoint has what it committed
        log.debug("waiting for a draining query: %r", exc)


def _state_size(document: Mapping[str, Any]) -> tuple[int, int]:
    """The state's rows and bytes over a progress's stateful operators."""
    operators = document.get("stateOperators") or []
    rows = sum(int(o.get("numRowsTotal") or 0) for o in operators)
    size = sum(int(o.get("memoryUsedBytes") or 0) for o in operators)
    return rows, size


class _Progress:
    """Every query's progress, one JSON string each (`telemetry.ProgressListener`'s way), to the engine."""

    def __init__(self, engine: StreamEngine) -> None:
        self.engine = engine
        self._java: Any = None

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            self.engine.progress_reported(json.loads(event.progress().json()))
        except Exception as exc:  # never into py4j's callback: it would print a traceback and go on
            log.warning("a query's progress could not be read: %s", one_line(exc))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]
