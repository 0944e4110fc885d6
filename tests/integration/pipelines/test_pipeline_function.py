"""The user-function pipeline on real PySpark: results written as JSON lines, the dead-letter column
honoured, and a failing function reported in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from hubshift.consumer.spark.batch import process_batch
from hubshift.pipelines.function import FunctionPipeline, PipelineFunctionError
from hubshift.sinks import FileSink, FolderStore
from tests.fixtures.spark import event_row


def sink(root: Path) -> FileSink:
    return FileSink(FolderStore(root), FolderStore(root / "dead-letter"))


def lines(root: Path, pattern: str) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(root.glob(pattern)) for line in path.read_text().splitlines()]


def sizes(events: DataFrame) -> DataFrame:
    return events.select("partition", "sequence_number", F.length("body").alias("size"), "enqueued_time")


def validate(events: DataFrame) -> DataFrame:
    body = F.col("body").cast("string")
    return events.select(
        "partition",
        "sequence_number",
        "offset",
        "body",
        body.alias("text"),
        F.when(~body.startswith("ok"), F.lit("does not start with ok")).alias("dead_letter_reason"),
    )


def test_results_are_written_and_ranges_reported(event_frame: Callable[..., Any], tmp_path: Path) -> None:
    rows = [event_row("0", n, b"x" * n) for n in range(1, 6)] + [event_row("1", 9, b"abc")]
    summary = process_batch(
        event_frame(rows), 0, "fn-0", FunctionPipeline("tests:sizes", sizes), sink(tmp_path)
    )
    assert summary.events == 6
    assert summary.partitions["0"].last_sequence_number == 5
    assert summary.outputs == {"results": 6}
    assert summary.dead_letters == 0
    written = sorted(lines(tmp_path, "results/*.jsonl"), key=lambda r: (r["partition"], r["sequence_number"]))
    assert [r["size"] for r in written] == [1, 2, 3, 4, 5, 3]
    assert written[0]["enqueued_time"] == "2026-11-21T10:00:00.000Z"


def test_the_dead_letter_column_routes_rows(event_frame: Callable[..., Any], tmp_path: Path) -> None:
    rows = [event_row("0", 1, b"ok one"), event_row("0", 2, b"bad"), event_row("0", 3, b"ok two")]
    pipeline = FunctionPipeline("tests:validate", validate)
    summary = process_batch(event_frame(rows), 4, "fn-0", pipeline, sink(tmp_path))
    assert summary.outputs == {"results": 2}
    assert summary.dead_letters == 1
    assert sorted(r["text"] for r in lines(tmp_path, "results/*.jsonl")) == ["ok one", "ok two"]
    (letter,) = lines(tmp_path / "dead-letter", "date=*/*.jsonl")
    assert letter["reason"] == "does not start with ok"
    assert letter["sequenceNumber"] == 2
    assert letter["body"] == "bad"
    assert letter["record"] == {"text": "bad"}


def test_a_failing_function_is_one_line_with_the_cause(
    event_frame: Callable[..., Any], tmp_path: Path
) -> None:
    def broken(events: DataFrame) -> DataFrame:
        return events.select("no_such_column")

    def not_a_frame(events: DataFrame) -> Any:
        return 42

    frame = event_frame([event_row("0", 1, b"x")])
    with pytest.raises(PipelineFunctionError) as error:
        process_batch(frame, 0, "fn-0", FunctionPipeline("jobs:broken", broken), sink(tmp_path))
    message = str(error.value)
    assert message.startswith("pipeline function jobs:broken failed: AnalysisException")
    assert "\n" not in message
    assert error.value.__cause__ is not None
    with pytest.raises(PipelineFunctionError, match="returned int, expected a DataFrame"):
        process_batch(frame, 0, "fn-0", FunctionPipeline("jobs:not_a_frame", not_a_frame), sink(tmp_path))
    assert not (tmp_path / "_batches").exists()  # nothing committed


def test_an_empty_batch_writes_nothing(event_frame: Callable[..., Any], tmp_path: Path) -> None:
    summary = process_batch(
        event_frame([]), 0, "fn-0", FunctionPipeline("tests:sizes", sizes), sink(tmp_path)
    )
    assert summary.partitions == {}
    assert summary.stem is None
    assert not tmp_path.joinpath("_batches").exists()


def parse_reading(events: DataFrame) -> DataFrame:
    """A user's function with a bug: its UDF raises on one particular event, every time."""
    from pyspark.sql.types import IntegerType

    @F.udf(IntegerType())
    def reading(body: bytes) -> int:
        if body == b"poison":
            raise ValueError("cannot parse a reading from 'poison'")
        return len(body)

    return events.select("partition", "sequence_number", reading("body").alias("reading"))


def test_an_event_that_fails_the_function_every_time_is_dead_lettered_and_the_partition_moves_on(
    event_frame: Callable[..., Any], tmp_path: Path
) -> None:
    rows = [event_row("0", n, b"x" * n) for n in range(1, 8)]
    rows[3] = event_row("0", 4, b"poison")
    rows.append(event_row("1", 20, b"abc"))
    pipeline = FunctionPipeline("jobs:parse_reading", parse_reading)
    summary = process_batch(event_frame(rows), 0, "fn-0", pipeline, sink(tmp_path))
    # The batch commits as a whole: the checkpoint may move past the poison event.
    assert summary.partitions["0"].last_sequence_number == 7 and summary.partitions["1"].events == 1
    assert summary.outputs == {"results": 7} and summary.dead_letters == 1
    written = {
        (r["partition"], r["sequence_number"]): r["reading"] for r in lines(tmp_path, "results/*.jsonl")
    }
    assert sorted(written) == [("0", n) for n in (1, 2, 3, 5, 6, 7)] + [("1", 20)]
    (letter,) = lines(tmp_path / "dead-letter", "date=*/*.jsonl")
    assert (letter["partition"], letter["sequenceNumber"], letter["body"]) == ("0", 4, "poison")
    assert "ValueError: cannot parse a reading from 'poison'" in letter["reason"]


def test_a_sink_that_fails_is_not_blamed_on_an_event(event_frame: Callable[..., Any], tmp_path: Path) -> None:
    class Broken(FileSink):
        def write(self, *args: Any, **kwargs: Any) -> Any:
            raise OSError("the sink is away")

    rows = [event_row("0", n, b"x") for n in range(1, 4)]
    with pytest.raises(OSError, match="the sink is away"):
        process_batch(
            event_frame(rows),
            0,
            "fn-0",
            FunctionPipeline("t:sizes", sizes),
            Broken(FolderStore(tmp_path), FolderStore(tmp_path / "dead-letter")),
        )
    assert not (tmp_path / "dead-letter").exists() or not list((tmp_path / "dead-letter").rglob("*.jsonl"))
