"""Faults on the real servers, with a pool of `hubshift consume --engine sdk` processes under the local
control loop: what must hold when the store or Event Hubs goes away and comes back."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import pytest

from tests.fixtures.runtime import Load, PoolFactory
from tests.harness.azurite import Azurite

LEASE_SECONDS = 15


def readers_in_order(lines: list[dict[str, Any]]) -> list[str]:
    """Partitions where a batch read at a lower owner level came after one at a higher level: two readers
    of the partition at once (each ownership has its own, higher, owner level)."""
    by_partition: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_partition[str(line["partition"])].append(line)
    overlapping = []
    for partition, batches in by_partition.items():
        highest = -1
        for batch in sorted(batches, key=lambda b: float(b["at"])):
            if int(batch["ownerLevel"]) < highest:
                overlapping.append(partition)
                break
            highest = max(highest, int(batch["ownerLevel"]))
    return overlapping


@pytest.mark.timeout(300)
async def test_a_store_outage_longer_than_the_membership_lease_stops_reading_in_time_and_loses_nothing(
    local_pool: PoolFactory, azurite: Azurite
) -> None:
    pool = await local_pool(
        4,
        rebalance={"leaseDurationSeconds": LEASE_SECONDS, "delaySeconds": 3, "maxHandoffSeconds": 10},
        consumer={"checkpoint": {"everySeconds": 2}},
    )
    await pool.until(lambda: pool.balanced_over(2), 60, "two consumers balanced")
    load = Load(pool.emulator.connection_string, rate=40)
    load.start()
    try:
        await asyncio.sleep(4)
        with azurite.unreachable():
            outage_started = time.time()
            await asyncio.sleep(LEASE_SECONDS + 12)  # well past the membership lease
        outage_ended = time.time()
        await pool.until(lambda: pool.balanced_over(2), 90, "balanced again after the outage")
        await asyncio.sleep(3)
    finally:
        sent = load.finish()
    await pool.until(lambda: pool.processed()[0] >= sent, 60, "every event processed")
    lines = pool.ranges()
    # A consumer stops reading before its membership lease could expire (lease minus a safety margin after
    # its last renewal), and reads nothing more until the store answers again.
    late = [line for line in lines if outage_started + LEASE_SECONDS < float(line["at"]) < outage_ended]
    assert late == [], f"batches read while the store was away past the lease: {late[:3]}"
    assert readers_in_order(lines) == [], "two readers of a partition at once"
    distinct, replayed = pool.processed()
    assert distinct == sent, "nothing lost"
    # Read again from the checkpoints: at most what came after them (2 s at 40 events/s, four partitions).
    assert replayed <= 40 * (2 + LEASE_SECONDS), replayed


@pytest.mark.timeout(300)
async def test_event_hubs_down_for_thirty_seconds_then_back_with_its_data(local_pool: PoolFactory) -> None:
    pool = await local_pool(
        4,
        rebalance={"delaySeconds": 3, "maxHandoffSeconds": 10},
        consumer={"checkpoint": {"everySeconds": 2}},
        emulator_data=True,
    )
    await pool.until(lambda: pool.balanced_over(2), 60, "two consumers balanced")
    first = Load(pool.emulator.connection_string, rate=40, duration=6)
    first.start()
    await asyncio.sleep(7)
    sent = first.finish()
    await pool.until(lambda: pool.processed()[0] >= sent, 30, "the first load processed")
    emulator = await pool.restart_emulator(down_seconds=30)
    second = Load(emulator.connection_string, rate=40, duration=6)
    second.start()
    await asyncio.sleep(7)
    sent += second.finish()
    await pool.until(lambda: pool.processed()[0] >= sent, 90, "every event processed after the restart")
    distinct, replayed = pool.processed()
    assert distinct == sent, "nothing lost"
    assert replayed <= 40 * 2 * 2, f"{replayed} replayed: more than a checkpoint interval"
    assert readers_in_order(pool.ranges()) == []


@pytest.mark.timeout(300)
async def test_the_operator_and_every_consumer_killed_together_resume_from_their_checkpoints(
    local_pool: PoolFactory,
) -> None:
    checkpoint_seconds, rate = 2, 40
    pool = await local_pool(
        4,
        rebalance={"delaySeconds": 3, "maxHandoffSeconds": 10},
        consumer={"checkpoint": {"everySeconds": checkpoint_seconds}},
    )
    await pool.until(lambda: pool.balanced_over(2), 60, "two consumers balanced")
    load = Load(pool.emulator.connection_string, rate=rate)
    load.start()
    try:
        await asyncio.sleep(6)
        for ordinal in sorted(pool.runtime.processes):
            pool.runtime.kill(ordinal)  # SIGKILL; started again like pods, with the same identities
        await pool.restart_operator(kill=True)
        await pool.until(lambda: pool.balanced_over(2), 60, "balanced again")
        await asyncio.sleep(4)
    finally:
        sent = load.finish()
    await pool.until(lambda: pool.processed()[0] >= sent, 60, "every event processed")
    distinct, replayed = pool.processed()
    assert distinct == sent, "nothing lost"
    # What came after the last checkpoints is read again, and nothing more: one checkpoint interval of the
    # load (with a second's slack for the kill landing between a batch and its checkpoint write).
    assert replayed <= rate * (checkpoint_seconds + 1), replayed
    assert readers_in_order(pool.ranges()) == []
