"""Handing a consumer group from hubshift to the Azure SDK's own EventProcessor and back, on Azurite and the
emulator (its offsets as numbers, and as a geo-replicated namespace gives them: strings that are no number).

hubshift's consumers read and checkpoint; one stops (SIGTERM: it releases), one is killed (its infinite
leases stay). `hubshift release` is refused while the killed one's membership lives, then breaks its
leases. The SDK's processor (`EventHubConsumerClient` + `BlobCheckpointStore`) takes every partition over
and starts right after hubshift's checkpoints (no replay beyond them, nothing lost), checkpointing as it
goes (no 412: no lease is left). Back again as docs/checkpoints.md says: the SDK stopped, a hubshift consumer
claims the partitions and starts right after the SDK's checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore

from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import ConsumerPool, consumer_environ, consumer_manifest, wait_for
from tests.harness.azurite import Azurite
from tests.harness.ranges import read_range_logs

pytestmark = pytest.mark.timeout(300)

PARTITIONS = ("0", "1", "2", "3")
HUBSHIFT = [sys.executable, "-m", "hubshift.cli"]


def send(connection_string: str, first: int, count: int) -> None:
    """`count` events to each partition, their bodies the sequence numbers they will get."""
    with EventHubProducerClient.from_connection_string(connection_string, eventhub_name="hub") as producer:
        for partition in PARTITIONS:
            batch = producer.create_batch(partition_id=partition)
            for n in range(first, first + count):
                batch.add(EventData(str(n)))
            producer.send_batch(batch)


def read_by_hubshift(ranges: Any) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for entry in read_range_logs(ranges):
        found.setdefault(entry["partition"], set()).update(range(entry["first"], entry["last"] + 1))
    return found


def sdk_processor(connection_string: str, storage: str, container: str, until: int) -> dict[str, list[Any]]:
    """The Azure SDK's processor over every partition, checkpointing each event, until each partition's
    event `until` came: per partition, (sequence number, offset) in the order received."""
    received: dict[str, list[Any]] = {p: [] for p in PARTITIONS}
    store = BlobCheckpointStore.from_connection_string(storage, container)
    client = EventHubConsumerClient.from_connection_string(
        connection_string,
        "$Default",
        eventhub_name="hub",
        checkpoint_store=store,
        load_balancing_interval=1,
    )

    def on_event(context: Any, event: Any) -> None:
        received[context.partition_id].append((event.sequence_number, str(event.offset)))
        context.update_checkpoint(event)  # raises (412) if a lease were left on the blob
        if all(events and events[-1][0] >= until for events in received.values()):
            client.close()

    errors: list[Exception] = []

    def on_error(_: Any, error: Exception) -> None:
        errors.append(error)

    reader = threading.Thread(target=lambda: client.receive(on_event, on_error=on_error), daemon=True)
    reader.start()
    reader.join(120)
    client.close()
    assert not errors, errors
    return received


@pytest.mark.parametrize("offsets", ["numeric", "geo"])
def test_the_sdk_processor_takes_over_after_release_and_hands_back(
    offsets: str,
    tmp_path: Any,
    emulator_factory: Any,
    azurite: Azurite,
    blob_container: str,
    consumer_pool: ConsumerPool,
) -> None:
    emulator: RunningEmulator = emulator_factory(
        ["hub:4"], extra_args=["--geo-offsets"] if offsets == "geo" else []
    )
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"blob": {"container": blob_container}},
        sink=tmp_path / "sink",
        consumer={"checkpoint": {"everySeconds": 1, "everyEvents": 10}},
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string, azurite.connection_string))
    ownership = consumer_pool.ownership(manifest)
    ranges = tmp_path / "ranges"
    owners = {"0": "a", "1": "a", "2": "b", "3": "b"}
    ownership.publish(owners, 1, 2)
    pool = {
        name: consumer_pool.start(
            manifest, name, engine="sdk", args=("--ranges", str(ranges / f"{name}.jsonl"))
        )
        for name in ("a", "b")
    }
    for consumer in pool.values():
        consumer.wait_ready()
    send(emulator.connection_string, 0, 50)
    wait_for(
        lambda: (
            all(read_by_hubshift(ranges).get(p) == set(range(50)) for p in PARTITIONS)
            and all(row.checkpoint.sequence_number >= 20 for row in ownership.snapshot().partitions)
        ),
        60,
        "hubshift reading and checkpointing",
    )
    pool["a"].terminate()  # hands 0 and 1 off: final checkpoints, leases released
    assert pool["a"].wait(timeout=60) == 0
    pool["b"].kill()  # 2 and 3 keep b's infinite leases

    def release() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *HUBSHIFT,
                *("release", "--container", blob_container, "--namespace", ownership.scope.fqns),
                *("--hub", "hub"),
            ],
            env={**os.environ, "HUBSHIFT_STORE": azurite.connection_string, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
        )

    refused = release()
    assert refused.returncode == 2 and "live consumers own partitions 2 (b), 3 (b)" in refused.stderr
    wait_for(lambda: not ownership.snapshot().live_members, 40, "b's membership to lapse")
    released = release()
    assert released.returncode == 0, released.stderr
    assert "b (gone: lease broken)" in released.stdout
    snapshot = ownership.snapshot()
    assert all(row.free for row in snapshot.partitions)
    checkpoints = {row.partition: row.checkpoint for row in snapshot.partitions}
    if offsets == "geo":
        assert all(":" in c.offset for c in checkpoints.values()), checkpoints

    send(emulator.connection_string, 50, 30)
    received = sdk_processor(emulator.connection_string, azurite.connection_string, blob_container, 79)
    for partition in PARTITIONS:
        numbers = [n for n, _ in received[partition]]
        after = checkpoints[partition].sequence_number + 1
        assert numbers[0] == after, f"partition {partition}: replayed before its checkpoint"
        assert numbers == list(range(after, 80)), f"partition {partition}: lost or repeated events"
    with BlobCheckpointStore.from_connection_string(azurite.connection_string, blob_container) as sdk:
        by_sdk = {c["partition_id"]: c for c in sdk.list_checkpoints(ownership.scope.fqns, "hub", "$Default")}
    assert {p: by_sdk[p]["sequence_number"] for p in PARTITIONS} == dict.fromkeys(PARTITIONS, 79)
    if offsets == "geo":
        assert all(":" in by_sdk[p]["offset"] for p in PARTITIONS)

    # back to hubshift: the SDK stopped, a consumer claims every partition and starts after its checkpoints
    back = tmp_path / "back"
    ownership.publish(dict.fromkeys(PARTITIONS, "c"), 2, 1)
    consumer = consumer_pool.start(manifest, "c", engine="sdk", args=("--ranges", str(back / "c.jsonl")))
    consumer.wait_ready()
    wait_for(lambda: ownership.owners() == dict.fromkeys(PARTITIONS, "c"), 60, "c claiming every partition")
    send(emulator.connection_string, 80, 10)
    wait_for(
        lambda: all(read_by_hubshift(back).get(p) == set(range(80, 90)) for p in PARTITIONS),
        60,
        "hubshift reading again",
        on_timeout=consumer.log,
    )
