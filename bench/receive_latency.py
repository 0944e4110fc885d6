"""Receiving many partitions at once: enqueue-to-delivery latency and CPU of one consumer process holding
32 partitions of which a few are busy. Sides: hubshift's receiver pool (`eventhubs/receiver.py`, the one
thread both engines read with); the Azure SDK's own `EventHubConsumerClient.receive_batch` (its processor
also takes the partitions in turn on one thread) as its users run it; and the same tuned (`sdk-tuned`: a
50 ms socket timeout instead of its 0.2 s). One emulator, the same run.

Each side runs in a child process of its own, on a hub of its own, reading every partition from the latest
event: its links open, it idles `--idle-seconds` (CPU measured: a consumer of quiet partitions), then
`--busy` partitions get `--rate` events/s each for `--seconds` (CPU and every event's latency measured: the
delivery's time minus the event's enqueued time, both this machine's clock; every event sent, waiting up to
60 s for the last). The sides take turns, in a rotated order each run (`--runs`), so a machine's noise
falls on all. Writes JSON (`--output`).

    .venv/bin/python bench/receive_latency.py [--runs 2] [--busy 3] [--rate 30] [--seconds 20]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.ranges import percentile

RESULTS = Path(__file__).resolve().parent / "results" / "receive_latency.json"
PARTITIONS = 32
OPEN_SECONDS = 8.0  # every link opened and its first credit given before anything is measured
SIDES = ("hubshift", "sdk", "sdk-tuned")
# The SDK's processor also takes its partitions in turn on one thread, each turn ending in a socket wait (its
# default 0.2 s); tuned, the 50 ms hubshift's receivers used before they stopped waiting on quiet links.
TUNED_SOCKET_TIMEOUT = 0.05
LAST_EVENTS_SECONDS = 60.0  # after the load, for every event sent to be delivered


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(side: str, connection_string: str, hub: str, idle: float) -> None:
    """One side: read every partition, say `ready` after the idle phase, measure between the lines `go`
    and `stop` on stdin, then report."""
    latencies: list[float] = []
    lock = threading.Lock()

    def record(enqueued: list[dt.datetime | None]) -> None:
        now = dt.datetime.now(dt.UTC)
        with lock:
            latencies.extend((now - t).total_seconds() for t in enqueued if t is not None)

    stop: Any
    if side == "hubshift":
        from hubshift.eventhubs.receiver import ReceiverPool, StartAt
        from hubshift.eventhubs.target import EventHubsTarget

        address = connection_string.split("Endpoint=sb://", 1)[1].split("/", 1)[0].split(";", 1)[0]
        pool = ReceiverPool(EventHubsTarget(connection_string, address, hub, "$Default"))
        for partition in range(PARTITIONS):
            pool.open(
                str(partition),
                1,
                StartAt(enqueued_time=dt.datetime.now(dt.UTC)),
                lambda batch: record(batch.column("enqueued_time").to_pylist()),
                lambda *_: None,
            )
        stop = pool.close
    else:
        from azure.eventhub import EventHubConsumerClient

        opened = threading.Semaphore(0)
        tuned = {"socket_timeout": TUNED_SOCKET_TIMEOUT} if side == "sdk-tuned" else {}
        client = EventHubConsumerClient.from_connection_string(
            connection_string,
            consumer_group="$Default",
            eventhub_name=hub,
            load_balancing_strategy="greedy",  # every partition claimed at once (one process, no store)
            **tuned,
        )
        reading = threading.Thread(
            target=client.receive_batch,
            kwargs={
                "on_event_batch": lambda _ctx, events: record([e.enqueued_time for e in events]),
                "on_partition_initialize": lambda _ctx: opened.release(),
                "starting_position": "@latest",
            },
            daemon=True,
        )
        reading.start()
        deadline = time.monotonic() + 120
        for _ in range(PARTITIONS):
            if not opened.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise RuntimeError("the SDK did not claim every partition within 120 s")
        stop = client.close
    time.sleep(OPEN_SECONDS)
    started = cpu_seconds()
    time.sleep(idle)
    idle_cpu = (cpu_seconds() - started) / idle
    with lock:
        latencies.clear()
    print("ready", flush=True)
    sys.stdin.readline()  # the load starts
    started, since = cpu_seconds(), time.monotonic()
    sent = int(sys.stdin.readline().split()[1])  # and ends: "stop SENT"
    busy_cpu = (cpu_seconds() - started) / (time.monotonic() - since)
    deadline = time.monotonic() + LAST_EVENTS_SECONDS
    while len(latencies) < sent and time.monotonic() < deadline:  # the last events' deliveries
        time.sleep(0.1)
    with lock:
        measured = sorted(latencies)
    print(json.dumps({"idleCpu": idle_cpu, "busyCpu": busy_cpu, "latencies": measured}), flush=True)
    stop()


def produce(connection_string: str, hub: str, busy: int, rate: float, seconds: float) -> int:
    """`rate` events/s to each of the first `busy` partitions, in 10 ms ticks, for `seconds`; events sent."""
    from azure.eventhub import EventData, EventHubProducerClient

    with EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub) as producer:
        for partition in range(busy):  # each link opened before the clock starts (these events count too)
            producer.send_batch([EventData(b"open")], partition_id=str(partition))
        sent = busy
        started = time.monotonic()
        due = 0.0
        while (elapsed := time.monotonic() - started) < seconds:
            due_now = int(elapsed * rate)
            for partition in range(busy):
                count = due_now - int(due)
                if count > 0:
                    producer.send_batch(
                        [EventData(b"x" * 100) for _ in range(count)], partition_id=str(partition)
                    )
                    sent += count
            due = float(due_now)
            time.sleep(0.01)
    return sent


def run_side(side: str, connection_string: str, hub: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", side, connection_string, hub]
    command += ["--idle-seconds", str(args.idle_seconds)]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdin is not None and process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {side} side did not start")
        process.stdin.write("go\n")
        process.stdin.flush()
        sent = produce(connection_string, hub, args.busy, args.rate, args.seconds)
        process.stdin.write(f"stop {sent}\n")
        process.stdin.flush()
        report = json.loads(process.stdout.readline())
        process.stdin.close()
        process.wait(30)
    ordered = report.pop("latencies")
    p50, p99 = (None if (v := percentile(ordered, q)) is None else round(v, 3) for q in (0.5, 0.99))
    return {
        "side": side,
        "sent": sent,
        "delivered": len(ordered),
        "p50": p50,
        "p99": p99,
        "max": round(ordered[-1], 3) if ordered else None,
        "idleCpuPercent": round(report["idleCpu"] * 100, 1),
        "busyCpuPercent": round(report["busyCpu"] * 100, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2, help="runs of each side, alternating")
    parser.add_argument("--busy", type=int, default=3, help="partitions with events")
    parser.add_argument("--rate", type=float, default=30.0, help="events/s to each busy partition")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of load measured")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="seconds of quiet measured first")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        side, connection_string, hub = args.child
        child(side, connection_string, hub, args.idle_seconds)
        return 0

    from hubshift.emulator.launch import start_emulator

    hubs = [f"r{run}{side}" for run in range(args.runs) for side in SIDES]
    emulator = start_emulator([f"{hub}:{PARTITIONS}" for hub in hubs])
    results = []
    try:
        for run in range(args.runs):
            for side in SIDES[run % len(SIDES) :] + SIDES[: run % len(SIDES)]:
                result = run_side(side, emulator.connection_string, f"r{run}{side}", args) | {"run": run + 1}
                results.append(result)
                print(
                    f"run {run + 1} {side}: p50 {result['p50']} s, p99 {result['p99']} s, max "
                    f"{result['max']} s ({result['delivered']} of {result['sent']} delivered); CPU idle "
                    f"{result['idleCpuPercent']} %, busy {result['busyCpuPercent']} %",
                    flush=True,
                )
    finally:
        emulator.stop()
    document = {
        "partitions": PARTITIONS,
        "busyPartitions": args.busy,
        "ratePerBusyPartition": args.rate,
        "seconds": args.seconds,
        "idleSeconds": args.idle_seconds,
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=1))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
