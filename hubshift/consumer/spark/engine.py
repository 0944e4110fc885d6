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

import errno
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from hubshift.consumer import leftovers
from hubshift.consumer.engine import Committed, Drained, EngineFailed, Notify, Stolen, not_started
from hubshift.consumer.lag import ReadProgress
from hubshift.consumer.spark import spool
from hubshift.consumer.spark.batch import SpoolRead, process_batch
from hubshift.consumer.spark.offsets import SourceOffset, SourcePartition, plan_ranges
from hubshift.consumer.spark.ownership_file import OwnershipView, read_planned, write_ownership
from hubshift.consumer.spark.source import (
    FORMAT,
    OPTION_MAX_EVENTS,
    OPTION_SCRATCH,
    OPTION_SPOOL,
    EventHubsDataSource,
)
from hubshift.consumer.spark.telemetry import ProgressListener, add_listener, read_jvm, remove_listener
from hubshift.errors import UserError, one_line
from hubshift.eventhubs.receiver import PartitionReceiver, ReceiverPool, StartAt
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.manifest import ConsumerSpec
from hubshift.ownership.model import Checkpoint
from hubshift.pipelines import build_pipeline
from hubshift.sinks import build_sink, build_store
from hubshift.sinks.commits import BatchSummary
from hubshift.spec import SparkSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from hubshift.consumer.metrics import ConsumerMetrics
    from hubshift.pipelines.base import Pipeline
    from hubshift.sinks.base import Sink

# A folder of jars for the consumers' Spark beside PySpark's own (tools/spark-jars); the image needs none.
JARS_ENV = "HUBSHIFT_SPARK_JARS"
# Spark's own `spark.redaction.regex` and hadoop-azure's account keys, which it misses: the UI's Environment
# page would show an Azure sink's key (spark.hadoop.fs.azure.account.key.<host>) as it is.
REDACTION = r"(?i)secret|password|token|access[.]?key|fs[.]azure[.]account[.]key"
log = logging.getLogger(__name__)

# A failed query is started again this many times in a row before the consumer gives up.
MAX_RESTARTS = 5
# How often the query is watched: its failure, and drains the source's planning has finished.
WATCH_SECONDS = 0.25
# How often the driver JVM's memory and collectors are read for the metrics.
JVM_SAMPLE_SECONDS = 5.0
LOG4J_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n%ex
"""


def offset_of_batch(checkpoint_dir: Path, batch_id: int) -> SourceOffset | None:
    """The source's end offset of a batch from Spark's offset log (`v1`, metadata, one line per source)."""
    try:
        lines = (checkpoint_dir / "offsets" / str(batch_id)).read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 3 or not lines[0].startswith("v"):
        return None
    return SourceOffset.from_json(json.loads(lines[2]))


@dataclass(frozen=True)
class _Retired:
    """An epoch no longer read whose spool folder waits for the batches planned before `version` to end."""

    partition: str
    owner_level: int
    version: int


@dataclass
class _Partition:
    owner_level: int
    next_sequence: int | None
    receiver: PartitionReceiver | None
    draining_since: int | None = None  # the ownership file's version that stopped planning it
    committed: Checkpoint | None = None
    committed_next: int | None = None  # first sequence number not yet committed (spool trimming)
    spooled_next: int | None = None  # one past the last sequence number spooled
    start: StartAt = field(default_factory=StartAt)  # where the epoch's receiving began


class SparkEngine:
    name = "spark"

    def __init__(
        self,
        target: EventHubsTarget,
        consumer_id: str,
        spec: ConsumerSpec,
        scratch: Path,
        *,
        pipeline: Pipeline | None = None,
        sink: Sink | None = None,
        metrics: ConsumerMetrics | None = None,
        pool: ReceiverPool | None = None,
        session_builder: Callable[[], SparkSession] | None = None,
        handled: Mapping[str, int] | None = None,
    ) -> None:
        self.target = target
        self.notify: Notify = not_started
        self.consumer_id = consumer_id
        self.spec = spec
        self.scratch = scratch
        self.spool_root = scratch / "spool"
        self.pipeline = pipeline
        self.sink = sink
        self.metrics = metrics
        # After a failover: per partition, the old hub's checkpoint (pipelines/failover.py).
        self.handled = dict(handled or {})
        self._pool = pool or ReceiverPool(target)
        self._session_builder = session_builder
        self._lock = threading.RLock()
        self._partitions: dict[str, _Partition] = {}
        self._ownership_version = 0
        self._spark: SparkSession | None = None
        self._query: StreamingQuery | None = None
        self._checkpoint_dir: Path | None = None
        self._monitor: threading.Thread | None = None
        self._closing = threading.Event()
        self._restarts = 0
        self._scratch_full_reported = False
        # Events of the last few batches by id, for their progress (a task may read the spool itself).
        self._rows_by_batch: dict[int, int] = {}
        self._retired: list[_Retired] = []
        # The ownership version the batch running now was planned with (None: no batch runs).
        self._in_flight: int | None = None
        self._listener: ProgressListener | None = None
        # Receivers stay at most this far ahead of what was committed (per partition).
        self.max_ahead = max(2 * spec.spark.max_events_per_trigger, 20_000)

    # --- life cycle --------------------------------------------------------------------------------

    def start(self, notify: Notify) -> None:
        self.notify = notify
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.spool_root.mkdir(parents=True, exist_ok=True)
        self._write_ownership()
        if self.sink is None:
            scope = f"{self.target.fqns}/{self.target.hub}/{self.target.consumer_group}".lower()
            self.sink = build_sink(self.spec.sink, scope=scope)
        self._spark = self._session_builder() if self._session_builder else self._build_session()
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

    def _build_session(self) -> SparkSession:
        # Spark's Python workers must run this interpreter: it has pyarrow and hubshift.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        log4j = self.scratch / "log4j2.properties"
        log4j.write_text(LOG4J_PROPERTIES)
        from pyspark.sql import SparkSession

        spark_spec = self.spec.spark
        builder = (
            SparkSession.builder.appName(f"hubshift-{self.consumer_id}")
            .master(spark_spec.master)
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(spark_spec.shuffle_partitions))
            .config("spark.driver.memory", spark_spec.driver_memory)
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.local.dir", str(self.scratch / "spark-local"))
            .config("spark.sql.warehouse.dir", str(self.scratch / "spark-warehouse"))
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
            .config("spark.sql.streaming.stopTimeout", "10s")
            # Each micro-batch is planned anew; adaptive execution costs ~15% of that fixed per-batch CPU and
            # has nothing to coalesce with a couple of shuffle partitions.
            .config("spark.sql.adaptive.enabled", "false")
            # The UI (when enabled) shows; it stops nothing.
            .config("spark.ui.killEnabled", "false")
        )
        if spark_spec.master.startswith("local"):
            # The driver's RPC and block manager have no authentication and deserialize what they are
            # sent: a local-mode driver has no executor elsewhere to talk to, so they listen on 127.0.0.1
            # only, never on the pod's address.
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                "spark.driver.host", "127.0.0.1"
            )
        for key, value in session_conf(spark_spec, self.sink, os.environ).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        jvm: Any = spark._jvm
        leftovers.record(self.scratch, int(jvm.java.lang.ProcessHandle.current().pid()))
        return spark

    def _start_query(self) -> None:
        assert self._spark is not None
        self._checkpoint_dir = self.scratch / f"spark-checkpoint-{time.time_ns()}"
        events = (
            self._spark.readStream.format(FORMAT)
            .option(OPTION_SCRATCH, str(self.scratch))
            .option(OPTION_SPOOL, str(self.spool_root))
            .option(OPTION_MAX_EVENTS, str(self.spec.spark.max_events_per_trigger))
            .load()
        )
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
        if self._listener is not None and self._spark is not None:
            try:  # a session shared with others (a session builder's) keeps no listener of ours
                remove_listener(self._spark, self._listener)
            except Exception as exc:
                log.debug("removing the progress listener: %r", exc)
        if self._spark is not None and self._session_builder is None:
            self._spark.stop()
        if self._monitor is not None:
            self._monitor.join(timeout=5)

    # --- partitions --------------------------------------------------------------------------------

    def start_partition(
        self, partition: str, owner_level: int, start: StartAt, next_sequence: int | None
    ) -> None:
        with self._lock:
            previous = self._partitions.get(partition)
            self._partitions[partition] = _Partition(owner_level, next_sequence, None, start=start)
            # No new version for a claim: the partition changes the offsets once its first events are
            # spooled. One for an epoch it replaces, whose folder then waits for the batches before it.
            if previous is not None:
                self._ownership_version += 1
            self._write_ownership()
        if previous is not None:
            self._forget(partition, previous)
        self._receive(partition, owner_level, start)

    def _receive(self, partition: str, owner_level: int, start: StartAt) -> None:
        """Open the epoch's receiver, spooling what it delivers; it stays with the epoch's state."""

        def deliver(batch: pa.RecordBatch) -> None:
            with self._lock:
                state = self._partitions.get(partition)
                if state is None or state.owner_level != owner_level or state.draining_since is not None:
                    return
                after = state.spooled_next
            first = int(batch.column("sequence_number")[0].as_py())
            if after is not None and first < after:
                # delivered again after a failure that came once it was spooled: only what is new
                batch = batch.slice(min(batch.num_rows, after - first))
                if batch.num_rows == 0:
                    return
            try:
                spool.write_segment(self.spool_root, partition, owner_level, batch, after=after)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    self._scratch_full(exc)
                raise  # the receiver delivers the same events again once it may
            with self._lock:
                state.spooled_next = int(batch.column("sequence_number")[-1].as_py()) + 1
            self._report_spool()

        def expired(first: int, last: int) -> None:
            with self._lock:
                state = self._partitions.get(partition)
                if state is None or state.owner_level != owner_level:
                    return
                after = state.spooled_next if state.spooled_next is not None else state.next_sequence
                if after is not None and last < after:
                    return  # recorded already (the delivery after it failed and came again)
            spool.write_expired(self.spool_root, partition, owner_level, first, last)
            with self._lock:
                state.spooled_next = last + 1
            log.warning(
                "partition %s: %d events (sequence numbers %d-%d) expired from the hub before they were "
                "read: its retention passed the checkpoint",
                partition,
                last - first + 1,
                first,
                last,
            )
            if self.metrics is not None:
                self.metrics.events_expired(partition, last - first + 1)

        def stolen(partition_id: str, level: int) -> None:
            self.notify(Stolen(partition_id, level))

        receiver = self._pool.open(
            partition,
            owner_level,
            start,
            deliver,
            stolen,
            lambda: self._has_room(partition, owner_level),
            on_expired=expired,
        )
        with self._lock:
            state = self._partitions.get(partition)
            if state is not None and state.owner_level == owner_level and state.draining_since is None:
                state.receiver = receiver
                return
        receiver.close(wait=None)  # stopped or drained meanwhile

    def _respool(self, partition: str, state: _Partition) -> None:
        """Receive an epoch again from its first uncommitted event into an empty spool folder: what it had
        spooled cannot give its ranges whole (a segment lost). Its old link is closed first, so the new one
        at the same owner level is not taken for another owner's."""
        receiver, state.receiver = state.receiver, None
        if receiver is not None:
            receiver.close(wait=10)
            receiver.closed.wait(10)
        spool.remove_epoch(self.spool_root, partition, state.owner_level)
        with self._lock:
            state.spooled_next = None
            begin = state.committed_next if state.committed_next is not None else state.next_sequence
            state.next_sequence = begin
        start = state.start if begin is None else StartAt(sequence_number=begin - 1)
        log.warning("partition %s: its spool lost events; receiving it again from %s", partition, begin)
        self._receive(partition, state.owner_level, start)

    def _spool_whole(self, partition: str, state: _Partition) -> bool:
        """Whether the epoch's spool holds, without a hole, everything from its first uncommitted event to
        the last one spooled."""
        if state.spooled_next is None:
            return True
        held = spool.extent(self.spool_root, partition, state.owner_level)
        begin = state.committed_next if state.committed_next is not None else state.next_sequence
        return held is not None and held.next == state.spooled_next and (begin is None or held.first <= begin)

    def drain_partition(self, partition: str) -> None:
        with self._lock:
            state = self._partitions.get(partition)
            if state is None or state.draining_since is not None:
                return
            self._ownership_version += 1
            state.draining_since = self._ownership_version
            self._write_ownership()
            receiver, state.receiver = state.receiver, None
        # What is spooled stays for the batch in flight; nothing more needs receiving.
        if receiver is not None:
            receiver.close(wait=None)

    def _scratch_full(self, error: OSError) -> None:
        """The spool cannot grow: stop the consumer (in bounded time, each partition released at what was
        committed, nothing lost) with one line that says what to do, rather than retry forever."""
        with self._lock:
            if self._scratch_full_reported:
                return
            self._scratch_full_reported = True
        self.notify(
            EngineFailed(
                f"the scratch folder {self.scratch} is full ({error.strerror}): events are read again from "
                "the last checkpoint once there is room; give the consumer more scratch space (in a pod: "
                "the /tmp emptyDir's node disk or sizeLimit)"
            )
        )

    def stop_partition(self, partition: str) -> None:
        with self._lock:
            state = self._partitions.pop(partition, None)
            if state is None:
                return
            self._ownership_version += 1
            self._write_ownership()
        self._forget(partition, state)

    def _forget(self, partition: str, state: _Partition) -> None:
        """Stop receiving an epoch at once; its spool folder stays until no batch can read it (a batch
        planned before the ownership file's current version may be reading it now)."""
        if state.receiver is not None:
            state.receiver.close(wait=None)
        with self._lock:
            self._retired.append(_Retired(partition, state.owner_level, self._ownership_version))

    def _remove_retired(self, planned_at: int | None) -> None:
        """Remove the retired epochs that no batch reads any more: those retired at or before the version
        `planned_at` a finished batch was planned with (None: every one, no query runs)."""
        with self._lock:
            done = [r for r in self._retired if planned_at is None or r.version <= planned_at]
            self._retired = [r for r in self._retired if r not in done]
            current = {(p, s.owner_level) for p, s in self._partitions.items()}
        for retired in done:
            if (retired.partition, retired.owner_level) not in current:
                spool.remove_epoch(self.spool_root, retired.partition, retired.owner_level)

    def progress(self) -> dict[str, ReadProgress]:
        with self._lock:
            states = dict(self._partitions)
        progress = {}
        for partition, state in states.items():
            receiver = state.receiver
            if receiver is None or receiver.last_enqueued_sequence is None:
                continue
            done = state.committed.sequence_number if state.committed else (state.next_sequence or 0) - 1
            progress[partition] = ReadProgress(
                done, receiver.last_enqueued_sequence, receiver.last_enqueued_time
            )
        return progress

    def enqueued_time(self, partition: str, sequence_number: int) -> datetime | None:
        with self._lock:
            state = self._partitions.get(partition)
            receiver = None if state is None else state.receiver
        return None if receiver is None else receiver.enqueued_time(sequence_number)

    def _write_ownership(self) -> None:
        view = OwnershipView(
            self._ownership_version,
            {
                p: SourcePartition(s.owner_level, s.next_sequence, draining=s.draining_since is not None)
                for p, s in self._partitions.items()
            },
        )
        write_ownership(self.scratch, view)

    def _report_spool(self) -> None:
        """The spool's depth: events received, not yet committed, over the partitions owned."""
        if self.metrics is None:
            return
        depth = 0
        with self._lock:
            for state in self._partitions.values():
                base = state.committed_next if state.committed_next is not None else state.next_sequence
                if base is not None and state.spooled_next is not None:
                    depth += max(0, state.spooled_next - base)
        self.metrics.set_spool(depth)

    def _has_room(self, partition: str, owner_level: int) -> bool:
        """Back-pressure: a partition is not read while its spool is `max_ahead` beyond what was committed
        (asked by the receiving thread before every turn: from memory, not the spool folder)."""
        with self._lock:
            state = self._partitions.get(partition)
            if state is None or state.owner_level != owner_level:
                return True
            base = state.committed_next if state.committed_next is not None else state.next_sequence
            spooled = state.spooled_next
        return base is None or spooled is None or spooled - base < self.max_ahead

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
            summary = process_batch(
                events,
                batch_id,
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
        if drained:
            self._report_spool()
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
        self._report_spool()
        for event in committed:
            self.notify(event)
        for partition, state in drained:
            spool.remove_epoch(self.spool_root, partition, state.owner_level)
            self.notify(Drained(partition, state.owner_level, state.committed))
        self._remove_retired(end.ownership_version)


def session_conf(spark: SparkSpec, sink: Sink | None, environ: Mapping[str, str]) -> dict[str, str]:
    """What the consumer's Spark session is configured with beyond its fixed settings: the jars beside
    PySpark's own (`HUBSHIFT_SPARK_JARS`: a folder `tools/spark-jars` fills; the image has them in PySpark's
    own jars), the Spark UI (off unless asked for), what the sink needs (Delta's extensions, hadoop-azure's
    settings), then the spec's own `spark.conf`. Secrets among them are redacted wherever Spark shows its
    settings (`REDACTION`)."""
    conf: dict[str, str] = {
        "spark.ui.enabled": "true" if spark.ui.enabled else "false",
        "spark.redaction.regex": REDACTION,
    }
    if spark.ui.enabled:
        conf["spark.ui.port"] = str(spark.ui.port)
    jars = environ.get(JARS_ENV)
    if jars:
        found = sorted(str(path) for path in Path(jars).glob("*.jar"))
        if not found:
            raise UserError(f"{JARS_ENV}={jars}: no jars there (tools/spark-jars fills such a folder)")
        # On the driver's own classpath (local mode: the executors too): JDBC's DriverManager and Delta's
        # classes are found by every class loader.
        conf["spark.driver.extraClassPath"] = ":".join(found)
    if sink is not None:
        conf.update(sink.spark_conf())
        check_jars(sink.describe(), sink.spark_conf(), jars)
    conf.update(spark.conf)
    return conf


# What a sink's Spark settings need on the classpath beside PySpark's own jars: (a word in the settings, the
# jars' file name prefixes, what they are).
NEEDED_JARS = (
    ("io.delta.", ("delta-spark_", "delta-storage-"), "Delta Lake's jars"),
    ("fs.azure.", ("hadoop-azure-",), "hadoop-azure"),
)


def check_jars(sink: str, settings: Mapping[str, str], jars: str | None) -> None:
    """A sink whose Spark settings need jars PySpark lacks (the image has them beside PySpark's own; on a
    machine `HUBSHIFT_SPARK_JARS` names a folder of them) is refused at start-up with one line that says
    where to get them, rather than with a class Spark cannot find at the first batch."""
    import pyspark

    folders = [Path(pyspark.__file__).parent / "jars", *([Path(jars)] if jars else [])]
    present = [path.name for folder in folders for path in folder.glob("*.jar")]
    text = " ".join([*settings, *settings.values()])
    for word, prefixes, what in NEEDED_JARS:
        if word in text and not all(any(n.startswith(p) for n in present) for p in prefixes):
            raise UserError(
                f"{sink} needs {what} beside PySpark's jars (the hubshift image has them): run "
                f"tools/spark-jars and set {JARS_ENV} to the folder it prints"
            )
