"""The `function` pipeline: a user's own `module:function(DataFrame) -> DataFrame`.

The function receives the micro-batch's event rows (hubshift/eventhubs/rows.py: partition,
sequence_number, offset, enqueued_time, partition_key, body, properties) and returns any DataFrame; its rows
are written as JSON lines under `results/`. A returned column named `dead_letter_reason` routes the rows
where it is set to the dead-letter location instead (with whichever event coordinates and body they keep).

The module must be importable by the consumer (installed in the image, or on PYTHONPATH). A reference that
cannot be imported fails when the consumer starts, with one line naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import Field

from hubshift.errors import UserError, one_line
from hubshift.pipelines.base import DEAD_LETTER_REASON, BuildContext, Output, PipelineKind, PipelineResult
from hubshift.usercode import FUNCTION_REFERENCE, load_function

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

OUTPUT = "results"
UserFunction = Callable[["DataFrame"], "DataFrame"]


class PipelineFunctionError(UserError):
    """The user's function failed or returned something other than a DataFrame (the cause is chained)."""


class FunctionPipeline:
    name = "function"

    def __init__(self, reference: str, function: UserFunction | None = None) -> None:
        self.reference = reference
        self.function = function if function is not None else load_function(reference, "pipeline function")

    def prepare(self, events: DataFrame) -> DataFrame:
        return events

    def transform(self, prepared: DataFrame) -> PipelineResult:
        # PySpark loads only where a pipeline runs (the operator reads this module's declaration)
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        try:
            result = self.function(prepared)
        except Exception as exc:
            raise PipelineFunctionError(
                f"pipeline function {self.reference} failed: {one_line(exc)}"
            ) from exc
        if not isinstance(result, DataFrame):
            raise PipelineFunctionError(
                f"pipeline function {self.reference} returned {type(result).__name__}, expected a DataFrame"
            )
        if DEAD_LETTER_REASON not in result.columns:
            return PipelineResult(outputs={OUTPUT: Output(result)})
        reason = F.col(DEAD_LETTER_REASON)
        return PipelineResult(
            outputs={OUTPUT: Output(result.where(reason.isNull()).drop(DEAD_LETTER_REASON))},
            dead_letters=result.where(reason.isNotNull()),
        )


def _build(block: str, context: BuildContext) -> FunctionPipeline:
    return FunctionPipeline(block)


PIPELINE = PipelineKind[str](
    name="function",
    annotation=str | None,
    field=Field(
        default=None,
        pattern=FUNCTION_REFERENCE,
        description="module:function taking and returning a DataFrame (type function).",
    ),
    required="function (module:function)",
    build=_build,
    shape="frames",
)
