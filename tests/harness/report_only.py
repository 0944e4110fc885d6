"""A control loop that only reports, for the operator tests that have no Event Hubs and no store: the
replicas stay as they are, the phase is Ready. `hubshift operator --control-loop
tests.harness.report_only:open_report_only` runs it (the operator process needs the repository on its
PYTHONPATH)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from hubshift.manifest import PartitionedConsumer
from hubshift.operator.kubernetes.runtime import KubernetesRuntime
from hubshift.operator.loop import CycleInputs, CycleReport
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.rebalance import RebalanceState
from hubshift.operator.status import (
    READY,
    Condition,
    PartitionedConsumerStatus,
    ResourcePhase,
    carry_transition_time,
)

OPENER = "tests.harness.report_only:open_report_only"
# The same loop, opened as the operator's own opener does up to its first request: reading the Secrets the
# spec names for the source and the store (`KubernetesRuntime.connection_environment`).
SECRET_READING_OPENER = "tests.harness.report_only:open_reading_secrets"


class ReportOnlyLoop:
    """A `CycleRunner` that publishes a Ready status with the replica count as it is."""

    def __init__(
        self, consumer: PartitionedConsumer, runtime: KubernetesRuntime, metrics: OperatorMetrics
    ) -> None:
        self.consumer = consumer
        self.runtime = runtime
        self.metrics = metrics

    async def cycle(self, inputs: CycleInputs) -> CycleReport:
        started = time.perf_counter()
        namespace, name = self.runtime.owner.namespace, self.runtime.owner.name
        current = await self.runtime.replicas()
        consumers = await self.runtime.consumers()
        ready = sum(1 for consumer in consumers if consumer.ready)
        condition = Condition(
            type=READY,
            status="True",
            reason="ChildrenReconciled",
            message="children reconciled; a report-only loop: replicas and assignment stay as they are",
        )
        now = datetime.now(UTC).replace(microsecond=0)
        generation = inputs.spec_generation
        status = PartitionedConsumerStatus(
            phase=ResourcePhase.READY,
            observed_generation=generation,
            desired_replicas=current,
            current_replicas=current,
            ready_replicas=ready,
            conditions=[
                carry_transition_time(list(inputs.previous_conditions), each, now, inputs.spec_generation)
                for each in (condition, *inputs.conditions)  # the runtime's, as the real loop reports them
            ],
        )
        await self.runtime.publish_status(status.to_body())
        self.metrics.desired_replicas.labels(namespace, name).set(current)
        self.metrics.current_replicas.labels(namespace, name).set(current)
        self.metrics.ready_replicas.labels(namespace, name).set(ready)
        self.metrics.set_phase(namespace, name, ResourcePhase.READY)
        return CycleReport(
            state=RebalanceState(),
            status=status,
            decision=None,
            owners={},
            backlog=None,
            actions=(),
            store_requests=0,
            duration=time.perf_counter() - started,
            next_cycle_in=self.consumer.spec.scaling.polling_interval_seconds,
        )

    def apply(self, consumer: PartitionedConsumer) -> None:
        self.consumer = consumer

    async def close(self) -> None:
        pass

    async def release(self) -> None:
        pass


async def open_report_only(
    consumer: PartitionedConsumer, runtime: KubernetesRuntime, metrics: OperatorMetrics
) -> ReportOnlyLoop:
    return ReportOnlyLoop(consumer, runtime, metrics)


async def open_reading_secrets(
    consumer: PartitionedConsumer, runtime: KubernetesRuntime, metrics: OperatorMetrics
) -> ReportOnlyLoop:
    """The report-only loop, after reading what `reconcile.open_cluster_loop` reads before it opens the hub
    and the store: the connection strings of the Secrets the spec names (the API server's audit log then
    says which Secrets a control loop was opened with)."""
    await runtime.connection_environment(consumer)
    return ReportOnlyLoop(consumer, runtime, metrics)
