"""A Spark consumer whose Blob sink stops answering for a minute: the batch waits (back-pressure), no
checkpoint moves while its output cannot be written, nothing is lost, and the consumer carries on without
restarting when the sink answers again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hubshift.apps.produce import LoadSpec, send_load
from hubshift.azure_storage import BlobContainer
from hubshift.consumer.app import Scratch
from hubshift.emulator.launch import RunningEmulator
from hubshift.ownership.checkpoints import list_checkpoints
from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks import BlobStore
from tests.fixtures.consumer import ConsumerPool, all_in_sink, consumer_environ, consumer_manifest, wait_for
from tests.harness.azurite import start_azurite

pytestmark = pytest.mark.timeout(600)
SINK_ENV = "HUBSHIFT_TEST_SINK"
OUTAGE_SECONDS = 60


def committed(view: AggregateView) -> tuple[dict[str, set[int]], int]:
    """Per partition, the sequence numbers the commit records cover, and how many were committed twice."""
    covered: dict[str, set[int]] = {}
    twice = 0
    for record in view.records:
        for part in record.partitions:
            numbers = set(range(part.first_sequence_number, part.last_sequence_number + 1))
            seen = covered.setdefault(part.partition, set())
            twice += len(seen & numbers)
            seen |= numbers
    return covered, twice


def total_now(view: AggregateView) -> int:
    """The view's total read afresh; -1 while the sink's connections recover from the outage."""
    from azure.core.exceptions import AzureError

    try:
        view.refresh()
    except AzureError:
        return -1
    return view.total()


def test_a_blob_sink_away_for_a_minute_holds_the_batch_and_loses_nothing(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    sink_server = start_azurite(tmp_path / "sink-azurite")
    try:
        manifest = consumer_manifest(
            tmp_path / "consumer.yaml",
            store={"sqlite": {"path": str(tmp_path / "store.db")}},
            consumer={
                "pipeline": {"type": "aggregate", "aggregate": {"windowSeconds": 60}},
                "sink": {
                    "type": "blob",
                    "blob": {"container": "aggregates", "connectionStringEnv": SINK_ENV},
                },
            },
        )
        consumer_pool.environ.update(consumer_environ(emulator.connection_string))
        consumer_pool.environ[SINK_ENV] = sink_server.connection_string
        ownership = consumer_pool.ownership(manifest)
        consumer = consumer_pool.start(manifest, "c0")
        consumer.wait_ready()
        wait_for(lambda: consumer.metric("hubshift_consumer_owned_partitions") == 2, 60, "both partitions")
        view = AggregateView(BlobStore(BlobContainer("aggregates", sink_server.connection_string)))

        first = send_load(emulator.connection_string, "hub", LoadSpec(homes=50, count=400, rate=400, seed=3))
        wait_for(
            lambda: view.refresh() >= 0 and view.total() == first.events, 120, "the first load in the sink"
        )

        sent_during: list[int] = []
        with sink_server.unreachable():
            before = list_checkpoints(ownership.store, ownership.scope)
            loader = threading.Thread(
                target=lambda: sent_during.append(
                    send_load(
                        emulator.connection_string, "hub", LoadSpec(homes=50, count=400, rate=100, seed=4)
                    ).events
                )
            )
            loader.start()
            deadline = time.monotonic() + OUTAGE_SECONDS
            while time.monotonic() < deadline:
                # Nothing can be written, so no checkpoint may move past what is in the sink.
                assert list_checkpoints(ownership.store, ownership.scope) == before
                assert consumer.process.poll() is None, "the consumer gave up"
                time.sleep(2)
            loader.join(timeout=60)
        sent = first.events + sent_during[0]
        wait_for(lambda: total_now(view) >= sent, 180, "every event in the sink")
        assert view.total() == sent, "nothing lost and nothing counted twice"
        covered, twice = committed(view)
        assert twice == 0
        assert sum(len(numbers) for numbers in covered.values()) == sent
        assert consumer.process.poll() is None, "it carried on without restarting"
        assert "starting it again" not in consumer.log()
        assert "trying again" in consumer.log()  # the writes waited for the sink
    finally:
        sink_server.stop()


def test_a_full_scratch_disk_stops_the_consumer_with_one_line_and_loses_nothing(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs as the consumer's spool")
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    sink = tmp_path / "sink"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml", store={"sqlite": {"path": str(tmp_path / "store.db")}}, sink=sink
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    # The consumer's scratch (ConsumerPool puts it at scratch-<id>), its spool on a 512 KiB tmpfs.
    scratch = tmp_path / "scratch-c0"
    spool = scratch / "spool"
    spool.mkdir(parents=True)
    (scratch / Scratch.MARKER).touch()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(spool)], check=True)
    try:
        consumer = consumer_pool.start(manifest, "c0")
        consumer.wait_ready()
        wait_for(lambda: consumer.metric("hubshift_consumer_owned_partitions") == 2, 60, "both partitions")
        produced = send_padded(emulator.connection_string, per_partition=40, size=20_000)
        code = consumer.wait(timeout=180)  # a bounded stop, not a retry loop
        assert code == 1
        errors = [line for line in consumer.log().splitlines() if " ERROR " in line]
        assert any("is full" in line and "scratch" in line for line in errors), errors
    finally:
        subprocess.run(["umount", str(spool)], check=False)
    # Room again: the consumer picks up where the committed checkpoints are, nothing lost.
    again = consumer_pool.start(manifest, "c0")
    again.wait_ready()
    wait_for(lambda: all_in_sink(sink, produced), 240, "every event in the sink", on_timeout=again.log)


def send_padded(connection_string: str, per_partition: int, size: int) -> dict[str, int]:
    """Sensor events with a large extra field (the aggregate ignores it), `per_partition` to each."""
    from azure.eventhub import EventData, EventHubProducerClient

    event = {
        "homeId": "h1",
        "sensorId": "h1-s00",
        "sensorType": "motion",
        "eventType": "detected",
        "eventTime": "2026-11-21T10:00:00.000Z",
        "padding": "x" * size,
    }
    with EventHubProducerClient.from_connection_string(connection_string, eventhub_name="hub") as producer:
        for partition in ("0", "1"):
            for _ in range(per_partition):
                batch = producer.create_batch(partition_id=partition)
                batch.add(EventData(json.dumps(event)))
                producer.send_batch(batch)
    return {"0": per_partition, "1": per_partition}
