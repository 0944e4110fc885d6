"""Every sink a manifest may name, in one list (`SINKS`), and what the parts read from it: the manifest's
`SinkSpec` (the `type`, one block per sink, where dead letters go), the CRD's rules, the connections, the
volume a pod mounts, and the stores a consumer writes to.

Adding a sink: its module (the block's model, a `SinkKind`) and one line in `SINKS`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from hubshift.errors import UserError
from hubshift.sinks import blob, delta, files, folder, foreach_batch, jdbc
from hubshift.sinks.base import ObjectStore, PodVolume, Sink, SinkContext, SinkKind
from hubshift.spec.kinds import Chosen, Kinds

SINKS = Kinds[SinkKind[Any]](
    ("spec", "consumer", "sink"),
    folder.SINK,
    blob.SINK,
    delta.SINK,
    files.PARQUET_SINK,
    files.JSON_SINK,
    jdbc.SINK,
    foreach_batch.SINK,
)


class SinkSpecBase(Chosen):
    """What every sink block shares: the type, and where dead letters go. `SinkSpec` adds one block per sink
    of `SINKS`."""

    KINDS = SINKS

    type: str = SINKS.default
    dead_letter_path: str | None = Field(
        default=None,
        description="Where events the pipeline refuses go, each with its reason (default: the folder or "
        "container's dead-letter/ for folder and blob, <path>/_dead_letters for delta, parquet and json).",
    )

    CEL = SINKS.required_rules()

    @property
    def kind(self) -> SinkKind[Any]:
        return SINKS[self.type]


if TYPE_CHECKING:
    SinkSpec = SinkSpecBase
else:
    SinkSpec = SINKS.model(
        "SinkSpec",
        SinkSpecBase,
        "Where each consumer's results, dead letters and commit records go.",
        "Which sink: its block of the same name says where (folder: the default).",
    )


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
    store = spec.kind.stores(spec.block, spec.dead_letter_path, environ, (*SINKS.location, spec.type))[0]
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
    context = SinkContext(environ, (*SINKS.location, spec.type), spec.dead_letter_path, scope, check)
    return spec.kind.build(spec.block, context)
