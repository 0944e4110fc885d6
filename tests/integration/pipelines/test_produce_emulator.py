"""`hubshift produce` against the hubshift emulator: totals per partition match the hub, each home stays
in one partition (the one the service's key hash picks), the key travels with the event, and bad input is
one line with a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient, parse_connection_string

from hubshift.apps.produce import HubSender, LoadSpec, send_load
from hubshift.emulator.launch import RunningEmulator
from hubshift.pipelines import sensor_events as ev


def hubshift(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hubshift.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def last_sequence_numbers(server: RunningEmulator, hub: str) -> dict[str, int]:
    client = EventHubProducerClient.from_connection_string(server.connection_string, eventhub_name=hub)
    try:
        return {
            p: client.get_partition_properties(p)["last_enqueued_sequence_number"]
            for p in client.get_partition_ids()
        }
    finally:
        client.close()


def receive_all(
    server: RunningEmulator, hub: str, expected: int, timeout: float = 60
) -> list[tuple[str, Any]]:
    received: list[tuple[str, Any]] = []
    done = threading.Event()
    client = EventHubConsumerClient.from_connection_string(
        server.connection_string, "$Default", eventhub_name=hub
    )

    def on_batch(context: Any, events: list[Any]) -> None:
        received.extend((context.partition_id, event) for event in events)
        if len(received) >= expected:
            done.set()

    worker = threading.Thread(
        target=client.receive_batch,
        kwargs={"on_event_batch": on_batch, "starting_position": "-1", "max_wait_time": 1},
        daemon=True,
    )
    worker.start()
    done.wait(timeout)
    client.close()
    worker.join(10)
    return received


def test_produce_command_totals_and_keys(emulator_factory: Any) -> None:
    server = emulator_factory(["telemetry:8"])
    result = hubshift(
        "produce",
        "--connection-string", server.connection_string,
        "--hub", "telemetry",
        "--homes", "200",
        "--rate", "2000",
        "--count", "3000",
        "--malformed-ratio", "0.05",
        "--seed", "11",
        "--output", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["events"] == 3000
    assert set(summary["partitions"]) == {str(p) for p in range(8)}
    assert summary["valid"] + summary["malformed"] == 3000
    assert 50 < summary["malformed"] < 260
    # the hub holds exactly what the summary says, partition by partition
    last = last_sequence_numbers(server, "telemetry")
    assert {p: last[p] + 1 for p in last} == summary["partitions"]

    received = receive_all(server, "telemetry", 3000)
    assert len(received) == 3000
    partitions_of_home: dict[str, set[str]] = defaultdict(set)
    for partition, event in received:
        key = event.partition_key.decode() if isinstance(event.partition_key, bytes) else event.partition_key
        partitions_of_home[key].add(partition)
        try:
            assert ev.parse_event(b"".join(event.body)).home_id == key
        except ev.InvalidEvent:
            pass
    assert all(len(partitions) == 1 for partitions in partitions_of_home.values())
    assert len(partitions_of_home) == summary["homes"]


def test_keyed_sends_land_where_the_sdk_would_send_them(emulator: RunningEmulator) -> None:
    """Our routing equals the hub's own for `partition_key` sends."""
    sender = HubSender.connect(emulator.connection_string, "hub")
    client = EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name="hub")
    try:
        for home in ("h000001", "h000002", "h000003", "h000777", "h123456"):
            before = last_sequence_numbers(emulator, "hub")
            client.send_batch([EventData(b"{}")], partition_key=home)
            after = last_sequence_numbers(emulator, "hub")
            (moved,) = [p for p in after if after[p] != before[p]]
            assert moved == sender.partition_for(home)
    finally:
        client.close()
        sender.close()


def test_library_call_with_a_stop_event(emulator: RunningEmulator) -> None:
    stop = threading.Event()
    timer = threading.Timer(1.5, stop.set)
    timer.start()
    started = time.monotonic()
    try:
        summary = send_load(emulator.connection_string, "hub", LoadSpec(homes=10, rate=200), stop=stop)
    finally:
        timer.cancel()
    assert 1.2 < time.monotonic() - started < 10
    assert 0 < summary.events < 600  # the first sends open one link per partition: slow
    assert sum(summary.partitions.values()) == summary.events


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--connection-string", "garbage-secret-value"], "not an Event Hubs connection string"),
        (["--hub", "nope"], "Event Hub 'nope' does not exist"),
        (["--homes", "0"], "--homes must be at least 1"),
        (["--profile", "wobble"], "--profile 'wobble'"),
    ],
)
def test_bad_input_is_one_line(emulator: RunningEmulator, args: list[str], message: str) -> None:
    base = {"--connection-string": emulator.connection_string, "--hub": "hub"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    command = ["produce", "--count", "1"] + [part for pair in base.items() for part in pair]
    result = hubshift(*command)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "garbage-secret-value" not in result.stderr
    key = parse_connection_string(emulator.connection_string).shared_access_key
    assert key not in result.stderr


def test_missing_connection_string_names_the_variable() -> None:
    result = hubshift("produce", "--hub", "hub", "--count", "1", env={"PATH": "/usr/bin"})
    assert result.returncode != 0
    assert "HUBSHIFT_EVENTHUBS_CONNECTION_STRING" in result.stderr
