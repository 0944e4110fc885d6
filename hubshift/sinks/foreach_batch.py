"""The `foreachBatch` sink: your own `module:function(DataFrame, batch)`, as Spark's `foreachBatch` calls it,
with what Spark's does not give: exactly which events the DataFrame came from.

`batch` (a `Batch`) says, per Event Hubs partition, the range of sequence numbers the batch holds
(`ranges`), the hub and consumer group they come from (`scope`), and a stable `id` of those ranges: a batch
run again with the same ranges (after a failure) has the same id, so a write keyed by it is idempotent. A
replay after a crash can cut the events into other batches: delivery is at least once, and `ranges` (or the
event coordinates the transform keeps) is what tells a repeat. The consumer checkpoints only after the
function returned; an exception fails the batch, which runs again.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from hubshift.errors import UserError, one_line
from hubshift.sinks.base import RowSink, SinkContext, SinkKind, StreamBatch, Transform, WriterBatch
from hubshift.sinks.commits import WrittenFile
from hubshift.sinks.spark_writer import dead_letter_folder, rows_to_write
from hubshift.spec import Model
from hubshift.usercode import FUNCTION_REFERENCE, load_function

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Batch:
    """What your foreachBatch function is told of a batch besides its rows."""

    id: str  # stable for the same ranges (a streaming job's: the same query and batch): a key for idempotence
    batch_id: int  # Spark's micro-batch id (a streaming job's query's own, stable across its restarts)
    consumer: str
    scope: str  # namespace/hub/consumer group
    ranges: Mapping[str, tuple[int, int]]  # partition -> (first, last) sequence number; {} for a job's rows
    partition: str | None = None  # a streaming job's: the partition whose query wrote the batch


def batch_id_of(scope: str, ranges: Mapping[str, tuple[int, int]]) -> str:
    """A digest of the scope and the ranges: the same events, the same id."""
    text = scope + "|" + ";".join(f"{p}:{a}-{z}" for p, (a, z) in sorted(ranges.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ForeachBatchSinkSpec(Model):
    """Your module:function(DataFrame, batch), called once per micro-batch."""

    function: str = Field(
        pattern=FUNCTION_REFERENCE, description="module:function(DataFrame, batch) that writes a batch."
    )


class ForeachBatchSink(RowSink):
    name = "foreachBatch"

    def __init__(self, block: ForeachBatchSinkSpec, context: SinkContext) -> None:
        self.reference = block.function
        self.function = checked(load_function(block.function, "sink foreachBatch"), block.function)
        self.scope = context.scope
        self.dead_letters = dead_letter_folder("foreach-batch-dead-letters", context.dead_letter_path)

    def check(self, spark: SparkSession) -> None:
        return None  # the function was imported and its signature checked when the sink was built

    def describe(self) -> str:
        return f"foreachBatch {self.reference}"

    def spark_conf(self) -> dict[str, str]:
        return {}

    def write_batch(self, events: DataFrame, transform: Transform, batch: WriterBatch) -> list[WrittenFile]:
        frame, files = rows_to_write(transform(events), self.name, self.dead_letters)
        if frame is None:
            return files
        ranges = {p: (r.first_sequence_number, r.last_sequence_number) for p, r in batch.ranges.items()}
        told = Batch(batch_id_of(self.scope, ranges), batch.batch_id, batch.consumer_id, self.scope, ranges)
        try:
            self.function(frame, told)
        except Exception as error:
            raise UserError(f"foreachBatch {self.reference} failed: {one_line(error)}") from error
        rows = sum(r.events for r in batch.ranges.values())
        return [WrittenFile("output", self.name, self.reference, rows), *files]

    def write_stream_batch(self, frame: DataFrame, batch: StreamBatch) -> list[WrittenFile]:
        told = Batch(
            f"{batch.app_id}/{batch.batch_id}",
            batch.batch_id,
            batch.consumer_id,
            self.scope,
            {},
            batch.partition,
        )
        try:
            self.function(frame, told)
        except Exception as error:
            raise UserError(f"foreachBatch {self.reference} failed: {one_line(error)}") from error
        return [WrittenFile("output", self.name, self.reference, 0)]


def checked(function: Callable[..., Any], reference: str) -> Callable[..., Any]:
    """The function, if it takes (DataFrame, batch); `UserError` naming what is wrong otherwise."""
    try:
        signature = inspect.signature(function)
        signature.bind(None, None)
    except (TypeError, ValueError):
        raise UserError(
            f"foreachBatch {reference}: the function must take two arguments (DataFrame, batch)"
        ) from None
    # Called as foreachBatch calls it, these return at once without writing: the batch would be checkpointed
    # as written and its events lost.
    lazy = (inspect.iscoroutinefunction, inspect.isgeneratorfunction, inspect.isasyncgenfunction)
    if any(test(f) for test in lazy for f in (function, type(function).__call__)):
        raise UserError(
            f"foreachBatch {reference}: the function must write when called, as a plain function; an async "
            "function or a generator would return before writing anything"
        )
    return function


SINK = SinkKind[ForeachBatchSinkSpec](
    name="foreachBatch",
    annotation=ForeachBatchSinkSpec | None,
    field=Field(default=None, description="Your module:function(DataFrame, batch) (type foreachBatch)."),
    required="foreachBatch (the function)",
    build=ForeachBatchSink,
    update="any",
)
