"""What a pipeline is: a function from one micro-batch of events to named outputs and dead letters.

`process_batch` (hubshift/spark_app/batch.py) calls `prepare` once and caches its result, so a pipeline
parses each event once however many outputs read it; `transform` then derives everything from that frame.
Nothing is computed here: the frames are lazy, and the sink writes them in one Spark job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# A column a pipeline may add to its prepared frame or its output: a non-null value makes the row a dead
# letter with that reason.
DEAD_LETTER_REASON = "dead_letter_reason"


@dataclass(frozen=True)
class Output:
    """One named result. `directory` (a string column of `frame`) spreads rows into sub-folders, e.g.
    `window=20261121T100000Z`; it is not written into the rows themselves unless also a column."""

    frame: DataFrame
    directory: Column | None = None


@dataclass(frozen=True)
class PipelineResult:
    outputs: Mapping[str, Output]
    # Rows with the event's coordinates (partition, sequence_number, offset, enqueued_time,
    # partition_key), its body and `dead_letter_reason`; None when this pipeline never rejects events.
    dead_letters: DataFrame | None = None


class Pipeline(Protocol):
    """One module per pipeline (aggregate.py, function.py), built from the manifest by `build_pipeline`."""

    @property
    def name(self) -> str: ...

    def prepare(self, events: DataFrame) -> DataFrame:
        """A per-row (narrow) view of the event rows that keeps their columns: parsing, validation.
        `process_batch` caches it and reads each partition's sequence range from it."""
        ...

    def transform(self, prepared: DataFrame) -> PipelineResult: ...
