"""The SDK's own load balancing on the emulator: two EventHubConsumerClient processes with
BlobCheckpointStore on Azurite share the partitions, and checkpoint where they read."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from azure.eventhub import EventData, parse_connection_string
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
from emulator_clients import producer, wait_until

from hubshift.emulator.launch import RunningEmulator
from tests.harness.azurite import Azurite

pytestmark = pytest.mark.timeout(150)

WORKER = Path(__file__).with_name("emulator_balancing_worker.py")


def lines(path: Path) -> list[tuple[str, int, str]]:
    if not path.exists():
        return []
    result = []
    for line in path.read_text().splitlines():
        partition, sequence, body = line.split(",", 2)
        result.append((partition, int(sequence), body))
    return result


def send_round(emulator: RunningEmulator, label: str) -> None:
    with producer(emulator.connection_string) as client:
        for partition in ("0", "1", "2", "3"):
            client.send_batch(
                [EventData(f"{label}-{partition}-{index}") for index in range(10)], partition_id=partition
            )


def test_two_event_processors_share_the_partitions_and_checkpoint(
    emulator: RunningEmulator, azurite: Azurite, blob_container: str, tmp_path: Path
) -> None:
    store = BlobCheckpointStore.from_connection_string(azurite.connection_string, blob_container)
    namespace = parse_connection_string(emulator.connection_string).fully_qualified_namespace

    def owners() -> Counter[str]:
        return Counter(item["owner_id"] for item in store.list_ownership(namespace, "hub", "$Default"))

    send_round(emulator, "first")
    outputs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    workers: list[subprocess.Popen[bytes]] = []
    try:
        workers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    emulator.connection_string,
                    azurite.connection_string,
                    blob_container,
                    str(outputs[0]),
                ]
            )
        )
        assert wait_until(lambda: len(lines(outputs[0])) == 40, 40), lines(outputs[0])
        workers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    emulator.connection_string,
                    azurite.connection_string,
                    blob_container,
                    str(outputs[1]),
                ]
            )
        )
        assert wait_until(lambda: sorted(owners().values()) == [2, 2], 60, interval=0.5), owners()
        ownership = {
            item["partition_id"]: item["owner_id"]
            for item in store.list_ownership(namespace, "hub", "$Default")
        }
        send_round(emulator, "second")

        def second_round() -> list[tuple[str, int, str]]:
            return [entry for output in outputs for entry in lines(output) if entry[2].startswith("second")]

        assert wait_until(lambda: len({entry[2] for entry in second_round()}) == 40, 40)
        for output in outputs:
            partitions = {entry[0] for entry in lines(output) if entry[2].startswith("second")}
            assert len(partitions) == 2, partitions
            assert len({ownership[partition] for partition in partitions}) == 1

        def checkpointed() -> dict[str, int]:
            return {
                item["partition_id"]: item["sequence_number"]
                for item in store.list_checkpoints(namespace, "hub", "$Default")
            }

        assert wait_until(lambda: checkpointed() == {"0": 19, "1": 19, "2": 19, "3": 19}, 20), checkpointed()
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
