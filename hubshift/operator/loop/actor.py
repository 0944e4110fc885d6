"""What the control loop does with a rebalance step once its state is written: sets the replicas, ends the
membership of owners that are gone (so their forced partitions move at once), nudges the consumers
(`POST /assignment`), deletes (evicts) the pods a rollout replaces once they hold nothing, records the
Events; and times each handoff from its publication to the new owner holding the partition."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from hubshift.operator.consumer_http import Nudger
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.observe import present_consumers
from hubshift.operator.publication import owners_to_expel
from hubshift.operator.rebalance import (
    BreakLeases,
    PublishAssignment,
    RebalanceState,
    RecordEvent,
    SetReplicas,
    Step,
)
from hubshift.operator.rollout import RolloutDecision
from hubshift.operator.runtime import ConsumerInstance, ConsumerRuntime
from hubshift.ownership.membership import expel
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import StoreError
from hubshift.ownership.stores.counting import CountingStore

log = logging.getLogger(__name__)


class Actor:
    """The actions of one resource's control loop, on its runtime, its store and its consumers."""

    def __init__(
        self,
        scope: Scope,
        store: CountingStore,
        runtime: ConsumerRuntime,
        nudge: Nudger,
        *,
        metrics: OperatorMetrics | None,
        labels: tuple[str, str],
    ) -> None:
        self.scope = scope
        self.store = store
        self.runtime = runtime
        self.nudge = nudge
        self.metrics = metrics
        self.labels = labels  # (namespace, resource name)
        self.moving: dict[str, tuple[str, float]] = {}  # partition -> (assignee, when published)
        self.last_scale_time: float | None = None

    async def act(
        self,
        step: Step,
        owners: Mapping[str, str | None],
        instances: Sequence[ConsumerInstance],
        now: float,
        current: int,
        state: RebalanceState | None,
    ) -> None:
        """The step's actions in order (its state is written already), then the nudges and the Events;
        `state` is the rebalance state the handoffs are timed against."""
        nudge_generation: int | None = None
        for action in step.actions:
            if isinstance(action, PublishAssignment):
                nudge_generation = action.generation
                await self._published(action, owners, instances, now)
            elif isinstance(action, BreakLeases):
                nudge_generation = action.generation
            elif isinstance(action, SetReplicas):
                await self._set_replicas(action, now, current)
        if nudge_generation is not None:
            await self._nudge_all(instances, nudge_generation)
        for action in step.actions:
            if isinstance(action, RecordEvent):
                await self.runtime.record_event(action.reason, action.message, warning=action.warning)
        self._time_handoffs(owners, now, state)

    async def _published(
        self,
        action: PublishAssignment,
        owners: Mapping[str, str | None],
        instances: Sequence[ConsumerInstance],
        now: float,
    ) -> None:
        """A generation was published: its moves timed from now, the owners gone expelled, counted."""
        for move in action.moves:
            self.moving[move.partition] = (move.assignee, now)
        present = present_consumers(instances)
        stopping = [i.name for i in instances if i.terminating]
        for gone in owners_to_expel(action, owners, [*present, *stopping]):
            await self._expel(gone)
        if self.metrics is not None:
            self.metrics.moves.labels(*self.labels).inc(len(action.moves))
            self.metrics.rebalances.labels(*self.labels, action.reason.value).inc()

    async def _set_replicas(self, action: SetReplicas, now: float, current: int) -> None:
        await self.runtime.set_replicas(action.replicas)
        if action.replicas != current:
            self.last_scale_time = now
            if self.metrics is not None:
                self.metrics.record_scale(*self.labels, current, action.replicas)

    async def replace(self, decision: RolloutDecision) -> None:
        """Delete the pods the rollout replaces (they hold nothing now), then record its Events."""
        for name in decision.delete:
            if await self.runtime.replace_consumer(name):
                revision = decision.state.revision if decision.state is not None else "?"
                await self.runtime.record_event(
                    "Replacing", f"{name} holds no partition: deleted, made again at revision {revision}"
                )
            else:
                log.info("%s: the PodDisruptionBudget refuses to evict %s now; retrying", self.scope, name)
        for event in decision.events:
            await self.runtime.record_event(event.reason, event.message, warning=event.warning)

    async def _expel(self, consumer: str) -> None:
        try:
            await asyncio.to_thread(expel, self.store, self.scope, consumer)
            log.info(
                "%s: ended the membership of %s (gone): its partitions move at once", self.scope, consumer
            )
        except StoreError as exc:
            log.warning("%s: could not end the membership of %s: %s", self.scope, consumer, exc)

    async def _nudge_all(self, instances: Sequence[ConsumerInstance], generation: int) -> None:
        addresses = [i.address for i in instances if i.address and not i.terminating]
        results = await asyncio.gather(*(self.nudge(a, generation) for a in addresses))
        missed = [a for a, ok in zip(addresses, results, strict=True) if not ok]
        if missed:
            log.debug(
                "%s: %d consumers did not take the nudge (they list on their own)", self.scope, len(missed)
            )

    def _time_handoffs(
        self, owners: Mapping[str, str | None], now: float, state: RebalanceState | None
    ) -> None:
        """The handoff-duration histogram: from a move's publication to the new owner holding it."""
        for partition, (assignee, published) in list(self.moving.items()):
            if state is not None and state.assignment.get(partition) != assignee:
                del self.moving[partition]  # superseded by a later generation
            elif owners.get(partition) == assignee:
                del self.moving[partition]
                if self.metrics is not None:
                    self.metrics.handoff_duration.labels(*self.labels).observe(max(0.0, now - published))
