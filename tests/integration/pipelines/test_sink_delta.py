"""A Spark team's job into Delta Lake, end to end: `hubshift consume` reads the emulator's hub, runs the
example's transform (examples/delta: parse, enrich from a broadcast lookup, partition by date) from a code
folder, and commits to a Delta table through Spark's Delta Lake; an independent reader (delta-rs) finds every
event sent in exactly one row, through a kill -9 mid-run and a replay of everything after the checkpoints."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hubshift.apps.produce import LoadSpec, send_load
from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import ConsumerPool, consumer_environ, consumer_manifest, wait_for

pytestmark = pytest.mark.timeout(900)
EXAMPLE_CODE = Path(__file__).resolve().parents[3] / "examples" / "delta"


def table_rows(path: Path) -> tuple[int, int]:
    """(rows, distinct events) of the Delta table, read by delta-rs: none of Spark's code."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        return 0, 0  # not committed yet
    rows = table.to_pyarrow_table(columns=["partition", "sequence_number"]).to_pylist()
    return len(rows), len({(r["partition"], r["sequence_number"]) for r in rows})


def test_every_event_in_exactly_one_row_through_kill_9_and_a_full_replay(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool, spark_jars: str
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:4"])  # type: ignore[operator]
    table = tmp_path / "homes"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        consumer={
            "spark": {"master": "local[1]", "triggerIntervalSeconds": 1, "maxEventsPerTrigger": 300},
            # Checkpoints only at a handoff: after the kill every event is read again from the start.
            "checkpoint": {"everySeconds": 3600, "everyEvents": 1_000_000},
            "code": {"path": str(EXAMPLE_CODE)},
            "pipeline": {"type": "function", "function": "homes_job:transform"},
            "sink": {"type": "delta", "delta": {"path": str(table), "partitionBy": ["date"]}},
        },
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    consumer_pool.environ["HUBSHIFT_SPARK_JARS"] = spark_jars
    total = 2400
    sent = send_load(
        emulator.connection_string, "hub", LoadSpec(homes=300, rate=100_000, count=total, seed=3)
    )
    assert sum(sent.partitions.values()) == total

    first = consumer_pool.start(manifest, "c0")
    wait_for(
        lambda: table_rows(table)[0] >= total // 4,
        300,
        "a quarter of the events in the table",
        on_timeout=first.log,
    )
    first.kill()  # mid-run: batches committed, none checkpointed
    assert table_rows(table)[0] < total

    again = consumer_pool.start(manifest, "c0")
    wait_for(lambda: table_rows(table)[0] >= total, 300, "every event in the table", on_timeout=again.log)
    stop = threading.Event()
    stop.wait(5)  # replays still running would add rows now
    rows, distinct = table_rows(table)
    assert (rows, distinct) == (total, total)
    again.terminate()
    assert again.process.wait(60) == 0
