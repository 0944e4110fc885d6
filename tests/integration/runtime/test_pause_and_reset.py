"""The pause a checkpoint reset needs, end to end on the local runtime (the control loop over `hubshift
consume` processes, Azurite, the emulator): `autoscaling.hubshift.dev/paused-replicas: "0"` stops the pool,
every consumer handing its partitions off; while it stays, no consumer comes back and no checkpoint moves,
whatever the backlog; `hubshift checkpoints reset` is refused before and works then; without the
annotation the consumers come back and read from the reset positions. `paused: "true"` (the count frozen)
stops nothing: a reset stays refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from hubshift.manifest import PartitionedConsumer
from hubshift.spec import PAUSED_ANNOTATION, PAUSED_REPLICAS_ANNOTATION
from tests.fixtures.runtime import HUB, Pool, PoolFactory
from tests.harness.ranges import read_range_logs

HUBSHIFT = [sys.executable, "-m", "hubshift.cli"]


def annotated(consumer: PartitionedConsumer, annotations: dict[str, str]) -> PartitionedConsumer:
    metadata = consumer.metadata.model_copy(update={"annotations": annotations})
    return consumer.model_copy(update={"metadata": metadata})


async def reset_to(pool: Pool, sequence: int) -> subprocess.CompletedProcess[str]:
    """`hubshift checkpoints reset --to-sequence N --execute`, as a person runs it beside the pool."""
    command = [
        *HUBSHIFT,
        *("checkpoints", "reset", "--to-sequence", str(sequence), "--execute"),
        *("--container", pool.operator.consumer.spec.checkpoint_store.blob.container),  # type: ignore[union-attr]
        *("--namespace", pool.scope.fqns, "--hub", HUB),
    ]
    environ = {
        **os.environ,
        "HUBSHIFT_STORE": pool.operator.environ["HUBSHIFT_STORAGE_CONNECTION_STRING"],
        "HUBSHIFT_EVENTHUBS": pool.emulator.connection_string,
    }
    return await asyncio.to_thread(
        subprocess.run, command, env=environ, capture_output=True, text=True, timeout=120
    )


def checkpoints(pool: Pool) -> dict[str, int]:
    return {row.partition: row.checkpoint.sequence_number for row in pool.snapshot().partitions}


def send(pool: Pool, count: int) -> None:
    from azure.eventhub import EventData, EventHubProducerClient

    with EventHubProducerClient.from_connection_string(
        pool.emulator.connection_string, eventhub_name=HUB
    ) as p:
        for partition in ("0", "1", "2", "3"):
            batch = p.create_batch(partition_id=partition)
            for n in range(count):
                batch.add(EventData(str(n)))
            p.send_batch(batch)


@pytest.mark.timeout(240)
async def test_a_paused_pool_stops_moving_checkpoints_and_resumes_from_a_reset(
    local_pool: PoolFactory,
) -> None:
    pool = await local_pool(4, rebalance={"delaySeconds": 1})
    manifest = pool.operator.consumer
    await pool.until(lambda: pool.balanced_over(2), 60, "two consumers balanced")
    send(pool, 30)
    await pool.until(lambda: set(checkpoints(pool).values()) == {29}, 30, "every event checkpointed")

    # paused: "true" freezes the count only; the consumers go on and a reset stays refused
    pool.operator.apply(annotated(manifest, {PAUSED_ANNOTATION: "true"}))
    await asyncio.sleep(3)
    frozen = await reset_to(pool, 10)
    assert frozen.returncode == 2 and "live consumers own partitions" in frozen.stderr, frozen.stderr

    pool.operator.apply(annotated(manifest, {PAUSED_REPLICAS_ANNOTATION: "0"}))
    await pool.until(
        lambda: not pool.runtime.processes and all(row.free for row in pool.snapshot().partitions),
        60,
        "every consumer stopped, every partition released",
    )
    assert all(code == 0 for _, code in pool.runtime.exits), "each consumer handed its partitions off"
    status = pool.last_status()
    assert any(c["type"] == "Paused" and c["status"] == "True" for c in status.get("conditions", [])), status
    stopped_at = checkpoints(pool)
    assert set(stopped_at.values()) == {29}

    send(pool, 20)  # a backlog that would scale an unpaused pool out
    await asyncio.sleep(4)
    assert not pool.runtime.processes and checkpoints(pool) == stopped_at, "the paused pool moved"
    reset = await reset_to(pool, 10)
    assert reset.returncode == 0, reset.stderr
    assert checkpoints(pool) == dict.fromkeys("0123", 9)
    await asyncio.sleep(3)
    assert not pool.runtime.processes and checkpoints(pool) == dict.fromkeys("0123", 9), "nobody overwrote it"

    resumed_at = time.time()
    pool.operator.apply(annotated(manifest, {}))
    await pool.until(lambda: pool.balanced_over(2), 60, "the pool back")
    await pool.until(lambda: set(checkpoints(pool).values()) == {49}, 30, "the events after the reset read")
    again = [r for r in read_range_logs(pool.output / "ranges") if r["at"] > resumed_at]
    for partition in "0123":
        firsts = [r["first"] for r in again if r["partition"] == partition]
        assert min(firsts) == 10, f"partition {partition} did not start at the reset position: {firsts}"
