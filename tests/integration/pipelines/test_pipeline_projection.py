"""The projection pipeline (log projection) on real PySpark, into a real PostgreSQL (and SQLite): the latest
event per key, a history table written once, replays that never put an older event back, bodies the column
cannot hold as dead letters; and a consumer killed with SIGKILL, restarted, then the whole hub read again into
the same tables, which still equal a reference computed here."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hubshift.consumer.spark.batch import process_batch
from hubshift.emulator.launch import RunningEmulator
from hubshift.pipelines import PipelineSpec, build_pipeline
from hubshift.pipelines.projection import DEFAULT_PROJECTION_ENV
from hubshift.sinks import FileSink, FolderStore
from tests.fixtures.consumer import (
    ConsumerPool,
    all_in_sink,
    consumer_environ,
    consumer_manifest,
    wait_for,
)
from tests.fixtures.hubs import send_events, tails
from tests.fixtures.spark import event_row
from tests.harness.postgres import Postgres

pytestmark = pytest.mark.timeout(600)

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def projection(database: str, **options: Any) -> dict[str, Any]:
    return {"table": "homes_latest", "keyColumn": "home", "database": database, **options}


def table_rows(database: Any, table: str = "homes_latest", key: str = "home") -> dict[str, dict[str, Any]]:
    """key -> {payload (parsed), partition, sequence} of every row."""
    query = f"SELECT {key}, payload, source_partition, source_sequence FROM {table}"
    if isinstance(database, Postgres):
        import psycopg

        with psycopg.connect(database.conninfo) as connection:
            rows = connection.execute(query).fetchall()
        return {k: {"payload": p, "partition": s, "sequence": n} for k, p, s, n in rows}
    with sqlite3.connect(database) as connection:
        rows = connection.execute(query).fetchall()
    return {k: {"payload": json.loads(p), "partition": s, "sequence": n} for k, p, s, n in rows}


def history_count(database: Any) -> tuple[int, int]:
    """(rows, distinct events) of the history table."""
    query = "SELECT count(*), count(DISTINCT (source_partition || '/' || source_sequence)) FROM homes_history"
    if isinstance(database, Postgres):
        import psycopg

        with psycopg.connect(database.conninfo) as connection:
            found = connection.execute(query).fetchone()
    else:
        with sqlite3.connect(database) as connection:
            found = connection.execute(query).fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


@pytest.fixture(params=["postgres", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict[str, Any], Any, dict[str, str]]:
    """(the projection's manifest block, where to look, the environment)."""
    if request.param == "postgres":
        server: Postgres = request.getfixturevalue("postgres")
        import psycopg

        with psycopg.connect(server.conninfo, autocommit=True) as connection:
            connection.execute("DROP TABLE IF EXISTS homes_latest, homes_history")
        return projection("postgres", postgres={}), server, {DEFAULT_PROJECTION_ENV: server.conninfo}
    path = tmp_path / "projection.db"
    return projection("sqlite", sqlite={"path": str(path)}), path, {}


def test_the_latest_event_per_key_survives_replays_and_older_events(
    event_frame: Callable[..., Any], database: tuple[dict[str, Any], Any, dict[str, str]], tmp_path: Path
) -> None:
    block, where, environ = database
    spec = PipelineSpec.model_validate(
        {"type": "projection", "projection": {**block, "historyTable": "homes_history"}}
    )
    from hubshift.pipelines import check_pipeline

    check_pipeline(spec, environ)  # start-up: the tables are made
    pipeline = build_pipeline(spec, environ)
    sink = FileSink(FolderStore(tmp_path), FolderStore(tmp_path / "dead-letter"))

    def body(home: str, n: int) -> bytes:
        return json.dumps({"home": home, "n": n}).encode()

    first = [event_row("0", n, body(f"h{n % 3}", n), partition_key=f"h{n % 3}") for n in range(9)]
    first += [
        event_row("1", 50, body("h9", 50), partition_key="h9"),
        event_row("1", 51, b"nope", partition_key="h9"),
    ]
    first += [event_row("1", 52, body("none", 52))]  # no partition key: skipped
    summary = process_batch(event_frame(first), 0, "projector", pipeline, sink)
    assert summary.events == 12 and summary.dead_letters == 1

    # The same batch again (a replay), then an older event of h0 alone: nothing goes back.
    process_batch(event_frame(first), 1, "projector", pipeline, sink)
    process_batch(
        event_frame([event_row("0", 3, body("h0", 3), partition_key="h0")]), 2, "projector", pipeline, sink
    )
    # h0 moves to partition 1 with a later enqueued time: the newer event wins across partitions.
    later = T0 + timedelta(minutes=5)
    moved = event_row("1", 60, body("h0", 60), partition_key="h0", enqueued_time=later)
    process_batch(event_frame([moved]), 3, "projector", pipeline, sink)

    rows = table_rows(where)
    assert {k: (r["payload"]["n"], r["partition"], r["sequence"]) for k, r in rows.items()} == {
        "h0": (60, "1", 60),
        "h1": (7, "0", 7),
        "h2": (8, "0", 8),
        "h9": (50, "1", 50),
    }
    assert history_count(where) == (11, 11)  # every keyed, storable event, once


def test_a_consumer_killed_and_a_hub_read_again_leave_the_reference_table(
    emulator_factory: Callable[..., RunningEmulator],
    consumer_pool: ConsumerPool,
    postgres: Postgres,
    tmp_path: Path,
) -> None:
    import psycopg

    with psycopg.connect(postgres.conninfo, autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS homes_latest, homes_history")
    emulator = emulator_factory(["hub:2"])
    consumer_pool.environ = {
        **consumer_environ(emulator.connection_string),
        DEFAULT_PROJECTION_ENV: postgres.conninfo,
    }
    block = {**projection("postgres", postgres={}), "historyTable": "homes_history"}

    def manifest(store: str) -> Path:
        return consumer_manifest(
            tmp_path / f"{store}.yaml",
            store={"sqlite": {"path": str(tmp_path / f"{store}.db")}},
            sink=tmp_path / f"sink-{store}",
            consumer={"pipeline": {"type": "projection", "projection": block}},
        )

    generator = random.Random(7)
    sent: list[tuple[str, int]] = []

    def produce(count: int) -> None:
        batch = []
        for _ in range(count):
            home = f"h{generator.randrange(40)}"
            sent.append((home, len(sent)))
            batch.append((home, json.dumps({"home": home, "n": len(sent) - 1}), None))
        send_events(emulator, "hub", batch)

    first = consumer_pool.start(manifest("first"), "projector-0")
    first.wait_ready(360)
    produce(1500)
    wait_for(lambda: len(table_rows(postgres)) >= 30, 180, "the first rows", on_timeout=first.log)
    first.kill()  # SIGKILL: whatever came after its last checkpoint is read again
    produce(1500)
    again = consumer_pool.start(manifest("first"), "projector-0")
    again.wait_ready(360)
    expected = {home: n for home, n in sent}  # per key, the last one sent (each key is in one partition)

    def caught_up() -> bool:
        return {k: r["payload"]["n"] for k, r in table_rows(postgres).items()} == expected

    wait_for(caught_up, 240, "the table to equal the reference", on_timeout=again.log)
    again.terminate()
    again.wait(60)
    # The whole hub read again into the same tables, by a new pool (a new checkpoint store).
    replay = consumer_pool.start(manifest("replay"), "projector-1")
    replay.wait_ready(360)
    produced = tails(emulator, "hub")
    assert sum(produced.values()) == len(sent)
    wait_for(
        lambda: all_in_sink(tmp_path / "sink-replay", produced), 240, "the replay", on_timeout=replay.log
    )
    assert {k: r["payload"]["n"] for k, r in table_rows(postgres).items()} == expected
    assert history_count(postgres) == (len(sent), len(sent))
