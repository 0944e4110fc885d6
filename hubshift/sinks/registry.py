"""Every sink a manifest may name, in one list (`SINKS`), and what the parts read from it: the manifest's
`SinkSpec` (the `type`, one block per sink, where dead letters go), the CRD's rules, the connections, the
volume a pod mounts, and the stores a consumer writes to.

Adding a sink: its module (the block's model, a `SinkKind`) and one line in `SINKS`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from hubshift.errors import UserError
from hubshift.sinks import blob, delta, files, folder, foreach_batch, jdbc
from hubshift.sinks.base import Location, ObjectStore, PodVolume, Sink, SinkContext, SinkKind
from hubshift.spec import Model, NamedConnection, cel

SINKS: tuple[SinkKind[Any], ...] = (
    folder.KIND,
    blob.KIND,
    delta.KIND,
    files.PARQUET,
    files.JSON,
    jdbc.KIND,
    foreach_batch.KIND,
)
BY_NAME: Mapping[str, SinkKind[Any]] = {kind.name: kind for kind in SINKS}
DEFAULT = folder.KIND.name
LOCATION: Location = ("spec", "consumer", "sink")


def _required(kind: SinkKind[Any]) -> str:
    return f"{kind.required} is required when type is {kind.name}"


class SinkSpecBase(Model):
    """What every sink block shares: the type, and where dead letters go. `SinkSpec` adds one block per sink
    of `SINKS`."""

    type: str = DEFAULT
    dead_letter_path: str | None = Field(
        default=None,
        description="Where events the pipeline refuses go, each with its reason (default: the folder or "
        "container's dead-letter/ for folder and blob, <path>/_dead_letters for delta, parquet and json).",
    )

    CEL = tuple(
        cel(
            f"!has(self.type) || self.type != '{kind.name}' || has(self.{kind.name})",
            _required(kind),
            f".{kind.name}",
        )
        for kind in SINKS
        if kind.required is not None
    )

    @property
    def kind(self) -> SinkKind[Any]:
        return BY_NAME[self.type]

    @property
    def block(self) -> Any:
        """The block of the chosen sink (`spec.consumer.sink.<type>`)."""
        return getattr(self, self.kind.field_name)

    @model_validator(mode="after")
    def _block_given(self) -> SinkSpecBase:
        kind = self.kind
        if kind.required is not None and self.block is None:
            raise ValueError(_required(kind))
        return self


if TYPE_CHECKING:
    SinkSpec = SinkSpecBase
else:
    SinkSpec = create_model(
        "SinkSpec",
        __base__=SinkSpecBase,
        __doc__="Where each consumer's results, dead letters and commit records go.",
        type=(
            Literal[tuple(BY_NAME)],
            Field(
                DEFAULT,
                description="Which sink: its block of the same name says where (folder: the default).",
            ),
        ),
        **{kind.field_name: (kind.annotation, kind.field) for kind in SINKS},
    )


def sink_connections(spec: SinkSpecBase, location: Location = LOCATION) -> list[NamedConnection]:
    """The connections the chosen sink makes (a block of another type, left over, makes none)."""
    return list(spec.kind.connections(spec.block, (*location, spec.type)))


def sink_volume(spec: SinkSpecBase, work_dir: str) -> PodVolume | None:
    """What a consumer pod must mount for the chosen sink (`UserError` when no pod could write it)."""
    return spec.kind.volume(spec.block, spec.dead_letter_path, work_dir)


def build_store(
    spec: SinkSpecBase, environ: Mapping[str, str] | None = None, *, check: bool = False
) -> ObjectStore:
    """Where a sink hubshift writes as files keeps its results and commit records (the output's readers and
    the editor's state use it too). `check` as in `build_sink`."""
    if spec.kind.stores is None:
        raise UserError(f"sink {spec.type} is written by Spark: it keeps no store of hubshift's")
    environ = os.environ if environ is None else environ
    store = spec.kind.stores(spec.block, spec.dead_letter_path, environ, (*LOCATION, spec.type))[0]
    if check:
        store.ensure()
    return store


def build_sink(
    spec: SinkSpecBase, environ: Mapping[str, str] | None = None, *, check: bool = True, scope: str = ""
) -> Sink:
    """The sink for a manifest's `consumer.sink` (connection strings from `environ`, default this process's
    environment). With `check`, its folders or Blob container are created if missing, so a bad path or bad
    credentials fail here, at start-up, in one line; `scope` (namespace/hub/consumer group) names its
    writes."""
    environ = os.environ if environ is None else environ
    context = SinkContext(environ, (*LOCATION, spec.type), spec.dead_letter_path, scope, check)
    return spec.kind.build(spec.block, context)
