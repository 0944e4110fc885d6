"""Your streaming job, its state following its partitions (`pipeline.type: stream`): the example's job
(examples/stateful: readings parsed, repeats dropped within the watermark, counted per home, sensor type and
10-second window) run by real consumers on the emulator with Spark's RocksDB state store and a Delta table
(read back with delta-rs), through a graceful handoff of a partition and a kill -9 of its owner. Every
window the watermark has passed is in the table once, with the count of the distinct readings sent."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubProducerClient

from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import ConsumerPool, consumer_environ, consumer_manifest, wait_for

pytestmark = pytest.mark.timeout(900)
EXAMPLE_CODE = Path(__file__).resolve().parents[3] / "examples" / "stateful"
T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)
HOMES = [f"h{n:03d}" for n in range(12)]
SENSORS = ("motion", "door")
LATENESS = timedelta(seconds=30)
WINDOW = 10


def reading(home: str, sensor: str, second: int) -> dict[str, str]:
    moment = T0 + timedelta(seconds=second)
    return {
        "homeId": home,
        "sensorId": f"{home}-{sensor}",
        "sensorType": sensor,
        "eventType": "detected",
        "eventTime": moment.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
    }


class Sent:
    """What was sent, per partition key (a home), for the reference counts."""

    def __init__(self, connection_string: str) -> None:
        self.producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name="hub")
        self.readings: list[dict[str, str]] = []

    def wave(self, first: int, last: int, *, repeat_every: int = 0) -> None:
        """Every home's sensors, a reading every 3 seconds of event time from `first` to `last`, in time
        order within each partition (a home's readings all in one: even homes in 0, odd in 1, as a partition
        key would keep them), each `repeat_every`-th sent twice (a sensor's retry)."""
        for partition in ("0", "1"):
            homes = HOMES[int(partition) :: 2]
            bodies = [
                reading(home, sensor, second)
                for second in range(first, last + 1, 3)
                for home in homes
                for sensor in SENSORS
                for _ in range(2 if repeat_every and second % repeat_every == 0 else 1)
            ]
            for start in range(0, len(bodies), 200):
                batch = self.producer.create_batch(partition_id=partition)
                for body in bodies[start : start + 200]:
                    batch.add(EventData(json.dumps(body)))
                self.producer.send_batch(batch)
            self.readings.extend(bodies)

    def expected(self, flushed_at: int) -> Counter[tuple[str, str, str]]:
        """The windows a watermark of `flushed_at` seconds minus the lateness has passed, with the count
        of distinct readings in each."""
        watermark = T0 + timedelta(seconds=flushed_at) - LATENESS
        counts: Counter[tuple[str, str, str]] = Counter()
        for body in {json.dumps(r, sort_keys=True) for r in self.readings}:
            r = json.loads(body)
            moment = datetime.strptime(r["eventTime"], "%Y-%m-%dT%H:%M:%S.000Z").replace(tzinfo=UTC)
            start = T0 + timedelta(seconds=(moment - T0).seconds // WINDOW * WINDOW)
            if start + timedelta(seconds=WINDOW) <= watermark:
                counts[(start.isoformat(), r["homeId"], r["sensorType"])] += 1
        return counts

    def close(self) -> None:
        self.producer.close()


def table(path: Path) -> list[dict[str, Any]]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        rows: list[dict[str, Any]] = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    except TableNotFoundError:
        return []
    return rows


def windows(rows: list[dict[str, Any]]) -> tuple[Counter[tuple[str, str, str]], int]:
    """The table's windows with their counts, and how many rows said a window a second time."""
    counts: Counter[tuple[str, str, str]] = Counter()
    twice = 0
    for row in rows:
        start = row["window_start"]
        start = start.replace(tzinfo=UTC) if start.tzinfo is None else start
        key = (start.isoformat(), row["home_id"], row["sensor_type"])
        twice += key in counts
        counts[key] = row["count"]
    return counts, twice


def test_a_stateful_job_s_windows_are_exact_through_a_handoff_and_a_kill_9(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool, spark_jars: str
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    path = tmp_path / "windows"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=tmp_path / "unused",
        consumer={
            "spark": {"master": "local[2]", "triggerIntervalSeconds": 1, "maxEventsPerTrigger": 400},
            "code": {"path": str(EXAMPLE_CODE)},
            "pipeline": {"type": "stream", "stream": {"function": "homes_stream:windows"}},
            "sink": {"type": "delta", "delta": {"path": str(path)}},
        },
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    consumer_pool.environ["HUBSHIFT_SPARK_JARS"] = spark_jars
    ownership = consumer_pool.ownership(manifest)
    ownership.publish({"0": "c0", "1": "c0"}, 1, 2, max_handoff_seconds=60)
    first = consumer_pool.start(manifest, "c0")
    first.wait_ready()
    wait_for(lambda: ownership.owners() == {"0": "c0", "1": "c0"}, 120, "c0 to own both partitions")

    sent = Sent(emulator.connection_string)
    try:
        sent.wave(0, 299, repeat_every=7)
        wait_for(lambda: len(table(path)) > 0, 300, "the first windows in the table", on_timeout=first.log)

        # A graceful handoff: c1 takes partition 1 with its state (open windows, readings seen).
        second = consumer_pool.start(manifest, "c1")
        second.wait_ready()
        ownership.publish({"0": "c0", "1": "c1"}, 2, 2, max_handoff_seconds=60)
        wait_for(lambda: ownership.owners() == {"0": "c0", "1": "c1"}, 180, "partition 1 on c1")
        sent.wave(300, 599, repeat_every=5)

        # A crash: c0 killed mid-run, c1 takes partition 0 from its checkpoint.
        time.sleep(3)
        first.kill()
        ownership.publish({"0": "c1", "1": "c1"}, 3, 1, forced=frozenset({"0"}))
        wait_for(lambda: ownership.owners() == {"0": "c1", "1": "c1"}, 180, "partition 0 on c1")
        sent.wave(600, 899, repeat_every=4)
        sent.wave(1000, 1000)  # moves every home's watermark past what came before
        expected = sent.expected(1000)
        wait_for(
            lambda: windows(table(path))[0] == expected,
            420,
            "every passed window in the table with its count",
            on_timeout=lambda: second.log()[-3000:],
        )
    finally:
        sent.close()
    time.sleep(5)  # a batch written twice would show now
    counts, twice = windows(table(path))
    assert twice == 0
    assert counts == expected
    assert "its job's query starts from" in second.log()
    second.terminate()
    assert second.wait(timeout=90) == 0
