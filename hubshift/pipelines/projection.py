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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from hubshift.errors import UserError, require_extra
from hubshift.pipelines.base import BuildContext, Location, Pipeline, PipelineKind, TaskResult
from hubshift.pipelines.editor import build_editor
from hubshift.pipelines.edits import Event, FieldReader
from hubshift.pipelines.projection_db import PostgresProjection, SqliteProjection
from hubshift.pipelines.projection_tables import SOURCE_COLUMNS, ProjectionDatabase, Record, Tables
from hubshift.pipelines.steps import EventFieldSpec
from hubshift.sinks.base import dead_letter_text
from hubshift.spec import SQL_NAME, SQL_TABLE, Model, NamedConnection, SecretConnectionSpec, cel

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# A table or column name in a projection's database (optionally schema-qualified for a table).
# The default variable of the database's connection string.
DEFAULT_PROJECTION_ENV = "HUBSHIFT_PROJECTION_CONNECTION_STRING"
POSTGRES_REQUIRED = "postgres is required when database is postgres"
_JSON_NUL = re.compile(r"(?<!\\)(\\\\)*\\u0000", re.IGNORECASE)


class PostgresSpec(SecretConnectionSpec):
    """A PostgreSQL database: its connection string (postgresql://... or key=value)."""

    SERVICE = "PostgreSQL"
    DEFAULT_VARIABLE = DEFAULT_PROJECTION_ENV


class SqliteDatabaseSpec(Model):
    """The projection's SQLite database (database sqlite)."""

    path: str = Field(default="hubshift-projection.db", min_length=1, description="The SQLite file.")


class ProjectionSpec(Model):
    """The latest event per key kept in a table (a compacted view), optionally every event in a history
    table; replays never overwrite a newer event with an older one."""

    database: Literal["sqlite", "postgres"] = Field(
        default="sqlite", description="sqlite (embedded, one machine) or postgres."
    )
    sqlite: SqliteDatabaseSpec = Field(default_factory=SqliteDatabaseSpec)
    postgres: PostgresSpec | None = None
    table: str = Field(pattern=SQL_TABLE, description="The latest event per key.")
    key_column: str = Field(default="key", pattern=SQL_NAME, description="The key's column (primary key).")
    payload_column: str = Field(default="payload", pattern=SQL_NAME, description="The body's column.")
    payload_type: Literal["json", "text", "binary"] = Field(
        default="json",
        description="json (jsonb; events whose body is not JSON are dead letters), text (UTF-8) or binary.",
    )
    key: EventFieldSpec = Field(
        default_factory=lambda: EventFieldSpec(partition_key=True),
        description="The value that identifies a record (default: the partition key; events without one "
        "are skipped).",
    )
    history_table: str | None = Field(
        default=None,
        pattern=SQL_TABLE,
        description="Also every event here, once (a time-series historian).",
    )
    create_tables: bool = Field(default=True, description="Create the tables at start-up when missing.")

    CEL = (
        cel(
            "!has(self.database) || self.database != 'postgres' || has(self.postgres)",
            POSTGRES_REQUIRED,
            ".postgres",
        ),
    )

    @model_validator(mode="after")
    def _postgres_configured(self) -> ProjectionSpec:
        if self.database == "postgres" and self.postgres is None:
            raise ValueError(POSTGRES_REQUIRED)
        return self


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


class ProjectionPipeline:
    name = "projection"

    def __init__(self, database: ProjectionDatabase, tables: Tables, key: EventFieldSpec) -> None:
        self.database = database
        self.tables = tables
        self.key = FieldReader(key)

    @classmethod
    def from_spec(cls, spec: ProjectionSpec, environ: Mapping[str, str]) -> ProjectionPipeline:
        tables = tables_of(spec)
        return cls(open_database(spec, tables, environ), tables, spec.key)

    def prepare(self, events: DataFrame) -> DataFrame:
        return events

    def process_task(self, rows: pa.Table) -> TaskResult:
        return TaskResult(dead_letters=self.forward(rows.to_pylist()))

    def forward(self, events: Sequence[Mapping[str, Any]]) -> list[str]:
        records, refused = to_records(events, self.key, self.tables.payload_type)
        if records:
            history = records if self.tables.history_table is not None else []
            self.database.write(list(latest_per_key(records).values()), history)
        return [dead_letter_text(row, reason) for row, reason in refused]


def tables_of(spec: ProjectionSpec) -> Tables:
    """The tables a projection block names; `UserError` when its column or table names clash."""
    tables = Tables(
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


def open_database(
    spec: ProjectionSpec, tables: Tables, environ: Mapping[str, str]
) -> PostgresProjection | SqliteProjection:
    """The database a projection block names (not yet connected)."""
    if spec.database == "postgres":
        assert spec.postgres is not None  # the model requires it for database postgres
        require_extra("psycopg", "postgres", "spec.consumer.pipeline.projection: database postgres")
        resolved = _connections(spec, LOCATION)[0].resolve(environ)
        return PostgresProjection(resolved.connection_string or "", tables, resolved.variable or "")
    return SqliteProjection(str(Path(spec.sqlite.path).absolute()), tables)


LOCATION: Location = ("spec", "consumer", "pipeline", "projection")


def _connections(block: ProjectionSpec, location: Location) -> list[NamedConnection]:
    if block.database != "postgres" or block.postgres is None:
        return []
    return [NamedConnection((*location, "postgres"), block.postgres, "pipeline")]


def _check(block: ProjectionSpec, environ: Mapping[str, str], location: Location) -> None:
    """The database reachable and its tables made or there."""
    open_database(block, tables_of(block), environ).prepare()


def _build(block: ProjectionSpec, context: BuildContext) -> Pipeline:
    return build_editor(ProjectionPipeline.from_spec(block, context.environ), context.editor, context.state)


PIPELINE = PipelineKind[ProjectionSpec](
    name="projection",
    annotation=ProjectionSpec | None,
    field=Field(default=None, description="The database table (type projection)."),
    required="projection (the table)",
    build=_build,
    connections=_connections,
    check=_check,
    takes_editor=True,
)
