"""Every pipeline a manifest may name, in one list (`PIPELINES`), and what the parts read from it: the
manifest's `PipelineSpec` (the `type` and one block per pipeline), the CRD's rules, the connections, the
consumer's start-up check and the build.

Adding a pipeline: its module (the block's model, a `PipelineKind`) and one line in `PIPELINES`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from hubshift.pipelines import aggregate, events, function, projection, replicate, route, stream
from hubshift.pipelines.base import BuildContext, Location, Pipeline, PipelineKind
from hubshift.pipelines.steps import MAX_STEPS, EditorStepSpec
from hubshift.spec import Model, NamedConnection, cel

if TYPE_CHECKING:
    from hubshift.sinks.base import ObjectStore

PIPELINES: tuple[PipelineKind[Any], ...] = (
    aggregate.KIND,
    function.KIND,
    stream.KIND,
    events.KIND,
    replicate.KIND,
    route.KIND,
    projection.KIND,
)
BY_NAME: Mapping[str, PipelineKind[Any]] = {kind.name: kind for kind in PIPELINES}
DEFAULT = aggregate.KIND.name
LOCATION: Location = ("spec", "consumer", "pipeline")

_EDITING = [kind.name for kind in PIPELINES if kind.takes_editor]
EDITOR_NEEDS = f"editor goes with type {', '.join(_EDITING[:-1])} or {_EDITING[-1]}"


def _required(kind: PipelineKind[Any]) -> str:
    return f"{kind.required} is required when type is {kind.name}"


class PipelineSpecBase(Model):
    """What every pipeline block shares: the type, and the editor steps run before the pipelines that take
    them. `PipelineSpec` adds one block per pipeline of `PIPELINES`."""

    type: str = DEFAULT
    editor: list[EditorStepSpec] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description=f"Steps applied in order before {EDITOR_NEEDS.removeprefix('editor goes with type ')}, "
        "in the same consumer.",
    )

    CEL = (
        *(
            cel(
                f"!has(self.type) || self.type != '{kind.name}' || has(self.{kind.name})",
                _required(kind),
                f".{kind.name}",
            )
            for kind in PIPELINES
            if kind.required is not None
        ),
        cel(
            "!has(self.editor) || size(self.editor) == 0 || "
            f"(has(self.type) && self.type in [{', '.join(repr(name) for name in _EDITING)}])",
            EDITOR_NEEDS,
            ".editor",
        ),
    )

    @property
    def kind(self) -> PipelineKind[Any]:
        return BY_NAME[self.type]

    @property
    def block(self) -> Any:
        """The block of the chosen pipeline (`spec.consumer.pipeline.<type>`)."""
        return getattr(self, self.type)

    @model_validator(mode="after")
    def _block_given(self) -> PipelineSpecBase:
        kind = self.kind
        if kind.required is not None and self.block is None:
            raise ValueError(_required(kind))
        if self.editor and not kind.takes_editor:
            raise ValueError(EDITOR_NEEDS)
        return self


if TYPE_CHECKING:
    PipelineSpec = PipelineSpecBase
else:
    PipelineSpec = create_model(
        "PipelineSpec",
        __base__=PipelineSpecBase,
        __doc__="The pipeline each consumer runs: `type`, its block, and the editor steps before it.",
        type=(
            Literal[tuple(BY_NAME)],
            Field(
                DEFAULT,
                description="Which pipeline: its block of the same name holds its settings (aggregate: the "
                "default).",
            ),
        ),
        **{kind.name: (kind.annotation, kind.field) for kind in PIPELINES},
    )


def pipeline_connections(spec: PipelineSpecBase, location: Location = LOCATION) -> list[NamedConnection]:
    """The connections the chosen pipeline makes (a block of another type, left over, makes none)."""
    return list(spec.kind.connections(spec.block, (*location, spec.type)))


def check_pipeline(spec: PipelineSpecBase, environ: Mapping[str, str], location: Location = LOCATION) -> None:
    """At a consumer's start: what the chosen pipeline writes to (reachable, credentials, tables)."""
    spec.kind.check(spec.block, environ, (*location, spec.type))


def build_pipeline(
    spec: PipelineSpecBase, environ: Mapping[str, str] | None = None, *, state: ObjectStore | None = None
) -> Pipeline:
    """The chosen pipeline. `environ`: where connection strings come from (default: this process's
    environment); `state`: where editor steps keep state across batches (the sink's store)."""
    context = BuildContext(os.environ if environ is None else environ, state, tuple(spec.editor))
    return spec.kind.build(spec.block, context)


__all__ = ["PIPELINES", "PipelineSpec", "build_pipeline", "check_pipeline", "pipeline_connections"]
