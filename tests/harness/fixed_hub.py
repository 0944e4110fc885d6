"""The real control loop over a hub that only answers how many partitions it has, and a SQLite store, for
the cluster tests that exercise what the loop decides (the replica count, the plan) on a real API server
without Event Hubs or Blob storage. `hubshift operator --control-loop tests.harness.fixed_hub:open_fixed_hub`
runs it (the operator process needs the repository on its PYTHONPATH); `HUBSHIFT_TEST_STORE_DIR` is where
its SQLite files go."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hubshift.eventhubs.model import PartitionInfo
from hubshift.manifest import PartitionedConsumer
from hubshift.operator.kubernetes.runtime import KubernetesRuntime
from hubshift.operator.loop import ControlLoop
from hubshift.operator.metrics import OperatorMetrics
from hubshift.ownership.scope import Scope
from hubshift.ownership.stores.sqlite import SqliteLeaseStore

OPENER = "tests.harness.fixed_hub:open_fixed_hub"
PARTITIONS = 8
STORE_DIR_ENV = "HUBSHIFT_TEST_STORE_DIR"


class FixedHub:
    """A probe of a hub with `PARTITIONS` empty partitions."""

    async def partitions(self) -> dict[str, PartitionInfo]:
        return {str(p): PartitionInfo(str(p), 0, -1, True) for p in range(PARTITIONS)}

    async def enqueued_time(self, partition: str, sequence_number: int) -> float | None:
        return None

    async def close(self) -> None:
        pass


async def open_fixed_hub(
    consumer: PartitionedConsumer, runtime: KubernetesRuntime, metrics: OperatorMetrics
) -> ControlLoop:
    folder = Path(os.environ.get(STORE_DIR_ENV) or tempfile.mkdtemp(prefix="hubshift-fixed-hub-"))
    meta = consumer.metadata
    store = SqliteLeaseStore(folder / f"{meta.namespace}-{meta.name}.db")
    scope = Scope("fixed.example.net", consumer.spec.event_hubs.hub, consumer.spec.event_hubs.consumer_group)
    return ControlLoop(consumer, scope, store, FixedHub(), runtime, metrics=metrics)
