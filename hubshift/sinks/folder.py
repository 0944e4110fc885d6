"""The `folder` sink (the embedded default): files under a local folder.

Every file is written to a hidden temporary name in its final folder and renamed into place, so a reader
sees a whole file or none, and a consumer killed mid-write leaves only a hidden temporary behind.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, model_validator

from hubshift.errors import UserError
from hubshift.sinks.base import ObjectStore, PodVolume, SinkKind, file_sink
from hubshift.sinks.layout import DEAD_LETTERS, TEMPORARY_PREFIX
from hubshift.spec import QUANTITY, Model, cel
from hubshift.spec.kinds import Location

CLAIM_OR_SIZE = "set claimName or size, not both"
CLASS_WITH_SIZE = "storageClassName goes with size"


class FolderVolumeSpec(Model):
    """In a cluster, the volume a folder sink lives on (the pods' root file system is read-only). Neither
    field: an emptyDir, gone with the pod."""

    claim_name: str | None = Field(
        default=None,
        min_length=1,
        description="An existing PersistentVolumeClaim every pod mounts (ReadWriteMany shares one folder).",
    )
    size: str | None = Field(
        default=None,
        pattern=QUANTITY,
        description="A volume of this size per pod, from a claim template (it outlives the pod).",
    )
    storage_class_name: str | None = Field(
        default=None, min_length=1, description="With size: the claim template's StorageClass."
    )

    CEL = (
        cel("!has(self.claimName) || !has(self.size)", CLAIM_OR_SIZE),
        cel("!has(self.storageClassName) || has(self.size)", CLASS_WITH_SIZE, ".storageClassName"),
    )

    @model_validator(mode="after")
    def _one_kind(self) -> FolderVolumeSpec:
        if self.claim_name is not None and self.size is not None:
            raise ValueError(CLAIM_OR_SIZE)
        if self.storage_class_name is not None and self.size is None:
            raise ValueError(CLASS_WITH_SIZE)
        return self


class FolderSinkSpec(Model):
    """A folder of files (type folder, the default): on this machine, or on a pod's volume."""

    path: str = Field(default="hubshift-output", description="Folder the results are written under.")
    volume: FolderVolumeSpec = Field(
        default_factory=FolderVolumeSpec,
        description="In a cluster: the volume mounted at path (default: an emptyDir).",
    )


@dataclass(frozen=True)
class FolderStore:
    root: Path

    def __post_init__(self) -> None:
        # Absolute: Spark's Python workers need not share the driver's working directory.
        object.__setattr__(self, "root", Path(self.root).absolute())

    def _path(self, name: str) -> Path:
        path = (self.root / name).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError(f"{name!r} is outside {self.root}")
        return path

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{TEMPORARY_PREFIX}{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            temporary.write_bytes(data)
            temporary.replace(path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def get(self, name: str) -> bytes:
        return self._path(name).read_bytes()

    def list(self, prefix: str = "") -> list[str]:
        # Walk only the folder the prefix names (or its parent, for a partial last segment).
        head, _, _ = prefix.rpartition("/")
        start = self.root / head if head else self.root
        if not start.is_dir():
            return []
        names: list[str] = []
        for folder, subfolders, files in os.walk(start):
            subfolders[:] = [d for d in subfolders if not d.startswith(TEMPORARY_PREFIX)]
            relative = Path(folder).relative_to(self.root).as_posix()
            for file in files:
                if file.startswith(TEMPORARY_PREFIX):
                    continue
                name = file if relative == "." else f"{relative}/{file}"
                if name.startswith(prefix):
                    names.append(name)
        return sorted(names)

    def ensure(self) -> None:
        """Create the folder at start-up, so an unwritable path fails here, in one line."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f"{TEMPORARY_PREFIX}probe.{secrets.token_hex(4)}.tmp"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UserError(f"sink folder {self.root}: cannot write there ({exc.strerror})") from None

    def describe(self) -> str:
        return f"folder {self.root}"


def _stores(
    block: FolderSinkSpec, dead_letter_path: str | None, environ: Mapping[str, str], location: Location
) -> tuple[ObjectStore, ObjectStore]:
    root = Path(block.path)
    dead_root = Path(dead_letter_path) if dead_letter_path else root / DEAD_LETTERS
    return FolderStore(root), FolderStore(dead_root)


def _volume(block: FolderSinkSpec, dead_letter_path: str | None, work_dir: str) -> PodVolume:
    """The folder is mounted where the consumer writes it (a relative path lies under the working
    directory); dead letters go under it unless the spec puts them elsewhere, which then needs the folder's
    volume too (refused)."""
    path = block.path.rstrip("/") or "/"
    mount_path = path if path.startswith("/") else f"{work_dir}/{path}"
    if dead_letter_path is not None:
        dead = dead_letter_path if dead_letter_path.startswith("/") else f"{work_dir}/{dead_letter_path}"
        if not (dead == mount_path or dead.startswith(mount_path + "/")):
            raise UserError(
                "spec.consumer.sink.deadLetterPath: in a cluster it must lie under sink.folder.path "
                f"({mount_path}), the only writable place for the folder sink"
            )
    volume = block.volume
    return PodVolume(mount_path, volume.claim_name, volume.size, volume.storage_class_name)


SINK = SinkKind[FolderSinkSpec](
    name="folder",
    annotation=FolderSinkSpec,
    field=Field(default_factory=FolderSinkSpec),
    build=file_sink("folder", _stores),
    stores=_stores,
    volume=_volume,
)
