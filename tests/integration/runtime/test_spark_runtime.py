"""The local runtime with Spark consumers (the aggregate pipeline; a Spark team's job into Delta Lake through
a scale-out, a store outage and a scale-in), and `hubshift demo` as a user runs it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks.folder import FolderStore
from tests.fixtures.runtime import Load, Pool, PoolFactory
from tests.harness.azurite import Azurite

SPARK = {
    "spark": {
        "master": "local[1]",
        "triggerIntervalSeconds": 1,
        "shufflePartitions": 1,
        "driverMemory": "512m",
    }
}


@pytest.mark.timeout(300)
async def test_spark_consumers_count_every_event_once_across_a_graceful_scale_in(
    local_pool: PoolFactory,
) -> None:
    pool = await local_pool(
        4,
        "spark",
        consumer={**SPARK, "pipeline": {"type": "aggregate", "aggregate": {"windowSeconds": 60}}},
        rebalance={"delaySeconds": 2, "maxHandoffSeconds": 60},
    )
    await pool.until(lambda: pool.balanced_over(2), 150, "two Spark consumers balanced")
    view = AggregateView(FolderStore(pool.output))

    def counted() -> int:
        view.refresh()
        return view.total()

    load = Load(pool.emulator.connection_string, rate=100, duration=5)
    load.start()
    load.join(30)
    await pool.until(lambda: counted() >= load.sent, 60, "the first events aggregated")

    second = Load(pool.emulator.connection_string, rate=100, duration=10)
    second.start()
    resized(pool, 1)
    await pool.until(
        lambda: pool.balanced_over(1) and len(pool.runtime.processes) == 1, 120, "drained to one"
    )
    second.join(30)
    total = load.sent + second.sent
    await pool.until(lambda: counted() >= total, 60, "every event aggregated")
    assert counted() == total, "a graceful handoff with Spark counts every event exactly once"
    assert ("homes-1", 0) in pool.runtime.exits


EXAMPLE_CODE = Path(__file__).resolve().parents[3] / "examples" / "delta"


def delta_rows(path: Path) -> tuple[int, int]:
    """(rows, distinct events) of the Delta table as delta-rs reads it (none of Spark's code)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        return 0, 0
    rows = table.to_pyarrow_table(columns=["partition", "sequence_number"]).to_pylist()
    return len(rows), len({(r["partition"], r["sequence_number"]) for r in rows})


def delta_version(path: Path) -> int:
    """The Delta table's latest version (-1 before its first commit): it moves with every committed batch."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(str(path)).version()
    except TableNotFoundError:
        return -1


def resized(pool: Pool, replicas: int) -> None:
    """The pool's manifest applied again with `replicas` consumers (as `kubectl apply` of a new spec)."""
    manifest = pool.operator.consumer
    scaling = manifest.spec.scaling.model_copy(update={"min_replicas": replicas, "max_replicas": replicas})
    pool.operator.apply(
        manifest.model_copy(update={"spec": manifest.spec.model_copy(update={"scaling": scaling})})
    )


@pytest.mark.timeout(1800)
async def test_a_delta_table_holds_every_event_once_through_scale_out_a_store_outage_and_scale_in(
    local_pool: PoolFactory,
    azurite: Azurite,
    spark_jars: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """examples/delta's job (its code from a folder) into a Delta table under a steady load: one consumer,
    then two (planned handoffs), the checkpoint store frozen past the membership lease (both stop reading
    and read again from their checkpoints: batches committed after them come again), then one (graceful
    handoffs). delta-rs finds every event sent in exactly one row."""
    monkeypatch.setenv("HUBSHIFT_SPARK_JARS", spark_jars)
    table = tmp_path / "homes"
    pool = await local_pool(
        4,
        "spark",
        scaling={"minReplicas": 1, "maxReplicas": 1},
        rebalance={"delaySeconds": 2, "maxHandoffSeconds": 60, "leaseDurationSeconds": 15},
        consumer={
            "spark": {**SPARK["spark"], "maxEventsPerTrigger": 400},
            "checkpoint": {"everySeconds": 5},
            "code": {"path": str(EXAMPLE_CODE)},
            "pipeline": {"type": "function", "function": "homes_job:transform"},
            "sink": {"type": "delta", "delta": {"path": str(table), "partitionBy": ["date"]}},
        },
    )
    await pool.until(lambda: pool.balanced_over(1), 180, "one Spark consumer reading")
    load = Load(pool.emulator.connection_string, rate=40)
    load.start()
    try:
        await pool.until(lambda: delta_rows(table)[0] > 0, 180, "the first rows committed")
        resized(pool, 2)
        await pool.until(lambda: pool.balanced_over(2), 240, "two Spark consumers balanced")
        await asyncio.sleep(3)
        with azurite.unreachable():
            await asyncio.sleep(25)  # past the 15 s membership lease: both stop reading
        await pool.until(lambda: pool.balanced_over(2), 240, "two consumers again after the outage")
        resized(pool, 1)
        await pool.until(
            lambda: pool.balanced_over(1) and len(pool.runtime.processes) == 1, 240, "drained to one"
        )
        await asyncio.sleep(3)
    finally:
        sent = load.finish()
    # The backlog left when the load stops depends on how busy the machine was (a starved consumer reads
    # 10 events/s of the 40 sent): wait while rows keep arriving.
    await pool.until(
        lambda: delta_rows(table)[0] >= sent,
        180,
        "every event in the table",
        progress=lambda: delta_version(table),
        at_most=900,
    )
    await asyncio.sleep(5)  # a replay still running would add rows now
    assert delta_rows(table) == (sent, sent), "every event in exactly one row"


@pytest.mark.timeout(300)
def test_hubshift_demo_runs_and_writes_aggregates(tmp_path: Path) -> None:
    output = tmp_path / "demo-output"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hubshift.cli",
            "demo",
            "--duration",
            "75",
            "--no-live",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "aggregated" in result.stdout
    index = json.loads((output / "views" / "index.json").read_text())
    assert index["windows"], "at least one window of aggregates"
    assert sum(w["events"] for w in index["windows"]) > 0
