"""Sinks: one module per sink behind the small interface in `base.py`.

`build_sink` turns the manifest's `consumer.sink` into a `Sink`: where results, dead letters and commit
records go. Credentials come from environment variables (see hubshift/spec.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from hubshift.errors import UserError
from hubshift.sinks.base import FileSink, ObjectStore, Sink
from hubshift.sinks.blob import BlobStore
from hubshift.sinks.folder import FolderStore
from hubshift.spec import SinkSpec

DEFAULT_DEAD_LETTER = "dead-letter"

__all__ = ["BlobStore", "FileSink", "FolderStore", "ObjectStore", "Sink", "build_sink", "build_store"]


def build_store(
    spec: SinkSpec, environ: Mapping[str, str] | None = None, *, check: bool = False
) -> ObjectStore:
    """Where the sink's results and commit records live (the reader of the output uses this too). `check`
    as in `build_sink`."""
    return _stores(spec, environ if environ is not None else os.environ, check=check)[0]


def build_sink(spec: SinkSpec, environ: Mapping[str, str] | None = None, *, check: bool = True) -> Sink:
    """The sink for a manifest's `consumer.sink`. With `check`, its folders or Blob container are created
    if missing, so a bad path or bad credentials fail here, at start-up, in one line."""
    store, dead_letters = _stores(spec, environ if environ is not None else os.environ, check=check)
    return FileSink(store, dead_letters)


def _stores(spec: SinkSpec, environ: Mapping[str, str], *, check: bool) -> tuple[ObjectStore, ObjectStore]:
    if spec.type == "blob":
        blob = spec.blob
        assert blob is not None  # the model requires it for type blob
        if blob.credential is not None:
            assert blob.account_url is not None  # the model requires it with a credential
            store = BlobStore(
                None,
                blob.container,
                blob.prefix.strip("/"),
                account_url=blob.account_url.rstrip("/"),
                identity=blob.credential,
            )
        else:
            variable = blob.connection_string_variable
            connection_string = environ.get(variable, "")
            if not connection_string:
                raise UserError(
                    f"sink blob: environment variable {variable} is not set (the storage connection string; "
                    "in a cluster, set sink.blob.connectionStringSecretRef; or use a token credential, "
                    "sink.blob.credential)"
                )
            store = BlobStore(connection_string, blob.container, blob.prefix.strip("/"))
        if check:
            store.ensure_container()
        dead_prefix = spec.dead_letter_path or "/".join(p for p in (store.prefix, DEFAULT_DEAD_LETTER) if p)
        return store, replace(store, prefix=dead_prefix.strip("/"))
    root = Path(spec.folder.path)
    dead_root = Path(spec.dead_letter_path) if spec.dead_letter_path else root / DEFAULT_DEAD_LETTER
    stores = FolderStore(root), FolderStore(dead_root)
    if check:
        for folder in stores:
            folder.ensure_folder()
    return stores
