"""The editor pattern: events changed before they are forwarded, in the same consumer. `spec.consumer.pipeline
.editor` lists steps, run in order, before `replicate`, `route` or `projection`:

- Spark's steps: `function` (your `module:function(DataFrame) -> DataFrame`: reshape, batch, join, drop;
  a `dead_letter_reason` column makes dead letters) and `filter` (a Spark SQL condition);
- Python's steps (`edits.py`): `select`, `flatten`, `validate`, `dedupe`, `enrich`, `gzip`, `gunzip`.

The steps become stages. Python steps that follow one another run as one pass over the task's events; the
Python steps after the last Spark step run inside the forwarding task itself, so an editor of Python steps
only (gunzip, validate, select...) costs no extra Spark job: the pipeline stays a `TaskPipeline` that reads
each event once. With a Spark step (or a route's SQL condition) the pipeline is an `EditingPipeline`: Spark
runs the stages in `edit` (Python stages in between as `mapInArrow`), after a Spark step the rows are put
back into the event row schema (`conform`), rows already refused pass a Spark step untouched, and an event
that makes a step fail is isolated as a poison event (`spark/batch.py`).

Whatever the steps do, the batch's progress is that of the events read: an event a step drops or refuses
still counts as processed, so its partition's checkpoint moves past it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hubshift.errors import one_line
from hubshift.pipelines.base import DEAD_LETTER_REASON, TaskResult
from hubshift.pipelines.edits import DedupeStep, Event, PythonStep, python_step, run_steps
from hubshift.pipelines.function import PipelineFunctionError
from hubshift.pipelines.steps import EditorStepSpec
from hubshift.sinks.base import JSON_OPTIONS, column, dead_letter_text
from hubshift.usercode import load_function

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from hubshift.sinks.base import ObjectStore


class Forwarder(Protocol):
    """The last step: where the edited events go (replicate, route, projection)."""

    name: str

    def prepare(self, events: DataFrame) -> DataFrame: ...

    def forward(self, events: Sequence[Mapping[str, Any]]) -> list[str]:
        """Deliver the events (rows in the event row schema, in order); the dead letters' lines."""
        ...


def edited_ddl() -> str:
    from hubshift.eventhubs.rows import EVENT_SCHEMA_DDL  # lazy: rows imports pyarrow

    return f"{EVENT_SCHEMA_DDL}, {DEAD_LETTER_REASON} string"


def edited_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    from hubshift.eventhubs.rows import EVENT_ARROW_SCHEMA  # lazy: rows imports pyarrow

    return EVENT_ARROW_SCHEMA.append(pa.field(DEAD_LETTER_REASON, pa.string()))


def event_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Rows in their source order: by partition, then sequence number (rows without them last)."""
    partition = row.get("partition")
    sequence = row.get("sequence_number")
    return (partition is None, str(partition), sequence is None, sequence or 0)


# --- Spark's steps -----------------------------------------------------------------------------------------


class SparkStep:
    """A step Spark runs over the batch's live rows; `apply` gets them in the event row schema."""

    def __init__(self, name: str, apply: Callable[[DataFrame], DataFrame]) -> None:
        self.name = name
        self.apply = apply

    def __call__(self, frame: DataFrame) -> DataFrame:
        return conform(on_live_rows(frame, self.apply))


def filter_step(condition: str) -> SparkStep:
    from pyspark.sql import functions as F

    return SparkStep("filter", lambda frame: frame.where(F.coalesce(F.expr(f"({condition})"), F.lit(False))))


def function_step(reference: str) -> SparkStep:

    function = load_function(reference, "editor function")

    def apply(frame: DataFrame) -> DataFrame:
        from pyspark.sql import DataFrame

        try:
            result = function(frame)
        except Exception as exc:
            raise PipelineFunctionError(f"editor function {reference} failed: {one_line(exc)}") from exc
        if not isinstance(result, DataFrame):
            raise PipelineFunctionError(
                f"editor function {reference} returned {type(result).__name__}, expected a DataFrame"
            )
        return result

    return SparkStep("function", apply)


def on_live_rows(frame: DataFrame, apply: Callable[[DataFrame], DataFrame]) -> DataFrame:
    """`apply` to the rows not yet refused; the refused ones (with their reason) join its result as they
    are."""
    from pyspark.sql import functions as F

    if DEAD_LETTER_REASON not in frame.columns:
        return apply(frame)
    reason = F.col(DEAD_LETTER_REASON)
    live = apply(frame.where(reason.isNull()).drop(DEAD_LETTER_REASON))
    return live.unionByName(frame.where(reason.isNotNull()), allowMissingColumns=True)


def conform(frame: DataFrame) -> DataFrame:
    """A frame in the event row schema and `dead_letter_reason`, whatever a step returned: columns of those
    names cast, missing ones null; without a `body`, the other columns as a JSON object become the body
    (a string body is taken as UTF-8)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    from hubshift.eventhubs.rows import EVENT_COLUMNS  # lazy: rows imports pyarrow

    types = {field.name: field.dataType for field in frame.schema.fields}
    names = {name for name, _ in EVENT_COLUMNS} | {DEAD_LETTER_REASON}
    selected = []
    for name, kind in EVENT_COLUMNS:
        if name == "body" and "body" not in types:
            rest = [column(c) for c in frame.columns if c not in names]
            value = F.to_json(F.struct(*rest), JSON_OPTIONS).cast("binary") if rest else F.lit(None)
        elif name == "body" and not isinstance(types["body"], BinaryType):
            value = column("body").cast("string").cast("binary")
        elif name in types:
            value = column(name)
        else:
            value = F.lit(None)
        selected.append(value.cast(kind).alias(name))
    reason = column(DEAD_LETTER_REASON) if DEAD_LETTER_REASON in types else F.lit(None)
    selected.append(reason.cast("string").alias(DEAD_LETTER_REASON))
    return frame.select(*selected)


# --- Python's steps between Spark's ------------------------------------------------------------------------


class PythonStage:
    """Python steps as one `mapInArrow` between Spark steps: the task's rows in their source order, the
    refused ones kept with their reason (pickled to the workers: configuration only)."""

    def __init__(self, steps: Sequence[PythonStep], *, trial: bool = False) -> None:
        self.steps = [_without_state(step) for step in steps] if trial else list(steps)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        rows = [row for batch in batches for row in batch.to_pylist()]
        if not rows:
            return
        rows.sort(key=event_order)
        out = [row for row in rows if row.get(DEAD_LETTER_REASON) is not None]
        kept, refused = run_steps(
            self.steps, [Event.of(r) for r in rows if r.get(DEAD_LETTER_REASON) is None]
        )
        out.extend(event.row for event in kept)
        out.extend({**event.dead_letter_row(), DEAD_LETTER_REASON: reason} for event, reason in refused)
        schema = edited_arrow_schema()
        yield pa.RecordBatch.from_pylist([{n: r.get(n) for n in schema.names} for r in out], schema=schema)


def _without_state(step: PythonStep) -> PythonStep:
    """A trial run (looking for the event that fails) must not record what it saw."""
    if isinstance(step, DedupeStep):
        step = copy.copy(step)
        step.store = None
    return step


# --- the pipeline ------------------------------------------------------------------------------------------

Stage = SparkStep | list[PythonStep]


def plan_stages(steps: Sequence[SparkStep | PythonStep]) -> tuple[list[Stage], list[PythonStep]]:
    """Steps in order as stages: Spark steps alone, Python steps that follow one another together; the
    Python steps after the last Spark step are the tail, which the forwarding task runs itself."""
    stages: list[Stage] = []
    for step in steps:
        if isinstance(step, SparkStep):
            stages.append(step)
        elif stages and isinstance(stages[-1], list):
            stages[-1].append(step)
        else:
            stages.append([step])
    last = stages[-1] if stages else None
    if isinstance(last, list):
        stages.pop()
        return stages, last
    return stages, []


class EditorPipeline:
    """Editor steps, then a forwarder, as one TaskPipeline (only Python steps: see the module)."""

    def __init__(self, forwarder: Forwarder, tail: Sequence[PythonStep]) -> None:
        self.forwarder = forwarder
        self.name = forwarder.name
        self.tail = list(tail)

    def prepare(self, events: DataFrame) -> DataFrame:
        return self.forwarder.prepare(events)

    def process_task(self, rows: pa.Table) -> TaskResult:

        events = rows.to_pylist()
        if DEAD_LETTER_REASON in rows.column_names:
            events.sort(key=event_order)  # Spark's steps may have changed the order
        dead = [
            dead_letter_text(row, row[DEAD_LETTER_REASON]) for row in events if row.get(DEAD_LETTER_REASON)
        ]
        live = [Event.of(row) for row in events if not row.get(DEAD_LETTER_REASON)]
        kept, refused = run_steps(self.tail, live)
        dead.extend(dead_letter_text(event.dead_letter_row(), reason) for event, reason in refused)
        dead.extend(self.forwarder.forward([event.row for event in kept]) if kept else [])
        return TaskResult(dead_letters=dead)


class SparkEditorPipeline(EditorPipeline):
    """An editor with Spark's steps (or a forwarder that needs Spark last): an `EditingPipeline`."""

    def __init__(
        self,
        forwarder: Forwarder,
        stages: Sequence[Stage],
        tail: Sequence[PythonStep],
        finish: Callable[[DataFrame], DataFrame] | None = None,
    ) -> None:
        super().__init__(forwarder, tail)
        self.stages = list(stages)
        self.finish = finish

    def edit(self, events: DataFrame, *, trial: bool = False) -> DataFrame:
        frame = self.forwarder.prepare(events)
        for stage in self.stages:
            if isinstance(stage, list):
                frame = conform(frame).coalesce(1).mapInArrow(PythonStage(stage, trial=trial), edited_ddl())
            else:
                frame = stage(frame)
        frame = conform(frame)
        if self.finish is not None:
            frame = on_live_rows(frame, self.finish)
        return frame


def build_editor(
    forwarder: Forwarder,
    steps: Sequence[EditorStepSpec],
    state: ObjectStore | None,
    *,
    finish: Callable[[DataFrame], DataFrame] | None = None,
) -> Forwarder | EditorPipeline:
    """The forwarder alone when there is nothing to edit, else the editor before it. `finish`: what Spark
    computes after the last step for the forwarder (a route's SQL conditions)."""
    built: list[SparkStep | PythonStep] = []
    for index, spec in enumerate(steps):
        python = python_step(spec, index, state)
        if python is not None:
            built.append(python)
        elif spec.filter is not None:
            built.append(filter_step(spec.filter))
        elif spec.function is not None:
            built.append(function_step(spec.function))
    if not built and finish is None:
        return forwarder
    stages, tail = plan_stages(built)
    if not stages and finish is None:
        return EditorPipeline(forwarder, tail)
    if finish is not None and tail:
        stages.append(tail)  # the forwarder's SQL reads the events as the steps left them
        tail = []
    return SparkEditorPipeline(forwarder, stages, tail, finish)
