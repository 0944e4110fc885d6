"""The replication task patterns' throughput, each beside its plain peer in the same run on the same events:

1. Replication: a Spark consumer (`hubshift consume`, the `replicate` pipeline, `keepPartition`) copying N
   events from a 4-partition hub to another, beside a plain `azure-eventhub` receive-then-send loop (one
   consumer client over the 4 partitions, one producer, each received batch sent to the same partition id
   with the same three `repl-*` properties added). Rate = N / (time from the assignment to the commit
   record that completes the N events; every send of a batch is acknowledged before its commit record).
2. Log projection: the `projection` pipeline (the latest event per home into PostgreSQL, newer-only upsert,
   COPY into a staging table) over the same N events, beside a plain receive-then-upsert loop (the SDK's
   receive_batch, psycopg's executemany of `INSERT ... ON CONFLICT DO UPDATE ... WHERE` per batch). Rate
   = events projected per second; rows = the rows the table ends with.

The consumer is warmed up first (the JVM compiles Spark's code over the first few dozen batches), then
parked while the load and the plain loop run, as bench/throughput.py does. PostgreSQL is Debian's
(tools/postgresql), started on 127.0.0.1 in a temporary folder.

Target (issue 15): replicated events/s at least 0.7 of the plain loop's.

    .venv/bin/python bench/replicate.py [--events 200000] [--projection-events 100000] [--skip-projection]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from throughput import (  # bench/throughput.py: the load, the parked consumer, the partitions' tails
    CONSUMER,
    PARTITIONS,
    Consumer,
    finish,
    load_partitions,
    receive_loop,
    steady_load,
    tails,
    wait_until,
)
from throughput import Parking as BaseParking

RESULTS = Path(__file__).resolve().parent / "results" / "replicate.json"
SOURCE = "bench"
PLAIN_TARGET = "plain-copy"
TARGET = "copy"


# --- the plain loops ----------------------------------------------------------------------------------------


def plain_replicate(connection_string: str, start: dict[str, int], events: int) -> dict[str, float]:
    """Receive with one consumer client, send each batch to the same partition of the plain target."""
    from azure.eventhub import EventData, EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=PLAIN_TARGET)

    def forward(context: Any, batch: list[Any]) -> None:
        out = producer.create_batch(partition_id=context.partition_id)
        for event in batch:
            copy = EventData(b"".join(event.body))
            properties = dict(event.properties or {})
            properties["repl-enqueue-time"] = event.enqueued_time.isoformat()
            properties["repl-sequence"] = str(event.sequence_number)
            properties["repl-offset"] = str(event.offset)
            copy.properties = properties
            try:
                out.add(copy)
            except ValueError:
                producer.send_batch(out)
                out = producer.create_batch(partition_id=context.partition_id)
                out.add(copy)
        producer.send_batch(out)

    try:
        return receive_loop(connection_string, start, events, forward, hub=SOURCE)
    finally:
        producer.close()


UPSERT = (
    "INSERT INTO plain_latest AS current (home, payload, source_partition, source_sequence, source_offset, "
    "enqueued_time, projected_at) VALUES (%s, %s, %s, %s, %s, %s, now()) ON CONFLICT (home) DO UPDATE SET "
    "payload = EXCLUDED.payload, source_partition = EXCLUDED.source_partition, source_sequence = "
    "EXCLUDED.source_sequence, source_offset = EXCLUDED.source_offset, enqueued_time = "
    "EXCLUDED.enqueued_time, projected_at = EXCLUDED.projected_at WHERE (current.source_partition = "
    "EXCLUDED.source_partition AND current.source_sequence < EXCLUDED.source_sequence) OR "
    "(current.source_partition <> EXCLUDED.source_partition AND "
    "current.enqueued_time < EXCLUDED.enqueued_time)"
)


def plain_project(
    connection_string: str, conninfo: str, start: dict[str, int], events: int
) -> dict[str, Any]:
    """Receive with one consumer client; per batch, one psycopg executemany of the upsert, committed."""
    import psycopg

    database = psycopg.connect(conninfo)
    database.execute(
        "CREATE TABLE IF NOT EXISTS plain_latest (home text PRIMARY KEY, payload jsonb, "
        "source_partition text NOT NULL, source_sequence bigint NOT NULL, source_offset text, "
        "enqueued_time timestamptz, projected_at timestamptz NOT NULL)"
    )
    database.commit()

    def upsert(context: Any, batch: list[Any]) -> None:
        rows = []
        for event in batch:
            text = b"".join(event.body).decode()
            home = json.loads(text)["homeId"]
            rows.append(
                (
                    home,
                    text,
                    context.partition_id,
                    event.sequence_number,
                    str(event.offset),
                    event.enqueued_time,
                )
            )
        with database.cursor() as cursor:
            cursor.executemany(UPSERT, rows)
        database.commit()

    try:
        result: dict[str, Any] = receive_loop(connection_string, start, events, upsert, hub=SOURCE)
        found = database.execute("SELECT count(*) FROM plain_latest").fetchone()
        result["rows"] = int(found[0]) if found else 0
        return result
    finally:
        database.close()


# --- the consumer's side ------------------------------------------------------------------------------------


class Parking(BaseParking):
    """The parked consumer of bench/throughput.py, timed through a run into its folder sink."""

    def run(self, target: dict[str, int]) -> dict[str, Any]:
        """Give the partitions back; time and CPU until the sink's commit records reach `target`."""
        consumer = self.consumer
        cpu_before = consumer.cpu_seconds()
        began = time.time()
        self.assign(CONSUMER)
        wait_until(lambda: consumer.committed_next() == target, 1800, "the consumer to finish")
        after = consumer.cpu_seconds()
        records = [r for r in consumer.records() if r["writtenAt"] > began]
        seconds = max(r["writtenAt"] for r in records) - began
        events = sum(p["events"] for r in records for p in r["partitions"])
        return {
            "events": events,
            "seconds": seconds,
            "rate": events / seconds,
            "cpuSeconds": round(sum(after[k] - cpu_before[k] for k in after), 2),
            "batches": len(records),
        }


def warmed(consumer: Consumer, connection_string: str, seconds: float) -> Parking:
    parking = Parking(consumer, connection_string, hub=SOURCE)
    wait_until(consumer.ready, 600, "the consumer to start")
    parking.assign(CONSUMER)
    wait_until(lambda: parking.owners() == dict.fromkeys(PARTITIONS, CONSUMER), 120, "the consumer to own")
    print("warming up ...", flush=True)
    steady_load(connection_string, 300, seconds)
    wait_until(lambda: consumer.committed_next() == tails(connection_string), 600, "the warm-up")
    parking.park()
    return parking


# --- the run ------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events replicated")
    parser.add_argument("--projection-events", type=int, default=100_000, help="events projected")
    parser.add_argument("--warmup-seconds", type=float, default=15.0)
    parser.add_argument("--skip-projection", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, sinks)")
    args = parser.parse_args()

    from hubshift.emulator.launch import running_emulator
    from hubshift.pipelines.projection import DEFAULT_PROJECTION_ENV
    from hubshift.pipelines.replicate import DEFAULT_REPLICATE_ENV
    from tests.harness.postgres import missing_reason, start_postgres

    workdir = Path(tempfile.mkdtemp(prefix="hubshift-bench-replicate-"))
    results: dict[str, Any] = {"events": args.events, "projectionEvents": args.projection_events}
    hubs = [f"{SOURCE}:4", f"{PLAIN_TARGET}:4", f"{TARGET}:4"]
    with running_emulator(hubs, consumer_groups=["raw"]) as emulator:
        cs = emulator.connection_string
        consumer = Consumer(
            workdir,
            cs,
            1.0,
            hub=SOURCE,
            name="replicate",
            pipeline={"type": "replicate", "replicate": {"hub": TARGET, "keepPartition": True}},
            environ={DEFAULT_REPLICATE_ENV: cs},
        )
        parking = None
        try:
            parking = warmed(consumer, cs, args.warmup_seconds)
            start = tails(cs)
            load_seconds = load_partitions(cs, args.events // len(PARTITIONS))
            target = tails(cs)
            total = sum(target[p] - start[p] for p in PARTITIONS)
            print(
                f"loaded {total} events in {load_seconds:.1f} s; the plain loop copies them ...", flush=True
            )
            plain = plain_replicate(cs, start, total)
            print(f"plain loop: {plain['rate']:.0f} events/s; the consumer copies them ...", flush=True)
            ours = parking.run(target)
            copied = sum(tails(cs, TARGET).values())
            results["replicate"] = {
                "plainSdkLoop": plain,
                "consumer": ours,
                "ratio": ours["rate"] / plain["rate"],
                "target": 0.7,
                "eventsInTarget": copied,
            }
            print(
                f"consumer: {ours['rate']:.0f} events/s ({ours['rate'] / plain['rate']:.2f} of plain)",
                flush=True,
            )
        finally:
            results["replicateConsumerExit"] = consumer.stop()
            if parking is not None:
                parking.close()

        reason = missing_reason()
        if args.skip_projection or reason is not None:
            results["projection"] = {"skipped": reason or "--skip-projection"}
        else:
            server = start_postgres()
            projector = Consumer(
                workdir,
                cs,
                1.0,
                hub=SOURCE,
                name="projection",
                pipeline={
                    "type": "projection",
                    "projection": {
                        "database": "postgres",
                        "postgres": {},
                        "table": "homes_latest",
                        "keyColumn": "home",
                        "key": {"json": "homeId"},
                    },
                },
                environ={DEFAULT_PROJECTION_ENV: server.conninfo},
            )
            parking = None
            try:
                parking = warmed(projector, cs, args.warmup_seconds)
                start = tails(cs)
                load_partitions(cs, args.projection_events // len(PARTITIONS))
                target = tails(cs)
                total = sum(target[p] - start[p] for p in PARTITIONS)
                print(f"loaded {total} events; the plain psycopg loop projects them ...", flush=True)
                plain = plain_project(cs, server.conninfo, start, total)
                print(f"plain loop: {plain['rate']:.0f} events/s; the consumer projects them ...", flush=True)
                ours = parking.run(target)
                import psycopg

                with psycopg.connect(server.conninfo) as connection:
                    found = connection.execute("SELECT count(*) FROM homes_latest").fetchone()
                ours["rows"] = int(found[0]) if found else 0
                results["projection"] = {
                    "plainPsycopgLoop": plain,
                    "consumer": ours,
                    "ratio": ours["rate"] / plain["rate"],
                }
            finally:
                results["projectionConsumerExit"] = projector.stop()
                if parking is not None:
                    parking.close()
                server.stop()
    finish(RESULTS, results, print_table, workdir, keep=args.keep)


def print_table(results: dict[str, Any]) -> None:
    print()
    print(f"{'':44} {'events/s':>10} {'seconds':>8} {'CPU s':>7}")
    rep = results.get("replicate")
    if rep:
        for name, row in (
            ("plain azure-eventhub receive-then-send", rep["plainSdkLoop"]),
            ("hubshift consume, replicate (Spark)", rep["consumer"]),
        ):
            print(f"{name:44} {row['rate']:10.0f} {row['seconds']:8.1f} {row['cpuSeconds']:7.1f}")
        verdict = "ok" if rep["ratio"] >= rep["target"] else "BELOW TARGET"
        print(f"{'replicate / plain':44} {rep['ratio']:10.2f}   (target >= {rep['target']}: {verdict})")
    proj = results.get("projection", {})
    if "skipped" in proj:
        print(f"projection: skipped ({proj['skipped']})")
    elif proj:
        for name, row in (
            ("plain psycopg receive-then-upsert", proj["plainPsycopgLoop"]),
            ("hubshift consume, projection (Spark)", proj["consumer"]),
        ):
            print(
                f"{name:44} {row['rate']:10.0f} {row['seconds']:8.1f} {row['cpuSeconds']:7.1f}"
                f"   ({row['rows']} rows)"
            )
        print(f"{'projection / plain':44} {proj['ratio']:10.2f}")
    print(f"\nload average {results.get('loadAverage', 0):.1f}; written to {RESULTS}")


if __name__ == "__main__":
    main()
