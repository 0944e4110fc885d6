"""The assignment record: the operator's published decision, one JSON blob, written with compare-and-swap.

Two writers that read the same ETag can never both win: the loser gets `WriteConflict`, re-reads and
decides again.
"""

from __future__ import annotations

from hubshift.ownership.model import Assignment, StoredAssignment
from hubshift.ownership.records import decode_assignment, encode_assignment
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import BlobNotFound, LeaseStore, StoreError


def read_assignment(store: LeaseStore, scope: Scope) -> StoredAssignment | None:
    """The current record and its ETag; None when no operator has published one."""
    try:
        data, etag = store.read(scope.assignment_blob)
    except BlobNotFound:
        return None
    try:
        return StoredAssignment(decode_assignment(data), etag)
    except ValueError as exc:
        raise StoreError(f"{scope.assignment_blob} is not a valid assignment record: {exc}") from None


def publish_assignment(store: LeaseStore, scope: Scope, assignment: Assignment, *, etag: str | None) -> str:
    """Write the record if it is still at `etag` (None: only if there is none yet); returns the new ETag.

    `WriteConflict` if another writer got there first.
    """
    return store.write(scope.assignment_blob, encode_assignment(assignment), etag=etag)
