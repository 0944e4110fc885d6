"""The kopf handlers and the Kubernetes adapter against kmock's in-memory Kubernetes API (no real server).

The operator runs in-process: `kopf.operator(registry=..., standalone=True, clusterwide=True)` with a login
handler pointing at kmock. kopf starts no watch at all until the emulator declares `v1/namespaces` and
`apiextensions.k8s.io/v1/customresourcedefinitions`, so both are declared with every resource we use.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from click.testing import CliRunner
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import PatchType
from prometheus_client import generate_latest

from hubshift.manifest import PartitionedConsumer
from hubshift.operator.cli import operator as operator_command
from hubshift.operator.kubernetes import handlers, reconcile
from hubshift.operator.kubernetes.api import (
    KubeAdapter,
    PartitionedConsumerResource,
    SecretUnavailable,
    consumer_instance,
)
from hubshift.operator.kubernetes.reconcile import CONTEXT_KEY, OperatorContext
from hubshift.operator.kubernetes.render import CONSUMER_LABEL, Owner, consumer_from_body, pod_labels
from hubshift.operator.kubernetes.runtime import KubernetesRuntime
from hubshift.operator.kubernetes.settings import OperatorConfig, apply_settings
from hubshift.operator.loop import CycleInputs, CycleReport
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.runtime import ConsumerInstance
from hubshift.operator.status import ResourcePhase
from hubshift.spec import SecretKeyRefSpec
from tests.fixtures.operator import root_schema
from tests.harness.report_only import ReportOnlyLoop

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "homes.yaml"
NAMESPACE = "sensors"
SENTINEL = "Endpoint=sb://leak.example/;SharedAccessKey=SENTINEL-7f3a9c-do-not-log"

RESOURCES: dict[str, dict[str, Any]] = {
    "v1/namespaces": {"namespaced": False, "kind": "Namespace"},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "namespaced": False,
        "kind": "CustomResourceDefinition",
    },
    "hubshift.dev/v1alpha1/partitionedconsumers": {
        "namespaced": True,
        "kind": "PartitionedConsumer",
        "subresources": {"status"},
        "verbs": {"get", "list", "watch", "patch", "create", "delete"},
    },
    "v1/pods": {"namespaced": True, "kind": "Pod", "verbs": {"get", "list", "watch"}},
    "v1/events": {"namespaced": True, "kind": "Event", "verbs": {"create"}},
    "v1/secrets": {"namespaced": True, "kind": "Secret", "verbs": {"get"}},
    "apps/v1/statefulsets": {"namespaced": True, "kind": "StatefulSet", "subresources": {"scale"}},
}

# What a test runs in each cycle, after the cycle was recorded: (the spec, the inputs, the runtime).
CycleFn = Callable[[PartitionedConsumer, CycleInputs, KubernetesRuntime], Awaitable[None]]


def manifest(name: str = "homes", **spec_updates: Any) -> dict[str, Any]:
    document: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    document["metadata"].update(
        name=name, namespace=NAMESPACE, uid=f"uid-{name}", resourceVersion="1", generation=1
    )
    document["spec"]["scaling"]["pollingIntervalSeconds"] = 60  # only nudges run cycles within a test
    for key, value in spec_updates.items():
        document["spec"][key] = value
    return document


def live_objects(kmock: Any, plural: str) -> dict[str, dict[str, Any]]:
    return {
        name: obj.raw
        for (resource, _namespace, name), obj in list(kmock.objects.items())
        if resource.plural == plural and not obj.deleted
    }


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def create_pod(kube: KubeAdapter, name: str, consumer: str = "homes", ready: bool = True) -> None:
    """A consumer pod as the StatefulSet would make it, already scheduled and running."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "resourceVersion": "1",
            "labels": pod_labels(consumer),
        },
        "spec": {"containers": [{"name": "consumer", "ports": [{"name": "metrics", "containerPort": 9090}]}]},
        "status": {
            "podIP": "10.0.0.7",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    await kube.client.create(Pod.from_dict(pod))


@dataclass
class Cycle:
    loop: RecordingLoop
    inputs: CycleInputs
    consumers: list[ConsumerInstance]


@dataclass
class Recorder:
    """Opens control loops that record every cycle (which loop, its inputs, the pods it saw), then run
    `then`, then report as the report-only loop does (children and status, no Event Hubs)."""

    calls: list[Cycle] = field(default_factory=list)
    opened: list[RecordingLoop] = field(default_factory=list)
    then: CycleFn | None = None

    async def open(
        self, consumer: PartitionedConsumer, runtime: KubernetesRuntime, metrics: OperatorMetrics
    ) -> RecordingLoop:
        loop = RecordingLoop(self, consumer, runtime, metrics)
        self.opened.append(loop)
        return loop


class RecordingLoop(ReportOnlyLoop):
    def __init__(
        self,
        recorder: Recorder,
        consumer: PartitionedConsumer,
        runtime: KubernetesRuntime,
        metrics: OperatorMetrics,
    ) -> None:
        super().__init__(consumer, runtime, metrics)
        self.recorder = recorder

    async def cycle(self, inputs: CycleInputs) -> CycleReport:
        self.recorder.calls.append(Cycle(self, inputs, await self.runtime.consumers()))
        if self.recorder.then is not None:
            await self.recorder.then(self.consumer, inputs, self.runtime)
        return await super().cycle(inputs)


@dataclass
class RunningOperator:
    kmock: Any
    kube: KubeAdapter
    context: OperatorContext

    async def create_consumer(self, document: dict[str, Any]) -> None:
        await self.kube.client.create(PartitionedConsumerResource.from_dict(document))

    async def create_pod(self, name: str, consumer: str = "homes", ready: bool = True) -> None:
        await create_pod(self.kube, name, consumer, ready)

    def status(self, name: str = "homes") -> dict[str, Any]:
        body = live_objects(self.kmock, "partitionedconsumers").get(name, {})
        status: dict[str, Any] = body.get("status", {})
        return status

    def events(self) -> list[dict[str, Any]]:
        return list(live_objects(self.kmock, "events").values())


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def running(kmock: Any, recorder: Recorder) -> AsyncIterator[RunningOperator]:
    """The operator in its own thread and event loop (as kopf's KopfRunner does): at shutdown kopf cancels
    every task its loop has, which must not include the test's own."""
    for resource, info in RESOURCES.items():
        kmock.resources[resource] = info
    url = str(kmock.url).rstrip("/")
    registry = kopf.OperatorRegistry()
    handlers.register(registry, OperatorConfig(metrics_port=None, liveness_port=None), recorder.open)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url, scheme="http")

    context = OperatorContext(
        kube=KubeAdapter.from_server(url),  # used in the operator's loop only
        metrics=OperatorMetrics(),
        open_loop=recorder.open,
        min_cycle_seconds=0.05,
    )
    memo = kopf.Memo()
    memo[CONTEXT_KEY] = context
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    async def operate() -> None:
        try:
            await kopf.operator(
                registry=registry,
                standalone=True,
                clusterwide=True,
                stop_flag=stop,
                ready_flag=ready,
                memo=memo,
            )
        finally:
            await context.kube.close()

    def run() -> None:
        try:
            asyncio.run(operate())
        except BaseException as error:  # reported by the test, not lost in the thread
            failure.append(error)

    thread = threading.Thread(target=run, name="kopf-operator", daemon=True)
    thread.start()
    kube = KubeAdapter.from_server(url)  # the test's own client, in the test's loop
    try:
        assert await asyncio.to_thread(ready.wait, 10), "the operator did not start"
        await asyncio.sleep(0.3)  # the watches start just after the ready flag
        yield RunningOperator(kmock=kmock, kube=kube, context=context)
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30)
        await kube.close()
    assert not thread.is_alive(), "the operator did not stop"
    assert not failure, failure


# --- the operator end to end on kmock -------------------------------------------------------------------


async def test_a_new_consumer_gets_its_children_owned_by_it(running: RunningOperator) -> None:
    await running.create_consumer(manifest())
    expected = {
        "configmaps": {"homes-manifest"},
        "services": {"homes", "homes-metrics"},
        "poddisruptionbudgets": {"homes"},
        "statefulsets": {"homes"},
    }
    for plural, names in expected.items():
        await eventually(lambda p=plural, n=names: set(live_objects(running.kmock, p)) >= n, what=plural)
        for name in names:
            owners = live_objects(running.kmock, plural)[name]["metadata"]["ownerReferences"]
            assert owners[0]["uid"] == "uid-homes" and owners[0]["controller"] is True
    statefulset = live_objects(running.kmock, "statefulsets")["homes"]
    assert statefulset["spec"]["replicas"] == 1  # scaling.minReplicas
    await eventually(lambda: any(e["reason"] == "ChildrenCreated" for e in running.events()), what="event")


async def test_until_the_control_loop_lands_the_status_says_ready(running: RunningOperator) -> None:
    await running.create_consumer(manifest())
    status = await eventually(lambda: running.status().get("currentReplicas") == 1 and running.status())
    assert status["phase"] == "Ready"
    assert status["observedGeneration"] == 1
    assert status["conditions"][0]["type"] == "Ready"
    assert status["conditions"][0]["status"] == "True"
    # Only declared status fields are written (kopf keeps its bookkeeping in annotations).
    declared = root_schema()["properties"]["status"]["properties"]
    assert set(status) <= set(declared)


async def test_one_loop_per_consumer_gets_its_spec_its_runtime_and_the_resources_metadata(
    running: RunningOperator, recorder: Recorder
) -> None:
    # Checked here, not in the loop: an assertion failing there is only a failed cycle, and the loop goes on.
    await running.create_consumer(manifest())
    await eventually(lambda: len(recorder.calls) >= 1, what="a first cycle")
    await running.create_pod("homes-0")
    await eventually(lambda: len(recorder.calls) >= 2, what="a second cycle")
    assert len(recorder.opened) == 1, "one loop (clients and memory) across cycles"
    loop = recorder.opened[0]
    assert all(call.loop is loop for call in recorder.calls[:2])
    assert isinstance(loop.runtime, KubernetesRuntime)
    assert loop.consumer.spec.event_hubs.hub == "telemetry"
    assert loop.runtime.owner == Owner(name="homes", namespace=NAMESPACE, uid="uid-homes")
    assert recorder.calls[0].inputs.spec_generation == 1


async def test_a_pod_event_runs_a_cycle_at_once_not_at_the_polling_interval(
    running: RunningOperator, recorder: Recorder
) -> None:
    await running.create_consumer(manifest())  # pollingIntervalSeconds: 60
    await eventually(lambda: recorder.calls, what="the first cycle")
    before = len(recorder.calls)
    await running.create_pod("homes-0")
    await running.create_pod("homes-1", ready=False)
    await eventually(
        lambda: (
            len(recorder.calls) > before
            and {c.name for c in recorder.calls[-1].consumers} == {"homes-0", "homes-1"}
        ),
        timeout=5,
        what="a cycle that sees both pods",
    )
    consumers = recorder.calls[-1].consumers
    assert [(c.name, c.ordinal, c.ready, c.address) for c in consumers] == [
        ("homes-0", 0, True, "10.0.0.7:9090"),
        ("homes-1", 1, False, "10.0.0.7:9090"),
    ]
    # A lost pod is seen from the watch at once, not when its lease expires.
    before = len(recorder.calls)
    await running.kube.client.delete(Pod, "homes-0", namespace=NAMESPACE)
    await eventually(
        lambda: (
            len(recorder.calls) > before and [c.name for c in recorder.calls[-1].consumers] == ["homes-1"]
        ),
        timeout=5,
        what="a cycle without the deleted pod",
    )


async def test_no_cycle_runs_before_the_statefulset_exists(
    running: RunningOperator, recorder: Recorder
) -> None:
    """kopf starts the control-loop daemon together with the children handler: a cycle before the
    StatefulSet exists would scale a missing StatefulSet (404, a failed cycle on every new CR). The daemon
    waits for that handler, which nudges it once the StatefulSet is there."""
    replicas_seen: list[int | None] = []

    async def looking(consumer: PartitionedConsumer, inputs: CycleInputs, runtime: KubernetesRuntime) -> None:
        replicas_seen.append(await runtime.kube.statefulset_replicas(NAMESPACE, "homes"))

    recorder.then = looking
    await running.create_consumer(manifest())
    await eventually(lambda: replicas_seen, what="a first cycle")
    assert None not in replicas_seen, replicas_seen
    assert running.context.metrics.cycle_errors.labels(NAMESPACE, "homes")._value.get() == 0


async def test_a_failing_cycle_is_counted_and_the_loop_goes_on(
    running: RunningOperator, recorder: Recorder
) -> None:
    failures = []

    async def failing_once(
        consumer: PartitionedConsumer, inputs: CycleInputs, runtime: KubernetesRuntime
    ) -> None:
        if not failures:
            failures.append(1)
            raise RuntimeError("store unreachable")

    recorder.then = failing_once
    await running.create_consumer(manifest())
    await eventually(lambda: failures, what="the failing cycle")
    await running.create_pod("homes-0")
    await eventually(lambda: len(recorder.calls) >= 2, what="a cycle after the failure")
    errors = running.context.metrics.cycle_errors.labels(NAMESPACE, "homes")._value.get()
    assert errors == 1


async def test_a_spec_change_reapplies_children_and_keeps_the_replica_count(
    running: RunningOperator, recorder: Recorder
) -> None:
    async def scale_to_three(
        consumer: PartitionedConsumer, inputs: CycleInputs, runtime: KubernetesRuntime
    ) -> None:
        if await runtime.replicas() == 1:  # the children exist: scale them, as the control loop would
            await runtime.set_replicas(3)

    recorder.then = scale_to_three
    await running.create_consumer(manifest())

    def replicas() -> int:
        sts = live_objects(running.kmock, "statefulsets").get("homes", {})
        return int(sts.get("spec", {}).get("replicas", 0))

    await eventually(lambda: replicas() == 3, what="the control loop's scale-out")
    changed = manifest()
    changed["spec"]["consumer"]["image"] = "registry.example/hubshift:0.2.0"
    changed["metadata"]["generation"] = 2
    await running.kube.client.patch(
        PartitionedConsumerResource,
        "homes",
        {"spec": changed["spec"], "metadata": {"generation": 2}},
        namespace=NAMESPACE,
        patch_type=PatchType.MERGE,
    )

    def image() -> str:
        sts = live_objects(running.kmock, "statefulsets")["homes"]
        return str(sts["spec"]["template"]["spec"]["containers"][0]["image"])

    await eventually(lambda: image() == "registry.example/hubshift:0.2.0", what="the new image")
    assert replicas() == 3


async def test_an_invalid_spec_is_reported_not_rendered(running: RunningOperator) -> None:
    # kmock has no CRD validation; a real API server refuses this with the same message (CEL rule).
    bad = manifest(checkpointStore={"blob": {"container": "abc"}, "sqlite": {"path": "/tmp/x.db"}})
    await running.create_consumer(bad)
    status = await eventually(lambda: running.status().get("phase") == "Invalid" and running.status())
    assert "spec.checkpointStore: set exactly one of blob or sqlite" in status["message"]
    await eventually(
        lambda: any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in running.events()),
        what="the warning event",
    )
    assert "homes" not in live_objects(running.kmock, "statefulsets")


async def test_a_sqlite_store_is_refused_in_a_cluster_with_a_status_that_says_why(
    running: RunningOperator, recorder: Recorder
) -> None:
    await running.create_consumer(manifest(checkpointStore={"sqlite": {"path": "/var/lib/hubshift/x.db"}}))
    status = await eventually(lambda: running.status().get("phase") == "Invalid" and running.status())
    assert "consumer pods cannot share a SQLite file" in status["message"]
    assert "use spec.checkpointStore.blob" in status["message"]
    assert "homes" not in live_objects(running.kmock, "statefulsets") and recorder.calls == []


async def test_deleting_the_consumer_stops_its_loop_and_forgets_its_metrics(
    running: RunningOperator, recorder: Recorder
) -> None:
    await running.create_consumer(manifest())
    metrics = running.context.metrics
    series = b'hubshift_current_replicas{consumer="homes",namespace="sensors"} 1.0'
    await eventually(lambda: series in generate_latest(metrics.registry), what="the replicas metric")
    await running.kube.client.delete(PartitionedConsumerResource, "homes", namespace=NAMESPACE)
    await eventually(lambda: "homes" not in live_objects(running.kmock, "partitionedconsumers"), what="gone")
    calls = len(recorder.calls)
    await running.create_pod("homes-0")
    await asyncio.sleep(0.5)
    assert len(recorder.calls) == calls  # no loop left for it
    assert b'consumer="homes"' not in generate_latest(metrics.registry)


async def test_secrets_never_reach_status_events_children_or_logs(
    running: RunningOperator, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    encoded = base64.b64encode(SENTINEL.encode()).decode()
    for name in ("telemetry-eventhubs", "telemetry-storage"):
        await running.kube.client.create(
            Secret.from_dict(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "data": {"connectionString": encoded},
                }
            )
        )
    read: list[str] = []

    async def uses_the_credentials(
        consumer: PartitionedConsumer, inputs: CycleInputs, runtime: KubernetesRuntime
    ) -> None:
        environment = await runtime.connection_environment(consumer)
        hubs = environment[consumer.spec.event_hubs.connection_string_variable]
        assert consumer.spec.checkpoint_store.blob is not None
        storage = environment[consumer.spec.checkpoint_store.blob.connection_string_variable]
        read.append(hubs)
        secret = await runtime.read_secret(
            SecretKeyRefSpec(name="telemetry-eventhubs", key="connectionString")
        )
        logging.getLogger("hubshift.test").info("connected with %s and %r", secret, secret)
        await runtime.record_event("Connected", f"using {secret}")
        assert storage == hubs

    recorder.then = uses_the_credentials
    await running.create_consumer(manifest())
    await eventually(lambda: read and running.status().get("phase") == "Ready", what="a cycle with secrets")
    assert read[0] == SENTINEL  # the operator could use them...

    # ...and they appear nowhere else: not in any object but the Secrets, nor any request sent, nor a log.
    for (resource, _namespace, name), obj in list(running.kmock.objects.items()):
        if resource.plural == "secrets" or obj.deleted:
            continue
        text = json.dumps(obj.raw)
        assert SENTINEL not in text and encoded not in text, f"{resource.plural}/{name} carries the secret"
    for request in list(running.kmock):
        if request.resource is not None and request.resource.plural == "secrets":
            continue  # the test's own creation of the Secrets
        assert SENTINEL not in request.text and encoded not in request.text, f"{request.method} {request.url}"
    for record in caplog.records:
        assert SENTINEL not in record.getMessage(), record.getMessage()


# --- the adapter and the runtime without kopf ------------------------------------------------------------


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[KubeAdapter]:
    for resource, info in RESOURCES.items():
        kmock.resources[resource] = info
    adapter = KubeAdapter.from_server(str(kmock.url).rstrip("/"))
    try:
        yield adapter
    finally:
        await adapter.close()


async def test_runtime_scales_lists_and_reports_without_kopf(kube: KubeAdapter, kmock: Any) -> None:
    body = manifest()
    consumer = consumer_from_body(body)
    owner = Owner.from_body(body)
    runtime = KubernetesRuntime(kube, owner)  # no pod index: pods are listed from the API
    await kube.client.create(PartitionedConsumerResource.from_dict(body))
    assert await runtime.replicas() == 0  # no StatefulSet yet
    from hubshift.operator.kubernetes.render import render_children

    await kube.apply_all(render_children(consumer, owner, 2))
    await kube.apply_all(render_children(consumer, owner, 2))  # idempotent
    assert await runtime.replicas() == 2
    await runtime.set_replicas(4)
    assert await runtime.replicas() == 4
    with pytest.raises(ValueError):
        await runtime.set_replicas(-1)

    await create_pod(kube, "homes-1", ready=False)
    await create_pod(kube, "homes-0")
    await create_pod(kube, "other-0", consumer="other")
    assert [c.name for c in await runtime.consumers()] == ["homes-0", "homes-1"]

    await runtime.record_event("ScaledOut", "2 -> 4 replicas: backlog 9000 over 4 partitions")
    event = next(iter(live_objects(kmock, "events").values()))
    assert event["involvedObject"]["uid"] == "uid-homes"
    assert event["type"] == "Normal" and event["reason"] == "ScaledOut"

    await runtime.publish_status({"phase": "Holddown", "holddownUntil": "2026-01-01T00:00:10Z"})
    stored = live_objects(kmock, "partitionedconsumers")["homes"]["status"]
    assert stored["phase"] == "Holddown"


async def test_a_spec_without_secret_references_never_gets_the_operators_own_credentials(
    kube: KubeAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = manifest()
    del body["spec"]["eventHubs"]["connectionStringSecretRef"]
    del body["spec"]["checkpointStore"]["blob"]["connectionStringSecretRef"]
    consumer = consumer_from_body(body)
    variable = consumer.spec.event_hubs.connection_string_variable
    monkeypatch.setenv(variable, SENTINEL)  # the operator's own, e.g. for another purpose
    runtime = KubernetesRuntime(kube, Owner.from_body(body))
    environment = await runtime.connection_environment(consumer)
    assert variable not in environment and SENTINEL not in environment.values()


async def test_a_missing_secret_is_named_without_any_content(kube: KubeAdapter) -> None:
    with pytest.raises(SecretUnavailable, match=r"Secret sensors/nowhere: not found"):
        await kube.read_secret(NAMESPACE, SecretKeyRefSpec(name="nowhere", key="k"))
    await kube.client.create(
        Secret.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "partial", "namespace": NAMESPACE},
                "data": {"other": base64.b64encode(SENTINEL.encode()).decode()},
            }
        )
    )
    with pytest.raises(SecretUnavailable) as error:
        await kube.read_secret(NAMESPACE, SecretKeyRefSpec(name="partial", key="connectionString"))
    assert "has no key 'connectionString'" in str(error.value)
    assert SENTINEL not in str(error.value)
    secret = await kube.read_secret(NAMESPACE, SecretKeyRefSpec(name="partial", key="other"))
    assert SENTINEL not in repr(secret) and SENTINEL not in str(secret)


# --- pure pieces ---------------------------------------------------------------------------------------


def test_consumer_instance_from_a_pod() -> None:
    pod = {
        "metadata": {"name": "homes-12", "labels": {"apps.kubernetes.io/pod-index": "12"}},
        "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": 9400}]}]},
        "status": {"podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert consumer_instance(pod) == ConsumerInstance("homes-12", 12, True, "10.1.2.3:9400", False)
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert consumer_instance(pod) == ConsumerInstance("homes-12", 12, False, "10.1.2.3:9400", True)
    assert consumer_instance({"metadata": {"name": "homes-3"}}) == ConsumerInstance(
        "homes-3", 3, False, None, False
    )


def test_pod_events_nudge_only_on_a_change_that_matters() -> None:
    context = OperatorContext(kube=None, metrics=OperatorMetrics(), open_loop=Recorder().open)  # type: ignore[arg-type]
    pod = {
        "metadata": {"name": "homes-0", "namespace": NAMESPACE, "labels": {CONSUMER_LABEL: "homes"}},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }
    key = (NAMESPACE, "homes")

    def woken() -> bool:
        event = context.wakeup(key)
        was = event.is_set()
        event.clear()
        return was

    reconcile.observe_pod(context, pod, None)
    assert woken()  # a new pod
    reconcile.observe_pod(context, pod, "MODIFIED")
    assert not woken()  # nothing the loop cares about changed
    pod["status"]["conditions"][0]["status"] = "True"
    reconcile.observe_pod(context, pod, "MODIFIED")
    assert woken()  # became ready
    reconcile.observe_pod(context, pod, "DELETED")
    assert woken()  # gone
    reconcile.observe_pod(context, {"metadata": {"name": "unrelated"}}, "ADDED")
    assert not woken()


def test_settings_are_applied_in_one_place() -> None:
    settings = kopf.OperatorSettings()
    apply_settings(settings, OperatorConfig(peering="hubshift", priority=7, clusterwide=False))
    assert settings.peering.name == "hubshift"
    assert settings.peering.mandatory is True
    assert settings.peering.standalone is False
    assert settings.peering.priority == 7
    assert settings.posting.level == logging.WARNING
    assert settings.watching.server_timeout == 300
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    standalone = kopf.OperatorSettings()
    apply_settings(standalone, OperatorConfig())
    assert standalone.peering.standalone is True


def test_in_a_pod_kopf_reaches_the_api_server_at_the_service_address_not_a_dns_name() -> None:
    """kopf's own service-account login names `https://kubernetes.default.svc`, which needs cluster DNS;
    a pod always has the Service's address in its environment (client-go and lightkube use it)."""
    info = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t", ca_path="/ca.crt")
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    login = handlers.service_account_login(info, environ)
    assert login is not None
    assert (login.server, login.token, login.ca_path) == ("https://10.96.0.1:443", "t", "/ca.crt")
    ipv6 = handlers.service_account_login(info, {**environ, "KUBERNETES_SERVICE_HOST": "fd00::1"})
    assert ipv6 is not None and ipv6.server == "https://[fd00::1]:443"
    assert handlers.service_account_login(info, {}) is info  # not in a pod: kopf's answer as it is
    assert handlers.service_account_login(None, environ) is None  # no token: the kubeconfig next


def test_metrics_replace_stale_label_sets() -> None:
    metrics = OperatorMetrics()
    metrics.set_hub(NAMESPACE, "homes", "homes", "$Default")
    metrics.set_backlog(NAMESPACE, "homes", {"0": 10, "1": 5})
    metrics.set_backlog(NAMESPACE, "homes", {"0": 3})
    text = generate_latest(metrics.registry).decode()
    hub = 'consumer="homes",consumer_group="$Default",hub="homes",namespace="sensors"'
    assert f'hubshift_partition_backlog_events{{{hub},partition="0"}} 3.0' in text
    assert 'partition="1"' not in text
    assert f"hubshift_backlog_events{{{hub}}} 3.0" in text
    metrics.set_phase(NAMESPACE, "homes", ResourcePhase.HOLDDOWN)
    assert (
        'hubshift_phase{consumer="homes",namespace="sensors",phase="Holddown"} 1.0'
        in generate_latest(metrics.registry).decode()
    )
    metrics.record_scale(NAMESPACE, "homes", 2, 4)
    metrics.rebalances.labels(NAMESPACE, "homes", "membership").inc()
    metrics.forget(NAMESPACE, "homes")
    assert 'consumer="homes"' not in generate_latest(metrics.registry).decode()


def test_operator_command_refuses_contradictory_flags() -> None:
    runner = CliRunner()
    result = runner.invoke(operator_command, ["--namespace", "a", "--all-namespaces"], standalone_mode=False)
    assert "either --namespace or --all-namespaces" in str(result.exception)
    result = runner.invoke(operator_command, ["--peering", "p", "--standalone"], standalone_mode=False)
    assert "either --peering or --standalone" in str(result.exception)
    help_text = runner.invoke(operator_command, ["--help"]).output
    for option in ("--namespace", "--all-namespaces", "--metrics-port", "--peering", "--standalone"):
        assert option in help_text
