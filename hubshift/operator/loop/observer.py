"""What the control loop sees, and keeps between cycles: the hub's partitions and positions (the probe,
once per polling interval), the ownership table (one store listing, in a worker thread), what every
consumer has processed, and from those the load, the backlog and the lag in seconds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hubshift.eventhubs.management import ProbeError
from hubshift.eventhubs.model import PartitionInfo
from hubshift.operator.consumer_http import consumer_figures
from hubshift.operator.load import (
    HubSample,
    WorkSample,
    consumer_capacity,
    load_weights,
    partition_loads,
    within,
)
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.observe import backlog_per_partition
from hubshift.operator.partition_lag import PartitionLag, lag_per_partition, lag_reads, remember_probes
from hubshift.operator.runtime import ConsumerInstance
from hubshift.ownership.model import OwnershipSnapshot
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.stores.counting import CountingStore
from hubshift.spec import StartPositionSpec

log = logging.getLogger(__name__)


class Observer:
    """The hub, the store and the consumers' work, as one resource's control loop last saw them."""

    def __init__(
        self,
        scope: Scope,
        store: CountingStore,
        probe: Any,
        *,
        metrics: OperatorMetrics | None,
        labels: tuple[str, str],
    ) -> None:
        self.scope = scope
        self.store = store
        self.probe = probe  # an `EventHubsProbe` (or, in tests and benchmarks, a stand-in)
        self.metrics = metrics
        self.labels = labels  # (namespace, resource name)
        self.snapshot: OwnershipSnapshot | None = None
        self.partitions: dict[str, PartitionInfo] | None = None
        self.partition_ids: tuple[str, ...] = ()
        self.probed_at: float | None = None
        self.probe_error: str | None = None
        # load and capacity (operator/load.py): the hub's positions and the consumers' work at each probe,
        # and the capacity last measured
        self.hub_samples: list[HubSample] = []
        self.work_samples: list[WorkSample] = []
        self.capacity: float | None = None
        # a streaming job's partitions whose state a consumer is restoring: partition -> (consumer, since)
        self.restoring: dict[str, tuple[str, float]] = {}
        # lag in seconds: events read by the loop itself, partition -> (sequence number, enqueued time), and
        # the reads tried, partition -> (sequence number, when)
        self.lag_read: dict[str, tuple[int, float]] = {}
        self.lag_tried: dict[str, tuple[int, float]] = {}
        self.lag_reading: asyncio.Task[None] | None = None
        # the probes that bound a lag from below, partition -> ((last enqueued sequence number, when), ...)
        self.lag_probes: dict[str, tuple[tuple[int, float], ...]] = {}

    def probed(self, now: float) -> bool:
        """Whether the hub was probed in the cycle of `now` (its backlog is fresh)."""
        return self.probed_at == now

    async def probe_hub(self, now: float, polling_interval: float, window: float) -> None:
        """Partition ids and last enqueued sequence numbers, once per polling interval."""
        if self.probed_at is not None and now - self.probed_at < polling_interval:
            return
        self.probed_at = now
        try:
            self.partitions = await self.probe.partitions()
            self.partition_ids = tuple(self.partitions)
            self.probe_error = None
            positions = {p: (i.last_enqueued, i.last_enqueued_offset) for p, i in self.partitions.items()}
            self.hub_samples = within([*self.hub_samples, HubSample(now, positions)], now, window)
        except ProbeError as exc:
            self.partitions = None
            self.probe_error = str(exc)
            log.warning("%s: backlog unreadable: %s", self.labels[1], exc)

    async def measure_work(self, now: float, instances: Sequence[ConsumerInstance], window: float) -> None:
        """At each probe, what every ready consumer has processed and for how long (their capacity), and the
        partitions whose state they are restoring (a consumer is ready once it reads, before its partitions'
        queries commit)."""
        if not self.probed(now):
            return
        reachable = [i for i in instances if i.address and i.ready and not i.terminating]
        answers = await asyncio.gather(*(consumer_figures(str(i.address)) for i in reachable))
        work = {
            i.name: answer.work
            for i, answer in zip(reachable, answers, strict=True)
            if answer is not None and answer.work is not None
        }
        self.restoring = {
            partition: (i.name, since)
            for i, answer in zip(reachable, answers, strict=True)
            if answer is not None
            for partition, since in answer.restoring.items()
        }
        self.work_samples = within([*self.work_samples, WorkSample(now, work)], now, window)
        capacity = consumer_capacity(self.work_samples, now, window)
        if capacity is not None:
            self.capacity = capacity  # kept while the consumers are idle: an idle pool is not slower

    def load(self, now: float, window: float) -> dict[str, float] | None:
        """Each partition's incoming events per second over the window; None before two probes."""
        loads = partition_loads(self.hub_samples, now, window)
        return load_weights(loads) if loads else None

    async def take_snapshot(self) -> OwnershipSnapshot:
        """The ownership table now: one store listing."""
        self.snapshot = await asyncio.to_thread(take_snapshot, self.store, self.scope, previous=self.snapshot)
        return self.snapshot

    def backlog(self, start: StartPositionSpec) -> dict[str, int] | None:
        """Each partition's backlog from the last probe and listing; None while either is missing."""
        if self.partitions is None or self.snapshot is None:
            return None
        return backlog_per_partition(self.partitions, self.snapshot, start)

    def lag(
        self, backlog: Mapping[str, int] | None, owners: Mapping[str, str | None], now: float
    ) -> dict[str, PartitionLag] | None:
        """Each partition's lag in seconds; starts reading, in the background, the few events whose time
        nobody wrote (partitions nobody reads), for the next cycles."""
        if backlog is None or self.partitions is None or self.snapshot is None:
            return None
        if self.probed(now):  # a fresh probe: its position joins the bounds (`remember_probes`)
            self.lag_probes = remember_probes(self.lag_probes, self.partitions, backlog, now)
        lag = lag_per_partition(self.partitions, self.snapshot, backlog, self.lag_read, now, self.lag_probes)
        if self.lag_reading is None or self.lag_reading.done():
            reads = lag_reads(lag, backlog, owners, self.snapshot.live_members, self.lag_tried, now)
            if reads and hasattr(self.probe, "enqueued_time"):
                for partition, sequence in reads:
                    self.lag_tried[partition] = (sequence, now)
                self.lag_reading = asyncio.get_running_loop().create_task(self._read_enqueued(reads))
        return lag

    async def _read_enqueued(self, reads: Sequence[tuple[str, int]]) -> None:
        for partition, sequence in reads:
            try:
                moment = await self.probe.enqueued_time(partition, sequence)
            except Exception as exc:  # one unreadable event leaves that lag unknown; the loop goes on
                log.debug("%s: reading partition %s failed: %s", self.scope, partition, type(exc).__name__)
                moment = None
            if self.metrics is not None:
                self.metrics.lag_reads.labels(*self.labels, "ok" if moment is not None else "failed").inc()
            if moment is not None:
                self.lag_read[partition] = (sequence, moment)

    async def close(self) -> None:
        reading = self.lag_reading
        if reading is not None and not reading.done():
            reading.cancel()
        await self.probe.close()
