"""Load-aware assignment on the local runtime (emulator, Azurite, `hubshift consume --engine sdk`): two busy
partitions on one consumer, and the control loop hands one of them to the other consumer, gracefully."""

from __future__ import annotations

import threading
import time

import pytest

from hubshift.operator.rebalance import PublishAssignment, PublishReason
from tests.fixtures.runtime import HUB, PoolFactory


class PartitionLoad(threading.Thread):
    """`rate` events a second to each of `partitions`, sent to the partition itself, until stopped."""

    def __init__(self, connection_string: str, partitions: list[str], rate: float) -> None:
        super().__init__(daemon=True, name="partition-load")
        self.connection_string, self.partitions, self.rate = connection_string, partitions, rate
        self.halt = threading.Event()
        self.sent = 0
        self.error: Exception | None = None

    def run(self) -> None:
        from azure.eventhub import EventData, EventHubProducerClient

        producer = EventHubProducerClient.from_connection_string(self.connection_string, eventhub_name=HUB)
        tick = 0.25
        try:
            with producer:
                while not self.halt.wait(tick):
                    for partition in self.partitions:
                        batch = producer.create_batch(partition_id=partition)
                        for _ in range(round(self.rate * tick)):
                            batch.add(EventData(b"x" * 100))
                        producer.send_batch(batch)
                        self.sent += len(batch)
        except Exception as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> int:
        self.halt.set()
        self.join(30)
        if self.error is not None:
            raise AssertionError(f"the load failed after {self.sent} events: {self.error!r}")
        return self.sent


@pytest.mark.timeout(150)
async def test_a_hot_partition_moves_away_from_the_busy_consumer_without_a_replay(
    local_pool: PoolFactory,
) -> None:
    pool = await local_pool(
        8,
        scaling={"minReplicas": 2, "maxReplicas": 2, "pollingIntervalSeconds": 1},
        rebalance={"strategy": "loadAware", "loadAware": {"windowSeconds": 6}},
    )
    await pool.until(lambda: pool.balanced_over(2), 40, "two consumers holding four partitions each")
    report = pool.operator.report
    assert report is not None
    generation = report.state.generation
    busy = sorted(p for p, c in report.state.assignment.items() if c == "homes-0")[:2]
    load = PartitionLoad(pool.emulator.connection_string, busy, rate=40)
    load.start()
    try:

        def split() -> bool:
            snapshot = pool.snapshot()
            owners = {row.partition: row.owner for row in snapshot.partitions if not row.free}
            current = pool.operator.report
            return (
                current is not None
                and current.status.phase == "Ready"
                and current.state.generation > generation
                and len({owners.get(p) for p in busy}) == 2
                and owners == {p: c for p, c in current.state.assignment.items() if c is not None}
            )

        await pool.until(split, 60, "the two busy partitions on two consumers, every handoff done")
        time.sleep(2)
    finally:
        sent = load.finish()
    await pool.until(lambda: pool.processed()[0] >= sent, 30, "every event processed")
    distinct, replayed = pool.processed()
    assert distinct == sent and replayed == 0, "a move for load is a graceful handoff: nothing read twice"
    publications = [a for r in pool.reports for a in r.actions if isinstance(a, PublishAssignment)]
    moved = [a for a in publications if a.reason is PublishReason.LOAD]
    assert len(moved) == 1 and len(moved[0].moves) == 1, [a.reason for a in publications]
    (move,) = moved[0].moves
    assert move.partition in busy and (move.previous, move.assignee) == ("homes-0", "homes-1")
    assert moved[0].forced == frozenset()
    messages = [e.message for e in pool.runtime.events if e.reason == "Rebalancing"]
    assert any("load: homes-0 carries" in m and f"moving {move.partition} (" in m for m in messages)
    status = pool.last_status()
    assert status["incomingEventsPerSecond"] > 0
    rates = {entry["consumer"]: entry["eventsPerSecond"] for entry in status["assignment"]}
    assert rates["homes-0"] > 0 and rates["homes-1"] > 0
