"""Concurrent projection writers on a real PostgreSQL: consumers writing overlapping keys at the same time
neither deadlock each other into failed writes nor lose the newest value of a key, and a deadlock or a
serialization failure that does happen is retried inside the write."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from hubshift.pipelines.projection_db import PostgresProjection
from hubshift.pipelines.projection_tables import Record, Tables, forget_connection
from tests.harness.postgres import Postgres

pytestmark = pytest.mark.timeout(180)

WRITERS = 3
KEYS = [f"home-{n:03d}" for n in range(200)]
ROUNDS = 40
TABLES = Tables("homes_latest", "home", "payload", "json", "homes_history", True)
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


@pytest.fixture
def tables(postgres: Postgres) -> Iterator[None]:
    with psycopg.connect(postgres.conninfo, autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS homes_latest, homes_history")
    PostgresProjection(postgres.conninfo, TABLES).prepare()
    yield


def writer(postgres: Postgres, name: str) -> PostgresProjection:
    """A projection writer with a connection of its own (the connection cache is per connection string,
    as each consumer process has its own)."""
    return PostgresProjection(f"{postgres.conninfo}?application_name={name}", TABLES)


def record(key: str, sequence: int) -> Record:
    return Record(key, f'{{"key": "{key}", "sequence": {sequence}}}', "0", sequence, str(sequence), T0)


def test_concurrent_writers_over_shared_keys_never_fail_and_keep_the_newest(
    postgres: Postgres, tables: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hubshift")
    failures: list[str] = []
    start = threading.Barrier(WRITERS)

    def run(index: int) -> None:
        projection = writer(postgres, f"writer-{index}")
        shuffle = random.Random(index)
        start.wait(timeout=30)
        try:
            for round_ in range(ROUNDS):
                # One event per key and write, each with a sequence number of its own (one source partition):
                # the newest of a key is the one with the highest.
                write = round_ * WRITERS + index
                batch = [record(key, write * len(KEYS) + n) for n, key in enumerate(KEYS)]
                shuffle.shuffle(batch)  # each consumer's batch comes in its own order
                try:
                    projection.write(batch, batch)
                except psycopg.Error as exc:
                    failures.append(type(exc).__name__)
        finally:
            forget_connection("postgres", projection.conninfo)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(WRITERS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "writers still running after 120 s"
    took = time.monotonic() - started

    assert failures == [], f"{len(failures)} of {WRITERS * ROUNDS} writes failed: {sorted(set(failures))}"
    # Taken in key order, the locks of shared keys never form a cycle: not one write needed its retry.
    assert [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()] == []
    last_write = (ROUNDS - 1) * WRITERS + WRITERS - 1
    newest = {key: last_write * len(KEYS) + n for n, key in enumerate(KEYS)}
    with psycopg.connect(postgres.conninfo) as connection:
        rows = connection.execute("SELECT home, payload, source_sequence FROM homes_latest").fetchall()
        history = connection.execute("SELECT count(*) FROM homes_history").fetchone()
    assert {home: (payload["sequence"], sequence) for home, payload, sequence in rows} == {
        key: (newest[key], newest[key]) for key in KEYS
    }
    assert history == (len(KEYS) * ROUNDS * WRITERS,)
    assert took < 120


def wait_until_blocked(postgres: Postgres, application: str) -> None:
    """Until the session of `application` waits for a lock another transaction holds."""
    with psycopg.connect(postgres.conninfo, autocommit=True) as connection:
        for _ in range(200):
            found = connection.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                (application,),
            ).fetchone()
            if found:
                return
            time.sleep(0.05)
    raise AssertionError(f"{application} never waited for a lock")


def write_in_background(
    projection: PostgresProjection, batch: list[Record]
) -> tuple[threading.Thread, list[str]]:
    errors: list[str] = []

    def run() -> None:
        try:
            projection.write(batch, [])
        except psycopg.Error as exc:
            errors.append(type(exc).__name__)
        finally:
            forget_connection("postgres", projection.conninfo)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_a_deadlock_is_retried_inside_the_write(
    postgres: Postgres, tables: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hubshift")
    seed = [record("home-a", 1), record("home-b", 1)]
    writer(postgres, "seed").write(seed, [])
    forget_connection("postgres", writer(postgres, "seed").conninfo)
    with psycopg.connect(postgres.conninfo) as other:
        # Another transaction holds home-b; the writer locks home-a, then waits for home-b; the other then
        # asks for home-a: a cycle, which PostgreSQL breaks by failing the writer (it waited first).
        other.execute("UPDATE homes_latest SET source_offset = 'other' WHERE home = 'home-b'")
        projection = writer(postgres, "deadlocked")
        thread, errors = write_in_background(projection, [record("home-a", 2), record("home-b", 2)])
        wait_until_blocked(postgres, "deadlocked")
        other.execute("UPDATE homes_latest SET source_offset = 'other' WHERE home = 'home-a'")
        other.commit()
        thread.join(timeout=60)
    assert not thread.is_alive() and errors == []
    retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retried) == 1 and "DeadlockDetected" in retried[0], retried
    assert postgres.conninfo not in retried[0] and postgres.password not in retried[0]
    with psycopg.connect(postgres.conninfo) as connection:
        rows = dict(connection.execute("SELECT home, source_sequence FROM homes_latest").fetchall())
    assert rows == {"home-a": 2, "home-b": 2}


def test_a_serialization_failure_is_retried_inside_the_write(
    postgres: Postgres, tables: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hubshift")
    writer(postgres, "seed").write([record("home-a", 1)], [])
    forget_connection("postgres", writer(postgres, "seed").conninfo)
    with psycopg.connect(postgres.conninfo) as other:
        other.execute("UPDATE homes_latest SET source_offset = 'other' WHERE home = 'home-a'")
        # A database whose transactions run REPEATABLE READ (a DBA's default_transaction_isolation): the
        # writer's snapshot predates the other's commit, so its update fails to serialize.
        projection = PostgresProjection(
            f"{postgres.conninfo}?application_name=repeatable"
            "&options=-c%20default_transaction_isolation%3Drepeatable%5C%20read",
            TABLES,
        )
        thread, errors = write_in_background(projection, [record("home-a", 2)])
        wait_until_blocked(postgres, "repeatable")
        other.commit()
        thread.join(timeout=60)
    assert not thread.is_alive() and errors == []
    retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retried) == 1 and "SerializationFailure" in retried[0], retried
    with psycopg.connect(postgres.conninfo) as connection:
        rows = dict(connection.execute("SELECT home, source_sequence FROM homes_latest").fetchall())
    assert rows == {"home-a": 2}
