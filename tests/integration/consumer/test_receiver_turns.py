"""The receiving thread's turns against the emulator, through the real SDK: a partition whose events come
more often than the socket timeout does not hold the thread (it held it until it had read a prefetch's
worth, 1,000 events, delivering none of them meanwhile), and its neighbours' events are not held either."""

from __future__ import annotations

import datetime as dt
import threading
import time

from azure.eventhub import EventData, EventHubProducerClient

from hubshift.emulator.launch import RunningEmulator
from hubshift.eventhubs.receiver import ReceiverPool, StartAt
from hubshift.eventhubs.target import EventHubsTarget

SECONDS = 4.0


def test_a_steady_stream_neither_holds_its_own_events_nor_its_neighbours(emulator_factory: object) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:4"])  # type: ignore[operator]
    pool = ReceiverPool(
        EventHubsTarget(emulator.connection_string, f"127.0.0.1:{emulator.port}", "hub", "$Default")
    )
    late: dict[str, list[float]] = {str(p): [] for p in range(4)}
    lock = threading.Lock()

    def deliver(partition: str) -> object:
        def record(batch: object) -> None:
            now = dt.datetime.now(dt.UTC)
            with lock:
                late[partition].extend(
                    (now - t).total_seconds()
                    for t in batch.column("enqueued_time").to_pylist()  # type: ignore[attr-defined]
                )

        return record

    with EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name="hub") as p:
        for partition in late:  # the producer's links open before the clock starts
            p.send_batch([EventData(b"open")], partition_id=partition)
        started = dt.datetime.now(dt.UTC)
        for partition in late:
            pool.open(partition, 1, StartAt(enqueued_time=started), deliver(partition), lambda *_: None)  # type: ignore[arg-type]
        try:
            time.sleep(2)  # every link open
            sent = {partition: 0 for partition in late}
            began = time.monotonic()
            tick = 0
            while time.monotonic() - began < SECONDS:
                p.send_batch([EventData(b"x")], partition_id="0")  # every 20 ms: never quiet for 50 ms
                sent["0"] += 1
                if tick % 5 == 0:
                    for partition in ("1", "2", "3"):  # every 100 ms
                        p.send_batch([EventData(b"y")], partition_id=partition)
                        sent[partition] += 1
                tick += 1
                time.sleep(0.02)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with lock:
                    if all(len(late[q]) >= sent[q] for q in late):
                        break
                time.sleep(0.05)
        finally:
            pool.close()
    with lock:
        assert all(len(late[q]) >= sent[q] for q in late), ({q: len(v) for q, v in late.items()}, sent)
        worst = {q: max(v) for q, v in late.items()}
    # before: partition 0's events waited for the 1,000th (about 20 s at 50 a second), its neighbours' too
    assert max(worst.values()) < 1.5, worst
