"""How the sinks sit together: every one is a `Sink` (the engine hands it the batch); those Spark writes
keep no store of hubshift's and take a DataFrame pipeline's rows only (`function`, `events`), those
hubshift writes as files take a task pipeline's lines too; and the one line an error becomes
(`one_line`)."""

from __future__ import annotations

from typing import Any

import pytest

from hubshift.errors import UserError, one_line
from hubshift.pipelines import PIPELINES, PipelineSpec, build_pipeline
from hubshift.pipelines.events import EventsPipeline
from hubshift.sinks import SINKS, FileSink, SinkSpec, build_sink, build_store
from hubshift.sinks.base import Sink

BLOCKS: dict[str, dict[str, Any]] = {
    "delta": {"path": "/data/t"},
    "parquet": {"path": "/data/p"},
    "json": {"path": "/data/j"},
    "jdbc": {"table": "orders"},
}
ENVIRON = {"HUBSHIFT_JDBC_URL": "jdbc:postgresql://db/orders?user=u&password=p"}


@pytest.mark.parametrize("kind", ["delta", "parquet", "json", "jdbc"])
def test_each_spark_sink_is_a_sink_of_rows_only_and_keeps_no_store(kind: str) -> None:
    spec = SinkSpec.model_validate({"type": kind, kind: BLOCKS[kind]})
    sink = build_sink(spec, ENVIRON, scope="ns/hub/cg")
    assert isinstance(sink, Sink) and not isinstance(sink, FileSink) and sink.lines is None
    assert sink.name == kind and not spec.kind.writes_lines
    with pytest.raises(UserError) as refused:
        build_store(spec, ENVIRON)
    assert str(refused.value) == f"sink {kind} is written by Spark: it keeps no store of hubshift's"


def test_the_sinks_hubshift_writes_as_files_take_lines_too() -> None:
    for kind in ("folder",):
        sink = build_sink(SinkSpec.model_validate({"type": kind}), {}, check=False)
        assert isinstance(sink, Sink) and isinstance(sink, FileSink) and sink.lines is sink
        assert sink.name == kind
    assert {kind.name for kind in SINKS if kind.writes_lines} == {"folder", "blob"}


def test_the_pipelines_of_dataframes() -> None:
    shapes = {kind.name: kind.shape for kind in PIPELINES}
    assert shapes == {
        "aggregate": "tasks",
        "function": "frames",
        "stream": "stream",
        "events": "frames",
        "replicate": "tasks",
        "route": "tasks",
        "projection": "tasks",
    }
    pipeline = build_pipeline(PipelineSpec.model_validate({"type": "events"}))
    assert isinstance(pipeline, EventsPipeline) and pipeline.name == "events"
    rows: Any = object()  # the events pipeline hands its rows on untouched
    assert pipeline.prepare(rows) is rows
    result = pipeline.transform(rows)
    assert list(result.outputs) == ["events"] and result.outputs["events"].frame is rows
    assert result.dead_letters is None


def test_one_line_folds_cuts_and_hides() -> None:
    assert one_line(ValueError("bad\n  value")) == "ValueError: bad value"
    assert one_line(KeyError()) == "KeyError"
    long = one_line(RuntimeError("x" * 1000), limit=50)
    assert long == "RuntimeError: " + "x" * 47 + "..."
    secret = "p4ss-w0rd"
    text = "y" * 295 + f" url=jdbc:postgresql://h/d?password={secret} tail"
    hidden = one_line(
        RuntimeError(text), hide={f"jdbc:postgresql://h/d?password={secret}": "<url>", secret: "*"}
    )
    assert "p4ss" not in hidden and len(hidden) <= len("RuntimeError: ") + 300
    assert (
        one_line(RuntimeError("a  b"), hide={"": "never"}) == "RuntimeError: a b"
    )  # no secret: nothing hidden
