"""The `stream` pipeline: your streaming job, `module:function(events) -> DataFrame` on a *streaming*
DataFrame, so that Spark's stateful operators work as they do in any Structured Streaming query: watermarks
and windowed aggregations, `dropDuplicatesWithinWatermark`, stream-static joins, `transformWithState` and
`applyInPandasWithState`.

Each partition a consumer owns is one streaming query of its own (`consumer/spark/streams.py`), over that
partition's events (the columns of `eventhubs/rows.py`), with its own Spark checkpoint (its offsets and its
state) in durable storage: `state.path`, or by default beside the checkpoint store (a Blob container's
account through hadoop-azure, a SQLite store's folder). When a partition moves to another consumer, its
query starts there from that checkpoint: the state follows the partition. The query's output rows go to the
sink in the output mode asked for (`append`, or `update` with the rows' key columns), each micro-batch
written once whatever the restarts (the sink's write is idempotent per query and batch).

The module must be importable by the consumer; a reference that cannot be imported, a function that does
not return a streaming DataFrame, or an output mode the query cannot use fails when the partition's query
starts, with one line naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from pydantic import Field

from hubshift.azure_storage import parse_connection_string
from hubshift.errors import UserError, one_line
from hubshift.pipelines.base import BuildContext, Location, PipelineKind
from hubshift.sinks.spark_writer import AzurePathSpec, hadoop_settings, path_connections
from hubshift.spec import CheckpointStoreSpec, Model, NamedConnection
from hubshift.usercode import FUNCTION_REFERENCE, load_function

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEFAULT_STATE_ENV = "HUBSHIFT_STATE_CONNECTION_STRING"
JOB_NAME = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
UserStream = Callable[["DataFrame"], "DataFrame"]


class StatePathSpec(AzurePathSpec):
    """Where each partition's Spark checkpoint (its offsets and its state) lives: a folder every consumer
    pod reaches (a shared volume) or Azure storage over ABFS, with an Azure path's connection string or
    credential."""

    DEFAULT_VARIABLE = DEFAULT_STATE_ENV


class StreamJobSpec(Model):
    """Your streaming job (type stream): a function from the partition's streaming events to the streaming
    rows the sink writes, its state in a Spark checkpoint per partition that follows the partition."""

    function: str = Field(
        pattern=FUNCTION_REFERENCE,
        description="module:function taking the events as a streaming DataFrame and returning one.",
    )
    output_mode: Literal["append", "update"] = Field(
        default="append",
        description="append: rows once final (a window after its watermark); update: rows as they change, "
        "upserted by keyColumns (delta, jdbc) or handed to your foreachBatch function.",
    )
    key_columns: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="The columns that identify an output row, for update mode into delta or jdbc.",
    )
    name: str = Field(
        default="stream",
        pattern=JOB_NAME,
        description="Names the job's state: a new name starts every partition's state afresh.",
    )
    state: StatePathSpec | None = Field(
        default=None,
        description="Where each partition's checkpoint and state live (default: beside the checkpoint "
        "store, under hubshift-state/).",
    )


class StreamPipelineError(UserError):
    """The job's function failed, or did not return a streaming DataFrame."""


class StreamPipeline:
    """The job: its function, applied to a partition's streaming events when its query starts."""

    name = "stream"

    def __init__(self, block: StreamJobSpec, function: UserStream | None = None) -> None:
        self.block = block
        self.reference = block.function
        self.function = function if function is not None else load_function(block.function, "stream function")

    def prepare(self, events: DataFrame) -> DataFrame:
        return events

    def stream(self, events: DataFrame) -> DataFrame:
        """The job's streaming rows for one partition's streaming events."""
        from pyspark.sql import DataFrame

        try:
            result = self.function(events)
        except Exception as exc:
            raise StreamPipelineError(f"stream function {self.reference} failed: {one_line(exc)}") from exc
        if not isinstance(result, DataFrame):
            raise StreamPipelineError(
                f"stream function {self.reference} returned {type(result).__name__}, expected a streaming "
                "DataFrame"
            )
        if not result.isStreaming:
            raise StreamPipelineError(
                f"stream function {self.reference} returned a batch DataFrame: return the events' streaming "
                "DataFrame, transformed (a join with a table is fine: the stream's side stays streaming)"
            )
        missing = [c for c in self.block.key_columns if c not in result.columns]
        if missing:
            raise StreamPipelineError(
                f"stream.keyColumns: {', '.join(missing)} not among the columns {self.reference} returns "
                f"({', '.join(result.columns)})"
            )
        return result


STATE_FOLDER = "hubshift-state"


@dataclass(frozen=True)
class StateRoot:
    """Where a job's partitions keep their Spark checkpoints: `path`, and the settings hadoop-azure reaches
    it with (an Azure path's; none for a folder)."""

    path: str
    settings: Mapping[str, str] = field(default_factory=dict, repr=False)

    def of(self, scope: str, name: str, partition: str) -> str:
        """One partition's checkpoint: `<root>/<namespace>/<hub>/<consumer group>/<job name>/<partition>`."""
        return "/".join([self.path.rstrip("/"), *scope.lower().split("/"), name, partition])


def state_root(
    job: StreamJobSpec, store: CheckpointStoreSpec, environ: Mapping[str, str], location: Location
) -> StateRoot:
    """Where the job's state lives: `state.path`, or beside the checkpoint store: its Blob container's
    account through hadoop-azure (`abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/hubshift-state`, with the
    store's connection string or credential; `abfs://` for an emulator's plain-http endpoint), or a folder
    beside its SQLite file."""
    if job.state is not None:
        named = path_connections(job.state, (*location, "state"))
        resolved = named[0].resolve(environ) if named else None
        settings = {} if resolved is None else hadoop_settings(job.state.path, resolved, environ)
        return StateRoot(job.state.path, settings)
    if store.sqlite is not None:
        return StateRoot(str(Path(store.sqlite.path).absolute().parent / STATE_FOLDER))
    assert store.blob is not None  # the model has one or the other
    named = store.connections(("spec", "checkpointStore"), "store")
    resolved = named[0].resolve(environ)
    if resolved.connection_string is not None:
        account = parse_connection_string(resolved.connection_string, resolved.variable or "the store")
        scheme, name = ("abfss" if account.secure else "abfs"), account.name
    else:
        assert store.blob.account_url is not None  # the model requires it with a credential
        scheme, name = "abfss", urlsplit(store.blob.account_url).hostname.split(".")[0]  # type: ignore[union-attr]
    path = f"{scheme}://{store.blob.container}@{name}.dfs.core.windows.net/{STATE_FOLDER}"
    return StateRoot(path, hadoop_settings(path, resolved, environ))


def _connections(block: StreamJobSpec, location: Location) -> list[NamedConnection]:
    return [] if block.state is None else path_connections(block.state, (*location, "state"))


def _build(block: StreamJobSpec, context: BuildContext) -> StreamPipeline:
    return StreamPipeline(block)


PIPELINE = PipelineKind[StreamJobSpec](
    name="stream",
    annotation=StreamJobSpec | None,
    field=Field(
        default=None,
        description="Your streaming job (type stream): its function, output mode and where its state lives.",
    ),
    required="stream (its function)",
    build=_build,
    connections=_connections,
    shape="stream",
)
