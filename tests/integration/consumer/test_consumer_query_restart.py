"""A micro-batch that fails stops Spark's query: the consumer starts a new query from what was committed,
so nothing is lost and nothing is written twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from hubshift.apps.produce import LoadSpec, send_load
from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import (
    FAIL_ONCE_DIR,
    ConsumerPool,
    all_in_sink,
    committed_ranges,
    consumer_environ,
    consumer_manifest,
    coverage,
    wait_for,
)

pytestmark = pytest.mark.timeout(600)


def test_a_failed_batch_is_read_again_by_a_new_query(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    sink = tmp_path / "sink"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=sink,
        consumer={"pipeline": {"type": "function", "function": "tests.fixtures.consumer:fail_once"}},
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    consumer_pool.environ[FAIL_ONCE_DIR] = str(tmp_path)
    consumer = consumer_pool.start(manifest, "c0")
    consumer.wait_ready()
    wait_for(lambda: consumer.metric("hubshift_consumer_owned_partitions") == 2, 60, "both partitions")
    summary = send_load(emulator.connection_string, "hub", LoadSpec(homes=20, rate=1000, count=400, seed=5))
    wait_for(
        lambda: all_in_sink(sink, summary.partitions), 240, "every event in the sink", on_timeout=consumer.log
    )
    assert (tmp_path / "failed").exists()
    assert "starting it again from what was committed" in consumer.log()
    ranges = committed_ranges(sink)
    for partition, count in summary.partitions.items():
        covered, duplicates = coverage(ranges.get(partition, []))
        assert covered == set(range(count)) and duplicates == 0, partition
    consumer.terminate()
    assert consumer.wait(timeout=60) == 0
