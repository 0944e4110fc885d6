"""The control loop as the kopf operator runs it: `open_cluster_loop` (connection strings from the
Secrets the spec names) under the `LoopDriver` (one loop kept across cycles, status through the runtime,
the next cycle soon while the state machine is busy, a spec edit applied, a new store opened again). The
pods are a stand-in for the kopf pod index; Event Hubs is the emulator."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hubshift.emulator.launch import RunningEmulator
from hubshift.manifest import PartitionedConsumer, parse_manifest
from hubshift.operator.driver import CycleRunner, Desired, LoopDriver
from hubshift.operator.kubernetes.reconcile import open_cluster_loop
from hubshift.operator.kubernetes.render import Owner
from hubshift.operator.loop import ControlLoop, CycleInputs
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.reservations import ScopeReservations
from hubshift.operator.runtime import ConsumerInstance
from hubshift.operator.status import failed_cycle_status
from hubshift.spec import DEFAULT_EVENTHUBS_ENV


@dataclass
class PodRuntime:
    """What `KubernetesRuntime` offers the loop, without an API server: the Secret holds `secret`."""

    secret: str
    owner: Owner = field(default_factory=lambda: Owner("homes", "default", "u"))
    pods: list[ConsumerInstance] = field(default_factory=list)
    replica_count: int = 0
    events: list[str] = field(default_factory=list)
    status: dict[str, object] = field(default_factory=dict)

    async def consumers(self) -> list[ConsumerInstance]:
        return list(self.pods)

    async def replicas(self) -> int:
        return self.replica_count

    async def set_replicas(self, count: int) -> None:
        self.replica_count = count

    async def revision(self) -> str | None:
        return None

    async def replace_consumer(self, name: str) -> bool:
        return True

    async def record_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(f"{reason}: {message}")

    async def publish_status(self, status: dict[str, object]) -> None:
        self.status = status

    async def connection_environment(self, consumer: PartitionedConsumer) -> dict[str, str]:
        return {consumer.spec.event_hubs.connection_string_variable: self.secret}


def resource(store: Path, generation: int = 2, max_replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "homes", "namespace": "default", "generation": generation, "uid": "u"},
        "spec": {
            "eventHubs": {"hub": "hub", "connectionStringSecretRef": {"name": "eh", "key": "cs"}},
            "checkpointStore": {"sqlite": {"path": str(store)}},
            "scaling": {"minReplicas": 2, "maxReplicas": max_replicas},
        },
    }


def desired(body: dict[str, Any]) -> Desired:
    return Desired(parse_manifest(body), CycleInputs.from_body(body))


def reporting_driver(runtime: PodRuntime, reservations: ScopeReservations | None = None) -> LoopDriver:
    """The driver as the operator runs it for one resource: `open_cluster_loop` (with the operator's
    `reservations`), a failed cycle reported in the resource's status."""

    async def open_loop(consumer: PartitionedConsumer) -> CycleRunner:
        return await open_cluster_loop(consumer, runtime, OperatorMetrics(), reservations=reservations)  # type: ignore[arg-type]

    async def report_failure(message: str) -> None:
        runtime.status = failed_cycle_status(None, None, message, 0.0).to_body()

    return LoopDriver(open_loop, labels=("x", "y"), on_failure=report_failure)


@pytest.mark.timeout(60)
async def test_the_operators_loop_reads_secrets_keeps_its_clients_applies_edits_and_reports(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:4"])
    runtime = PodRuntime(emulator.connection_string)
    metrics = OperatorMetrics()
    opened: list[CycleRunner] = []

    async def open_loop(consumer: PartitionedConsumer) -> CycleRunner:
        loop = await open_cluster_loop(consumer, runtime, metrics)  # type: ignore[arg-type]
        opened.append(loop)
        return loop

    driver = LoopDriver(open_loop, labels=("default", "homes"), metrics=metrics)
    body = resource(tmp_path / "store.db")
    polling = parse_manifest(body).spec.scaling.polling_interval_seconds
    try:
        await driver.cycle(desired(body))
        assert len(opened) == 1 and isinstance(opened[0], ControlLoop)
        assert runtime.replica_count == 2
        assert runtime.status["phase"] == "Ready" and runtime.status["observedGeneration"] == 2
        assert runtime.status["partitionCount"] == 4

        runtime.pods = [ConsumerInstance(f"homes-{i}", i, True, f"127.0.0.1:{1 + i}") for i in range(2)]
        wait = await driver.cycle(desired(body))
        assert len(opened) == 1, "the same loop, clients and memory across cycles"
        # The cold start was planned: each ready pod is handed its share at once, no holddown.
        assert runtime.status["phase"] == "Rebalancing" and runtime.status["change"] == "planned"
        assert wait < polling, "a busy loop runs its next cycle soon"

        edited = resource(tmp_path / "store.db", generation=3, max_replicas=4)
        await driver.cycle(desired(edited))
        assert len(opened) == 1, "an edit that keeps the hub and the store keeps the loop"
        assert runtime.status["observedGeneration"] == 3

        moved = resource(tmp_path / "other.db", generation=4)
        await driver.cycle(desired(moved))
        assert len(opened) == 2, "a new store: the loop connects again"
        assert (tmp_path / "other.db").exists()
        assert driver.errors == 0
    finally:
        await driver.close()
    assert emulator.connection_string not in json.dumps(runtime.status) + " ".join(runtime.events)
    assert DEFAULT_EVENTHUBS_ENV not in json.dumps(runtime.status)


@pytest.mark.timeout(60)
async def test_a_second_resource_on_the_same_hub_and_consumer_group_is_refused_until_the_first_is_deleted(
    tmp_path: Path, emulator_factory: Any
) -> None:
    """Records are keyed by the scope (namespace, hub, consumer group): a second resource naming the same
    ones, in another namespace, would publish assignments over the first's. The record names its driver;
    the second resource is refused, its status says why, and it takes over once the first is deleted."""
    emulator: RunningEmulator = emulator_factory(["hub:4"])
    first_runtime = PodRuntime(emulator.connection_string)
    second_runtime = PodRuntime(emulator.connection_string, owner=Owner("steal", "other", "u2"))
    body = resource(tmp_path / "store.db")
    intruder = dict(body, metadata={"name": "steal", "namespace": "other", "generation": 1, "uid": "u2"})

    first, second = reporting_driver(first_runtime), reporting_driver(second_runtime)
    try:
        await first.cycle(desired(body))
        assert first.errors == 0
        await second.cycle(desired(intruder))
        assert second.errors == 1
        ready = second_runtime.status["conditions"][0]  # type: ignore[index]
        assert (
            ready["status"] == "False"
            and "published by PartitionedConsumer default/homes" in ready["message"]
        )
        assert second_runtime.replica_count == 0  # it scaled nothing
        await first.release()  # the first resource is deleted
        await second.cycle(desired(intruder))
        assert second.errors == 1 and second_runtime.status["phase"] == "Ready"
    finally:
        await first.close()
        await second.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("second_store", ["elsewhere.db", "store.db"])
async def test_the_younger_of_two_resources_on_one_consumer_group_is_refused_whichever_store_it_names(
    tmp_path: Path, emulator_factory: Any, second_store: str
) -> None:
    """Another checkpoint store holds no record naming the first resource, yet the two pools would still
    steal the hub's partitions from each other: the operator's reservations refuse the younger resource on the
    same hub and consumer group, whichever store it names, until the older one is gone. With one store,
    the older takes the record over from the younger that published first (neither stands refused)."""
    emulator: RunningEmulator = emulator_factory(["hub:4"])
    reservations = ScopeReservations()
    first_runtime = PodRuntime(
        emulator.connection_string, owner=Owner("homes", "default", "u", "2026-01-01T00:00:00Z")
    )
    second_runtime = PodRuntime(
        emulator.connection_string, owner=Owner("steal", "other", "u2", "2026-02-01T00:00:00Z")
    )
    body = resource(tmp_path / "store.db")
    intruder = resource(tmp_path / second_store)
    intruder["metadata"] = {"name": "steal", "namespace": "other", "generation": 1, "uid": "u2"}

    # the younger resource's loop starts first (an operator resuming both after a restart): it runs until
    # the older one's loop opens, then it is refused and its pods are stopped
    second, first = (
        reporting_driver(second_runtime, reservations),
        reporting_driver(first_runtime, reservations),
    )
    try:
        await second.cycle(desired(intruder))
        assert second.errors == 0 and second_runtime.replica_count == 2
        await first.cycle(desired(body))
        await second.cycle(desired(intruder))
        assert first.errors == 0 and second.errors == 1
        ready = second_runtime.status["conditions"][0]  # type: ignore[index]
        assert ready["status"] == "False"
        assert "PartitionedConsumer default/homes already consumes hub 'hub'" in ready["message"]
        assert second_runtime.replica_count == 0 and first_runtime.replica_count == 2
        await first.release()  # the first resource is deleted: its claim goes with its loop
        await second.cycle(desired(intruder))
        assert second.errors == 1 and second_runtime.status["phase"] == "Ready"
        assert second_runtime.replica_count == 2
    finally:
        await first.close()
        await second.close()
