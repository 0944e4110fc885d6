"""Emulator throughput and CPU per event, against the SDK clients it serves, in the same run.

One `EventHubProducerClient` process (full `EventDataBatch`es) and one `EventHubConsumerClient` process
(`receive_batch`) move N events through one partition of the emulator, for 256-byte and 1 KB events.
Each client reports the CPU it spent on the work (`time.process_time`, all its threads, from its first
send or receive call to its last event); the emulator's CPU is read with psutil from outside over the
same window. Target: the emulator spends less CPU per event than either SDK client.

    .venv/bin/python bench/emulator.py [--events 50000] [--sizes 256,1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "emulator.json"


# --- the client processes --------------------------------------------------------------------------------


def run_producer(connection_string: str, hub: str, events: int, size: int) -> None:
    from azure.eventhub import EventData, EventHubProducerClient

    body = b"x" * size
    client = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub)
    with client:
        client.get_partition_ids()  # connect before measuring
        start_cpu, start = time.process_time(), time.time()
        sent = 0
        while sent < events:
            batch = client.create_batch(partition_id="0")
            while sent < events:
                try:
                    batch.add(EventData(body))
                except ValueError:
                    break
                sent += 1
            client.send_batch(batch)
        report = {"cpu": time.process_time() - start_cpu, "start": start, "end": time.time()}
    print(json.dumps(report), flush=True)


def run_consumer(connection_string: str, hub: str, events: int) -> None:
    import threading

    from azure.eventhub import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group="$Default", eventhub_name=hub
    )
    state: dict[str, Any] = {"received": 0, "first": None}
    done = threading.Event()

    def on_batch(context: Any, batch: list[Any]) -> None:
        if not batch:
            return
        if state["first"] is None:
            state["first"] = time.time()
        state["received"] += len(batch)
        if state["received"] >= events and not done.is_set():
            state["end"] = time.time()
            state["cpu"] = time.process_time() - state["start_cpu"]
            done.set()

    state["start_cpu"] = time.process_time()
    print(json.dumps({"ready": True}), flush=True)
    thread = threading.Thread(
        target=client.receive_batch,
        kwargs={
            "on_event_batch": on_batch,
            "partition_id": "0",
            "starting_position": "-1",
            "max_batch_size": 300,
        },
        daemon=True,
    )
    thread.start()
    done.wait(600)
    client.close()
    print(json.dumps({"cpu": state.get("cpu"), "first": state["first"], "end": state.get("end")}), flush=True)


# --- the measurement -------------------------------------------------------------------------------------


@dataclass
class Result:
    event_bytes: int
    events: int
    events_per_second: float
    emulator_cpu_us_per_event: float
    producer_cpu_us_per_event: float
    consumer_cpu_us_per_event: float
    emulator_below_each_client: bool


def child(role: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--role", role, *args], stdout=subprocess.PIPE, text=True
    )


def read_json(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"a client process exited without a report (exit code {process.wait()})")
    result: dict[str, Any] = json.loads(line)
    return result


def measure(connection_string: str, emulator_pid: int, hub: str, events: int, size: int) -> Result:
    import psutil

    emulator = psutil.Process(emulator_pid)
    consumer = child("consumer", connection_string, hub, str(events))
    read_json(consumer)  # imported and about to receive
    time.sleep(1.5)  # its receiver is attached and idle
    cpu_before = sum(emulator.cpu_times()[:2])
    producer = child("producer", connection_string, hub, str(events), str(size))
    produced = read_json(producer)
    consumed = read_json(consumer)
    cpu_after = sum(emulator.cpu_times()[:2])
    producer.wait(30)
    consumer.wait(30)
    if consumed.get("cpu") is None:
        raise RuntimeError("the consumer did not receive every event")
    emulator_cpu = cpu_after - cpu_before
    per_event = {
        "emulator": emulator_cpu / events * 1e6,
        "producer": produced["cpu"] / events * 1e6,
        "consumer": consumed["cpu"] / events * 1e6,
    }
    elapsed = consumed["end"] - produced["start"]
    return Result(
        event_bytes=size,
        events=events,
        events_per_second=events / elapsed,
        emulator_cpu_us_per_event=round(per_event["emulator"], 2),
        producer_cpu_us_per_event=round(per_event["producer"], 2),
        consumer_cpu_us_per_event=round(per_event["consumer"], 2),
        emulator_below_each_client=per_event["emulator"] < min(per_event["producer"], per_event["consumer"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--sizes", default="256,1024")
    parser.add_argument("--role", choices=["producer", "consumer"], help=argparse.SUPPRESS)
    parser.add_argument("role_args", nargs="*", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.role == "producer":
        connection_string, hub, events, size = options.role_args
        run_producer(connection_string, hub, int(events), int(size))
        return
    if options.role == "consumer":
        connection_string, hub, events = options.role_args
        run_consumer(connection_string, hub, int(events))
        return

    from rich.console import Console
    from rich.table import Table

    from hubshift.emulator.launch import running_emulator

    sizes = [int(size) for size in options.sizes.split(",")]
    results = []
    with running_emulator([f"bench{size}:1" for size in sizes]) as server:
        for size in sizes:
            results.append(
                measure(server.connection_string, server.pid, f"bench{size}", options.events, size)
            )

    table = Table(
        title=f"hubshift emulator: {options.events} events through one partition, one producer, one consumer"
    )
    for column in (
        "event",
        "events/s",
        "emulator CPU/event",
        "producer CPU/event",
        "consumer CPU/event",
        "target",
    ):
        table.add_column(column, justify="right")
    for result in results:
        table.add_row(
            f"{result.event_bytes} B",
            f"{result.events_per_second:,.0f}",
            f"{result.emulator_cpu_us_per_event:.1f} µs",
            f"{result.producer_cpu_us_per_event:.1f} µs",
            f"{result.consumer_cpu_us_per_event:.1f} µs",
            "met" if result.emulator_below_each_client else "MISSED",
        )
    Console().print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "emulator",
                "cpus": os.cpu_count(),
                "target": "emulator CPU per event < each SDK client's CPU per event",
                "results": [asdict(result) for result in results],
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")


if __name__ == "__main__":
    main()
