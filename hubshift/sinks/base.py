"""What a sink is (`Sink`: one interface every sink implements), and the one way the sinks that hubshift
writes as files (folder, blob) write a batch.

Every sink takes a micro-batch's events and a pipeline's transform and writes the transform's rows,
committing them, in one call (`Sink.write_batch`): a Delta table, Parquet or JSON files, a JDBC table, a
`foreachBatch` function, or JSON lines with a commit record in a folder or a Blob container. The sinks
hubshift writes as files have one capability more (`Sink.lines`, a `LineWriter`): a pipeline that works
on Arrow rows inside Spark's tasks (the aggregate, the replication patterns) writes its lines from those
tasks through a `TaskWriter` (each task its own share of a batch, one file per output and folder,
atomically, reporting the names back; nothing but those names reaches the driver), and the driver commits
the batch's record afterwards (`commits.py`). The pipeline's shape alone picks the path.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from hubshift.errors import UserError
from hubshift.sinks.commits import BatchRecord, PartitionRange, WrittenFile
from hubshift.sinks.layout import data_file, dead_letter_file, new_run
from hubshift.spec.kinds import Block, Kind, Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType


# The default variable of a sink's Azure Storage connection string (blob; delta, parquet, json at an Azure
# path).
DEFAULT_SINK_STORAGE_ENV = "HUBSHIFT_SINK_CONNECTION_STRING"

# Timestamps in every JSON line: UTC, milliseconds, `Z`.
JSON_OPTIONS = {"timeZone": "UTC", "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"}
DEAD_LETTER_OUTPUT = "dead-letter"

# A column of a FramePipeline's output: a non-null value makes the row a dead letter with that reason.
DEAD_LETTER_REASON = "dead_letter_reason"

# (output name, sub-folder or None) -> JSON lines
LineGroups = dict[tuple[str, str | None], list[str]]


@dataclass(frozen=True)
class Output:
    """One named result of a FramePipeline. `directory` (a string column of `frame`) spreads rows into
    sub-folders; it is not written into the rows themselves unless also a column."""

    frame: DataFrame
    directory: Column | None = None


@dataclass(frozen=True)
class PipelineResult:
    outputs: Mapping[str, Output]
    # Rows with the event's coordinates, its body and `dead_letter_reason`; None when there are none.
    dead_letters: DataFrame | None = None


def format_time(moment: datetime) -> str:
    """ISO 8601 in UTC with milliseconds and a `Z`: `2026-11-21T10:00:01.123Z`."""
    utc = moment.astimezone(UTC) if moment.tzinfo else moment
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


# Event columns (schema.py) as they appear in a dead letter.
_DEAD_LETTER_FIELDS = {
    "partition": "partition",
    "sequence_number": "sequenceNumber",
    "offset": "offset",
    "enqueued_time": "enqueuedTime",
    "partition_key": "partitionKey",
    "properties": "properties",
}


class ObjectStore(Protocol):
    """Named byte blobs under a root: a folder, or a Blob container and prefix. Instances are pickled to
    Spark's Python workers, so they hold configuration only and open clients lazily."""

    def put(self, name: str, data: bytes) -> None:
        """Write `name` whole, replacing it; readers see the old or the new content, never a part."""
        ...

    def get(self, name: str) -> bytes:
        """The content of `name`; `FileNotFoundError` when there is none."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Names starting with `prefix` (at any depth), sorted."""
        ...

    def ensure(self) -> None:
        """Create the folder or container if needed, so bad paths or credentials fail at start-up."""
        ...

    def describe(self) -> str:
        """Where this is, for messages (never a secret)."""
        ...


class TaskWriter(Protocol):
    """Writes one Spark task's lines of one batch; pickled to the Python workers."""

    def write(self, outputs: LineGroups, dead_letters: list[str], task: int) -> list[WrittenFile]: ...


class LineWriter(Protocol):
    """What a sink hubshift writes as files can do besides `Sink`: take the lines Spark's tasks write (a
    task pipeline's), then the batch's commit record from the driver."""

    def task_writer(self, stem: str, when: datetime) -> TaskWriter:
        """What Spark tasks use to write batch `stem` (processed at `when`)."""
        ...

    def commit(self, record: BatchRecord) -> None:
        """Record the batch as complete; only committed batches are part of the output."""
        ...


@dataclass(frozen=True)
class WriterBatch:
    """One micro-batch as a sink sees it: its id, its consumer, its stem (unique per consumer run and
    batch), when it was processed, the pipeline that made its rows, and per Event Hubs partition the range
    of sequence numbers it holds (before a replay's already written events are left out)."""

    batch_id: int
    consumer_id: str
    stem: str
    when: datetime
    ranges: Mapping[str, PartitionRange]
    pipeline: str = ""


Transform = Callable[["DataFrame"], PipelineResult]


@dataclass(frozen=True)
class StreamBatch:
    """One micro-batch of a streaming job's query (one partition's): `app_id` names the query's checkpoint,
    `batch_id` is Spark's (a batch run again after a crash or on the partition's next owner has the same
    id, and the same rows); `output_mode` and `key_columns` are the job's."""

    app_id: str
    batch_id: int
    partition: str
    consumer_id: str
    when: datetime
    output_mode: str = "append"
    key_columns: tuple[str, ...] = ()


@runtime_checkable
class Sink(Protocol):
    """Where a consumer's rows go: one module per sink, built from the manifest by `build_sink`. It takes a
    batch's events and the pipeline's transform, leaves out what a replay finds already written (as far as
    the sink allows), writes the transform's rows and commits, in one call (`write_batch`). What it wrote
    is reported as `WrittenFile`s (one per output, with its row count)."""

    name: str
    # This process's run, part of every batch's stem (a batch id is Spark's, new at each query start).
    run: str

    def write_batch(self, events: DataFrame, transform: Transform, batch: WriterBatch) -> list[WrittenFile]:
        """Write the batch; when this returns, every event of `batch.ranges` is durably in the sink (or was,
        before a replay), so the consumer may checkpoint past them. Raises when nothing was committed."""
        ...

    def describe(self) -> str: ...

    def spark_conf(self) -> Mapping[str, str]:
        """What the consumer's Spark session needs for this sink (Delta's extensions, hadoop-azure's
        settings as `spark.hadoop.*`); nothing for most."""
        ...

    def check(self, spark: SparkSession) -> None:
        """At start-up, before anything is claimed: the sink is there and writable (`UserError`, one line
        naming what to fix)."""
        ...

    @property
    def lines(self) -> LineWriter | None:
        """The sink's writer of lines from Spark's tasks, for a task pipeline (None: it takes rows only)."""
        ...

    def write_stream_batch(self, frame: DataFrame, batch: StreamBatch) -> list[WrittenFile]:
        """Write one micro-batch of a streaming job's rows, once: a batch of the same query and id written
        before (a restart, the partition's next owner running it again) writes nothing more."""
        ...


class FileTaskWriter:
    def __init__(self, store: ObjectStore, dead_letter_store: ObjectStore, stem: str, when: datetime) -> None:
        self.store = store
        self.dead_letter_store = dead_letter_store
        self.stem = stem
        self.when = when

    def write(self, outputs: LineGroups, dead_letters: list[str], task: int) -> list[WrittenFile]:
        written: list[WrittenFile] = []
        for (output, directory), lines in outputs.items():
            if lines:
                name = data_file(output, directory, self.stem, task)
                self.store.put(name, _encode(lines))
                written.append(WrittenFile("output", output, name, len(lines)))
        if dead_letters:
            name = dead_letter_file(self.when, self.stem, task)
            self.dead_letter_store.put(name, _encode(dead_letters))
            written.append(WrittenFile("dead-letter", DEAD_LETTER_OUTPUT, name, len(dead_letters)))
        return written


class FileSink:
    """The sink hubshift writes as files (`folder`, `blob`): JSON lines in `store` with a commit record per
    batch, dead letters in `dead_letter_store`; a task pipeline's lines come from Spark's tasks (`lines`)."""

    def __init__(
        self,
        store: ObjectStore,
        dead_letter_store: ObjectStore,
        run: str | None = None,
        *,
        name: str = "folder",
    ) -> None:
        self.name = name
        self.store = store
        self.dead_letter_store = dead_letter_store
        self.run = run or new_run()

    def describe(self) -> str:
        return self.store.describe()

    def spark_conf(self) -> Mapping[str, str]:
        return {}

    def check(self, spark: SparkSession) -> None:
        return None  # its stores were made (or refused) when it was built

    @property
    def lines(self) -> FileSink:
        return self

    def task_writer(self, stem: str, when: datetime) -> FileTaskWriter:
        return FileTaskWriter(self.store, self.dead_letter_store, stem, when)

    def write_stream_batch(self, frame: DataFrame, batch: StreamBatch) -> list[WrittenFile]:
        raise UserError(f"sink {self.name} takes no streaming job's rows (the manifest's rules say which do)")

    def write_batch(self, events: DataFrame, transform: Transform, batch: WriterBatch) -> list[WrittenFile]:
        """The transform's rows as JSON lines (one Spark job), then the batch's commit record."""
        files = self.write(transform(events), batch.stem, batch.when)
        self.commit(commit_record(batch, self.run, files))
        return files

    def write(self, result: PipelineResult, stem: str, when: datetime) -> list[WrittenFile]:
        """A pipeline result's outputs and dead letters as files (one Spark job): the files written."""
        from pyspark.sql import functions as F

        frames: list[DataFrame] = []
        for output, spec in result.outputs.items():
            directory = spec.directory if spec.directory is not None else F.lit(None).cast("string")
            line = F.to_json(F.struct(*(column(c) for c in spec.frame.columns)), JSON_OPTIONS)
            frames.append(
                spec.frame.select(
                    F.lit(False).alias("dead"),
                    F.lit(output).alias("output"),
                    directory.alias("directory"),
                    line.alias("line"),
                )
            )
        if result.dead_letters is not None:
            frames.append(
                result.dead_letters.select(
                    F.lit(True).alias("dead"),
                    F.lit(DEAD_LETTER_OUTPUT).alias("output"),
                    F.lit(None).cast("string").alias("directory"),
                    dead_letter_line(result.dead_letters).alias("line"),
                )
            )
        if not frames:
            return []
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        task = WriteTask(self.task_writer(stem, when))
        return sorted(files_from_rows(union.mapInArrow(task, WRITTEN_SCHEMA).collect()), key=_file_order)

    def commit(self, record: BatchRecord) -> None:
        self.store.put(record.name, record.to_json())


WRITTEN_SCHEMA = "destination string, output string, name string, rows long"


# This process's run: a sink Spark writes names its batches `<consumer>-<run>-<batch id>`.
PROCESS_RUN = new_run()


class RowSink:
    """What the sinks that take a DataFrame pipeline's rows only (Spark writes them) share: the process's
    run, and no writer of lines."""

    run = PROCESS_RUN
    lines: LineWriter | None = None


def commit_record(batch: WriterBatch, run: str, files: Sequence[WrittenFile]) -> BatchRecord:
    """The record that commits a batch's files to a sink hubshift writes as files."""
    return BatchRecord(
        consumer_id=batch.consumer_id,
        run=run,
        batch_id=batch.batch_id,
        stem=batch.stem,
        pipeline=batch.pipeline,
        committed_at=batch.when,
        partitions=tuple(batch.ranges[p] for p in sorted(batch.ranges, key=partition_order)),
        files=tuple(files),
    )


def partition_order(partition: str) -> tuple[int, str]:
    """Event Hubs partition ids in numeric order where they are numbers."""
    return (int(partition), "") if partition.isdigit() else (1 << 62, partition)


def written_batch(files: list[WrittenFile]) -> pa.RecordBatch:
    import pyarrow as pa

    return pa.RecordBatch.from_pydict(
        {
            "destination": [f.destination for f in files],
            "output": [f.output for f in files],
            "name": [f.name for f in files],
            "rows": [f.rows for f in files],
        },
        schema=pa.schema(
            [
                ("destination", pa.string()),
                ("output", pa.string()),
                ("name", pa.string()),
                ("rows", pa.int64()),
            ]
        ),
    )


def files_from_rows(rows: Iterable[Any]) -> list[WrittenFile]:
    return [WrittenFile(r["destination"], r["output"], r["name"], int(r["rows"])) for r in rows]


def _file_order(file: WrittenFile) -> tuple[str, str, str]:
    return (file.destination, file.output, file.name)


def column(name: str) -> Column:
    """A column by name, whatever characters the name holds."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def dead_letter_line(frame: DataFrame) -> Column:
    """The dead-letter line of each row of a frame with `dead_letter_reason`; its columns other than the
    event's go under `record`."""
    from pyspark.sql import functions as F

    types = {field.name: field.dataType for field in frame.schema.fields if field.name != DEAD_LETTER_REASON}
    rest = [name for name in types if name not in _DEAD_LETTER_FIELDS and name != "body"]
    return dead_letter_json(types, F.col(DEAD_LETTER_REASON), rest)


def dead_letter_json(types: Mapping[str, DataType], reason: Column, rest: Sequence[str] = ()) -> Column:
    """One JSON dead letter: the event's coordinates (those of `types` present), the reason, the body (as
    text when it is UTF-8, else base64) and the `rest` columns under `record`."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    fields: list[Column] = [
        column(name).alias(alias) for name, alias in _DEAD_LETTER_FIELDS.items() if name in types
    ]
    fields.append(reason.alias("reason"))
    if "body" in types:
        if isinstance(types["body"], BinaryType):
            text = F.try_validate_utf8(F.col("body").cast("string"))
            fields.append(text.alias("body"))
            fields.append(F.when(text.isNull(), F.base64("body")).alias("bodyBase64"))
        else:
            fields.append(F.col("body").alias("body"))
    if rest:
        fields.append(F.struct(*(column(name) for name in rest)).alias("record"))
    return F.to_json(F.struct(*fields), JSON_OPTIONS)


def dead_letter_text(event: Mapping[str, Any], reason: str) -> str:
    """`dead_letter_json`'s line for one event row (a dict in the event schema), built in Python: the same
    fields in the same order, nulls left out, times in UTC with milliseconds."""
    document: dict[str, Any] = {}
    for name, alias in _DEAD_LETTER_FIELDS.items():
        value = event.get(name)
        if value is None:
            continue
        if isinstance(value, datetime):
            value = format_time(value)
        elif name == "properties":
            value = dict(value)  # Arrow gives a map as (key, value) pairs
        document[alias] = value
    document["reason"] = reason
    body = event.get("body")
    if body is not None:
        try:
            document["body"] = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            document["bodyBase64"] = base64.b64encode(body).decode("ascii")
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


class WriteTask:
    """Runs in each Spark task of `FileSink.write`: groups the task's lines and writes them."""

    def __init__(self, writer: TaskWriter) -> None:
        self.writer = writer

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        lines: dict[tuple[bool, str, str | None], list[str]] = {}
        for batch in batches:
            _group_lines(batch, lines)
        outputs: LineGroups = {}
        dead: list[str] = []
        for (is_dead, output, directory), group in lines.items():
            if is_dead:
                dead.extend(group)
            else:
                outputs[(output, directory)] = group
        yield written_batch(self.writer.write(outputs, dead, task))


def _group_lines(batch: pa.RecordBatch, into: dict[tuple[bool, str, str | None], list[str]]) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return
    keys = ["dead", "output", "directory"]
    distinct = pa.Table.from_batches([batch.select(keys)]).group_by(keys).aggregate([]).to_pylist()
    for key in distinct:
        dead, output, directory = bool(key["dead"]), str(key["output"]), key["directory"]
        if len(distinct) == 1:
            selected = batch.column("line")
        else:
            same_directory = (
                pc.is_null(batch.column("directory"))
                if directory is None
                else pc.fill_null(pc.equal(batch.column("directory"), directory), False)
            )
            mask = pc.and_(
                pc.and_(pc.equal(batch.column("dead"), dead), pc.equal(batch.column("output"), output)),
                same_directory,
            )
            selected = pc.filter(batch.column("line"), mask)
        into.setdefault((dead, output, directory), []).extend(selected.to_pylist())


def _encode(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def sink_summary(files: list[WrittenFile]) -> tuple[Mapping[str, int], int]:
    """Rows written per output, and dead letters written."""
    outputs: dict[str, int] = {}
    dead = 0
    for file in files:
        if file.destination == "dead-letter":
            dead += file.rows
        else:
            outputs[file.output] = outputs.get(file.output, 0) + file.rows
    return outputs, dead


# --- how a manifest declares a sink ------------------------------------------------------------------


@dataclass(frozen=True)
class PodVolume:
    """What a sink needs mounted in a consumer pod at `mount_path`: an existing claim (`claim_name`), a claim
    per pod from a template (`size`, `storage_class_name`), or neither: an emptyDir, gone with the pod."""

    mount_path: str
    claim_name: str | None = None
    size: str | None = None
    storage_class_name: str | None = None


def no_volume(block: Any, dead_letter_path: str | None, work_dir: str) -> PodVolume | None:
    return None


@dataclass(frozen=True)
class SinkContext:
    """What building a sink may use besides its block: the environment connection strings come from, where
    the block is (messages), where its dead letters go (`deadLetterPath`, or its default), the hub and
    consumer group the events come from (`scope`: the identity of its writes, so two pools never take each
    other's progress for their own), and whether to make its folders or container now (`check`: a bad path
    or credential fails at start-up, in one line)."""

    environ: Mapping[str, str]
    location: Location
    dead_letter_path: str | None
    scope: str = ""
    check: bool = True


Stores = Callable[[Any, str | None, Mapping[str, str], Location], tuple[ObjectStore, ObjectStore]]


def file_sink(name: str, stores: Stores) -> Callable[[Any, SinkContext], FileSink]:
    """How a sink hubshift writes as files is built: its stores (results and commit records, dead letters),
    made at start-up when asked."""

    def build(block: Any, context: SinkContext) -> FileSink:
        store, dead_letters = stores(block, context.dead_letter_path, context.environ, context.location)
        if context.check:
            store.ensure()
            dead_letters.ensure()
        return FileSink(store, dead_letters, name=name)

    return build


@dataclass(frozen=True, kw_only=True)
class SinkKind(Kind[Block]):
    """A sink type as a manifest names it (`spec.consumer.sink.type`, a `Kind`), with what the parts need of
    it besides its block and connections: `build(block, context)`: the `Sink`; `stores(block,
    dead_letter_path, environ, location)`, for a sink hubshift writes as files: where results and commit
    records go and where dead letters go (it takes any pipeline's lines, and the output's readers and the
    editor's state use the same stores); `volume(block, dead_letter_path, work_dir)`: what a pod must mount
    (`UserError` for a configuration no pod can write); `update`: how it takes a streaming job's output mode
    update (`keyed`: an upsert by the job's key columns; `any`: its function does what it does; None: it
    takes append only)."""

    build: Callable[[Block, SinkContext], Sink]
    stores: Stores | None = None
    volume: Callable[[Block, str | None, str], PodVolume | None] = no_volume
    update: Literal["keyed", "any"] | None = None

    @property
    def writes_lines(self) -> bool:
        """Whether it takes a task pipeline's lines too (a sink hubshift writes as files), not only rows."""
        return self.stores is not None
