"""The same agent without Spark (`--engine sdk`, the rebalance benchmark's consumer): three consumers share
16 partitions, a graceful move replays nothing, an orphan of a killed consumer resumes at its checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hubshift.apps.produce import LoadSpec, send_load
from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import ConsumerPool, consumer_environ, consumer_manifest, wait_for
from tests.harness.ranges import count_replays, read_range_logs

pytestmark = pytest.mark.timeout(300)
PARTITIONS = [str(p) for p in range(16)]


def test_sdk_consumers_follow_the_assignment_and_take_over_orphans(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:16"])  # type: ignore[operator]
    ranges = tmp_path / "ranges"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=tmp_path / "sink",
        consumer={"checkpoint": {"everySeconds": 1, "everyEvents": 20}},
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    ownership = consumer_pool.ownership(manifest)
    produced: dict[str, int] = {}

    def produce(count: int, seed: int) -> None:
        spec = LoadSpec(homes=300, rate=5000, count=count, seed=seed)
        summary = send_load(emulator.connection_string, "hub", spec)
        for partition, n in summary.partitions.items():
            produced[partition] = produced.get(partition, 0) + n

    def all_read() -> bool:
        # Every sequence number read is one produced (0 .. n-1 per partition): all read when they add up.
        distinct, _ = count_replays(read_range_logs(ranges))
        return distinct == sum(produced.values())

    first = {p: f"s{int(p) % 3}" for p in PARTITIONS}
    ownership.publish(first, 1, 3)
    consumers = {
        name: consumer_pool.start(
            manifest, name, engine="sdk", args=("--ranges", str(ranges / f"{name}.jsonl"))
        )
        for name in ("s0", "s1", "s2")
    }
    for consumer in consumers.values():
        consumer.wait_ready()
    wait_for(lambda: ownership.owners() == first, 30, "the first assignment")
    produce(2000, seed=1)
    wait_for(all_read, 60, "the first load")

    second = {p: "s0" if int(p) < 6 else "s1" if int(p) < 11 else "s2" for p in PARTITIONS}
    ownership.publish(second, 2, 3)
    for consumer in consumers.values():
        consumer.nudge(2)
    wait_for(lambda: ownership.owners() == second, 30, "the graceful move")
    produce(2000, seed=2)
    wait_for(all_read, 60, "every event after the move")
    assert count_replays(read_range_logs(ranges))[1] == 0, "a graceful move replayed events"

    # kill -9: s2's partitions are orphans the moment its membership lapses; the operator gives them to s0.
    consumers["s2"].kill()
    killed_at = time.time()
    orphans = [p for p in PARTITIONS if second[p] == "s2"]
    table = ownership.snapshot()
    checkpoints = {row.partition: row.checkpoint.sequence_number for row in table.partitions}
    third = {p: "s0" if owner == "s2" else owner for p, owner in second.items()}
    ownership.publish(third, 3, 3)
    consumers["s0"].nudge(3)
    wait_for(lambda: ownership.owners() == third, 60, "the orphans taken over")
    produce(1000, seed=3)
    wait_for(all_read, 60, "every event after the crash")
    batches = read_range_logs(ranges)
    for partition in orphans:
        resumed = [
            b["first"]
            for b in batches
            if b["partition"] == partition and b["consumer"] == "s0" and b["at"] > killed_at
        ]
        assert min(resumed) == checkpoints[partition] + 1, partition
    for name in ("s0", "s1"):
        consumers[name].terminate()
        assert consumers[name].wait(timeout=60) == 0
