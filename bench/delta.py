"""A Spark team's Delta job (examples/delta.yaml: parse, enrich from a broadcast lookup, write Delta
partitioned by date) through `hubshift consume`, beside a plain peer over the same events in the same run:
an `azure-eventhub` receive loop that parses and enriches each batch in Python and appends it to its own
Delta table with `deltalake` (delta-rs), with no checkpoints and no ownership.

1. One Spark consumer owning 4 partitions (`function` pipeline `homes_job:transform`, `delta` sink on a
   folder), warmed up, is parked (the bench plays the operator, as bench/throughput.py does); N events are
   loaded; the peer reads exactly those N (its own consumer group) into its table; then the partitions are
   given back to the consumer, which reads the same N from its checkpoints into its table. Rate = N / (time
   from the assignment to the Delta commit whose transaction versions, one per partition, cover the N).
   Checkpoints (SQLite store) and ownership are part of the consumer's time; the peer has neither.
2. Both tables are read back with delta-rs: each holds every event exactly once (the consumer's includes
   the warm-up's events too).

Target (issue 21): the consumer at least 0.8x the peer's events/s.

    .venv/bin/python bench/delta.py [--events 200000] [--trigger-seconds 2] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # hubshift, and bench/throughput.py beside

from throughput import PARTITIONS, Consumer, Parking, finish, receive_loop, tails, wait_until

RESULTS = Path(__file__).resolve().parent / "results" / "delta.json"
ROOT = Path(__file__).resolve().parents[1]
CODE = ROOT / "examples" / "delta"
HUB = "delta"
TARGET = 0.8


def load(connection_string: str, events: int, seed: int) -> None:
    """`events` home-security readings over 400 homes (the example's lookup file names them), as fast as the
    SDK sends."""
    from hubshift.apps.produce import LoadSpec, send_load

    send_load(connection_string, HUB, LoadSpec(homes=400, count=events, rate=1_000_000, seed=seed))


# --- the peer: receive, parse and enrich in Python, append with delta-rs ------------------------------


class PeerWriter:
    """What a team would write without hubshift: each received batch parsed (json), enriched from the same
    lookup file, buffered, and appended to a Delta table with delta-rs every `flush_events`."""

    def __init__(self, table: Path, flush_events: int) -> None:
        self.table = str(table)
        self.flush_events = flush_events
        self.sites: dict[str, dict[str, str]] = json.loads((CODE / "sites.json").read_text())
        self.rows: list[dict[str, Any]] = []
        self.written = 0

    def handle(self, context: Any, batch: list[Any]) -> None:
        partition = context.partition_id
        for event in batch:
            reading = json.loads(event.body_as_str())
            site = self.sites.get(reading["homeId"], {})
            at = datetime.fromisoformat(reading["eventTime"].replace("Z", "+00:00"))
            self.rows.append(
                {
                    "partition": partition,
                    "sequence_number": event.sequence_number,
                    "enqueued_time": event.enqueued_time,
                    "home_id": reading["homeId"],
                    "sensor_type": reading["sensorType"],
                    "event_type": reading["eventType"],
                    "event_time": at,
                    "date": at.date(),
                    "city": site.get("city", "unknown"),
                    "region": site.get("region"),
                }
            )
        if len(self.rows) >= self.flush_events:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        from deltalake import write_deltalake

        if not self.rows:
            return
        write_deltalake(self.table, pa.Table.from_pylist(self.rows), mode="append", partition_by=["date"])
        self.written += len(self.rows)
        self.rows = []


def peer(connection_string: str, start: dict[str, int], events: int, table: Path) -> dict[str, float]:
    writer = PeerWriter(table, flush_events=20_000)
    cpu, began = time.process_time(), time.monotonic()
    read = receive_loop(connection_string, start, events, handle=writer.handle, hub=HUB, timeout=900)
    writer.flush()
    seconds, cpu = time.monotonic() - began, time.process_time() - cpu
    return {"events": read["events"], "seconds": seconds, "rate": writer.written / seconds, "cpuSeconds": cpu}


# --- the consumer's table -----------------------------------------------------------------------------


def committed_next(table: Path, scope: str) -> dict[str, int]:
    """Per partition, one past the last sequence number the consumer's Delta commits recorded (the
    transaction version of `hubshift/<scope>/<partition>`; delta-rs reads it from the log)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        delta = DeltaTable(str(table))
    except TableNotFoundError:
        return dict.fromkeys(PARTITIONS, 0)
    found = {}
    for partition in PARTITIONS:
        version = delta.transaction_version(f"hubshift/{scope}/{partition}")
        found[partition] = 0 if version is None else version + 1
    return found


def exactly_once(table: Path) -> dict[str, int]:
    from deltalake import DeltaTable

    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["partition", "sequence_number"]).to_pylist()
    return {"rows": len(rows), "distinct": len({(r["partition"], r["sequence_number"]) for r in rows})}


def commit_times(table: Path, since: float) -> Iterator[float]:
    """When each of the table's commits after `since` (epoch seconds) was made."""
    from deltalake import DeltaTable

    for entry in DeltaTable(str(table)).history():
        when = entry["timestamp"] / 1000
        if when > since:
            yield when


# --- the run ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--warmup-events", type=int, default=20_000)
    parser.add_argument("--trigger-seconds", type=float, default=2.0)
    parser.add_argument("--max-events-per-trigger", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, tables)")
    args = parser.parse_args()

    from hubshift.emulator.launch import running_emulator

    jars = (
        os.environ.get("HUBSHIFT_SPARK_JARS") or os.popen(str(ROOT / "tools" / "spark-jars")).read().strip()
    )
    workdir = Path(tempfile.mkdtemp(prefix="hubshift-bench-delta-"))
    ours_table, peer_table = workdir / "hubshift-table", workdir / "peer-table"
    results: dict[str, Any] = {"events": args.events, "triggerIntervalSeconds": args.trigger_seconds}
    with running_emulator([f"{HUB}:4"], consumer_groups=["raw"]) as emulator:
        cs = emulator.connection_string
        consumer = Consumer(
            workdir,
            cs,
            args.trigger_seconds,
            hub=HUB,
            environ={"HUBSHIFT_SPARK_JARS": jars},
            consumer={
                "code": {"path": str(CODE)},
                "pipeline": {"type": "function", "function": "homes_job:transform"},
                "sink": {"type": "delta", "delta": {"path": str(ours_table), "partitionBy": ["date"]}},
                "spark": {
                    "master": "local[2]",
                    "triggerIntervalSeconds": args.trigger_seconds,
                    "maxEventsPerTrigger": args.max_events_per_trigger,
                },
            },
        )
        parking = Parking(consumer, cs, hub=HUB)
        scope = f"{parking.scope.fqns}/{HUB}/$default".lower()
        try:
            wait_until(consumer.ready, 300, "the consumer to start")
            parking.assign("bench-0")
            print("warming up (Spark compiles its code and Delta creates the table) ...", flush=True)
            load(cs, args.warmup_events, args.seed + 1000)
            warm = tails(cs, HUB)
            wait_until(lambda: committed_next(ours_table, scope) == warm, 600, "the warm-up in the table")

            parking.park()
            start = tails(cs, HUB)
            load(cs, args.events, args.seed)
            target = tails(cs, HUB)
            total = sum(target[p] - start[p] for p in PARTITIONS)
            print(f"loaded {total} events; the peer reads them into its table ...", flush=True)
            theirs = peer(cs, start, total, peer_table)
            print(f"peer: {theirs['rate']:.0f} events/s; the consumer reads them ...", flush=True)

            cpu_before = consumer.cpu_seconds()
            began = time.time()
            parking.assign("bench-0")
            wait_until(lambda: committed_next(ours_table, scope) == target, 900, "the consumer to finish")
            finished = max(commit_times(ours_table, began), default=time.time())
            after = consumer.cpu_seconds()
            cpu = {kind: round(after[kind] - cpu_before[kind], 2) for kind in after}
            seconds = finished - began
            ours: dict[str, Any] = {
                "events": total,
                "seconds": seconds,
                "rate": total / seconds,
                "cpuSeconds": sum(cpu.values()),
                "cpuSecondsByProcess": cpu,
                "commits": len(list(commit_times(ours_table, began))),
            }
            results["delta"] = {
                "peer": theirs,
                "consumer": ours,
                "ratio": ours["rate"] / theirs["rate"],
                "target": TARGET,
                "peerTable": exactly_once(peer_table),
                "consumerTable": exactly_once(ours_table),
                "consumerTableExpected": total + args.warmup_events,
            }
        finally:
            results["consumerExit"] = consumer.stop()
            parking.close()
    finish(RESULTS, results, print_table, workdir, keep=args.keep)


def print_table(results: dict[str, Any]) -> None:
    d = results.get("delta")
    if not d:
        return
    print()
    print(f"{'':44} {'events/s':>10} {'seconds':>8} {'CPU s':>7} {'CPU µs/event':>13}")
    for name, row in (
        ("azure-eventhub loop + delta-rs (peer)", d["peer"]),
        ("hubshift consume: Spark + Delta Lake", d["consumer"]),
    ):
        per_event = 1e6 * row["cpuSeconds"] / max(row["events"], 1)
        print(
            f"{name:44} {row['rate']:10.0f} {row['seconds']:8.1f} {row['cpuSeconds']:7.1f} {per_event:13.0f}"
        )
    verdict = "ok" if d["ratio"] >= d["target"] else "BELOW TARGET"
    print(f"{'consumer / peer':44} {d['ratio']:10.2f}   (target >= {d['target']}: {verdict})")
    split = ", ".join(f"{k} {v:.1f}" for k, v in d["consumer"]["cpuSecondsByProcess"].items())
    print(f"{'consumer CPU seconds by process':44} {split}")
    print(
        f"tables read back with delta-rs: peer {d['peerTable']}, consumer {d['consumerTable']} "
        f"(expected {d['consumerTableExpected']} distinct, as many rows)"
    )
    print(f"\nwritten to {RESULTS}")


if __name__ == "__main__":
    main()
