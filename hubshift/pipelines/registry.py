"""Every pipeline a manifest may name, in one list (`PIPELINES`), and what the parts read from it: the
manifest's `PipelineSpec` (the `type` and one block per pipeline), the CRD's rules, the connections, the
consumer's start-up check and the build.

Adding a pipeline: its module (the block's model, a `PipelineKind`) and one line in `PIPELINES`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from hubshift.pipelines import aggregate, events, function, projection, replicate, route, stream
from hubshift.pipelines.base import BuildContext, Location, Pipeline, PipelineKind
from hubshift.pipelines.steps import MAX_STEPS, EditorStepSpec
from hubshift.spec import cel
from hubshift.spec.kinds import Chosen, Kinds

if TYPE_CHECKING:
    from hubshift.sinks.base import ObjectStore

PIPELINES = Kinds[PipelineKind[Any]](
    ("spec", "consumer", "pipeline"),
    aggregate.PIPELINE,
    function.PIPELINE,
    stream.PIPELINE,
    events.PIPELINE,
    replicate.PIPELINE,
    route.PIPELINE,
    projection.PIPELINE,
)

_EDITING = PIPELINES.names(lambda kind: kind.takes_editor)
EDITOR_NEEDS = f"editor goes with type {', '.join(_EDITING[:-1])} or {_EDITING[-1]}"


class PipelineSpecBase(Chosen):
    """What every pipeline block shares: the type, and the editor steps run before the pipelines that take
    them. `PipelineSpec` adds one block per pipeline of `PIPELINES`."""

    KINDS = PIPELINES

    type: str = PIPELINES.default
    editor: list[EditorStepSpec] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description=f"Steps applied in order before {EDITOR_NEEDS.removeprefix('editor goes with type ')}, "
        "in the same consumer.",
    )

    CEL = (
        *PIPELINES.required_rules(),
        cel(
            "!has(self.editor) || size(self.editor) == 0 || "
            f"(has(self.type) && self.type in [{', '.join(repr(name) for name in _EDITING)}])",
            EDITOR_NEEDS,
            ".editor",
        ),
    )

    @property
    def kind(self) -> PipelineKind[Any]:
        return PIPELINES[self.type]

    @model_validator(mode="after")
    def _editor_taken(self) -> PipelineSpecBase:
        if self.editor and not self.kind.takes_editor:
            raise ValueError(EDITOR_NEEDS)
        return self


if TYPE_CHECKING:
    PipelineSpec = PipelineSpecBase
else:
    PipelineSpec = PIPELINES.model(
        "PipelineSpec",
        PipelineSpecBase,
        "The pipeline each consumer runs: `type`, its block, and the editor steps before it.",
        "Which pipeline: its block of the same name holds its settings (aggregate: the default).",
    )


def check_pipeline(
    spec: PipelineSpecBase, environ: Mapping[str, str], location: Location = PIPELINES.location
) -> None:
    """At a consumer's start: what the chosen pipeline writes to (reachable, credentials, tables)."""
    spec.kind.check(spec.block, environ, (*location, spec.type))


def build_pipeline(
    spec: PipelineSpecBase, environ: Mapping[str, str] | None = None, *, state: ObjectStore | None = None
) -> Pipeline:
    """The chosen pipeline. `environ`: where connection strings come from (default: this process's
    environment); `state`: where editor steps keep state across batches (the sink's store)."""
    context = BuildContext(os.environ if environ is None else environ, state, tuple(spec.editor))
    return spec.kind.build(spec.block, context)


__all__ = ["PIPELINES", "PipelineSpec", "build_pipeline", "check_pipeline"]
