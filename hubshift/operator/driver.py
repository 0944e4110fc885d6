"""When a PartitionedConsumer's control loop runs its cycles: one driver, one rule, for both runtimes
(the kopf daemon of `hubshift operator` and the local runtime of `hubshift run` and the demo).

The rule:
- a cycle runs when the previous one asked for it (`CycleReport.next_cycle_in`: the polling interval,
  sooner while a holddown or a handoff runs, exactly at the holddown's end), or at once when woken (a
  consumer appeared, went or changed readiness; the spec changed);
- never sooner than `min_cycle_seconds` after the previous cycle started (pod events come in bursts);
- a failed cycle (the store or the hub away, a Secret missing, a refusal) is counted and logged (one
  warning per run of the same failure), reported to `on_failure` (the runtimes put it into the status:
  `Ready` False with the failure's line), and the next one comes after a back-off: 1 s, doubling, at most
  the polling interval;
- before each cycle the driver asks what the resource says now (`Desired`: the spec and the cycle's
  inputs). A changed spec applies from this cycle on (`CycleRunner.apply`); a changed hub or store
  closes the loop's connections and opens them again. Nothing is desired (an invalid spec, children not
  yet created): no cycle, wait for a wake-up.

The driver keeps no state between runs; each PartitionedConsumer has its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, stop_never, wait_exponential

from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumer
from hubshift.operator.loop import CycleInputs, CycleReport
from hubshift.operator.metrics import OperatorMetrics
from hubshift.ownership.store import StoreError

log = logging.getLogger(__name__)

MIN_CYCLE_SECONDS = 0.5
# With nothing to run (an invalid spec, no children yet), look again this often even without a wake-up.
NOTHING_TO_RUN_SECONDS = 60.0
FIRST_RETRY_SECONDS = 1.0
LAST_RETRY_SECONDS = FIRST_RETRY_SECONDS * 2**16
# After a failed cycle: every failure is retried, never giving up, after tenacity's exponential wait (from
# FIRST_RETRY_SECONDS, doubling with each failure in a row up to LAST_RETRY_SECONDS; `failure_backoff`
# caps it at the polling interval). The driver counts a run of failures as tenacity counts a retried call's
# attempts.
RETRY_POLICY = AsyncRetrying(
    wait=wait_exponential(multiplier=FIRST_RETRY_SECONDS, max=LAST_RETRY_SECONDS), stop=stop_never
)


def failure_backoff(failures: RetryCallState, polling_interval: float) -> float:
    """The wait before the cycle after `failures` failed cycles in a row."""
    return min(RETRY_POLICY.wait(failures), polling_interval)


class Flag(Protocol):
    """Something a loop can wait on: an `asyncio.Event`, kopf's `DaemonStopped`."""

    def is_set(self) -> bool: ...

    def wait(self) -> Awaitable[object]: ...


async def first_of(*flags: Flag, timeout: float) -> None:
    """Until the first of `flags` is set, or `timeout` seconds: a control loop's pause between cycles."""
    waiters = [asyncio.ensure_future(flag.wait()) for flag in flags]
    try:
        await asyncio.wait(waiters, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class CycleRunner(Protocol):
    """What the driver runs: a `ControlLoop` (or, in tests, a stand-in)."""

    async def cycle(self, inputs: CycleInputs) -> CycleReport: ...

    def apply(self, consumer: PartitionedConsumer) -> None:
        """A changed spec with the same hub and store: its settings from the next cycle on."""
        ...

    async def close(self) -> None: ...

    async def release(self) -> None:
        """The resource is gone: let another resource drive its scope."""
        ...


LoopOpener = Callable[[PartitionedConsumer], Awaitable[CycleRunner]]


@dataclass(frozen=True)
class Desired:
    """What the resource says now: the spec to run, and the next cycle's inputs from its metadata."""

    consumer: PartitionedConsumer
    inputs: CycleInputs


def same_connections(a: PartitionedConsumer, b: PartitionedConsumer) -> bool:
    """Whether the loop's clients (the hub, the store) serve both specs."""
    return (a.spec.event_hubs, a.spec.checkpoint_store) == (b.spec.event_hubs, b.spec.checkpoint_store)


class LoopDriver:
    """Runs one PartitionedConsumer's cycles until stopped (`run`), then `close`."""

    def __init__(
        self,
        open_loop: LoopOpener,
        *,
        labels: tuple[str, str],
        metrics: OperatorMetrics | None = None,
        wakeup: asyncio.Event | None = None,
        lock: asyncio.Lock | None = None,
        min_cycle_seconds: float = MIN_CYCLE_SECONDS,
        on_report: Callable[[CycleReport], None] | None = None,
        on_failure: Callable[[str], Awaitable[None]] | None = None,
        logger: logging.Logger | logging.LoggerAdapter[Any] = log,
    ) -> None:
        self.open_loop = open_loop
        self.labels = labels
        self.metrics = metrics
        self.wakeup = wakeup if wakeup is not None else asyncio.Event()
        self.lock = lock if lock is not None else asyncio.Lock()
        self.min_cycle_seconds = min_cycle_seconds
        self.on_report = on_report
        self.on_failure = on_failure
        self.logger = logger
        self._last_failure: str | None = None
        self.loop: CycleRunner | None = None
        self.consumer: PartitionedConsumer | None = None
        self.report: CycleReport | None = None
        self.cycles = 0
        self.errors = 0
        self._failures: RetryCallState | None = None  # the failed cycles in a row, if the last one failed
        if metrics is not None:
            metrics.initialise(*labels)

    def start_with(self, loop: CycleRunner, consumer: PartitionedConsumer) -> None:
        """Run an already opened loop (the caller checked the hub and the store up front)."""
        self.loop, self.consumer = loop, consumer

    def wake(self) -> None:
        """Run the next cycle as soon as the rule allows."""
        self.wakeup.set()

    async def run(self, stop: Flag, desired: Callable[[], Desired | None]) -> None:
        while not stop.is_set():
            self.wakeup.clear()  # a wake-up during the cycle runs the next one at once
            started = time.monotonic()
            wish = desired()
            wait = NOTHING_TO_RUN_SECONDS
            if wish is not None:
                async with self.lock:
                    wait = await self.cycle(wish)
            await first_of(stop, self.wakeup, timeout=wait)
            too_soon = self.min_cycle_seconds - (time.monotonic() - started)
            if too_soon > 0 and not stop.is_set():
                await first_of(stop, timeout=too_soon)

    async def close(self) -> None:
        loop, self.loop = self.loop, None
        if loop is not None:
            await loop.close()

    async def cycle(self, wish: Desired) -> float:
        """One cycle of `wish` now (`run` calls it by the rule); the seconds until the next."""
        polling = wish.consumer.spec.scaling.polling_interval_seconds
        started = time.perf_counter()
        try:
            loop = await self._loop_for(wish.consumer)
            report = await loop.cycle(wish.inputs)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the driver outlives a failed cycle; the next one retries
            self.errors += 1
            failures = self._failed_again()
            if self.metrics is not None:
                self.metrics.cycle_errors.labels(*self.labels).inc()
            known = isinstance(error, StoreError | UserError)
            what = str(error) if known else f"{type(error).__name__}: {error}"
            if what != self._last_failure:
                self.logger.warning("control-loop cycle failed (retrying): %s", what)
            else:
                self.logger.debug("control-loop cycle failed again (retrying): %s", what)
            self.logger.debug("control-loop cycle failed", exc_info=True)
            self._last_failure = what
            await self._report_failure(what)
            return failure_backoff(failures, polling)
        finally:
            if self.metrics is not None:
                self.metrics.cycle_duration.labels(*self.labels).observe(time.perf_counter() - started)
        self._failures = None
        if self._last_failure is not None:
            self.logger.info("control-loop cycles work again")
            self._last_failure = None
        self.cycles += 1
        self.report = report
        if self.on_report is not None:
            self.on_report(report)
        return float(report.next_cycle_in)

    def _failed_again(self) -> RetryCallState:
        """One more failed cycle in a row."""
        if self._failures is None:
            self._failures = RetryCallState(RETRY_POLICY, None, (), {})
        else:
            self._failures.prepare_for_next_attempt()
        return self._failures

    async def _report_failure(self, what: str) -> None:
        if self.on_failure is None:
            return
        try:
            await self.on_failure(what)
        except Exception as error:  # a status that cannot be written is no reason to stop the driver
            self.logger.debug("could not report the failed cycle: %s", error)

    async def release(self) -> None:
        """The resource is gone: its loop lets another resource drive the scope (best effort), then closes."""
        loop = self.loop
        if loop is not None:
            try:
                await loop.release()
            except Exception as error:
                self.logger.warning("could not release the scope: %s", error)
        await self.close()

    async def _loop_for(self, consumer: PartitionedConsumer) -> CycleRunner:
        """The loop for this spec: the same one with the new settings, or a new one for a new hub or store."""
        if self.loop is not None and self.consumer is not None and consumer != self.consumer:
            if same_connections(self.consumer, consumer):
                self.loop.apply(consumer)
                self.consumer = consumer
            else:
                self.logger.info("the hub or the checkpoint store changed: connecting again")
                await self.close()
        if self.loop is None:
            self.loop = await self.open_loop(consumer)
            self.consumer = consumer
        return self.loop
