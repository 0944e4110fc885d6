"""`spark.includeSystemProperties`: the events' system properties (the AMQP properties section a sender set,
and the service's annotations) reach the sink as a `system_properties` column, read from the emulator by a
Spark consumer and written to Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubProducerClient

from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import (
    ConsumerPool,
    consumer_environ,
    consumer_manifest,
    parquet_folder_rows,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)


def test_system_properties_reach_the_sink_as_a_column(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:1"])  # type: ignore[operator]
    producer = EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name="hub")
    with producer:
        batch = producer.create_batch(partition_id="0")
        for n in range(6):
            event = EventData(b'{"n": %d}' % n)
            if n % 2 == 0:
                event.message_id = f"order-{n}"
                event.correlation_id = "run-1"
                event.content_type = "application/json"
            batch.add(event)
        producer.send_batch(batch)
    output = tmp_path / "parquet"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        consumer={
            "spark": {"master": "local[1]", "triggerIntervalSeconds": 1, "includeSystemProperties": True},
            "pipeline": {"type": "events"},
            "sink": {"type": "parquet", "parquet": {"path": str(output)}},
        },
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    consumer = consumer_pool.start(manifest, "c0")
    consumer.wait_ready()

    def rows() -> list[dict[str, Any]]:
        found = parquet_folder_rows(output, ["sequence_number", "system_properties"])
        return sorted(found, key=lambda row: int(row["sequence_number"]))

    wait_for(lambda: len(rows()) >= 6, 180, "6 events in the folder", on_timeout=consumer.log)
    found = rows()
    assert [row["sequence_number"] for row in found] == list(range(6))
    for n, row in enumerate(found):
        properties = dict(row["system_properties"])
        assert properties["x-opt-sequence-number"] == str(n)
        assert "x-opt-enqueued-time" in properties and "x-opt-offset" in properties
        if n % 2 == 0:
            assert properties["message-id"] == f"order-{n}"
            assert properties["correlation-id"] == "run-1"
            assert properties["content-type"] == "application/json"
        else:
            assert "message-id" not in properties
    consumer.terminate()
    assert consumer.wait(timeout=60) == 0
