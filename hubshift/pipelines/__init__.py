"""Pipelines: one module per pipeline (its block's model, its rules, connections, start-up check and build,
declared as a `PipelineKind`), listed in `registry.PIPELINES`. PySpark is imported only where a pipeline runs,
so the operator reads the declarations without loading it."""

from hubshift.pipelines.registry import PIPELINES, PipelineSpec, build_pipeline, check_pipeline

__all__ = ["PIPELINES", "PipelineSpec", "build_pipeline", "check_pipeline"]
