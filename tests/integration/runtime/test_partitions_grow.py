"""A hub that gains partitions while a pool reads it (Event Hubs premium and dedicated allow it): the new
partitions are assigned at once, without a holddown, and read from their start."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from azure.eventhub import EventData, EventHubProducerClient

from tests.fixtures.runtime import HUB, PoolFactory


def emulator_config(path: Path, partitions: int) -> Path:
    """Microsoft's emulator configuration format, which `hubshift emulator --config` reads."""
    entity = {"Name": HUB, "PartitionCount": partitions, "ConsumerGroups": []}
    path.write_text(json.dumps({"UserConfig": {"NamespaceConfig": [{"Entities": [entity]}]}}))
    return path


def send_to(connection_string: str, partition: str, count: int) -> None:
    with EventHubProducerClient.from_connection_string(connection_string, eventhub_name=HUB) as producer:
        batch = producer.create_batch(partition_id=partition)
        for n in range(count):
            batch.add(EventData(json.dumps({"n": n})))
        producer.send_batch(batch)


@pytest.mark.timeout(150)
async def test_new_partitions_are_assigned_at_once_and_read_from_their_start(
    local_pool: PoolFactory, tmp_path: Path
) -> None:
    config = emulator_config(tmp_path / "emulator.json", 4)
    pool = await local_pool(config_file=config, rebalance={"delaySeconds": 30, "maxHandoffSeconds": 10})
    await pool.until(lambda: pool.balanced_over(2), 60, "two consumers balanced over 4 partitions")
    holddowns = pool.events().count("Holddown")

    emulator_config(config, 6)
    assert pool.emulator.process is not None
    grown = time.monotonic()
    pool.emulator.process.send_signal(signal.SIGHUP)
    for partition in ("4", "5"):
        send_to(pool.emulator.connection_string, partition, 5)

    def new_partitions_read() -> bool:
        ranges = [r for r in pool.ranges() if r["partition"] in ("4", "5")]
        return {r["partition"] for r in ranges if r["first"] == 0} == {"4", "5"}

    took = await pool.until(
        lambda: pool.balanced_over(2) and len(pool.operator.report.state.assignment) == 6,  # type: ignore[union-attr]
        25,
        "the six partitions balanced over the two consumers",
    )
    await pool.until(new_partitions_read, 20, "the new partitions read from their first event")
    # Far sooner than the 30 s holddown: a partition-count change is not a change of consumers.
    assert time.monotonic() - grown < 25 and took < 25
    assert pool.events().count("Holddown") == holddowns
    counts = sorted(pool.snapshot().owners.values())
    assert len(counts) == 6
