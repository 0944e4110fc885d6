"""The control loop as the kopf operator runs it (`cluster_loop.cycle`): connection strings from the
Secrets the spec names, the loop kept in the CR's memo, status through the runtime, a self-nudge while the
state machine is busy. The pods are a stand-in for the kopf pod index; Event Hubs is the emulator."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import pytest
from pydantic import SecretStr

from hubshift.emulator.launch import RunningEmulator
from hubshift.manifest import parse_manifest
from hubshift.operator.kubernetes import cluster_loop
from hubshift.operator.kubernetes.reconcile import CONTEXT_KEY, OperatorContext
from hubshift.operator.loop import ControlLoop
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.runtime import ConsumerInstance


@dataclass
class PodRuntime:
    """What `KubernetesRuntime` offers the loop, without an API server."""

    consumer: Any
    secret: str
    pods: list[ConsumerInstance] = field(default_factory=list)
    target: int = 0
    events: list[str] = field(default_factory=list)
    status: dict[str, object] = field(default_factory=dict)

    async def consumers(self) -> list[ConsumerInstance]:
        return list(self.pods)

    async def replicas(self) -> int:
        return self.target

    async def set_replicas(self, count: int) -> None:
        self.target = count

    async def record_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(f"{reason}: {message}")

    async def publish_status(self, status: dict[str, object]) -> None:
        self.status = status

    async def event_hubs_connection_string(self) -> SecretStr:
        return SecretStr(self.secret)

    async def storage_connection_string(self) -> SecretStr | None:
        return None


@pytest.mark.timeout(60)
async def test_a_cycle_from_the_operator_reads_secrets_keeps_its_loop_and_reports(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:4"])
    body = {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "homes", "namespace": "default", "generation": 2, "uid": "u"},
        "spec": {
            "eventHubs": {"hub": "hub", "connectionStringSecretRef": {"name": "eh", "key": "cs"}},
            "checkpointStore": {"sqlite": {"path": str(tmp_path / "store.db")}},
            "scaling": {"minReplicas": 2, "maxReplicas": 2},
        },
    }
    consumer = parse_manifest(body)
    runtime = PodRuntime(consumer, emulator.connection_string)
    memo = kopf.Memo()
    memo[CONTEXT_KEY] = OperatorContext(kube=None, metrics=OperatorMetrics(), control_loop=cluster_loop.cycle)  # type: ignore[arg-type]

    await cluster_loop.cycle(body, runtime, memo)  # type: ignore[arg-type]
    loop = memo[cluster_loop.MEMO_KEY]
    assert isinstance(loop, ControlLoop)
    assert runtime.target == 2
    assert runtime.status["phase"] == "Ready" and runtime.status["observedGeneration"] == 2
    assert runtime.status["partitionCount"] == 4

    runtime.pods = [ConsumerInstance(f"homes-{i}", i, True, f"127.0.0.1:{1 + i}") for i in range(2)]
    await cluster_loop.cycle(body, runtime, memo)  # type: ignore[arg-type]
    assert memo[cluster_loop.MEMO_KEY] is loop, "the same loop, clients and memory across cycles"
    assert runtime.status["phase"] == "Holddown"
    context = memo[CONTEXT_KEY]
    assert context.wakeup(("default", "homes")).is_set(), "a busy loop asks for its next cycle soon"
    assert emulator.connection_string not in json.dumps(runtime.status) + " ".join(runtime.events)
    await loop.close()
