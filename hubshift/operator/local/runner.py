"""`LocalOperator`: a PartitionedConsumer's control loop over local consumer processes (`hubshift run`, the
demo, the runtime tests and the rebalance benchmark), scheduled by the same `LoopDriver` as the operator's
kopf daemon.

Connection strings come from this process's environment (or the `environ` given), under the variable
names the manifest gives. Editing the manifest (`apply`) works like `kubectl apply`: settings from the
next cycle on. A running pool keeps its hub and its store: its consumer processes were started for them
(the StatefulSet of the operator would roll; processes here are not restarted), so changing either is
refused with one line.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Unpack

from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumer
from hubshift.operator.driver import CycleRunner, Desired, LoopDriver, same_connections
from hubshift.operator.local.processes import LocalRuntime, ProcessOptions
from hubshift.operator.loop import CycleInputs, CycleReport, open_control_loop
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.status import failed_cycle_status
from hubshift.ownership.model import Driver


class LocalOperator:
    """The control loop over a `LocalRuntime`: `open` (checks the hub and the store), `run` until the stop
    flag is set, then `shutdown` (consumers hand their partitions off)."""

    def __init__(
        self,
        manifest_path: Path,
        consumer: PartitionedConsumer,
        workdir: Path,
        *,
        metrics: OperatorMetrics | None = None,
        on_report: Callable[[CycleReport], None] | None = None,
        **processes: Unpack[ProcessOptions],
    ) -> None:
        self.consumer = consumer
        self.workdir = workdir
        self.metrics = metrics
        self.driver = LoopDriver(
            self._open_loop,
            labels=(consumer.metadata.namespace, consumer.metadata.name),
            metrics=metrics,
            on_report=on_report,
            on_failure=self._report_failure,
        )
        self.runtime = LocalRuntime(manifest_path, consumer, workdir, on_change=self.driver.wake, **processes)
        self.created_at = time.time()

    @property
    def environ(self) -> dict[str, str]:
        """The environment the consumers get, where the connection strings are read from."""
        return self.runtime.environ

    # what the driver knows, for the callers that watch the pool
    @property
    def loop(self) -> CycleRunner | None:
        return self.driver.loop

    @property
    def report(self) -> CycleReport | None:
        return self.driver.report

    @property
    def cycles(self) -> int:
        return self.driver.cycles

    @property
    def errors(self) -> int:
        return self.driver.errors

    @property
    def on_report(self) -> Callable[[CycleReport], None] | None:
        return self.driver.on_report

    @on_report.setter
    def on_report(self, callback: Callable[[CycleReport], None] | None) -> None:
        self.driver.on_report = callback

    async def open(self) -> CycleRunner:
        """Check the hub and the store (`UserError`, one line, when either is wrong) and open the loop."""
        loop = await self._open_loop(self.consumer, check_hub=True)
        self.driver.start_with(loop, self.consumer)
        return loop

    def apply(self, consumer: PartitionedConsumer) -> None:
        """A changed manifest: its settings from the next cycle on (the driver applies it)."""
        if not same_connections(self.consumer, consumer):
            raise UserError(
                "the hub and the checkpoint store of a running consumer cannot change: restart it"
            )
        self.consumer = consumer
        self.runtime.consumer = consumer
        self.driver.wake()

    async def run(self, stop: asyncio.Event) -> None:
        """Cycles until `stop` is set (the caller then calls `shutdown`)."""
        if self.driver.loop is None:
            await self.open()
        self.runtime.start_supervising()
        await self.driver.run(stop, self._desired)

    async def shutdown(self, grace: float | None = None) -> None:
        """The consumers hand their partitions off (each within its pod's grace period), then the scope's
        record stops naming this run as its driver."""
        rebalance = self.consumer.spec.rebalance
        await self.runtime.stop_all(grace if grace is not None else rebalance.termination_grace_seconds)
        await self.driver.release()

    def _desired(self) -> Desired:
        previous = self.runtime.status.get("conditions")
        inputs = CycleInputs(
            annotations=dict(self.consumer.metadata.annotations),
            created_at=self.created_at,
            spec_generation=1,
            previous_conditions=previous if isinstance(previous, list) else (),
        )
        return Desired(self.consumer, inputs)

    async def _open_loop(self, consumer: PartitionedConsumer, *, check_hub: bool = False) -> CycleRunner:
        where = f"{consumer.metadata.namespace}/{consumer.metadata.name}"
        return await open_control_loop(
            consumer,
            self.environ,
            self.runtime,
            metrics=self.metrics,
            check_hub=check_hub,
            driver=Driver(uid=f"local:{where}", resource=f"hubshift run {where}"),
        )

    async def _report_failure(self, message: str) -> None:
        last = self.driver.report.status if self.driver.report is not None else None
        status = failed_cycle_status(last, self.runtime.status.get("conditions"), message, time.time())
        await self.runtime.publish_status(status.to_body())


def install_stop_signals(stop: asyncio.Event) -> None:
    """Ctrl-C and SIGTERM end the run after the current cycle; a second Ctrl-C does too (no traceback)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
