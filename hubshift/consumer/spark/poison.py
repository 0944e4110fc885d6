"""Events that make a user's pipeline fail every time (a poison event): found and dead-lettered, so the
partition moves on instead of the micro-batch failing again and again until the consumer gives up.

When the sink's write of a `FramePipeline`'s result fails (or the tasks of an `EditingPipeline`: an editor's
function or SQL, a route's SQL condition), `find_poison_events` runs the pipeline alone on the batch
(Spark's `noop` writer: every column computed, nothing written or sent). If that succeeds, the failure was
not an event's (the sink was away, say) and the batch fails as before. If it fails, the batch is bisected
over its (partition, sequence number) keys until each failing event stands alone; its own error is its
dead-letter reason. A batch with more than `MAX_POISON_EVENTS` such events fails as a whole: that is a
broken pipeline, not a bad event. The cost is one Spark job per step, paid only when a batch failed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hubshift.consumer.spark.spool import SpoolGap
from hubshift.pipelines.base import PipelineResult

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)

MAX_POISON_EVENTS = 16
Key = tuple[str, int]  # (partition, sequence number)

# The line of a Python traceback (as Spark relays a worker's failure) that names the error.
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit|Interrupt|Warning))(?::\s*(.*))?$")


def failure_reason(error: BaseException, limit: int = 300) -> str:
    """One line for a dead letter: the innermost Python error a Spark failure relays, else the error."""
    text = str(error)
    found = [m for line in text.splitlines() if (m := _ERROR_LINE.match(line))]
    if found:
        name, message = found[-1].group(1), (found[-1].group(2) or "").strip()
        line = f"{name}: {message}" if message else name
    else:
        first = " ".join(text.split())
        line = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def not_an_event(error: BaseException) -> bool:
    """A failure that is the consumer's, whatever the events (the spool could not give a range whole):
    never an event's, so never a dead letter."""
    return SpoolGap.__name__ in str(error) or isinstance(error, SpoolGap)


def evaluate(result: PipelineResult) -> None:
    """Compute every row and column of a pipeline's result without writing it (raises what the job
    raises)."""
    frames = [output.frame for output in result.outputs.values()]
    if result.dead_letters is not None:
        frames.append(result.dead_letters)
    for frame in frames:
        frame.write.format("noop").mode("overwrite").save()


def keys_where(keys: Sequence[Key]) -> Column:
    """A filter for the rows of these keys; `keys` sorted, so each partition's are one run of sequence
    numbers (a batch reads a contiguous range of each partition)."""
    from pyspark.sql import functions as F

    bounds: dict[str, tuple[int, int]] = {}
    for partition, sequence in keys:
        low, high = bounds.get(partition, (sequence, sequence))
        bounds[partition] = (min(low, sequence), max(high, sequence))
    condition = F.lit(False)
    for partition, (low, high) in bounds.items():
        condition = condition | (
            (F.col("partition") == partition) & F.col("sequence_number").between(low, high)
        )
    return condition


def find_poison_events(name: str, trial: Callable[[DataFrame], None], prepared: DataFrame) -> dict[Key, str]:
    """The events that make the pipeline (`name`; `trial` runs it on some of the rows without writing
    anything) fail on their own, with their errors; {} when it does not fail on this batch. `ValueError`
    when more than `MAX_POISON_EVENTS` do."""
    keys = sorted(
        (str(row["partition"]), int(row["sequence_number"]))
        for row in prepared.select("partition", "sequence_number").collect()
    )

    def error_of(subset: Sequence[Key]) -> str | None:
        try:
            trial(prepared.where(keys_where(subset)))
        except Exception as exc:  # the user's code, as Spark relays it: any error counts
            if not_an_event(exc):
                raise
            return failure_reason(exc)
        return None

    if not keys or error_of(keys) is None:
        return {}
    poison: dict[Key, str] = {}
    pending = [keys]
    while pending:
        subset = pending.pop()
        if len(subset) == 1:
            reason = error_of(subset)
            if reason is not None:
                poison[subset[0]] = reason
                if len(poison) > MAX_POISON_EVENTS:
                    raise ValueError(
                        f"more than {MAX_POISON_EVENTS} events of the batch make the pipeline fail"
                    )
            continue
        middle = len(subset) // 2
        for half in (subset[:middle], subset[middle:]):
            if error_of(half) is not None:
                pending.append(half)
    log.warning(
        "%d events make the pipeline %s fail every time: they go to the dead letters (%s)",
        len(poison),
        name,
        "; ".join(f"partition {p} #{s}" for p, s in sorted(poison)[:5]),
    )
    return poison
