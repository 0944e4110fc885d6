"""The loop driver's one rule, with a stand-in loop: when cycles run, how failures back off, how spec edits
apply, and that nothing runs while nothing is desired."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import pytest

from hubshift.manifest import PartitionedConsumer, parse_manifest
from hubshift.operator.driver import Desired, LoopDriver
from hubshift.operator.loop import CycleInputs, CycleReport
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.rebalance import RebalanceState
from hubshift.operator.status import PartitionedConsumerStatus

LABELS = ("default", "homes")


def consumer(hub: str = "homes", polling: float = 5.0, max_replicas: int = 4) -> PartitionedConsumer:
    return parse_manifest(
        {
            "apiVersion": "hubshift.dev/v1alpha1",
            "kind": "PartitionedConsumer",
            "metadata": {"name": "homes"},
            "spec": {
                "eventHubs": {"hub": hub},
                "checkpointStore": {"sqlite": {"path": "store.db"}},
                "scaling": {"pollingIntervalSeconds": polling, "maxReplicas": max_replicas},
            },
        }
    )


@dataclass
class FakeLoop:
    """A `CycleRunner` whose cycles ask for `next_in` seconds (or fail while `failing`)."""

    consumer: PartitionedConsumer
    next_in: float = 60.0
    failing: int = 0
    started: list[float] = field(default_factory=list)
    applied: list[PartitionedConsumer] = field(default_factory=list)
    closed: bool = False
    released: bool = False

    async def cycle(self, inputs: CycleInputs) -> CycleReport:
        self.started.append(time.monotonic())
        if self.failing:
            self.failing -= 1
            raise RuntimeError("the store is away")
        return CycleReport(
            state=RebalanceState(),
            status=PartitionedConsumerStatus(),
            decision=None,
            owners={},
            backlog=None,
            actions=(),
            store_requests=0,
            duration=0.0,
            next_cycle_in=self.next_in,
        )

    def apply(self, consumer: PartitionedConsumer) -> None:
        self.applied.append(consumer)

    async def close(self) -> None:
        self.closed = True

    async def release(self) -> None:
        self.released = True


@dataclass
class Opener:
    loops: list[FakeLoop] = field(default_factory=list)
    next_in: float = 60.0
    failing: int = 0

    async def __call__(self, consumer: PartitionedConsumer) -> FakeLoop:
        loop = FakeLoop(consumer, self.next_in, self.failing)
        self.loops.append(loop)
        return loop


async def run_for(driver: LoopDriver, seconds: float, wish: Desired | None) -> None:
    stop = asyncio.Event()
    task = asyncio.ensure_future(driver.run(stop, lambda: wish))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(task, 5)


def wish(spec: PartitionedConsumer | None = None) -> Desired:
    return Desired(spec or consumer(), CycleInputs())


async def test_the_next_cycle_comes_when_the_last_one_asked() -> None:
    opener = Opener(next_in=0.2)
    driver = LoopDriver(opener, labels=LABELS, min_cycle_seconds=0.0)
    await run_for(driver, 0.7, wish())
    (loop,) = opener.loops
    gaps = [b - a for a, b in zip(loop.started, loop.started[1:], strict=False)]
    assert 3 <= len(loop.started) <= 5
    assert all(0.15 <= gap <= 0.4 for gap in gaps), gaps


async def test_a_wake_up_runs_a_cycle_at_once_but_not_sooner_than_the_minimum_spacing() -> None:
    opener = Opener(next_in=60.0)
    driver = LoopDriver(opener, labels=LABELS, min_cycle_seconds=0.3)
    stop = asyncio.Event()
    task = asyncio.ensure_future(driver.run(stop, wish))
    await asyncio.sleep(0.05)
    driver.wake()
    driver.wake()  # a burst of pod events is one cycle
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(task, 5)
    started = opener.loops[0].started
    assert len(started) == 2, "the first cycle, then one for the burst of wake-ups"
    assert started[1] - started[0] >= 0.29


async def test_failures_are_counted_and_retried_with_a_growing_back_off() -> None:
    metrics = OperatorMetrics()
    opener = Opener(next_in=60.0, failing=2)
    driver = LoopDriver(opener, labels=LABELS, metrics=metrics, min_cycle_seconds=0.0)
    await run_for(driver, 3.5, wish())
    started = opener.loops[0].started
    assert driver.errors == 2 and driver.cycles == 1
    assert metrics.cycle_errors.labels(*LABELS)._value.get() == 2
    assert 0.9 <= started[1] - started[0] <= 1.5  # 1 s
    assert 1.9 <= started[2] - started[1] <= 2.5  # then 2 s


async def test_a_failed_cycle_is_reported_to_the_runtime_and_logged_once_per_run_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reported: list[str] = []

    async def on_failure(message: str) -> None:
        reported.append(message)

    opener = Opener(next_in=60.0, failing=2)
    driver = LoopDriver(opener, labels=LABELS, min_cycle_seconds=0.0, on_failure=on_failure)
    with caplog.at_level(logging.INFO, logger="hubshift.operator.driver"):
        await run_for(driver, 3.5, wish())
    assert reported == ["RuntimeError: the store is away"] * 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["control-loop cycle failed (retrying): RuntimeError: the store is away"]
    assert "control-loop cycles work again" in [r.getMessage() for r in caplog.records]


async def test_release_lets_the_loop_give_its_scope_up_then_closes_it() -> None:
    opener = Opener()
    driver = LoopDriver(opener, labels=LABELS, min_cycle_seconds=0.0)
    await run_for(driver, 0.2, wish())
    await driver.release()
    assert opener.loops[0].released and opener.loops[0].closed and driver.loop is None


async def test_an_edit_applies_to_the_same_loop_and_a_new_hub_opens_a_new_one() -> None:
    opener = Opener()
    driver = LoopDriver(opener, labels=LABELS)
    await driver.cycle(wish(consumer()))
    await driver.cycle(wish(consumer(max_replicas=8)))
    (first,) = opener.loops
    assert [c.spec.scaling.max_replicas for c in first.applied] == [8]
    await driver.cycle(wish(consumer(hub="other")))
    assert first.closed and len(opener.loops) == 2
    assert opener.loops[1].consumer.spec.event_hubs.hub == "other"
    await driver.close()
    assert opener.loops[1].closed


async def test_nothing_runs_while_nothing_is_desired() -> None:
    opener = Opener()
    driver = LoopDriver(opener, labels=LABELS, min_cycle_seconds=0.0)
    await run_for(driver, 0.3, None)
    assert opener.loops == [] and driver.cycles == 0


@pytest.mark.parametrize("polling", [1.0, 5.0])
async def test_the_back_off_never_exceeds_the_polling_interval(polling: float) -> None:
    opener = Opener(failing=10)
    driver = LoopDriver(opener, labels=LABELS)
    waits = [await driver.cycle(wish(consumer(polling=polling))) for _ in range(6)]
    assert waits[0] == 1.0 and max(waits) == polling
