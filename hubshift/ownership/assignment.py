"""The assignment record: the operator's published decision, one JSON blob, written with compare-and-swap.

Two writers that read the same ETag can never both win: the loser gets `WriteConflict`, re-reads and
decides again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from hubshift.ownership.model import Assignment, AssignmentRecord, Phase, partition_sort_key
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import BlobNotFound, LeaseStore, StoreError

_KNOWN = {
    "generation",
    "partitions",
    "phase",
    "replicas",
    "updatedAt",
    "holddownUntil",
    "maxHandoffSeconds",
    "partitionIds",
    "consumers",
    "forced",
}


def encode_assignment(assignment: Assignment) -> bytes:
    partitions = {p: assignment.partitions[p] for p in sorted(assignment.partitions, key=partition_sort_key)}
    document: dict[str, Any] = {
        **assignment.extra,
        "generation": assignment.generation,
        "partitions": partitions,
        "phase": assignment.phase.value,
        "replicas": assignment.replicas,
        "updatedAt": assignment.updated_at.isoformat(),
        "holddownUntil": None if assignment.holddown_until is None else assignment.holddown_until.isoformat(),
        "maxHandoffSeconds": assignment.max_handoff_seconds,
    }
    # Written only when set, so a record without them reads back equal.
    if assignment.partition_ids:
        document["partitionIds"] = list(assignment.partition_ids)
    if assignment.consumers:
        document["consumers"] = list(assignment.consumers)
    if assignment.forced:
        document["forced"] = sorted(assignment.forced, key=partition_sort_key)
    return json.dumps(document, indent=1).encode()


def decode_assignment(data: bytes) -> Assignment:
    """`ValueError` when `data` is not an assignment record."""
    document = json.loads(data)
    if not isinstance(document, dict):
        raise ValueError("the assignment record is not a JSON object")
    try:
        partitions = document["partitions"]
        if not isinstance(partitions, Mapping):
            raise ValueError("partitions must be an object")
        holddown = document.get("holddownUntil")
        handoff = document.get("maxHandoffSeconds")
        return Assignment(
            generation=int(document["generation"]),
            partitions={str(p): str(c) for p, c in partitions.items()},
            phase=Phase(document["phase"]),
            replicas=int(document["replicas"]),
            updated_at=datetime.fromisoformat(document["updatedAt"]),
            holddown_until=None if holddown is None else datetime.fromisoformat(holddown),
            max_handoff_seconds=None if handoff is None else float(handoff),
            partition_ids=tuple(str(p) for p in document.get("partitionIds") or ()),
            consumers=tuple(str(c) for c in document.get("consumers") or ()),
            forced=frozenset(str(p) for p in document.get("forced") or ()),
            extra={k: v for k, v in document.items() if k not in _KNOWN},
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the assignment record lacks or mistypes {exc}") from None


def read_assignment(store: LeaseStore, scope: Scope) -> AssignmentRecord | None:
    """The current record and its ETag; None when no operator has published one."""
    try:
        data, etag = store.read(scope.assignment_blob)
    except BlobNotFound:
        return None
    try:
        return AssignmentRecord(decode_assignment(data), etag)
    except ValueError as exc:
        raise StoreError(f"{scope.assignment_blob} is not a valid assignment record: {exc}") from None


def publish_assignment(store: LeaseStore, scope: Scope, assignment: Assignment, *, etag: str | None) -> str:
    """Write the record if it is still at `etag` (None: only if there is none yet); returns the new ETag.

    `WriteConflict` if another writer got there first.
    """
    return store.write(scope.assignment_blob, encode_assignment(assignment), etag=etag)
