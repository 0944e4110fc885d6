"""Sinks: one module per sink (its block's model, connections, the volume a pod mounts and its stores,
declared as a `SinkKind`), listed in `registry.SINKS`, behind the small interface in `base.py`: where
results, dead letters and commit records go."""

from hubshift.sinks.base import FileSink, ObjectStore, Sink
from hubshift.sinks.blob import BlobStore
from hubshift.sinks.folder import FolderStore
from hubshift.sinks.registry import SINKS, SinkSpec, build_sink, build_store, sink_volume

__all__ = [
    "SINKS",
    "BlobStore",
    "FileSink",
    "FolderStore",
    "ObjectStore",
    "Sink",
    "SinkSpec",
    "build_sink",
    "build_store",
    "sink_volume",
]
