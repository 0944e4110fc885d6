"""The projection's databases: PostgreSQL (psycopg 3) and SQLite (the standard library), one transaction per
Spark task, the same tables and the same "newer only" rule (`projection.py` says what they hold).

The PostgreSQL connection string comes from the environment variable the manifest names; it never appears
in a message: errors name the database by host and database name only.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from hubshift.errors import UserError
from hubshift.pipelines.projection_tables import (
    Record,
    Tables,
    cached_connection,
    forget_connection,
    record_values,
    utc_now,
)

log = logging.getLogger(__name__)

# A write that deadlocks or fails to serialize against another consumer's is run again, up to this many
# times in all, after a short random pause (so the two do not collide again in step).
WRITE_ATTEMPTS = 5


# --- PostgreSQL ------------------------------------------------------------------------------------------

_PG_TYPES = {"json": "jsonb", "text": "text", "binary": "bytea"}


class PostgresProjection:
    def __init__(self, conninfo: str, tables: Tables, variable: str = "") -> None:
        self.conninfo = conninfo
        self.tables = tables
        self.variable = variable

    def describe(self) -> str:
        """Where (host, port, database), never the credentials."""
        try:
            from psycopg.conninfo import conninfo_to_dict

            parts = conninfo_to_dict(self.conninfo)
        except Exception:
            return f"PostgreSQL ({self.variable or 'connection string'})"
        host = parts.get("host") or "localhost"
        port = parts.get("port") or "5432"
        return f"PostgreSQL {host}:{port}/{parts.get('dbname') or parts.get('user') or ''}".rstrip("/")

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.conninfo, autocommit=False, connect_timeout=10)

    def connection(self) -> Any:
        return cached_connection("postgres", self.conninfo, self._connect)

    def _name(self, table: str) -> Any:
        from psycopg import sql

        return sql.Identifier(*table.split("."))

    def _create_statements(self) -> list[Any]:
        from psycopg import sql

        t = self.tables
        payload = sql.SQL(_PG_TYPES[t.payload_type])
        key, body = sql.Identifier(t.key_column), sql.Identifier(t.payload_column)
        source = sql.SQL(
            "source_partition text NOT NULL, source_sequence bigint NOT NULL, source_offset text, "
            "enqueued_time timestamptz, projected_at timestamptz NOT NULL"
        )
        statements = [
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({} text PRIMARY KEY, {} {}, {})").format(
                self._name(t.table), key, body, payload, source
            )
        ]
        if t.history_table is not None:
            statements.append(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ({} text NOT NULL, {} {}, {}, "
                    "PRIMARY KEY (source_partition, source_sequence))"
                ).format(self._name(t.history_table), key, body, payload, source)
            )
        return statements

    def prepare(self) -> None:
        from psycopg import sql

        t = self.tables
        try:
            with self._connect() as connection:
                if t.create:
                    for statement in self._create_statements():
                        connection.execute(statement)
                for table in (t.table, t.history_table):
                    if table is None:
                        continue
                    columns = sql.SQL(", ").join(sql.Identifier(c) for c in t.columns)
                    connection.execute(
                        sql.SQL("SELECT {} FROM {} WHERE false").format(columns, self._name(table))
                    )
        except Exception as exc:
            raise UserError(f"projection database {self.describe()}: {self.explain(exc)}") from None

    def explain(self, error: BaseException) -> str:
        """One line about a failure, with the connection string and its password taken out."""
        text = " ".join(str(error).split()) or type(error).__name__
        secrets = [self.conninfo]
        try:
            from psycopg.conninfo import conninfo_to_dict

            password = conninfo_to_dict(self.conninfo).get("password")
            if password:
                secrets.append(str(password))
        except Exception:
            return "the connection string is not valid (check " + (self.variable or "it") + ")"
        for secret in secrets:
            text = text.replace(secret, "***")
        return text[:300]

    def write(self, latest: Sequence[Record], history: Sequence[Record]) -> None:
        """One transaction: the winners upserted (newer only), every record into the history table. A
        deadlock or serialization failure against another consumer's write re-runs the whole transaction."""
        from psycopg.errors import DeadlockDetected, SerializationFailure

        retrying = Retrying(
            retry=retry_if_exception_type((DeadlockDetected, SerializationFailure)),
            stop=stop_after_attempt(WRITE_ATTEMPTS),
            wait=wait_random_exponential(multiplier=0.05, max=1.0),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            connection = self.connection()
            for attempt in retrying:
                with attempt:
                    self._write_once(connection, latest, history)
        except Exception:
            forget_connection("postgres", self.conninfo)
            raise

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "projection write to %s: %s, retrying (attempt %d of %d)",
            self.describe(),
            type(error).__name__,
            state.attempt_number + 1,
            WRITE_ATTEMPTS,
        )

    def _write_once(self, connection: Any, latest: Sequence[Record], history: Sequence[Record]) -> None:
        from psycopg import sql

        t = self.tables
        staged = sql.Identifier(f"hubshift_staged_{t.payload_type}")
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in t.columns)
        now = utc_now()
        with connection.transaction():
            connection.execute(
                sql.SQL(
                    "CREATE TEMPORARY TABLE IF NOT EXISTS {} ({} text, {} {}, source_partition text, "
                    "source_sequence bigint, source_offset text, enqueued_time timestamptz, "
                    "projected_at timestamptz, latest boolean) ON COMMIT DELETE ROWS"
                ).format(
                    staged,
                    sql.Identifier(t.key_column),
                    sql.Identifier(t.payload_column),
                    sql.SQL(_PG_TYPES[t.payload_type]),
                )
            )
            winners = {id(record) for record in latest}
            rows = history if history else latest
            with connection.cursor() as cursor:
                copy_sql = sql.SQL("COPY {} ({}, latest) FROM STDIN").format(staged, columns)
                with cursor.copy(copy_sql) as copy:
                    # `history` holds every record, the winners among them; else only the winners.
                    for record in rows:
                        copy.write_row((*record_values(record, now), id(record) in winners))
                cursor.execute(self._upsert(staged, columns))
                if t.history_table is not None and history:
                    # In key order too, for the same reason as the upsert (two consumers replaying events).
                    cursor.execute(
                        sql.SQL(
                            "INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY source_partition, "
                            "source_sequence ON CONFLICT (source_partition, source_sequence) DO NOTHING"
                        ).format(self._name(t.history_table), columns, columns, staged)
                    )

    def _upsert(self, staged: Any, columns: Any) -> Any:
        from psycopg import sql

        t = self.tables
        table = self._name(t.table)
        key = sql.Identifier(t.key_column)
        updates = sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
            for c in t.columns
            if c != t.key_column
        )
        # Rows are locked in the order they are inserted: in key order, every consumer takes the locks of the
        # keys they share in the same order and none waits for another in a cycle (a deadlock).
        return sql.SQL(
            "INSERT INTO {} AS current ({}) SELECT {} FROM {} WHERE latest ORDER BY {} "
            "ON CONFLICT ({}) DO UPDATE SET {} WHERE "
            "(current.source_partition = EXCLUDED.source_partition "
            "AND current.source_sequence < EXCLUDED.source_sequence) OR "
            "(current.source_partition <> EXCLUDED.source_partition "
            "AND current.enqueued_time < EXCLUDED.enqueued_time)"
        ).format(table, columns, columns, staged, key, key, updates)


# --- SQLite ----------------------------------------------------------------------------------------------

_SQLITE_TYPES = {"json": "TEXT", "text": "TEXT", "binary": "BLOB"}


def _quote(name: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def _iso(moment: datetime | None) -> str | None:
    # Fixed width, so text order is time order in the comparisons below.
    if moment is None:
        return None
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SqliteProjection:
    def __init__(self, path: str, tables: Tables) -> None:
        self.path = path
        self.tables = tables

    def describe(self) -> str:
        return f"SQLite {self.path}"

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA busy_timeout=60000")
        return connection

    def _create_statements(self) -> list[str]:
        t = self.tables
        payload = _SQLITE_TYPES[t.payload_type]
        source = (
            "source_partition TEXT NOT NULL, source_sequence INTEGER NOT NULL, source_offset TEXT, "
            "enqueued_time TEXT, projected_at TEXT NOT NULL"
        )
        key, body = _quote(t.key_column), _quote(t.payload_column)
        create = "CREATE TABLE IF NOT EXISTS"
        statements = [f"{create} {_quote(t.table)} ({key} TEXT PRIMARY KEY, {body} {payload}, {source})"]
        if t.history_table is not None:
            statements.append(
                f"{create} {_quote(t.history_table)} ({key} TEXT NOT NULL, {body} {payload}, {source}, "
                "PRIMARY KEY (source_partition, source_sequence))"
            )
        return statements

    def prepare(self) -> None:
        t = self.tables
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            connection = self._connect()
            try:
                if t.create:
                    for statement in self._create_statements():
                        connection.execute(statement)
                columns = ", ".join(_quote(c) for c in t.columns)
                for table in (t.table, t.history_table):
                    if table is not None:
                        connection.execute(f"SELECT {columns} FROM {_quote(table)} WHERE 0")
            finally:
                connection.close()
        except (OSError, sqlite3.Error) as exc:
            raise UserError(f"projection database {self.describe()}: {exc}") from None

    def write(self, latest: Sequence[Record], history: Sequence[Record]) -> None:
        t = self.tables
        now = _iso(utc_now())
        columns = ", ".join(_quote(c) for c in t.columns)
        marks = ", ".join("?" for _ in t.columns)
        table = _quote(t.table)
        updates = ", ".join(f"{_quote(c)} = excluded.{_quote(c)}" for c in t.columns if c != t.key_column)
        current = table.rsplit(".", 1)[-1]
        upsert = (
            f"INSERT INTO {table} ({columns}) VALUES ({marks}) "
            f"ON CONFLICT ({_quote(t.key_column)}) DO UPDATE SET {updates} "
            f"WHERE ({current}.source_partition = excluded.source_partition AND "
            f"{current}.source_sequence < excluded.source_sequence) OR ({current}.source_partition <> "
            f"excluded.source_partition AND {current}.enqueued_time < excluded.enqueued_time)"
        )

        def values(record: Record) -> tuple[Any, ...]:
            key, payload, partition, sequence, offset, enqueued, _ = record_values(record, utc_now())
            return (key, payload, partition, sequence, offset, _iso(enqueued), now)

        try:
            connection = cached_connection("sqlite", self.path, self._connect)
            connection.execute("BEGIN IMMEDIATE")
            try:
                connection.executemany(upsert, [values(r) for r in latest])
                if t.history_table is not None and history:
                    connection.executemany(
                        f"INSERT INTO {_quote(t.history_table)} ({columns}) VALUES ({marks}) "
                        "ON CONFLICT (source_partition, source_sequence) DO NOTHING",
                        [values(r) for r in history],
                    )
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise
        except Exception:
            forget_connection("sqlite", self.path)
            raise


__all__ = ["PostgresProjection", "SqliteProjection"]
