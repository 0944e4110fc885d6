"""Pipelines: one module per pipeline behind the small interface in `base.py`.

`build_pipeline` turns the manifest's `consumer.pipeline` into a `Pipeline`: `aggregate`, `function`, or one
of the forwarding pipelines (`replicate`, `route`, `projection`) with the editor's steps before it
(`editor.py`). PySpark is imported only when a pipeline is built, so `aggregate_view` (the reader of the
aggregate's output) stays light.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hubshift.pipelines.base import Pipeline
    from hubshift.sinks.base import ObjectStore
    from hubshift.spec import PipelineSpec


def build_pipeline(
    spec: PipelineSpec, environ: Mapping[str, str] | None = None, *, state: ObjectStore | None = None
) -> Pipeline:
    """`environ`: where connection strings come from (default: this process's environment); `state`:
    where editor steps keep state across batches (the sink's store)."""
    environ = os.environ if environ is None else environ
    if spec.type in ("replicate", "route", "projection"):
        from hubshift.pipelines.editor import build_editor

        finish = None
        forwarder: Any
        if spec.type == "replicate":
            from hubshift.pipelines.replicate import ReplicatePipeline

            assert spec.replicate is not None  # the model requires it for type replicate
            forwarder = ReplicatePipeline.from_spec(spec.replicate, environ)
        elif spec.type == "route":
            from hubshift.pipelines.route import RoutePipeline

            assert spec.route is not None  # the model requires it for type route
            forwarder = RoutePipeline.from_spec(spec.route, environ)
            finish = forwarder.with_sql if forwarder.sql else None
        else:
            from hubshift.pipelines.projection import ProjectionPipeline

            assert spec.projection is not None  # the model requires it for type projection
            forwarder = ProjectionPipeline.from_spec(spec.projection, environ)
        pipeline: Pipeline = build_editor(forwarder, spec.editor, state, finish=finish)
        return pipeline
    if spec.type == "function":
        from hubshift.pipelines.function import FunctionPipeline

        assert spec.function is not None  # the model requires it for type function
        return FunctionPipeline(spec.function)
    from hubshift.pipelines.aggregate import AggregatePipeline

    return AggregatePipeline.from_spec(spec.aggregate)
