"""The `folder` sink (the embedded default): files under a local folder.

Every file is written to a hidden temporary name in its final folder and renamed into place, so a reader
sees a whole file or none, and a consumer killed mid-write leaves only a hidden temporary behind.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from hubshift.errors import UserError
from hubshift.sinks.layout import TEMPORARY_PREFIX


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

    def ensure_folder(self) -> None:
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
