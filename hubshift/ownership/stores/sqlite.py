"""The SQLite backend of `LeaseStore`: one file, safe across processes, with Azure Blob's lease semantics.

Every operation is one transaction (`BEGIN IMMEDIATE` for writes, so two processes never interleave a
check and a write); WAL lets readers go on while a writer commits. Lease expiry is by wall clock (`clock`,
injectable for tests): every process on the machine shares it, as every client of Azure shares the
server's.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hubshift.ownership.store import (
    INFINITE,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    BlobEntry,
    BlobNotFound,
    LeaseConflict,
    LeaseLost,
    LeaseState,
    StoreUnavailable,
    WriteConflict,
)

DEFAULT_CONTAINER = "hubshift"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
    container     TEXT NOT NULL,
    name          TEXT NOT NULL,
    data          BLOB NOT NULL,
    metadata      TEXT NOT NULL,
    etag          TEXT NOT NULL,
    last_modified REAL NOT NULL,
    lease_id      TEXT,
    lease_state   TEXT NOT NULL DEFAULT 'available',
    lease_expires REAL,
    lease_seconds INTEGER,
    PRIMARY KEY (container, name)
) WITHOUT ROWID
"""
_COLUMNS = "name, data, metadata, etag, last_modified, lease_id, lease_state, lease_expires, lease_seconds"


@dataclass
class _Row:
    name: str
    data: bytes
    metadata: dict[str, str]
    etag: str
    last_modified: float
    lease_id: str | None
    stored_state: str  # available | leased | broken
    lease_expires: float | None  # None while leased = infinite
    lease_seconds: int | None

    def state(self, now: float) -> LeaseState:
        if self.stored_state == "leased":
            if self.lease_expires is not None and self.lease_expires <= now:
                return LeaseState.EXPIRED
            return LeaseState.LEASED
        if self.stored_state == "broken":
            return LeaseState.BROKEN
        return LeaseState.AVAILABLE


class SqliteLeaseStore:
    """`LeaseStore` over a SQLite file; `container` separates several stores in one file."""

    def __init__(
        self,
        path: str | Path,
        container: str = DEFAULT_CONTAINER,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout_seconds: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.container = container
        self._clock = clock
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(
                str(self.path), timeout=busy_timeout_seconds, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the SQLite store {self.path}: {exc}") from exc

    # -- reading ---------------------------------------------------------------------------------------

    def list(self, prefix: str) -> list[BlobEntry]:
        now = self._clock()
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM blobs WHERE container = ? AND substr(name, 1, ?) = ? ORDER BY name",
                (self.container, len(prefix), prefix),
            ).fetchall()
        return [_entry(_row(r), now) for r in rows]

    def properties(self, name: str) -> BlobEntry:
        now = self._clock()
        with self._transaction(write=False) as conn:
            return _entry(self._get(conn, name), now)

    def read(self, name: str) -> tuple[bytes, str]:
        with self._transaction(write=False) as conn:
            row = self._get(conn, name)
        return row.data, row.etag

    # -- writing ---------------------------------------------------------------------------------------

    def create(self, name: str, metadata: Mapping[str, str]) -> bool:
        with self._transaction(write=True) as conn:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO blobs (container, name, data, metadata, etag, last_modified) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self.container, name, b"", json.dumps(dict(metadata)), _new_etag(), self._clock()),
            )
            return cursor.rowcount == 1

    def write(self, name: str, data: bytes, *, etag: str | None) -> str:
        now = self._clock()
        new_etag = _new_etag()
        with self._transaction(write=True) as conn:
            row = self._find(conn, name)
            if etag is None:
                if row is not None:
                    raise WriteConflict(f"{name} already exists")
                conn.execute(
                    "INSERT INTO blobs (container, name, data, metadata, etag, last_modified) "
                    "VALUES (?, ?, ?, '{}', ?, ?)",
                    (self.container, name, data, new_etag, now),
                )
                return new_etag
            if row is None or row.etag != etag:
                raise WriteConflict(f"{name} changed since it was read")
            self._check_write_lease(row, None, now)
            self._update(conn, row, now, new_etag, data=data, metadata={})
        return new_etag

    def set_metadata(self, name: str, metadata: Mapping[str, str], *, lease_id: str | None) -> str:
        now = self._clock()
        new_etag = _new_etag()
        with self._transaction(write=True) as conn:
            row = self._get(conn, name)
            self._check_write_lease(row, lease_id, now)
            self._update(conn, row, now, new_etag, data=row.data, metadata=dict(metadata))
        return new_etag

    # -- leases ----------------------------------------------------------------------------------------

    def acquire_lease(self, name: str, lease_id: str, duration: int) -> None:
        if duration != INFINITE and not MIN_LEASE_SECONDS <= duration <= MAX_LEASE_SECONDS:
            raise ValueError(f"lease duration must be {MIN_LEASE_SECONDS}-{MAX_LEASE_SECONDS} s or infinite")
        now = self._clock()
        with self._transaction(write=True) as conn:
            row = self._get(conn, name)
            if row.state(now) is LeaseState.LEASED and row.lease_id != lease_id:
                raise LeaseConflict(f"{name} is leased by another holder")
            self._set_lease(conn, name, lease_id, "leased", now, duration)

    def renew_lease(self, name: str, lease_id: str) -> None:
        now = self._clock()
        with self._transaction(write=True) as conn:
            row = self._get(conn, name)
            # Azure renews an expired lease too, as long as nobody took or wrote the blob since.
            if row.state(now) not in (LeaseState.LEASED, LeaseState.EXPIRED) or row.lease_id != lease_id:
                raise LeaseLost(f"{name} is not leased by this lease id")
            self._set_lease(conn, name, lease_id, "leased", now, row.lease_seconds or INFINITE)

    def release_lease(self, name: str, lease_id: str) -> None:
        now = self._clock()
        with self._transaction(write=True) as conn:
            row = self._get(conn, name)
            if row.state(now) not in (LeaseState.LEASED, LeaseState.EXPIRED) or row.lease_id != lease_id:
                raise LeaseLost(f"{name} is not leased by this lease id")
            self._set_lease(conn, name, None, "available")

    def break_lease(self, name: str) -> None:
        now = self._clock()
        with self._transaction(write=True) as conn:
            row = self._get(conn, name)
            if row.state(now) in (LeaseState.LEASED, LeaseState.EXPIRED):
                self._set_lease(conn, name, row.lease_id, "broken")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- internals -------------------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"the SQLite store {self.path} is not usable: {exc}") from exc
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK")
                raise StoreUnavailable(f"the SQLite store {self.path} is not usable: {exc}") from exc

    def _find(self, conn: sqlite3.Connection, name: str) -> _Row | None:
        found = conn.execute(
            f"SELECT {_COLUMNS} FROM blobs WHERE container = ? AND name = ?", (self.container, name)
        ).fetchone()
        return None if found is None else _row(found)

    def _get(self, conn: sqlite3.Connection, name: str) -> _Row:
        row = self._find(conn, name)
        if row is None:
            raise BlobNotFound(name)
        return row

    def _check_write_lease(self, row: _Row, lease_id: str | None, now: float) -> None:
        """Azure's rule for a write: a leased blob needs its lease id; an unleased one must get none."""
        leased = row.state(now) is LeaseState.LEASED
        if leased and lease_id != row.lease_id:
            raise LeaseLost(f"{row.name} is leased{'' if lease_id is None else ' by another lease id'}")
        if not leased and lease_id is not None:
            raise LeaseLost(f"{row.name} has no active lease")

    def _update(
        self,
        conn: sqlite3.Connection,
        row: _Row,
        now: float,
        etag: str,
        *,
        data: bytes,
        metadata: dict[str, str],
    ) -> None:
        # A write to a blob whose lease expired ends that lease for good (it can no longer be renewed).
        expired = row.state(now) is LeaseState.EXPIRED
        end_lease = ", lease_id = NULL, lease_state = 'available', lease_expires = NULL, lease_seconds = NULL"
        conn.execute(
            "UPDATE blobs SET data = ?, metadata = ?, etag = ?, last_modified = ?"
            + (end_lease if expired else "")
            + " WHERE container = ? AND name = ?",
            (data, json.dumps(metadata), etag, now, self.container, row.name),
        )

    def _set_lease(
        self,
        conn: sqlite3.Connection,
        name: str,
        lease_id: str | None,
        state: str,
        now: float = 0.0,
        seconds: int | None = None,
    ) -> None:
        """Leased: `seconds` from `now` (INFINITE: no expiry); other states keep no expiry."""
        leased = state == "leased"
        expires = now + seconds if leased and seconds is not None and seconds != INFINITE else None
        conn.execute(
            "UPDATE blobs SET lease_id = ?, lease_state = ?, lease_expires = ?, lease_seconds = ? "
            "WHERE container = ? AND name = ?",
            (lease_id, state, expires, seconds if leased else None, self.container, name),
        )


def _row(values: tuple[Any, ...]) -> _Row:
    name, data, metadata, etag, last_modified, lease_id, state, expires, seconds = values
    return _Row(
        name=str(name),
        data=bytes(data),
        metadata=json.loads(str(metadata)),
        etag=str(etag),
        last_modified=float(last_modified),
        lease_id=None if lease_id is None else str(lease_id),
        stored_state=str(state),
        lease_expires=None if expires is None else float(expires),
        lease_seconds=None if seconds is None else int(seconds),
    )


def _entry(row: _Row, now: float) -> BlobEntry:
    state = row.state(now)
    return BlobEntry(
        name=row.name,
        metadata=row.metadata,
        etag=row.etag,
        last_modified=datetime.fromtimestamp(row.last_modified, tz=UTC),
        lease_state=state,
        lease_infinite=state is LeaseState.LEASED and row.lease_expires is None,
        size=len(row.data),
    )


def _new_etag() -> str:
    return f'"0x{secrets.token_hex(8).upper()}"'
