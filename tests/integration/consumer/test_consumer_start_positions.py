"""A partition without a checkpoint starts at the configured position: `latest` skips what was there at
the first claim, an enqueued time skips what came before it; once a checkpoint exists it wins."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from azure.eventhub import EventData, EventHubProducerClient

from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import ConsumerPool, consumer_environ, consumer_manifest, wait_for
from tests.harness.ranges import read_range_logs

pytestmark = pytest.mark.timeout(300)


def send(connection_string: str, count: int) -> None:
    producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name="hub")
    with producer:
        for partition in ("0", "1"):
            batch = producer.create_batch(partition_id=partition)
            for n in range(count):
                batch.add(EventData(b"event %d" % n))
            producer.send_batch(batch)


def first_read(ranges: Path) -> dict[str, int]:
    """Per partition, the first sequence number in the range logs under `ranges`."""
    found: dict[str, int] = {}
    for entry in read_range_logs(ranges):
        found[entry["partition"]] = min(found.get(entry["partition"], entry["first"]), entry["first"])
    return found


@pytest.mark.parametrize("position", ["latest", "enqueuedTime"])
def test_start_position_without_a_checkpoint(
    position: str, tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    send(emulator.connection_string, 30)  # sequence numbers 0-29 in each partition
    time.sleep(1.5)
    start: dict[str, object] = {"type": position}
    if position == "enqueuedTime":
        start["enqueuedTime"] = datetime.now(UTC).isoformat()
        time.sleep(1.5)
        send(emulator.connection_string, 20)  # 30-49: after the start time
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=tmp_path / "sink",
        consumer={"startPosition": start},
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    ranges, again_ranges = tmp_path / "ranges", tmp_path / "again"
    consumer = consumer_pool.start(manifest, "c0", engine="sdk", args=("--ranges", str(ranges / "c0.jsonl")))
    consumer.wait_ready()
    if position == "latest":
        wait_for(lambda: consumer.metric("hubshift_consumer_owned_partitions") == 2, 30, "both partitions")
        send(emulator.connection_string, 20)  # 30-49: after the first claim
    wait_for(lambda: first_read(ranges).keys() == {"0", "1"}, 60, "events read", on_timeout=consumer.log)
    assert first_read(ranges) == {"0": 30, "1": 30}
    consumer.terminate()
    assert consumer.wait(timeout=60) == 0

    # Restarted: the checkpoint (49) wins over the start position.
    send(emulator.connection_string, 5)  # 50-54
    again = consumer_pool.start(
        manifest, "c0", engine="sdk", args=("--ranges", str(again_ranges / "c0.jsonl"))
    )
    again.wait_ready()
    wait_for(lambda: first_read(again_ranges).keys() == {"0", "1"}, 60, "the restart reading")
    assert first_read(again_ranges) == {"0": 50, "1": 50}


def test_a_partition_of_its_own_starts_at_a_sequence_number(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    """`startPosition.partitions` (Kafka's startingOffsets per partition): partition 1 from event 12 (the
    checkpoint written at its claim names event 11, its offset read from the hub), partition 0 from a
    sequence number not enqueued yet, which starts it at its end; a partition not named starts at the pool's
    position."""
    emulator: RunningEmulator = emulator_factory(["hub:3"])  # type: ignore[operator]
    send(emulator.connection_string, 30)  # 0-29 in partitions 0 and 1; partition 2 empty
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=tmp_path / "sink",
        consumer={
            "startPosition": {
                "type": "latest",
                "partitions": {
                    "0": {"type": "sequenceNumber", "sequenceNumber": 500},
                    "1": {"type": "sequenceNumber", "sequenceNumber": 12},
                },
            }
        },
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    ranges = tmp_path / "ranges"
    consumer = consumer_pool.start(manifest, "c0", engine="sdk", args=("--ranges", str(ranges / "c0.jsonl")))
    consumer.wait_ready()
    wait_for(lambda: consumer.metric("hubshift_consumer_owned_partitions") == 3, 30, "every partition")
    send(emulator.connection_string, 5)  # 30-34 in partitions 0 and 1
    wait_for(lambda: first_read(ranges).keys() == {"0", "1"}, 60, "events read", on_timeout=consumer.log)
    assert first_read(ranges) == {"0": 30, "1": 12}
    assert "sequence number 500, is not enqueued yet (the last is 29): it starts at its end" in consumer.log()
    consumer.terminate()
    assert consumer.wait(timeout=60) == 0
