"""The range log: what `hubshift consume --engine sdk` writes by default, one JSON line per batch it
processed (consumer, partition, owner level, first and last sequence number, events, when the first and
the last were enqueued, time). The benchmarks and the tests read it, count replays over it and measure
enqueue-to-processed latency (tests/harness/ranges.py). `Costly` adds a fixed amount of work per event
before it (`--event-cost`): a consumer whose capacity is bounded by its work, as in the skew benchmark."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Protocol

import pyarrow as pa


class BatchHandler(Protocol):
    def __call__(self, partition: str, owner_level: int, batch: pa.RecordBatch) -> None: ...


class RangeLog:
    """The default handler: one JSON line per batch with the partition, owner level and sequence range, so
    a benchmark can count what was processed and what was processed twice."""

    def __init__(self, path: Path, consumer: str) -> None:
        self.path = path
        self.consumer = consumer
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, partition: str, owner_level: int, batch: pa.RecordBatch) -> None:
        sequence = batch.column("sequence_number")
        enqueued = batch.column("enqueued_time")
        line = json.dumps(
            {
                "consumer": self.consumer,
                "partition": partition,
                "ownerLevel": owner_level,
                "first": sequence[0].as_py(),
                "last": sequence[batch.num_rows - 1].as_py(),
                "events": batch.num_rows,
                "firstEnqueued": _seconds(enqueued[0].as_py()),
                "lastEnqueued": _seconds(enqueued[batch.num_rows - 1].as_py()),
                "at": time.time(),
            }
        )
        with self._lock, self.path.open("a") as handle:
            handle.write(line + "\n")


class Costly:
    """`handler` after `seconds` of work per event, one event after another on the receiving thread: the
    consumer then processes at most ``1 / seconds`` events a second, whatever the machine."""

    def __init__(self, handler: BatchHandler, seconds: float) -> None:
        self.handler = handler
        self.seconds = seconds

    def __call__(self, partition: str, owner_level: int, batch: pa.RecordBatch) -> None:
        time.sleep(self.seconds * batch.num_rows)
        self.handler(partition, owner_level, batch)


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()
