"""The `projection` pipeline: the log projection pattern of the replication tasks. The event stream flattened
onto a database table: the latest event per key (a compacted view, "event sourcing"), and optionally every
event in a history table (a time-series historian).

    latest:  <keyColumn> text primary key, <payloadColumn> jsonb | text | bytea, source_partition,
             source_sequence, source_offset, enqueued_time, projected_at
    history: the same columns, one row per event, primary key (source_partition, source_sequence)

Idempotent under replays (a batch run again, a partition read again after a crash or a handoff, a whole
hub read again into the same tables): a row of the latest table is replaced only by a newer event: from the
same source partition, a higher sequence number; from another partition (the key moved), a later enqueued
time. A history row is written once. Each Spark task writes its events in one transaction (PostgreSQL:
COPY into a temporary table, then one upsert and one insert from it); the sink's commit record and the
checkpoint follow, so a failure before the commit only means the batch is written again.

PostgreSQL goes through psycopg 3; SQLite (the embedded default, for `hubshift run`) through the standard
library. The key is the partition key by default (events without one are skipped, as the pattern's own
example does) or a property or a JSON field. A body the payload column cannot hold (not JSON for `json`,
not UTF-8 for `text`, a NUL character PostgreSQL refuses) is a dead letter with the reason.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from hubshift.errors import UserError
from hubshift.pipelines.base import TaskResult
from hubshift.pipelines.edits import Event, FieldReader
from hubshift.spec import EventFieldSpec, ProjectionSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# The columns every projection table has besides the key and the payload.
SOURCE_COLUMNS = ("source_partition", "source_sequence", "source_offset", "enqueued_time", "projected_at")
_JSON_NUL = re.compile(r"(?<!\\)(\\\\)*\\u0000", re.IGNORECASE)


@dataclass(frozen=True)
class Record:
    """One event as a row of the tables."""

    key: str
    payload: str | bytes
    partition: str
    sequence: int
    offset: str | None
    enqueued: datetime | None


def newer(candidate: Record, current: Record) -> bool:
    """Whether `candidate` replaces `current`: a higher sequence number of the same source partition, or a
    later enqueued time when they come from different partitions."""
    if candidate.partition == current.partition:
        return candidate.sequence > current.sequence
    if candidate.enqueued is None or current.enqueued is None:
        return False
    return candidate.enqueued > current.enqueued


def latest_per_key(records: Iterable[Record]) -> dict[str, Record]:
    """The newest record of each key (`newer`), the first one seen on a tie."""
    latest: dict[str, Record] = {}
    for record in records:
        known = latest.get(record.key)
        if known is None or newer(record, known):
            latest[record.key] = record
    return latest


def payload_of(body: bytes, payload_type: str) -> str | bytes:
    """The body as the payload column holds it; `ValueError` (the reason) when it cannot."""
    if payload_type == "binary":
        return body
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the body is not UTF-8 text") from None
    if "\x00" in text:
        raise ValueError("the body holds a NUL character")
    if payload_type == "json":
        try:
            json.loads(text)
        except ValueError:
            raise ValueError("the body is not JSON") from None
        if _JSON_NUL.search(text):
            raise ValueError("the body holds \\u0000, which a JSON column refuses")
    return text


def to_records(
    rows: Sequence[Mapping[str, Any]], key: FieldReader, payload_type: str
) -> tuple[list[Record], list[tuple[Mapping[str, Any], str]]]:
    """The records of the events that have a key and a payload the column holds, and the refused events with
    their reasons; events without a key are left out."""
    records: list[Record] = []
    refused: list[tuple[Mapping[str, Any], str]] = []
    for row in rows:
        event = Event(dict(row))
        value = key.read(event)
        if value is None:
            continue
        if "\x00" in value:
            refused.append((row, f"the {key.describe()} holds a NUL character"))
            continue
        try:
            payload = payload_of(event.body, payload_type)
        except ValueError as exc:
            refused.append((row, str(exc)))
            continue
        sequence = row.get("sequence_number")
        partition = row.get("partition")
        if sequence is None or partition is None:
            refused.append(
                (row, "the event has no partition and sequence number (an editor step dropped them)")
            )
            continue
        records.append(
            Record(value, payload, str(partition), int(sequence), row.get("offset"), row.get("enqueued_time"))
        )
    return records, refused


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

    @classmethod
    def from_spec(cls, spec: ProjectionSpec) -> Tables:
        tables = cls(
            spec.table,
            spec.key_column,
            spec.payload_column,
            spec.payload_type,
            spec.history_table,
            spec.create_tables,
        )
        names = [spec.key_column.lower(), spec.payload_column.lower(), *SOURCE_COLUMNS]
        if len(set(names)) != len(names):
            raise UserError(
                "spec.consumer.pipeline.projection: keyColumn and payloadColumn must differ from each other "
                f"and from {', '.join(SOURCE_COLUMNS)}"
            )
        if spec.history_table is not None and spec.history_table.lower() == spec.table.lower():
            raise UserError("spec.consumer.pipeline.projection: historyTable must differ from table")
        return tables

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


class ProjectionPipeline:
    name = "projection"

    def __init__(self, database: ProjectionDatabase, tables: Tables, key: EventFieldSpec) -> None:
        self.database = database
        self.tables = tables
        self.key = FieldReader(key)

    @classmethod
    def from_spec(cls, spec: ProjectionSpec, environ: Mapping[str, str]) -> ProjectionPipeline:
        from hubshift.pipelines.projection_db import open_database

        tables = Tables.from_spec(spec)
        return cls(open_database(spec, tables, environ), tables, spec.key)

    def prepare(self, events: DataFrame) -> DataFrame:
        return events

    def process_task(self, rows: pa.Table) -> TaskResult:
        return TaskResult(dead_letters=self.forward(rows.to_pylist()))

    def forward(self, events: Sequence[Mapping[str, Any]]) -> list[str]:
        from hubshift.sinks.base import dead_letter_text

        records, refused = to_records(events, self.key, self.tables.payload_type)
        if records:
            history = records if self.tables.history_table is not None else []
            self.database.write(list(latest_per_key(records).values()), history)
        return [dead_letter_text(row, reason) for row, reason in refused]


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
