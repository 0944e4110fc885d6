"""How hubshift's records are written in the store, as pure functions (no I/O): the checkpoint blob's
metadata (the Azure SDKs' `offset` and `sequencenumber`, plus `ownerid`, `ownerlevel`, `hubshiftstart` and
`hubshiftnextenqueued`) and the assignment record's JSON. docs/architecture.md lists every record and its
layout."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from hubshift.ownership.model import Assignment, ChangeKind, Checkpoint, Driver, Phase, partition_sort_key

# --- checkpoint blobs ----------------------------------------------------------------------------------

OFFSET = "offset"
SEQUENCE_NUMBER = "sequencenumber"
OWNER = "ownerid"
OWNER_LEVEL = "ownerlevel"
START = "hubshiftstart"
# When the event after the checkpoint was enqueued, if the consumer had received it: the control loop's lag
# in seconds without reading events (docs/observability.md). It belongs to the `sequencenumber` beside it.
NEXT_ENQUEUED = "hubshiftnextenqueued"


def checkpoint_metadata(
    checkpoint: Checkpoint,
    *,
    owner: str | None = None,
    owner_level: int | None = None,
    next_enqueued: datetime | None = None,
) -> dict[str, str]:
    metadata = {OFFSET: str(checkpoint.offset), SEQUENCE_NUMBER: str(checkpoint.sequence_number)}
    if checkpoint.start is not None:
        metadata[START] = checkpoint.start.isoformat()
    if next_enqueued is not None:
        metadata[NEXT_ENQUEUED] = next_enqueued.isoformat()
    if owner is not None:
        metadata[OWNER] = owner
    if owner_level is not None:
        metadata[OWNER_LEVEL] = str(owner_level)
    return metadata


def moved_metadata(metadata: Mapping[str, str], checkpoint: Checkpoint) -> dict[str, str]:
    """A checkpoint blob's metadata with its position moved by hand (a reset): the owner and owner level
    stay (the next claim still goes one level up), what belonged to the old position goes."""
    kept = {key: value for key, value in metadata.items() if key not in (START, NEXT_ENQUEUED)}
    return {**kept, **checkpoint_metadata(checkpoint)}


def parse_checkpoint(metadata: Mapping[str, str]) -> Checkpoint | None:
    """The position in a checkpoint blob's metadata; None when it carries none (or garbage)."""
    offset, sequence = metadata.get(OFFSET), metadata.get(SEQUENCE_NUMBER)
    if offset is None or sequence is None:
        return None
    try:
        sequence_number = int(sequence)
        start = datetime.fromisoformat(metadata[START]) if START in metadata else None
    except ValueError:
        return None
    return Checkpoint(offset=offset, sequence_number=sequence_number, start=start)


def parse_next_enqueued(metadata: Mapping[str, str]) -> datetime | None:
    """When the event after the checkpoint in `metadata` was enqueued; None when not written (or garbage)."""
    text = metadata.get(NEXT_ENQUEUED)
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def parse_owner_level(metadata: Mapping[str, str]) -> int:
    try:
        return max(0, int(metadata.get(OWNER_LEVEL, "0")))
    except ValueError:
        return 0


# --- the assignment record -----------------------------------------------------------------------------

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
    "planned",
    "plannedUntil",
    "change",
    "returning",
    "drivenBy",
}


def encode_assignment(assignment: Assignment) -> bytes:
    document: dict[str, Any] = {
        **assignment.extra,
        "generation": assignment.generation,
        "partitions": _by_partition(assignment.partitions),
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
    if assignment.planned:
        document["planned"] = _by_partition(assignment.planned)
    if assignment.planned_until is not None:
        document["plannedUntil"] = assignment.planned_until.isoformat()
    if assignment.change is not None:
        document["change"] = assignment.change.value
    if assignment.returning:
        document["returning"] = list(assignment.returning)
    if assignment.driver is not None:
        document["drivenBy"] = {"uid": assignment.driver.uid, "resource": assignment.driver.resource}
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
        planned = document.get("planned") or {}
        if not isinstance(planned, Mapping):
            raise ValueError("planned must be an object")
        planned_until = document.get("plannedUntil")
        change = document.get("change")
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
            planned={str(p): str(c) for p, c in planned.items()},
            planned_until=None if planned_until is None else datetime.fromisoformat(planned_until),
            change=_change_kind(change),
            returning=tuple(str(c) for c in document.get("returning") or ()),
            driver=_driver(document.get("drivenBy")),
            extra={k: v for k, v in document.items() if k not in _KNOWN},
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the assignment record lacks or mistypes {exc}") from None


def _by_partition(owners: Mapping[str, str]) -> dict[str, str]:
    return {p: owners[p] for p in sorted(owners, key=partition_sort_key)}


def _driver(value: object) -> Driver | None:
    """The publishing resource; None when the record names none (written by a version before it did)."""
    if not isinstance(value, Mapping) or not value.get("uid"):
        return None
    return Driver(uid=str(value["uid"]), resource=str(value.get("resource") or "?"))


def _change_kind(value: object) -> ChangeKind | None:
    """A kind this version does not know (a newer operator's) reads as none: the record stays readable."""
    return ChangeKind(value) if value in {kind.value for kind in ChangeKind} else None
