"""The range log: what `hubshift consume --engine sdk` writes by default, one JSON line per batch it
processed (consumer, partition, owner level, first and last sequence number, events, when it was handled
and when its first event was enqueued: how long that event waited). The rebalance benchmark and the tests
read it and count replays and waits over it (tests/harness/ranges.py)."""

from __future__ import annotations

import json
import threading
import time
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
        enqueued = batch.column("enqueued_time")[0].as_py()  # an aware datetime (UTC)
        line = json.dumps(
            {
                "consumer": self.consumer,
                "partition": partition,
                "ownerLevel": owner_level,
                "first": sequence[0].as_py(),
                "last": sequence[batch.num_rows - 1].as_py(),
                "events": batch.num_rows,
                "at": time.time(),
                "enqueued": None if enqueued is None else enqueued.timestamp(),
            }
        )
        with self._lock, self.path.open("a") as handle:
            handle.write(line + "\n")
