"""`ControlLoop`: one cycle of one PartitionedConsumer's control loop, the same for pods and local processes,
in the order docs/architecture.md ("The control loop") gives: observe (`Observer`), decide (`Decider`:
the replicas, the rollout, the rebalance step and its record), act (`Actor`), report (`Reporter`).

The decisions are pure (`autoscaler`, `rollout`, `rebalance`, `observe`, `partition_lag`,
`status.build_status`); the store is synchronous and runs in a worker thread, so a cycle never blocks the
event loop. When cycles run is the `LoopDriver`'s business (`driver.py`), the same for both runtimes.
Between cycles the four parts keep what the decisions hand back; what must survive a restart is in the
store: the assignment record (the rebalance state) and the autoscaler's record (`scaling_record.py`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from hubshift.connections import event_hubs_target, open_checkpoint_store, ownership_scope
from hubshift.errors import UserError
from hubshift.eventhubs.management import EventHubsProbe, ProbeError
from hubshift.manifest import PartitionedConsumer
from hubshift.operator import autoscaler
from hubshift.operator.cadence import next_cycle_in
from hubshift.operator.consumer_http import Nudger, nudge_consumer
from hubshift.operator.loop.actor import Actor
from hubshift.operator.loop.decider import Decider, Decisions
from hubshift.operator.loop.inputs import ConsumersSeen, CycleInputs
from hubshift.operator.loop.observer import Observer
from hubshift.operator.loop.report import CycleReport, Reporter
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.reservations import ScopeReservations
from hubshift.operator.runtime import ConsumerRuntime
from hubshift.ownership.model import Driver
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseStore
from hubshift.ownership.stores.counting import CountingStore
from hubshift.spec import TokenCredentialSpec

log = logging.getLogger(__name__)


class ControlLoop:
    """The control loop of one PartitionedConsumer. `cycle()` runs one cycle; the caller schedules them
    (`report.next_cycle_in`), and runs one at once when a consumer appears, goes or changes readiness."""

    def __init__(
        self,
        consumer: PartitionedConsumer,
        scope: Scope,
        store: LeaseStore,
        probe: EventHubsProbe | Any,
        runtime: ConsumerRuntime,
        *,
        metrics: OperatorMetrics | None = None,
        nudge: Nudger = nudge_consumer,
        clock: Callable[[], float] = time.time,
        driver: Driver | None = None,
        reservations: ScopeReservations | None = None,
        created: str = "",
    ) -> None:
        self.consumer = consumer
        self.scope = scope
        self.store = CountingStore(store)
        self.runtime = runtime
        self.clock = clock
        labels = (consumer.metadata.namespace, consumer.metadata.name)
        self.observer = Observer(scope, self.store, probe, metrics=metrics, labels=labels)
        self.decider = Decider(
            scope,
            self.store,
            self.observer,
            runtime,
            driver=driver,
            reservations=reservations,
            created=created,
        )
        self.actor = Actor(scope, self.store, runtime, nudge, metrics=metrics, labels=labels)
        self.reporter = Reporter(self.observer, runtime, metrics=metrics, labels=labels)

    def apply(self, consumer: PartitionedConsumer) -> None:
        """A changed spec: scaling and rebalance settings from the next cycle on."""
        self.consumer = consumer
        # Decide replicas again at once, on the backlog last read (at most a polling interval old): probing
        # every partition first would delay the scale the new bounds ask for by that probe.
        self.decider.decision = None

    async def release(self) -> None:
        """The resource is gone (deleted, or `hubshift run` ends): its record no longer names it as the
        scope's driver, so another resource may take the scope over. Best effort (CAS, one attempt)."""
        await self.decider.release()

    async def close(self) -> None:
        self.decider.drop_reservation()
        await self.observer.close()
        await asyncio.to_thread(self.store.store.close)

    async def cycle(self, inputs: CycleInputs | None = None) -> CycleReport:
        inputs = inputs or CycleInputs()
        await self.decider.refuse_if_reserved()
        started = time.perf_counter()
        requests_before = self.store.total
        now = self.clock()
        pause = autoscaler.parse_pause(inputs.annotations)
        for problem in pause.problems:
            log.warning("%s: %s", self.consumer.metadata.name, problem)
        seen = await self._observe(now, inputs)
        decided = await self.decider.decide(self.consumer, now, seen, pause, self.clock)
        step = decided.step
        await self.actor.act(
            step, decided.owners, seen.instances, now, seen.current_replicas, self.decider.rebalance_state
        )
        await self.actor.replace(decided.rollout)
        return await self._report(now, seen, pause, decided, started, requests_before)

    async def _observe(self, now: float, inputs: CycleInputs) -> ConsumersSeen:
        """The hub (once per polling interval), the consumers and their work, the replicas, the revision."""
        spec = self.consumer.spec
        window = spec.rebalance.load_aware.window_seconds
        await self.observer.probe_hub(now, spec.scaling.polling_interval_seconds, window)
        instances = await self.runtime.consumers()
        await self.observer.measure_work(now, instances, window)
        current = await self.runtime.replicas()
        revision = await self.runtime.revision()
        return ConsumersSeen(instances, current, revision, inputs)

    async def _report(
        self,
        now: float,
        seen: ConsumersSeen,
        pause: autoscaler.Pause,
        decided: Decisions,
        started: float,
        requests_before: int,
    ) -> CycleReport:
        """The status and the metrics of this cycle, and what it saw and did."""
        current = await self.runtime.replicas()
        reporter = self.reporter
        figures = await reporter.figures(self.consumer, now, decided.owners)
        last_scale = self.actor.last_scale_time
        status = await reporter.publish_status(
            self.consumer, now, seen, pause, decided, figures, current, last_scale
        )
        duration = time.perf_counter() - started
        reporter.export(self.consumer, now, decided, seen.instances, current, figures)
        state = decided.step.state
        polling = self.consumer.spec.scaling.polling_interval_seconds
        return CycleReport(
            state=state,
            status=status,
            decision=decided.scaling_decision,
            owners=decided.owners,
            backlog=figures.backlog,
            lag=figures.lag,
            actions=decided.step.actions,
            store_requests=self.store.total - requests_before,
            duration=duration,
            next_cycle_in=next_cycle_in(state, self.clock(), polling),
            load=figures.load,
            capacity=self.observer.capacity,
        )


async def open_control_loop(
    consumer: PartitionedConsumer,
    environ: Mapping[str, str],
    runtime: ConsumerRuntime,
    *,
    metrics: OperatorMetrics | None = None,
    check_hub: bool = False,
    identity: TokenCredentialSpec | None = None,
    driver: Driver | None = None,
    reservations: ScopeReservations | None = None,
    created: str = "",
) -> ControlLoop:
    """A control loop with its clients for this spec: the hub (one probe, kept open) and the store, their
    connection strings from `environ`, their token credentials the spec's (or `identity`, the operator's
    own, in their place). A bad spec or credential is a `UserError` (one line); with `check_hub`, so is a
    hub that cannot be read now (`hubshift run` checks up front; the operator reports it in status)."""
    target = event_hubs_target(consumer.spec.event_hubs, environ, identity=identity)
    store = await asyncio.to_thread(
        functools.partial(open_checkpoint_store, consumer.spec.checkpoint_store, environ, identity=identity)
    )
    probe = EventHubsProbe(target)
    if check_hub:
        try:
            await probe.partition_ids()
        except ProbeError as exc:
            await probe.close()
            store.close()
            raise UserError(str(exc)) from None
    return ControlLoop(
        consumer,
        ownership_scope(target),
        store,
        probe,
        runtime,
        metrics=metrics,
        driver=driver,
        reservations=reservations,
        created=created,
    )
