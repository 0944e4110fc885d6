"""The local runtime end to end on the emulator and Azurite: `hubshift consume` processes (the SDK engine,
where Spark adds nothing but start-up time) driven by the control loop."""

from __future__ import annotations

import asyncio

import pytest

from hubshift.operator.rebalance import PublishAssignment
from tests.fixtures.runtime import Load, PoolFactory


@pytest.mark.timeout(150)
async def test_scales_out_under_load_then_in_when_idle_without_replaying_an_event(
    local_pool: PoolFactory,
) -> None:
    pool = await local_pool(
        8,
        scaling={
            "minReplicas": 1,
            "maxReplicas": 4,
            "target": {"unprocessedEventsPerReplica": 150},
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0, "policies": []},
                "scaleDown": {"stabilizationWindowSeconds": 4, "policies": []},
            },
        },
        # Checkpoints lag the reading, so the backlog the autoscaler sees is rate x checkpoint interval.
        consumer={"checkpoint": {"everySeconds": 3}},
    )
    await pool.until(lambda: pool.balanced_over(1), 40, "one consumer holding all 8 partitions")
    load = Load(pool.emulator.connection_string, rate=300)
    load.start()
    try:
        await pool.until(lambda: pool.runtime.replica_count >= 2, 40, "a scale-out under load")
        runtime = pool.runtime
        await pool.until(
            lambda: pool.balanced_over(runtime.replica_count) and runtime.replica_count >= 2, 40, "balanced"
        )
        scaled_out = pool.runtime.replica_count
    finally:
        sent = load.finish()
    await pool.until(lambda: pool.runtime.replica_count == 1, 60, "a scale-in when idle")
    await pool.until(lambda: pool.balanced_over(1) and len(pool.runtime.processes) == 1, 40, "drained to one")
    await pool.until(lambda: pool.processed()[0] >= sent, 20, "every event processed")
    distinct, replayed = pool.processed()
    assert scaled_out >= 2
    assert distinct == sent
    assert replayed == 0, "graceful handoffs replay nothing"
    assert {"ScalingOut", "ScalingIn", "Rebalanced"} <= set(pool.events())
    assert all(code == 0 for _, code in pool.runtime.exits), "scaled-in consumers exit 0 after handing off"


@pytest.mark.timeout(150)
async def test_a_planned_scale_out_hands_each_new_consumer_its_share_without_a_holddown(
    local_pool: PoolFactory,
) -> None:
    # A minute of holddown: a scale-out that waited for it could not be balanced within the bound below.
    pool = await local_pool(8, scaling={"minReplicas": 1, "maxReplicas": 1}, rebalance={"delaySeconds": 60})
    await pool.until(lambda: pool.balanced_over(1), 40, "one consumer holding all 8 partitions")
    load = Load(pool.emulator.connection_string, rate=200)
    load.start()
    try:
        await asyncio.sleep(2)
        manifest = pool.operator.consumer
        scaling = manifest.spec.scaling.model_copy(update={"min_replicas": 4, "max_replicas": 4})
        pool.operator.apply(
            manifest.model_copy(update={"spec": manifest.spec.model_copy(update={"scaling": scaling})})
        )
        await pool.until(lambda: pool.last_status().get("change") == "planned", 10, "the plan published")
        planned = pool.last_status().get("planned") or []
        assert sorted(entry["consumer"] for entry in planned) == ["homes-1", "homes-2", "homes-3"]
        await pool.until(lambda: len(pool.ready()) == 4, 40, "four consumers ready")
        balanced = await pool.until(lambda: pool.balanced_over(4), 15, "balanced over four")
        await asyncio.sleep(2)
    finally:
        sent = load.finish()
    assert balanced < 10, f"balanced {balanced:.1f}s after the last consumer was ready (holddown: 60 s)"
    await pool.until(lambda: pool.processed()[0] >= sent, 30, "every event processed")
    distinct, replayed = pool.processed()
    assert distinct == sent
    assert replayed == 0, "each planned handoff was graceful"
    events = pool.events()
    assert "Planned" in events and "Holddown" not in events
    assert pool.last_status().get("change") is None and pool.last_status().get("phase") == "Ready"


@pytest.mark.timeout(120)
async def test_a_consumer_that_dies_and_returns_within_the_delay_causes_no_handoff(
    local_pool: PoolFactory,
) -> None:
    pool = await local_pool(8, rebalance={"delaySeconds": 15})
    await pool.until(lambda: pool.balanced_over(2), 60, "two consumers balanced")
    generation = pool.operator.report.state.generation  # type: ignore[union-attr]
    load = Load(pool.emulator.connection_string, rate=100)
    load.start()
    try:
        await asyncio.sleep(1)
        pool.runtime.kill(1)  # SIGKILL; restarted like a pod, with the same identity
        await pool.until(lambda: pool.last_status().get("phase") == "Holddown", 10, "the holddown")
        await pool.until(lambda: pool.balanced_over(2), 14, "the consumer back, holding its own partitions")
    finally:
        load.finish()
    report = pool.operator.report
    assert report is not None and report.state.generation == generation, "no new assignment was published"
    assert "HolddownCancelled" in pool.events()
    assert ("homes-1", -9) in pool.runtime.exits


@pytest.mark.timeout(120)
async def test_a_consumer_that_does_not_return_is_replaced_without_waiting_for_its_lease(
    local_pool: PoolFactory,
) -> None:
    # A 60 s membership lease: without the operator's help its partitions would wait a minute.
    pool = await local_pool(8, rebalance={"delaySeconds": 3, "leaseDurationSeconds": 60})
    await pool.until(lambda: pool.balanced_over(2), 60, "two consumers balanced")
    pool.runtime.kill(1, restart=False)
    taken = await pool.until(lambda: pool.balanced_over(1), 30, "homes-0 holding every partition")
    assert taken < 3 + 10, (
        f"reassigned after {taken:.1f}s: the delay (3 s) and a few seconds, not the 60 s lease"
    )
    assert "homes-1" not in pool.snapshot().live_members


@pytest.mark.timeout(150)
async def test_an_operator_killed_mid_rebalance_leaves_no_partition_with_two_owners_and_no_extra_move(
    local_pool: PoolFactory,
) -> None:
    pool = await local_pool(8, rebalance={"delaySeconds": 2, "maxHandoffSeconds": 20})
    await pool.until(lambda: pool.balanced_over(2), 60, "two consumers balanced")
    load = Load(pool.emulator.connection_string, rate=200)
    load.start()
    before = len(pool.reports)
    try:
        manifest = pool.operator.consumer
        scaling = manifest.spec.scaling.model_copy(update={"min_replicas": 4, "max_replicas": 4})
        pool.operator.apply(
            manifest.model_copy(update={"spec": manifest.spec.model_copy(update={"scaling": scaling})})
        )
        await pool.until(
            lambda: pool.last_status().get("phase") == "Rebalancing", 40, "a rebalance under way"
        )
        await pool.restart_operator(kill=True)
        await pool.until(lambda: pool.balanced_over(4), 60, "four consumers balanced after the restart")
        await asyncio.sleep(2)
    finally:
        sent = load.finish()
    await pool.until(lambda: pool.processed()[0] >= sent, 30, "every event processed")
    distinct, replayed = pool.processed()
    assert distinct == sent
    assert replayed == 0, "no partition was read by two consumers at once, and no handoff replayed"
    generations = [r.state.generation for r in pool.reports]
    assert generations == sorted(generations), "the restarted operator continued the record, never went back"
    published = [a for r in pool.reports[before:] for a in r.actions if isinstance(a, PublishAssignment)]
    moves = sum(len(a.moves) for a in published)
    assert moves == 4, f"{moves} moves: 2 -> 4 consumers over 8 partitions needs 4, the restart adds none"
