"""Three Spark consumers share 16 partitions (the emulator, Azurite, real PySpark): every produced event
reaches the sink, a graceful move of partitions between them replays nothing, window totals equal the
events produced, and SIGTERM hands everything off."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hubshift.apps.produce import LoadSpec, send_load
from hubshift.emulator.launch import RunningEmulator
from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks.folder import FolderStore
from tests.fixtures.consumer import (
    ConsumerPool,
    all_in_sink,
    committed_ranges,
    consumer_environ,
    consumer_manifest,
    coverage,
    wait_for,
)
from tests.harness.azurite import Azurite

pytestmark = pytest.mark.timeout(900)

PARTITIONS = [str(p) for p in range(16)]
CONSUMERS = ["c0", "c1", "c2"]


def assign(owners: dict[str, list[str]]) -> dict[str, str]:
    return {p: consumer for consumer, parts in owners.items() for p in parts}


def produce(emulator: RunningEmulator, count: int, rate: float, seed: int) -> dict[str, int]:
    spec = LoadSpec(homes=200, rate=rate, count=count, seed=seed)
    return send_load(emulator.connection_string, "hub", spec).partitions


def add(total: dict[str, int], more: dict[str, int]) -> None:
    for partition, count in more.items():
        total[partition] = total.get(partition, 0) + count


def test_three_consumers_share_sixteen_partitions_and_move_them_gracefully(
    tmp_path: Path,
    emulator_factory: object,
    azurite: Azurite,
    blob_container: str,
    consumer_pool: ConsumerPool,
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:16"])  # type: ignore[operator]
    sink = tmp_path / "sink"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"blob": {"container": blob_container}},
        sink=sink,
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string, azurite.connection_string))
    ownership = consumer_pool.ownership(manifest)
    first = assign({"c0": PARTITIONS[0:6], "c1": PARTITIONS[6:11], "c2": PARTITIONS[11:16]})
    ownership.publish(first, 1, 3, max_handoff_seconds=30)
    consumers = [consumer_pool.start(manifest, name) for name in CONSUMERS]
    for consumer in consumers:
        consumer.wait_ready()
    wait_for(lambda: ownership.owners() == first, 60, "the first assignment to be owned")

    produced: dict[str, int] = {}
    add(produced, produce(emulator, 1600, 2000, seed=1))
    wait_for(lambda: all_in_sink(sink, produced), 240, "the first load in the sink")

    # A graceful move while events keep coming: c0 gives 2 partitions to c1 and 1 to c2, c1 gives 1 to c2.
    second = assign(
        {
            "c0": PARTITIONS[0:3],
            "c1": PARTITIONS[3:5] + PARTITIONS[6:10],
            "c2": PARTITIONS[5:6] + PARTITIONS[10:16],
        }
    )
    during: dict[str, int] = {}
    load = threading.Thread(target=lambda: add(during, produce(emulator, 1600, 200, seed=2)))
    load.start()
    ownership.publish(second, 2, 3, max_handoff_seconds=30)
    for consumer in consumers:
        consumer.nudge(2)
    wait_for(lambda: ownership.owners() == second, 90, "the second assignment to be owned")
    load.join(timeout=60)
    add(produced, during)
    add(produced, produce(emulator, 800, 2000, seed=3))
    wait_for(lambda: all_in_sink(sink, produced), 240, "every event in the sink")

    ranges = committed_ranges(sink)
    for partition, count in produced.items():
        covered, duplicates = coverage(ranges.get(partition, []))
        assert covered == set(range(count)), partition
        assert duplicates == 0, f"partition {partition} replayed {duplicates} events after a graceful move"
    moved = [p for p in PARTITIONS if first[p] != second[p]]
    for partition in moved:
        assert {r.consumer for r in ranges[partition]} == {first[partition], second[partition]}

    view = AggregateView(FolderStore(sink))
    view.refresh()
    assert view.total() == sum(produced.values())

    for consumer in consumers:
        consumer.terminate()
    for consumer in consumers:
        assert consumer.wait(timeout=90) == 0, consumer.log()[-3000:]
    table = ownership.snapshot()
    assert all(row.free for row in table.partitions)
    final = {row.partition: row.checkpoint.sequence_number for row in table.partitions}
    assert {p: final.get(p, -1) for p in PARTITIONS} == {p: produced.get(p, 0) - 1 for p in PARTITIONS}
