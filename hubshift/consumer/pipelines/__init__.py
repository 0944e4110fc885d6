"""Pipelines: one module per pipeline behind the small interface in `base.py`.

`build_pipeline` turns the manifest's `consumer.pipeline` into a `Pipeline`. PySpark is imported only when a
pipeline is built, so `aggregate_view` (the reader of the aggregate's output) stays light.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hubshift.consumer.pipelines.base import Pipeline
    from hubshift.spec import PipelineSpec


def build_pipeline(spec: PipelineSpec, environ: Mapping[str, str] | None = None) -> Pipeline:
    """`environ`: where connection strings come from (default: this process's environment)."""
    if spec.type == "replicate":
        from hubshift.consumer.pipelines.replicate import ReplicatePipeline

        assert spec.replicate is not None  # the model requires it for type replicate
        return ReplicatePipeline.from_spec(spec.replicate, os.environ if environ is None else environ)
    if spec.type == "function":
        from hubshift.consumer.pipelines.function import FunctionPipeline

        assert spec.function is not None  # the model requires it for type function
        return FunctionPipeline(spec.function)
    from hubshift.consumer.pipelines.aggregate import AggregatePipeline

    return AggregatePipeline.from_spec(spec.aggregate)
