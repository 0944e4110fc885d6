"""Your streaming job, its state following its partitions (`pipeline.type: stream`): the example's job
(examples/stateful: readings parsed, repeats dropped within the watermark, counted per home, sensor type and
10-second window) run by real consumers on the emulator with Spark's RocksDB state store and a Delta table
(read back with delta-rs), through a graceful handoff of a partition and a kill -9 of its owner. Every
window the watermark has passed is in the table once, with the count of the distinct readings sent."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import ConsumerPool, consumer_environ, consumer_manifest, wait_for
from tests.harness.windows import Readings, windows

pytestmark = pytest.mark.timeout(900)
EXAMPLE_CODE = Path(__file__).resolve().parents[3] / "examples" / "stateful"


def table(path: Path) -> list[dict[str, Any]]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        rows: list[dict[str, Any]] = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    except TableNotFoundError:
        return []
    return rows


def test_a_stateful_job_s_windows_are_exact_through_a_handoff_and_a_kill_9(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool, spark_jars: str
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    path = tmp_path / "windows"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        consumer={
            "spark": {"master": "local[2]", "triggerIntervalSeconds": 1, "maxEventsPerTrigger": 400},
            "code": {"path": str(EXAMPLE_CODE)},
            "pipeline": {"type": "stream", "stream": {"function": "homes_stream:windows"}},
            "sink": {"type": "delta", "delta": {"path": str(path)}},
        },
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    consumer_pool.environ["HUBSHIFT_SPARK_JARS"] = spark_jars
    ownership = consumer_pool.ownership(manifest)
    ownership.publish({"0": "c0", "1": "c0"}, 1, 2, max_handoff_seconds=60)
    first = consumer_pool.start(manifest, "c0")
    first.wait_ready()
    wait_for(lambda: ownership.owners() == {"0": "c0", "1": "c0"}, 120, "c0 to own both partitions")

    sent = Readings(emulator.connection_string, "hub", ["0", "1"])
    try:
        sent.wave(0, 299, repeat_every=7)
        wait_for(lambda: len(table(path)) > 0, 300, "the first windows in the table", on_timeout=first.log)

        # A graceful handoff: c1 takes partition 1 with its state (open windows, readings seen).
        second = consumer_pool.start(manifest, "c1")
        second.wait_ready()
        ownership.publish({"0": "c0", "1": "c1"}, 2, 2, max_handoff_seconds=60)
        wait_for(lambda: ownership.owners() == {"0": "c0", "1": "c1"}, 180, "partition 1 on c1")
        sent.wave(300, 599, repeat_every=5)

        # A crash: c0 killed mid-run, c1 takes partition 0 from its checkpoint.
        time.sleep(3)
        first.kill()
        ownership.publish({"0": "c1", "1": "c1"}, 3, 1, forced=frozenset({"0"}))
        wait_for(lambda: ownership.owners() == {"0": "c1", "1": "c1"}, 180, "partition 0 on c1")
        sent.wave(600, 899, repeat_every=4)
        sent.wave(1000, 1000)  # moves every home's watermark past what came before
        expected = sent.expected(1000)
        wait_for(
            lambda: windows(table(path))[0] == expected,
            420,
            "every passed window in the table with its count",
            on_timeout=lambda: second.log()[-3000:],
        )
    finally:
        sent.close()
    time.sleep(5)  # a batch written twice would show now
    counts, twice = windows(table(path))
    assert twice == 0
    assert counts == expected
    assert "its job's query starts from" in second.log()
    second.terminate()
    assert second.wait(timeout=90) == 0
