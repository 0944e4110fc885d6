"""The consumer without Spark: the same ownership agent over plain `azure-eventhub` receivers, each batch
handed to a handler on the receiver's thread (`hubshift consume --engine sdk`).

It exists for the rebalance benchmark, which compares ownership protocols and must not measure JVM
start-up, and for consumers that need no Spark. A batch counts as processed once the handler returned; a
drained partition's final position is the last batch its handler finished. A batch is about a second of the
handler's work (`HandlerPace`), so a drain waits for about that much.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa

from hubshift.consumer.engine import Committed, Drained, Notify, Stolen, not_started
from hubshift.consumer.lag import ReadProgress
from hubshift.consumer.ranges import BatchHandler
from hubshift.eventhubs.receiver import MAX_BATCH, PartitionReceiver, ReceiverPool, StartAt
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.ownership.model import Checkpoint

if TYPE_CHECKING:
    from hubshift.consumer.metrics import ConsumerMetrics

log = logging.getLogger(__name__)


# A delivery is one call of the handler, on the receiving thread: every other partition's reads and every
# drain wait for it. Once the handler's time per event is known, a delivery holds about this much of it (a
# 20 ms-an-event handler took 1,000 events, 20 s, at a time: a drain past the handoff time, its new owner
# breaking the lease and reading the batch again); before, FIRST_DELIVERY_EVENTS.
DELIVERY_SECONDS = 1.0
FIRST_DELIVERY_EVENTS = 100
# Each delivery's time per event moves the estimate this share of the way (a slower handler counts soon).
PACE_WEIGHT = 0.3


class HandlerPace:
    """The handler's time per event, smoothed, and the events per delivery that keep one near
    `DELIVERY_SECONDS` (at least 1, at most the receivers' `MAX_BATCH`)."""

    def __init__(self) -> None:
        self.seconds_per_event: float | None = None

    def record(self, events: int, seconds: float) -> None:
        if events <= 0 or seconds < 0:
            return
        sample = seconds / events
        known = self.seconds_per_event
        self.seconds_per_event = sample if known is None else known + PACE_WEIGHT * (sample - known)

    def batch_limit(self) -> int:
        per_event = self.seconds_per_event
        if per_event is None:
            return FIRST_DELIVERY_EVENTS
        events = DELIVERY_SECONDS / per_event if per_event > 0 else math.inf
        return MAX_BATCH if events >= MAX_BATCH else max(1, int(events))


@dataclass
class _Reading:
    receiver: PartitionReceiver
    owner_level: int
    last: Checkpoint | None = None


class SdkEngine:
    name = "sdk"

    def __init__(
        self,
        target: EventHubsTarget,
        handler: BatchHandler,
        *,
        pool: ReceiverPool | None = None,
        metrics: ConsumerMetrics | None = None,
    ) -> None:
        self.target = target
        self.metrics = metrics
        self.notify: Notify = not_started
        self.handler = handler
        self._pool = pool or ReceiverPool(target)
        self.pace = HandlerPace()
        self._lock = threading.Lock()
        self._reading: dict[str, _Reading] = {}

    def start(self, notify: Notify) -> None:
        self.notify = notify

    def start_partition(
        self, partition: str, owner_level: int, start: StartAt, next_sequence: int | None
    ) -> None:
        def deliver(batch: pa.RecordBatch) -> None:
            started = time.monotonic()
            self.handler(partition, owner_level, batch)
            took = time.monotonic() - started
            self.pace.record(batch.num_rows, took)
            if self.metrics is not None:
                first = batch.column("enqueued_time")[0].as_py()
                self.metrics.handled(partition, batch.num_rows, took, first)
            last = batch.num_rows - 1
            position = Checkpoint(
                offset=str(batch.column("offset")[last].as_py()),
                sequence_number=int(batch.column("sequence_number")[last].as_py()),
            )
            with self._lock:
                reading = self._reading.get(partition)
                if reading is not None and reading.owner_level == owner_level:
                    reading.last = position
            self.notify(Committed(partition, owner_level, position, batch.num_rows))

        def stolen(partition_id: str, level: int) -> None:
            self.notify(Stolen(partition_id, level))

        with self._lock:
            previous = self._reading.pop(partition, None)
        if previous is not None:
            previous.receiver.close(wait=None)
        receiver = self._pool.open(
            partition, owner_level, start, deliver, stolen, batch_limit=self.pace.batch_limit
        )
        with self._lock:
            self._reading[partition] = _Reading(receiver, owner_level)

    def drain_partition(self, partition: str) -> None:
        with self._lock:
            reading = self._reading.get(partition)
        if reading is None:
            return

        def finish() -> None:
            reading.receiver.close(wait=30, final_read=True)
            with self._lock:
                if self._reading.get(partition) is reading:
                    del self._reading[partition]
            self.notify(Drained(partition, reading.owner_level, reading.last))

        threading.Thread(target=finish, name=f"drain-{partition}", daemon=True).start()

    def stop_partition(self, partition: str) -> None:
        with self._lock:
            reading = self._reading.pop(partition, None)
        if reading is not None:
            reading.receiver.close(wait=None)

    def progress(self) -> dict[str, ReadProgress]:
        with self._lock:
            readings = dict(self._reading)
        progress = {}
        for partition, reading in readings.items():
            receiver = reading.receiver
            if receiver.last_enqueued_sequence is not None:
                done = reading.last.sequence_number if reading.last is not None else -1
                progress[partition] = ReadProgress(
                    done, receiver.last_enqueued_sequence, receiver.last_enqueued_time
                )
        return progress

    def enqueued_time(self, partition: str, sequence_number: int) -> datetime | None:
        with self._lock:
            reading = self._reading.get(partition)
        return None if reading is None else reading.receiver.enqueued_time(sequence_number)

    def close(self) -> None:
        with self._lock:
            self._reading.clear()
        self._pool.close()
