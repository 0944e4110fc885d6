"""The tables of a log projection (`projection.py`) and one event as their row: what the pipeline and the
database adapters (`projection_db.py`) share; each Python worker's open connections."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

# The columns every projection table has besides the key and the payload.
SOURCE_COLUMNS = ("source_partition", "source_sequence", "source_offset", "enqueued_time", "projected_at")


@dataclass(frozen=True)
class Record:
    """One event as a row of the tables."""

    key: str
    payload: str | bytes
    partition: str
    sequence: int
    offset: str | None
    enqueued: datetime | None


class ProjectionDatabase(Protocol):
    """Where the tables are; pickled to Spark's Python workers (configuration only, connections opened
    there and kept per worker)."""

    def prepare(self) -> None:
        """At start-up: create the tables (when asked) and check their columns; `UserError` (one line)."""
        ...

    def write(self, latest: Sequence[Record], history: Sequence[Record]) -> None:
        """One transaction: upsert `latest` (newer only), insert `history` (once)."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Tables:
    table: str
    key_column: str
    payload_column: str
    payload_type: str
    history_table: str | None
    create: bool

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.key_column, self.payload_column, *SOURCE_COLUMNS)


def record_values(record: Record, now: datetime) -> tuple[Any, ...]:
    return (
        record.key,
        record.payload,
        record.partition,
        record.sequence,
        record.offset,
        record.enqueued,
        now,
    )


# One open connection per database in each Python worker, kept across micro-batches (as the replicate
# pipeline keeps its producers); dropped after a failure, so the next batch connects again.
_CONNECTIONS: dict[tuple[str, str], Any] = {}

_CONNECTIONS_LOCK = threading.Lock()


def cached_connection(kind: str, address: str, connect: Any) -> Any:
    with _CONNECTIONS_LOCK:
        connection = _CONNECTIONS.get((kind, address))
        if connection is None:
            connection = _CONNECTIONS[(kind, address)] = connect()
        return connection


def forget_connection(kind: str, address: str) -> None:
    with _CONNECTIONS_LOCK:
        connection = _CONNECTIONS.pop((kind, address), None)
    if connection is not None:
        try:
            connection.close()
        except Exception:
            pass


def utc_now() -> datetime:
    return datetime.now(UTC)
