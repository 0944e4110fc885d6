"""What a pipeline is: how a manifest declares it (`PipelineKind`), and a function from one micro-batch of
events to named outputs and dead letters.

Each pipeline module declares one `PipelineKind`: its block's model, the connections it makes, its start-up
check and how it is built; `registry.PIPELINES` lists them, and the manifest's `PipelineSpec`, the CRD, the
consumer and the operator's renderer all read that list. Adding a pipeline is its module and one line there.

What is built has one of two shapes, chosen by what the pipeline needs (`process_batch` runs either):

- `TaskPipeline` (the aggregate, replicate): `prepare` is a narrow projection in the JVM (theirs are the
  event rows as they are), then each Spark task hands its rows to `process_task` as Arrow and gets back the
  lines to write. One Event Hubs partition is one input partition and a home's events stay in its
  partition, so per-task partial counts are complete partials: no shuffle, no cache, one Spark job per
  batch that reads each event once.
- `FramePipeline` (a user's function): any DataFrame in, any DataFrame out. The batch is cached, since
  both the pipeline and the sequence ranges read it, and the sink writes the result in a second job.
- `EditingPipeline` (an editor with steps Spark runs, a route with SQL conditions): a TaskPipeline whose
  events first go through `edit`, which may drop, add or reshape rows and may fail on an event. The batch
  is cached, its ranges read from the events themselves, and an event `edit` fails on is isolated as a
  FramePipeline's poison event is.

Every prepared frame keeps the event coordinates (`partition`, `sequence_number`, `offset`,
`enqueued_time`), from which `process_batch` reports what the batch covered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from hubshift.sinks.base import DEAD_LETTER_REASON, LineGroups, Output, PipelineResult
from hubshift.spec.kinds import Block, Kind, Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from hubshift.pipelines.steps import EditorStepSpec
    from hubshift.sinks.base import ObjectStore

# A column of a TaskPipeline's prepared frame: the whole dead-letter JSON line, null for a good event.
DEAD_LETTER_LINE = "dead_letter_line"


@dataclass
class TaskResult:
    """What one Spark task of a TaskPipeline writes."""

    outputs: LineGroups = field(default_factory=dict)
    dead_letters: list[str] = field(default_factory=list)


class Pipeline(Protocol):
    """One module per pipeline (aggregate.py, function.py, replicate.py), built from the manifest by
    `build_pipeline`."""

    @property
    def name(self) -> str: ...

    def prepare(self, events: DataFrame) -> DataFrame:
        """A per-row (narrow) view of the event rows that keeps their coordinates."""
        ...


@runtime_checkable
class TaskPipeline(Pipeline, Protocol):
    """Runs inside Spark tasks (pickled to the Python workers: plain configuration only)."""

    def process_task(self, rows: pa.Table) -> TaskResult:
        """The lines for this task's prepared rows (dead letters: the `dead_letter_line` column)."""
        ...


@runtime_checkable
class FramePipeline(Pipeline, Protocol):
    def transform(self, prepared: DataFrame) -> PipelineResult: ...


@runtime_checkable
class EditingPipeline(TaskPipeline, Protocol):
    def edit(self, events: DataFrame, *, trial: bool = False) -> DataFrame:
        """Spark's part, before the tasks: its rows (the event row schema and `dead_letter_reason`) go to
        `process_task`. `trial`: only to see whether it fails (no state is read or written)."""
        ...


@dataclass(frozen=True)
class BuildContext:
    """What building a pipeline may use besides its block: the environment connection strings come from,
    where editor steps keep state across batches (the sink's store; None: no state kept), and the editor's
    steps (`spec.consumer.pipeline.editor`) for a pipeline that takes them."""

    environ: Mapping[str, str]
    state: ObjectStore | None = None
    editor: Sequence[EditorStepSpec] = ()


def no_check(block: Any, environ: Mapping[str, str], location: Location) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class PipelineKind(Kind[Block]):
    """A pipeline type as a manifest names it (`spec.consumer.pipeline.type`, a `Kind`), with what the parts
    need of it besides its block and connections: `check(block, environ, location)`: at a consumer's start,
    what it writes to (reachable, credentials); `build(block, context)`: the pipeline; `takes_editor`:
    whether editor steps may run before it; `shape`: whether it writes lines from Spark's tasks (`tasks`), a
    DataFrame per micro-batch (`frames`: what a sink Spark writes itself takes), or is a streaming job whose
    state follows its partitions (`stream`: a query per partition, `consumer/spark/streams.py`)."""

    build: Callable[[Block, BuildContext], Pipeline]
    check: Callable[[Block, Mapping[str, str], Location], None] = no_check
    takes_editor: bool = False
    shape: Literal["tasks", "frames", "stream"] = "tasks"


__all__ = [
    "DEAD_LETTER_LINE",
    "DEAD_LETTER_REASON",
    "BuildContext",
    "EditingPipeline",
    "FramePipeline",
    "LineGroups",
    "Location",
    "Output",
    "Pipeline",
    "PipelineKind",
    "PipelineResult",
    "TaskPipeline",
    "TaskResult",
]
