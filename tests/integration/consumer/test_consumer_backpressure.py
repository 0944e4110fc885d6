"""Back-pressure on the emulator: a partition's receiver stops reading once its spool is `max_ahead` events
beyond what was committed, and the events it did not take stay in the hub (no JVM: only the receivers and
the spool of a SparkEngine whose query is not started)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from azure.eventhub import EventData, EventHubProducerClient

from hubshift.consumer.spark import spool
from hubshift.consumer.spark.engine import SparkEngine
from hubshift.consumer.spark.spooling import Reading
from hubshift.emulator.launch import RunningEmulator
from hubshift.eventhubs.receiver import StartAt
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.manifest import ConsumerSpec

pytestmark = pytest.mark.timeout(180)


def test_a_partition_stops_reading_max_ahead_of_its_commits(
    emulator_factory: Callable[..., RunningEmulator], tmp_path: Path
) -> None:
    emulator = emulator_factory(["hub:1"])
    producer = EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name="hub")
    with producer:
        for _ in range(30):
            batch = producer.create_batch(partition_id="0")
            for n in range(1000):
                batch.add(EventData(b"%d" % n))
            producer.send_batch(batch)
    target = EventHubsTarget(emulator.connection_string, f"127.0.0.1:{emulator.port}", "hub", "$Default")
    spec = ConsumerSpec.model_validate({"spark": {"maxEventsPerTrigger": 5000}})
    engine = SparkEngine(Reading(target, "c0", spec, tmp_path))
    assert engine.max_ahead == 20_000
    try:
        engine.start_partition("0", 1, StartAt(sequence_number=-1), 0)

        def spooled() -> int:
            extent = spool.extent(engine.spool_root, "0", 1)
            return 0 if extent is None else extent.next

        deadline = time.monotonic() + 60
        while spooled() < engine.max_ahead and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # time enough to read the rest, were it not held back
        # A turn that had room delivers one batch of up to 1,000 events past the bound, no more.
        assert engine.max_ahead <= spooled() <= engine.max_ahead + 1000
    finally:
        engine.close()
