"""The `delta` sink: a Delta Lake table, every event in exactly one committed row.

Each micro-batch is one Delta commit that carries, beside the data files, one transaction identifier per
Event Hubs partition it holds (Delta's `SetTransaction`, the action its own streaming sink writes):
`appId` = `hubshift/<namespace>/<hub>/<consumer group>/<partition>`, `version` = the last sequence number
of that partition the commit adds. Before writing, the batch reads those versions in the same transaction
and leaves out every event at or below them: a batch run again after a crash, a partition read again by its
next owner from an older checkpoint, a replay whose batch boundaries differ, all find their events already
committed. Delta's optimistic concurrency fails a commit whose transaction identifiers another commit changed
meanwhile (a deposed owner still finishing), and the batch is tried again against the new versions; blind
appends of other partitions never conflict.

Delta's public writer takes one transaction identifier per write, so the commit goes through its
transaction API (`DeltaLog.startTransaction`, `writeFiles`, `commit`) over py4j: internal, and pinned with
Delta Lake 4.4.0 for Spark 4.2 (`tools/spark-jars`). The table is created on the first batch with the
block's `partitionBy`; with `options.mergeSchema: "true"` a new column of the transform's rows is added to
the table (a schema commit of its own) before the batch's commit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from hubshift.errors import UserError, one_line
from hubshift.sinks import spark_writer
from hubshift.sinks.base import SinkContext, SinkKind, StreamBatch, Transform, WriterBatch
from hubshift.sinks.commits import WrittenFile
from hubshift.sinks.spark_writer import PathSink, SparkPathSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# What a Spark session needs for Delta Lake (its jars are on the classpath: tools/spark-jars).
SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Reading a table's snapshot before each commit shuffles into 50 tasks by default; a consumer commits
    # small batches often, and one task makes each commit about five times cheaper (bench notes in
    # docs/consumer.md, "Your own job"). A user's spark.conf may still set it.
    "spark.databricks.delta.snapshotPartitions": "1",
}
# A commit that lost to another one on the same partitions is tried again this many times in all.
COMMIT_ATTEMPTS = 3
# Delta's answers to a commit that lost a race, each safe to try again from a fresh snapshot (the high-water
# marks are read again): another writer of the same partitions (a deposed owner still finishing), and two
# consumers creating the table at once (the later one's first commit finds the protocol and metadata the
# other set).
CONFLICTS = (
    "ConcurrentTransactionException",
    "ProtocolChangedException",
    "MetadataChangedException",
    "ConcurrentAppendException",
)


def lost_a_race(error: BaseException) -> bool:
    """Whether a commit failed because another commit came first (Delta's conflict checks)."""
    text = str(error)
    return any(name in text for name in CONFLICTS)


class DeltaSinkSpec(SparkPathSpec):
    """A Delta Lake table: every event in exactly one committed row (see `docs/consumer.md`, "Your own
    job")."""


class DeltaSink(PathSink):
    name = "delta"

    def __init__(self, block: DeltaSinkSpec, context: SinkContext) -> None:
        super().__init__(block, context)
        self.path = block.path
        self.scope = context.scope

    def describe(self) -> str:
        return f"Delta table {self.path}"

    def spark_conf(self) -> dict[str, str]:
        return {**SESSION_CONF, **self.hadoop_conf()}

    def app_id(self, partition: str) -> str:
        return f"hubshift/{self.scope}/{partition}"

    def _retrying(self) -> Retrying:
        def again(state: RetryCallState) -> None:
            log.info("%s: another commit came first; trying again from the table's new version", self.path)

        return Retrying(
            stop=stop_after_attempt(COMMIT_ATTEMPTS),
            retry=retry_if_exception(lost_a_race),
            before_sleep=again,
            reraise=True,
        )

    def write_batch(self, events: DataFrame, transform: Transform, batch: WriterBatch) -> list[WrittenFile]:
        return self._retrying()(self._commit, events, transform, batch)

    def write_stream_batch(self, frame: DataFrame, batch: StreamBatch) -> list[WrittenFile]:
        """A streaming job's micro-batch: one commit carrying a transaction identifier of the query
        (`hubshift/stream/<query id>`) whose version is the batch id, so a batch run again finds itself
        written. Append mode adds the rows; update mode merges them by the job's key columns (Delta's
        MERGE, made idempotent by the same identifier through its session settings)."""
        return self._retrying()(self._commit_stream, frame, batch)

    def _commit_stream(
        self, frame: DataFrame, batch: StreamBatch, *, again: bool = False
    ) -> list[WrittenFile]:
        app = f"hubshift/stream/{batch.app_id}"
        table = _Table(frame.sparkSession, self.path)
        transaction = table.start()
        if int(transaction.txnVersion(app)) >= batch.batch_id:
            return []  # written before: a restart, or the partition's next owner running it again
        if table.needs_schema(transaction, frame, self.block):
            if again:
                raise UserError(f"Delta table {self.path}: its schema did not take the rows' columns")
            spark_writer.configured_writer(frame.limit(0), "delta", self.block).save(self.path)
            return self._commit_stream(frame, batch, again=True)
        if batch.output_mode == "update":
            rows = merge_rows(frame, self.path, batch.key_columns, app, batch.batch_id)
            return [WrittenFile("output", self.name, f"{self.path} (merged)", rows)]
        actions = table.write_files(transaction, frame)
        rows = table.rows(actions)
        actions.add(table.set_transaction(app, batch.batch_id))
        version = table.commit(transaction, actions)
        return [WrittenFile("output", self.name, f"{self.path}@v{version}", rows)]

    def _commit(
        self, events: DataFrame, transform: Transform, batch: WriterBatch, *, again: bool = False
    ) -> list[WrittenFile]:
        table = _Table(events.sparkSession, self.path)
        transaction = table.start()
        written = {p: int(transaction.txnVersion(self.app_id(p))) for p in batch.ranges}
        todo = spark_writer.to_write(batch.ranges, written)
        if not todo:
            return []  # a replay: everything this batch holds is in the table already
        result = transform(spark_writer.not_yet_written(events, {p: v for p, v in written.items() if v >= 0}))
        frame, files = spark_writer.rows_to_write(result, self.name, self.dead_letters)
        if frame is not None and table.needs_schema(transaction, frame, self.block):
            if again:
                raise UserError(f"Delta table {self.path}: its schema did not take the rows' columns")
            # Create the table (partitioned as the block says), or add the rows' new columns: a commit of
            # its own; then the whole batch again on the new schema, its high-water marks read afresh (a
            # commit made meanwhile would not conflict with a transaction that starts after it).
            spark_writer.configured_writer(frame.limit(0), "delta", self.block).save(self.path)
            return self._commit(events, transform, batch, again=True)
        actions = table.write_files(transaction, frame) if frame is not None else table.empty_actions()
        rows = table.rows(actions)
        for partition, last in todo.items():
            actions.add(table.set_transaction(self.app_id(partition), last))
        version = table.commit(transaction, actions)
        return [WrittenFile("output", self.name, f"{self.path}@v{version}", rows), *files]


def merge_rows(frame: DataFrame, path: str, keys: Sequence[str], app: str, version: int) -> int:
    """Upsert the rows into the table by their keys (Delta's MERGE), skipped by Delta when the table already
    holds a commit of `app` at `version` or later: the settings that make it so are set on the batch's own
    session (a streaming query's is a copy of the consumer's: other queries' batches never see them)."""
    from delta.tables import DeltaTable  # lazy: PySpark loads only in a consumer

    spark = frame.sparkSession
    condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)
    spark.conf.set("spark.databricks.delta.write.txnAppId", app)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(version))
    try:
        rows = frame.count()
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(frame.alias("s"), condition)
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")
    return rows


class _Table:
    """One Delta table through Delta's transaction API (py4j)."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        jvm: Any = spark._jvm
        self.jvm = jvm
        self.log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        self.converters = jvm.scala.jdk.javaapi.CollectionConverters
        self.path = path

    def start(self) -> Any:
        """A transaction on the table's latest version (-1: the table does not exist yet)."""
        return self.log.startTransaction()

    def needs_schema(self, transaction: Any, frame: DataFrame, block: SparkPathSpec) -> bool:
        """Whether the table must be created, or widened with the frame's new columns, first."""
        if int(transaction.readVersion()) < 0:
            return True
        current = set(transaction.metadata().schema().fieldNames())
        new = [name for name in frame.columns if name not in current]
        if not new:
            return False
        if block.options.get("mergeSchema", "").lower() != "true":
            raise UserError(
                f"Delta table {self.path}: the rows have columns the table lacks ({', '.join(new)}); set "
                'options.mergeSchema: "true" to add them, or change the transform'
            )
        return True

    def write_files(self, transaction: Any, frame: DataFrame) -> Any:
        try:
            written = transaction.writeFiles(frame._jdf)
        except Exception as error:
            raise UserError(
                f"Delta table {self.path}: writing the batch failed: {one_line(error)}"
            ) from error
        return self.jvm.java.util.ArrayList(self.converters.asJava(written))

    def empty_actions(self) -> Any:
        return self.jvm.java.util.ArrayList()

    def set_transaction(self, app_id: str, version: int) -> Any:
        now = self.jvm.scala.Some(int(time.time() * 1000))
        return self.jvm.org.apache.spark.sql.delta.actions.SetTransaction(app_id, version, now)

    def rows(self, actions: Any) -> int:
        """The rows the data files hold (from their statistics)."""
        total = 0
        for action in actions:
            stats = action.stats()
            if stats:
                total += int(json.loads(stats).get("numRecords", 0))
        return total

    def commit(self, transaction: Any, actions: Any) -> int:
        none = self.jvm.scala.Option.empty()
        append = self.jvm.org.apache.spark.sql.SaveMode.Append
        operation = getattr(self.jvm.org.apache.spark.sql.delta, "DeltaOperations$Write")(
            append, *([none] * 8)
        )
        return int(transaction.commit(self.converters.asScala(actions).toList(), operation))


SINK = SinkKind[DeltaSinkSpec](
    name="delta",
    annotation=DeltaSinkSpec | None,
    field=Field(
        default=None, description="A Delta Lake table (type delta): every event in one committed row."
    ),
    required="delta (the table's path)",
    connections=spark_writer.path_connections,
    build=DeltaSink,
    update="keyed",
)
