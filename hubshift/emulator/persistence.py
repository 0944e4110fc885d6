"""Events kept across restarts (`--data-dir`): one SQLite file, written as each delivery is accepted.

WAL mode with `synchronous=NORMAL` keeps every accepted event through a crash of the emulator process
(not of the machine) at the cost of one small transaction per producer delivery.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hubshift.emulator.partition_log import NEVER_ENQUEUED_MS, StoredEvent

SCHEMA = """
CREATE TABLE IF NOT EXISTS hubs (
    name TEXT PRIMARY KEY,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS partitions (
    hub TEXT NOT NULL,
    partition TEXT NOT NULL,
    next_sequence INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    last_enqueued_ms INTEGER NOT NULL,
    PRIMARY KEY (hub, partition)
);
CREATE TABLE IF NOT EXISTS events (
    hub TEXT NOT NULL,
    partition TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    header_length INTEGER NOT NULL,
    message BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_position ON events (hub, partition, sequence);
"""


@dataclass(frozen=True, slots=True)
class SavedPartition:
    events: list[StoredEvent]
    next_sequence: int
    next_offset: int
    last_enqueued_ms: int


class EventStore:
    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "events.sqlite3"
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def hub_created_at(self, hub: str, default_ms: int) -> int:
        """The hub's creation time, recorded the first time the hub is seen."""
        self._db.execute("INSERT OR IGNORE INTO hubs (name, created_at_ms) VALUES (?, ?)", (hub, default_ms))
        row = self._db.execute("SELECT created_at_ms FROM hubs WHERE name = ?", (hub,)).fetchone()
        return int(row[0])

    def load(self, hub: str, partition: str) -> SavedPartition:
        row = self._db.execute(
            "SELECT next_sequence, next_offset, last_enqueued_ms FROM partitions "
            "WHERE hub = ? AND partition = ?",
            (hub, partition),
        ).fetchone()
        if row is None:
            return SavedPartition([], 0, 0, NEVER_ENQUEUED_MS)
        events = [
            StoredEvent(sequence, offset, enqueued_ms, header_length, bytes(message))
            for sequence, offset, enqueued_ms, header_length, message in self._db.execute(
                "SELECT sequence, offset, enqueued_ms, header_length, message FROM events "
                "WHERE hub = ? AND partition = ? ORDER BY sequence",
                (hub, partition),
            )
        ]
        return SavedPartition(events, int(row[0]), int(row[1]), int(row[2]))

    def append(
        self,
        hub: str,
        partition: str,
        events: Sequence[StoredEvent],
        next_sequence: int,
        next_offset: int,
        last_enqueued_ms: int,
    ) -> None:
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO events "
                "(hub, partition, sequence, offset, enqueued_ms, header_length, message) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (hub, partition, e.sequence_number, e.offset, e.enqueued_ms, e.header_length, e.message)
                    for e in events
                ],
            )
            self._db.execute(
                "INSERT OR REPLACE INTO partitions "
                "(hub, partition, next_sequence, next_offset, last_enqueued_ms) VALUES (?, ?, ?, ?, ?)",
                (hub, partition, next_sequence, next_offset, last_enqueued_ms),
            )

    def discard_before(self, hub: str, partition: str, sequence: int) -> None:
        self._db.execute(
            "DELETE FROM events WHERE hub = ? AND partition = ? AND sequence < ?", (hub, partition, sequence)
        )

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    def close(self) -> None:
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
