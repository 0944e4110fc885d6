"""The reference a stateful job's output is compared with (examples/stateful: readings per home, sensor
type and 10-second window of event time, repeats dropped, each window written once the watermark, 30 seconds
behind the newest reading of its partition, has passed it): readings made and sent in event-time order
within each partition, what the windows must hold, and what a Delta table of them holds."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)
HOMES = tuple(f"h{n:03d}" for n in range(12))
SENSORS = ("motion", "door")
LATENESS = timedelta(seconds=30)
WINDOW = 10
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.000Z"
Window = tuple[str, str, str]  # (window start, home, sensor type)


def reading(home: str, sensor: str, second: int) -> dict[str, str]:
    moment = T0 + timedelta(seconds=second)
    return {
        "homeId": home,
        "sensorId": f"{home}-{sensor}",
        "sensorType": sensor,
        "eventType": "detected",
        "eventTime": moment.strftime(TIME_FORMAT),
    }


class Readings:
    """Readings sent to a hub, each home's all to one partition (as a partition key keeps them), in event-time
    order within each partition, some sent twice (a sensor's retry)."""

    def __init__(self, connection_string: str, hub: str, partitions: Sequence[str]) -> None:
        from azure.eventhub import EventHubProducerClient

        self.producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub)
        self.partitions = list(partitions)
        self.sent: list[dict[str, str]] = []

    def homes_of(self, partition: str) -> list[str]:
        index = self.partitions.index(partition)
        return [home for n, home in enumerate(HOMES) if n % len(self.partitions) == index]

    def wave(self, first: int, last: int, *, repeat_every: int = 0) -> int:
        """Every home's sensors, a reading every 3 seconds of event time from `first` to `last`, each
        `repeat_every`-th sent twice. How many events were sent."""
        from azure.eventhub import EventData

        count = 0
        for partition in self.partitions:
            bodies = [
                reading(home, sensor, second)
                for second in range(first, last + 1, 3)
                for home in self.homes_of(partition)
                for sensor in SENSORS
                for _ in range(2 if repeat_every and second % repeat_every == 0 else 1)
            ]
            for start in range(0, len(bodies), 200):
                batch = self.producer.create_batch(partition_id=partition)
                for body in bodies[start : start + 200]:
                    batch.add(EventData(json.dumps(body)))
                self.producer.send_batch(batch)
            self.sent.extend(bodies)
            count += len(bodies)
        return count

    def expected(self, flushed_at: int) -> Counter[Window]:
        """The windows a watermark at `flushed_at` seconds less the lateness has passed, with the count of
        distinct readings in each."""
        watermark = T0 + timedelta(seconds=flushed_at) - LATENESS
        counts: Counter[Window] = Counter()
        for body in {json.dumps(r, sort_keys=True) for r in self.sent}:
            r = json.loads(body)
            moment = datetime.strptime(r["eventTime"], TIME_FORMAT).replace(tzinfo=UTC)
            start = T0 + timedelta(seconds=int((moment - T0).total_seconds()) // WINDOW * WINDOW)
            if start + timedelta(seconds=WINDOW) <= watermark:
                counts[(start.isoformat(), r["homeId"], r["sensorType"])] += 1
        return counts

    def close(self) -> None:
        self.producer.close()


def windows(rows: Sequence[dict[str, Any]]) -> tuple[Counter[Window], int]:
    """The windows a table of the job's rows holds with their counts, and how many rows said a window a
    second time."""
    counts: Counter[Window] = Counter()
    twice = 0
    for row in rows:
        start = row["window_start"]
        start = start.replace(tzinfo=UTC) if start.tzinfo is None else start
        key = (start.isoformat(), row["home_id"], row["sensor_type"])
        twice += key in counts
        counts[key] = row["count"]
    return counts, twice
