"""The `events` pipeline: the events as they are, for a sink that writes them (a Delta table of the raw
events, Parquet files, your foreachBatch function): the event row columns (`hubshift/eventhubs/rows.py`:
partition, sequence_number, offset, enqueued_time, partition_key, body, properties), nothing changed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from hubshift.pipelines.base import BuildContext, Output, PipelineKind, PipelineResult

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

OUTPUT = "events"


class EventsPipeline:
    name = "events"

    def prepare(self, events: DataFrame) -> DataFrame:
        return events

    def transform(self, prepared: DataFrame) -> PipelineResult:
        return PipelineResult(outputs={OUTPUT: Output(prepared)})


def _build(block: object, context: BuildContext) -> EventsPipeline:
    return EventsPipeline()


PIPELINE = PipelineKind[object](
    name="events",
    annotation=bool | None,
    field=Field(default=None, description="Nothing to set (type events: the events as they are)."),
    build=_build,
    shape="frames",
)
