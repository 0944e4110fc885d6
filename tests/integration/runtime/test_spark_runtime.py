"""The local runtime with Spark consumers (the aggregate pipeline), and `hubshift demo` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks.folder import FolderStore
from tests.fixtures.runtime import Load, PoolFactory

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

    manifest = pool.operator.consumer
    scaling = manifest.spec.scaling.model_copy(update={"min_replicas": 1, "max_replicas": 1})
    second = Load(pool.emulator.connection_string, rate=100, duration=10)
    second.start()
    pool.operator.apply(
        manifest.model_copy(update={"spec": manifest.spec.model_copy(update={"scaling": scaling})})
    )
    await pool.until(
        lambda: pool.balanced_over(1) and len(pool.runtime.processes) == 1, 120, "drained to one"
    )
    second.join(30)
    total = load.sent + second.sent
    await pool.until(lambda: counted() >= total, 60, "every event aggregated")
    assert counted() == total, "a graceful handoff with Spark counts every event exactly once"
    assert ("homes-1", 0) in pool.runtime.exits


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
