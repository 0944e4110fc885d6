"""The one narrow storage interface: blobs with metadata, leases and compare-and-swap.

Two backends implement it with the same semantics (Azure Blob, SQLite) and pass one contract suite
(`tests/integration/test_store_contract.py`). Everything above it (checkpoints, partition leases, the
assignment record, the ownership table) is written once, against this interface.

Semantics follow Azure Blob storage:
- a lease is held by a lease id for `duration` seconds (15-60) or forever (`INFINITE`);
- acquiring with the id that already holds the lease succeeds (and restarts its duration);
  any other id is refused with `LeaseConflict` while the lease is active;
- writes of metadata on a leased blob must carry the holder's lease id, otherwise `LeaseLost`;
- `break_lease` ends a lease at once; the old id is refused afterwards;
- a lease of finite duration expires by the store's clock; until another id acquires it or the blob is
  written, its holder may renew it (Azure's rule);
- `write` with `etag` is compare-and-swap; `etag=None` means "only if the blob does not exist".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

INFINITE = -1
MIN_LEASE_SECONDS = 15
MAX_LEASE_SECONDS = 60


class LeaseState(enum.Enum):
    AVAILABLE = "available"
    LEASED = "leased"
    EXPIRED = "expired"
    BREAKING = "breaking"
    BROKEN = "broken"


@dataclass(frozen=True)
class BlobEntry:
    """What one listing row (or one properties request) says about a blob."""

    name: str
    metadata: Mapping[str, str]
    etag: str
    last_modified: datetime
    lease_state: LeaseState = LeaseState.AVAILABLE
    lease_infinite: bool = False
    size: int = 0
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def leased(self) -> bool:
        return self.lease_state is LeaseState.LEASED


class StoreError(Exception):
    """Base of every store failure."""


class StoreUnavailable(StoreError):
    """The store cannot be reached, or refused our credentials."""


class ContainerNotFound(StoreError):
    """The container (Blob) does not exist."""


class BlobNotFound(StoreError):
    """The named blob does not exist."""


class LeaseConflict(StoreError):
    """Somebody else holds the lease."""


class LeaseLost(StoreError):
    """Our lease id is not (or no longer) the one holding the blob: the write was fenced off."""


class WriteConflict(StoreError):
    """A compare-and-swap lost: the blob changed (or exists, or is gone) since it was read."""


class LeaseStore(Protocol):
    """Blobs with metadata, leases and compare-and-swap, under one container or database."""

    def list(self, prefix: str) -> list[BlobEntry]:
        """Every blob whose name starts with `prefix`, with metadata and lease state, in one request."""
        ...

    def properties(self, name: str) -> BlobEntry:
        """One blob's properties and metadata; `BlobNotFound` if absent."""
        ...

    def create(self, name: str, metadata: Mapping[str, str]) -> bool:
        """Create an empty blob with metadata unless it exists; True if this call created it."""
        ...

    def read(self, name: str) -> tuple[bytes, str]:
        """Content and ETag; `BlobNotFound` if absent."""
        ...

    def write(self, name: str, data: bytes, *, etag: str | None) -> str:
        """Compare-and-swap the content; returns the new ETag or raises `WriteConflict`."""
        ...

    def set_metadata(self, name: str, metadata: Mapping[str, str], *, lease_id: str | None) -> str:
        """Replace the metadata, fenced by `lease_id` when the blob is leased; returns the new ETag."""
        ...

    def acquire_lease(self, name: str, lease_id: str, duration: int) -> None:
        """Take (or re-take with the same id) the lease; `LeaseConflict` if another id holds it."""
        ...

    def renew_lease(self, name: str, lease_id: str) -> None:
        """Restart the lease's duration; `LeaseLost` if `lease_id` no longer holds it."""
        ...

    def release_lease(self, name: str, lease_id: str) -> None:
        """Give the lease up; `LeaseLost` if `lease_id` no longer holds it."""
        ...

    def break_lease(self, name: str) -> None:
        """End whatever lease the blob has, at once (a no-op when it has none); `BlobNotFound` if absent."""
        ...

    def close(self) -> None: ...
