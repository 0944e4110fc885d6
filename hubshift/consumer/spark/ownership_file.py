"""The ownership file: how the agent (main process) tells the streaming source (Spark's source runner, a
different process) which partitions to plan, under which owner level, from where; and the planned file,
how the source tells the engine which version of it the last micro-batch was planned with.

One small JSON file in the consumer's scratch folder, replaced atomically (write, fsync, rename), so a
reader sees either the old or the new content, never half of one. Every write carries a higher version.
Once the source planned with version G, no batch planned afterwards reads a partition drained at G: a
drain is done when the batch in flight (planned before G) is, without waiting for the next batch to run.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hubshift.consumer.spark.offsets import SourcePartition

FILE_NAME = "ownership.json"
PLANNED_NAME = "planned"


@dataclass(frozen=True)
class OwnershipView:
    ownership_version: int
    partitions: Mapping[str, SourcePartition] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.ownership_version,
            "partitions": {
                p: {
                    "ownerLevel": self.partitions[p].owner_level,
                    "nextSequence": self.partitions[p].next_sequence,
                    "draining": self.partitions[p].draining,
                }
                for p in sorted(self.partitions)
            },
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> OwnershipView:
        return cls(
            ownership_version=int(document["version"]),
            partitions={
                str(p): SourcePartition(
                    owner_level=int(entry["ownerLevel"]),
                    next_sequence=None if entry.get("nextSequence") is None else int(entry["nextSequence"]),
                    draining=bool(entry.get("draining", False)),
                )
                for p, entry in document.get("partitions", {}).items()
            },
        )


EMPTY = OwnershipView(ownership_version=0)


def ownership_path(scratch: str | os.PathLike[str]) -> Path:
    return Path(scratch) / FILE_NAME


def _replace(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}-", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        Path(temporary).replace(target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_ownership(scratch: str | os.PathLike[str], view: OwnershipView) -> None:
    _replace(ownership_path(scratch), json.dumps(view.to_json()))


def write_planned(scratch: str | os.PathLike[str], version: int) -> None:
    """The source planned a micro-batch with this version of the ownership file (written by the source)."""
    _replace(Path(scratch) / PLANNED_NAME, str(version))


def read_planned(scratch: str | os.PathLike[str]) -> int:
    """The version of the ownership file the source last planned with (-1: none yet)."""
    try:
        return int((Path(scratch) / PLANNED_NAME).read_text())
    except (FileNotFoundError, ValueError):
        return -1


def read_ownership(scratch: str | os.PathLike[str]) -> OwnershipView:
    """The current view; nothing owned when the agent has not written one yet."""
    try:
        document = json.loads(ownership_path(scratch).read_text())
    except FileNotFoundError:
        return EMPTY
    return OwnershipView.from_json(document)
