"""hubshift as a user deploys it, on a cluster with real pods: `helm install` of charts/hubshift as the
subchart of an umbrella chart (`global` values, as GitOps repositories hold it) with the image built from
the Dockerfile, `kubectl create secret` and `kubectl apply` of examples/homes.yaml (only its connection
strings, sizes and timings changed), then what a pool lives through: examples/route.yaml beside it with a
pod template (a dedicated node, a ConfigMap-mounted lookup file, a variable from a Secret, a sidecar), a
backlog, an idle spell, a pod deleted mid-batch, a container killed, an operator upgrade, an upgrade to a
new image tag that rolls the pool, the end.

The scenarios run in order on one cluster, one operator and one pool (each Spark part once); a scenario
whose predecessor failed is skipped, saying which. Where the cluster has the Prometheus Operator's image
(`ScenarioCluster.monitoring`: the node tier), it runs beside the pool from the start, as
kube-prometheus-stack users run it (tests/scenarios/monitoring.py), and the chart is installed with its
ServiceMonitor, PodMonitor and PrometheusRule: one scenario then reads the dashboards and alerts from it.
Each tier runs them by subclassing `DeployedScenarios` and giving a `scenario_cluster` fixture
(tests/scenarios/cluster.py): tests/node/test_node_deployed.py on the node tier's real node,
tests/kind/test_kind_deployed.py on kind.

The servers the pods talk to run where the cluster says (the node's network namespace, or the kind
network's gateway): the hubshift emulator with one hub of four partitions, and Azurite, holding the
checkpoint store and the aggregates' Blob sink. Every event the test sends is kept, so the window totals
the consumers wrote (read with `AggregateView`, as a web page would) are compared with totals computed here.

Figures (printed at the end of the run and written to bench/results/<cluster>_tier.json): helm install to
operator Ready, kubectl apply to pool Ready, the pod template's pool Ready and its events through, scale-out
and scale-in on real pods, the recoveries, the image upgrade's roll.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hubshift.apps.produce import GeneratedEvent, HubSender, LoadSpec, produce_load
from hubshift.connections import event_hubs_target, open_checkpoint_store, ownership_scope
from hubshift.emulator.launch import RunningEmulator
from hubshift.manifest import PartitionedConsumer, parse_manifest
from hubshift.operator.kubernetes.render import CONSUMER_LABEL, termination_grace_seconds
from hubshift.ownership.model import OwnershipSnapshot
from hubshift.ownership.snapshot import take_snapshot
from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.pipelines.sensor_events import parse_event
from hubshift.sinks import build_store
from tests.fixtures.cluster import eventually
from tests.fixtures.hubs import read_hub, send_events
from tests.harness.azurite import Azurite
from tests.scenarios import extending, monitoring
from tests.scenarios.cluster import (
    FIGURES,
    JSON,
    SESSION_STARTED,
    PodWatch,
    ScenarioCluster,
    ScenarioError,
    audit_events,
    pod_ready,
    refused,
    sampling,
    termination,
)
from tests.scenarios.rollouts import (
    FLEET_CONSUMER_GROUPS,
    FLEET_HUB,
    FLEET_PARTITIONS,
    MAX_HANDOFF_SECONDS,
    POOL_SIZE,
    Load,
    measure_rollouts,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "hubshift"
EXAMPLE = REPO_ROOT / "examples" / "homes.yaml"

RELEASE = "hubshift"
SYSTEM_NAMESPACE = "hubshift-system"
NAMESPACE = "homes"
NAME = "homes"  # the example's PartitionedConsumer
HUB, PARTITIONS = "telemetry", 4
CONTAINER = "consumer"
METRICS_PORT = 9090  # the consumers' default metricsPort
OPERATOR_METRICS_PORT = 9100
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
OPERATOR_USER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{RELEASE}"
# How a 403 shows in the operator's log: kopf's APIForbiddenError, lightkube's ApiError with the API
# server's reason Forbidden and message "... is forbidden: User ... cannot ...".
FORBIDDEN = re.compile("forbidden", re.IGNORECASE)

MAX_REPLICAS = 2
PER_REPLICA = 2000  # scaling.target.unprocessedEventsPerReplica
POLLING_SECONDS = 2
DELAY_SECONDS = 5  # rebalance.delaySeconds: the holddown
HANDOFF_SECONDS = 15  # rebalance.maxHandoffSeconds
# Held through the scenarios, so the pool stays at two consumers until the scale-in scenario shortens it.
SCALE_DOWN_WINDOW_SECONDS = 600

# A Spark consumer pod to Ready: 20-60 s on two cores, but 3 minutes seen while other suites loaded the
# machine to 20 (the node's pods get a small share of a contended CPU). The bounds below allow for that;
# a passing run takes what it takes.
POD_START_SECONDS = 360
COUNT_SECONDS = 300  # every event sent, counted in the sink
# HubshiftLagHigh as the monitored install sets it: low enough that a stopped consumer trips it in well under
# a minute, before the kubelet's liveness probe (3 x 10 s) restarts it.
LAG_ALERT_SECONDS, LAG_ALERT_FOR = 10, "5s"


def secret_names(document: JSON) -> tuple[str, str]:
    spec = document["spec"]
    return (
        spec["eventHubs"]["connectionStringSecretRef"]["name"],
        spec["checkpointStore"]["blob"]["connectionStringSecretRef"]["name"],
    )


def example(cluster: ScenarioCluster) -> JSON:
    """examples/homes.yaml with what this cluster needs: connection strings (through the Secrets it already
    names; the Event Hubs endpoint is the connection string's), sizes that fit two cores, short timings."""
    document: JSON = yaml.safe_load(EXAMPLE.read_text())
    spec = document["spec"]
    spec["eventHubs"].pop("namespace")  # the emulator: the connection string's endpoint names it
    consumer = spec["consumer"]  # no image: the operator's own (the chart's), as for every resource
    consumer["resources"] = {"requests": {"cpu": "100m", "memory": "640Mi"}, "limits": {"memory": "1536Mi"}}
    consumer["spark"] = {"master": "local[1]", "driverMemory": "512m", "shufflePartitions": 1}
    consumer["checkpoint"] = {"everySeconds": 2, "everyEvents": 5000}
    spec["scaling"].update(
        maxReplicas=MAX_REPLICAS,
        pollingIntervalSeconds=POLLING_SECONDS,
        target={"unprocessedEventsPerReplica": PER_REPLICA},
        behavior={"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_SECONDS}},
    )
    spec["rebalance"].update(delaySeconds=DELAY_SECONDS, maxHandoffSeconds=HANDOFF_SECONDS)
    return document


# --- what the test sent, and what it should count -----------------------------------------------------

WindowKey = tuple[datetime, str, str]


class RecordingSender:
    """The load generator's sender, keeping every event it sent (after the hub took it)."""

    def __init__(self, inner: HubSender, sent: list[GeneratedEvent], lock: threading.Lock) -> None:
        self.inner = inner
        self.sent = sent
        self.lock = lock

    def partition_ids(self) -> list[str]:
        return self.inner.partition_ids()

    def partition_for(self, key: str) -> str:
        return self.inner.partition_for(key)

    def send(self, partition: str, events: Sequence[GeneratedEvent]) -> None:
        self.inner.send(partition, events)
        with self.lock:
            self.sent.extend(events)

    def close(self) -> None:
        self.inner.close()


def expected_totals(
    events: Sequence[GeneratedEvent], window_seconds: int, event_types: Sequence[str]
) -> Counter[WindowKey]:
    """What the aggregate pipeline must count for these events: per window (of the event time), home and
    sensor type, the events of the types asked for."""
    totals: Counter[WindowKey] = Counter()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for generated in events:
        event = parse_event(generated.body)
        if event_types and event.event_type not in event_types:
            continue
        micros = (event.event_time - epoch) // timedelta(microseconds=1)
        start = epoch + timedelta(seconds=micros // (window_seconds * 1_000_000) * window_seconds)
        totals[(start, event.home_id, event.sensor_type)] += 1
    return totals


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` with these labels in a Prometheus exposition (0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def within_bucket(text: str, histogram: str, count: float, **labels: str) -> float | None:
    """The smallest bucket bound of `histogram` holding all of its `count` observations (None: only +Inf)."""
    buckets = [
        (float(sample.labels["le"]), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == f"{histogram}_bucket" and labels.items() <= sample.labels.items()
    ]
    return min((bound for bound, value in buckets if value >= count and bound != float("inf")), default=None)


# --- the deployment the scenarios share ---------------------------------------------------------------


@dataclass
class Deployment:
    cluster: ScenarioCluster
    workdir: Path
    figures: dict[str, Any]
    done: set[str] = field(default_factory=set)
    sent: list[GeneratedEvent] = field(default_factory=list)
    sent_lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: list[Any] = field(default_factory=list)  # what to stop at the end, last first
    manifest: JSON | None = None
    consumer: PartitionedConsumer | None = None
    emulator: RunningEmulator | None = None
    azurite: Azurite | None = None
    chart: Path = CHART  # the umbrella chart the release was installed from (extending.umbrella_chart)
    watch: PodWatch | None = None
    operator_logs: list[str] = field(default_factory=list)  # of operator pods already replaced
    monitored_since: float | None = None  # when the Prometheus Operator's Prometheus was asked for
    # where the scenario's release and resource are (another scenario names its own)
    namespace: str = NAMESPACE
    system_namespace: str = SYSTEM_NAMESPACE
    release: str = RELEASE
    name: str = NAME

    # -- order

    def require(self, *steps: str) -> None:
        missing = [step for step in steps if step not in self.done]
        if missing:
            pytest.skip(f"needs the scenario(s) {', '.join(missing)}, which did not pass")

    @classmethod
    def begin(
        cls, cluster: ScenarioCluster, tmp_path_factory: pytest.TempPathFactory, request: Any, folder: str
    ) -> Deployment:
        """A scenario class's deployment, its figures kept under the cluster's name for the tier's JSON."""
        figures = request.config.stash.setdefault(FIGURES, {}).setdefault(cluster.name, {})
        return cls(cluster, tmp_path_factory.mktemp(folder), figures)

    def stop(self) -> None:
        """Stop what the scenarios started, last first; one that fails does not keep the rest running."""
        for stop in reversed(self.stopping):
            try:
                stop()
            except Exception as error:
                print(f"stopping {stop}: {error}")

    def figure(self, name: str, seconds: float) -> None:
        self.figures[name] = round(seconds, 1)
        print(f"{self.cluster.name}: {name} = {seconds:.1f} s")

    # -- servers, load, the store and the sink

    def start_servers(self) -> None:
        emulator = self.cluster.start_emulator(
            [f"{HUB}:{PARTITIONS}", *extending.ROUTE_HUBS, f"{FLEET_HUB}:{FLEET_PARTITIONS}"],
            consumer_groups=FLEET_CONSUMER_GROUPS,
        )
        self.stopping.append(emulator.stop)
        self.emulator = emulator
        # its access log counts each side's storage requests (tests/scenarios/rollouts.py)
        azurite = self.cluster.start_azurite(self.workdir / "azurite", self.workdir / "azurite-access.log")
        self.stopping.append(azurite.stop)
        self.azurite = azurite

    @property
    def eventhubs(self) -> str:
        """The emulator's connection string (the pods' Event Hubs Secret)."""
        return self.emulator.connection_string if self.emulator is not None else ""

    @property
    def storage(self) -> str:
        """Azurite's connection string (the pods' checkpoint store Secret)."""
        return self.azurite.connection_string if self.azurite is not None else ""

    def send(self, spec: LoadSpec, stop: threading.Event | None = None) -> int:
        sender = RecordingSender(HubSender.connect(self.eventhubs, HUB), self.sent, self.sent_lock)
        try:
            return produce_load(spec, sender, hub=HUB, stop=stop).events
        finally:
            sender.close()

    def environ(self) -> dict[str, str]:
        """The consumer's environment as the pods get it from the Secrets."""
        assert self.consumer is not None
        spec = self.consumer.spec
        assert spec.checkpoint_store.blob is not None
        return {
            spec.event_hubs.connection_string_variable: self.eventhubs,
            spec.checkpoint_store.blob.connection_string_variable: self.storage,
        }

    def snapshot(self) -> OwnershipSnapshot:
        assert self.consumer is not None
        spec, environ = self.consumer.spec, self.environ()
        store = open_checkpoint_store(spec.checkpoint_store, environ, create=False)
        try:
            return take_snapshot(store, ownership_scope(event_hubs_target(spec.event_hubs, environ)))
        finally:
            store.close()

    def totals(self) -> dict[WindowKey, int]:
        assert self.consumer is not None
        sink = self.consumer.spec.consumer.sink
        assert sink.blob is not None
        view = AggregateView(build_store(sink, {sink.blob.connection_string_variable: self.storage}))
        view.refresh()
        return {key: count.count for key, count in view.counts().items()}

    def expected(self) -> Counter[WindowKey]:
        assert self.consumer is not None
        aggregate = self.consumer.spec.consumer.pipeline.aggregate
        with self.sent_lock:
            sent = list(self.sent)
        return expected_totals(sent, aggregate.window_seconds, aggregate.event_types)

    def assert_exact_totals(self, timeout: float = COUNT_SECONDS) -> int:
        """Wait until the sink counts as many events as were sent (of the types counted), then compare
        every window, home and sensor type: nothing lost, nothing counted twice."""
        expected = self.expected()
        want = sum(expected.values())
        counted: dict[WindowKey, int] = {}

        def all_counted() -> bool:
            counted.clear()
            counted.update(self.totals())
            return sum(counted.values()) >= want

        eventually(all_counted, timeout, lambda: self.describe_counts(want, sum(counted.values())))
        time.sleep(3)  # a batch committed twice would show now
        counted = self.totals()
        wrong = {k: (counted.get(k, 0), v) for k, v in expected.items() if counted.get(k, 0) != v}
        extra = {k: c for k, c in counted.items() if k not in expected}
        assert not wrong and not extra, (
            f"window totals differ from the events sent: {len(wrong)} wrong (counted, sent), e.g. "
            f"{list(wrong.items())[:5]}; {len(extra)} counted but never sent, e.g. {list(extra.items())[:5]}"
        )
        return want

    # -- the cluster's view

    def describe_counts(self, want: int, counted: int) -> str:
        """Why the sink counts fewer events than were sent: each pod's own counts of what it skipped or
        could not write, the checkpoints against the hub, then what `describe` shows."""
        lines = [f"{want} events counted (counted {counted})"]
        for pod in self.consumer_pods():
            name = pod["metadata"]["name"]
            try:
                text = self.pod_metrics(name)
            except Exception as error:  # a pod restarting: its metrics are not there
                lines.append(f"{name}: no metrics ({error})")
                continue
            for family in (
                "hubshift_consumer_events_expired_total",
                "hubshift_consumer_dead_letters_total",
                "hubshift_consumer_batches_total",
                "hubshift_consumer_events_total",
            ):
                found = [line for line in text.splitlines() if line.startswith(family)]
                lines.append(f"{name}: " + ("; ".join(found[:12]) if found else f"no {family}"))
        try:
            snapshot = self.snapshot()
            lines.append(
                "checkpoints: "
                + ", ".join(
                    f"{row.partition}@{row.checkpoint.sequence_number} ({row.owner})"
                    for row in snapshot.partitions
                )
            )
        except Exception as error:
            lines.append(f"checkpoints unreadable: {error}")
        return "\n".join(lines) + "\n" + self.describe("the counts above")

    def kill_container(self, pod_name: str, timeout: float) -> JSON:
        """SIGKILL the pod's container from the node side (no SIGTERM, no drain, no release) and wait until
        it has restarted and is Ready; its container status then."""
        pod = self.cluster.get("-n", self.namespace, "pod", pod_name)
        (status,) = pod["status"]["containerStatuses"]
        restarts = status["restartCount"]
        self.cluster.kill_container(pod["spec"]["nodeName"], status["containerID"].split("://", 1)[1])

        def restarted() -> JSON | None:
            again = self.cluster.get("-n", self.namespace, "pod", pod_name)
            (now,) = again["status"]["containerStatuses"]
            return now if now["restartCount"] > restarts and pod_ready(again) else None

        found: JSON = self.wait(restarted, timeout, f"{pod_name}'s container restarted and Ready")
        return found

    def cr(self) -> JSON:
        return self.cluster.get("-n", self.namespace, "partitionedconsumer", self.name)

    def consumer_pods(self) -> list[JSON]:
        pods = self.cluster.get("-n", self.namespace, "pods", "-l", f"{CONSUMER_LABEL}={self.name}")["items"]
        return sorted(pods, key=lambda pod: pod["metadata"]["name"])

    def operator_pods(self) -> list[JSON]:
        selector = f"app.kubernetes.io/instance={self.release},app.kubernetes.io/component=operator"
        items: list[JSON] = self.cluster.get("-n", self.system_namespace, "pods", "-l", selector)["items"]
        return items

    def pod_metrics(self, pod: str) -> str:
        return self.cluster.proxy_get(self.namespace, pod, METRICS_PORT, "/metrics")

    def balanced(self, consumers: Sequence[str]) -> OwnershipSnapshot | None:
        """Phase Ready over exactly these Ready pods, each holding an even share of the partitions as the
        published record says; the snapshot, else None."""
        status = self.cr().get("status") or {}
        if status.get("phase") != "Ready" or status.get("readyReplicas") != len(consumers):
            return None
        pods = {pod["metadata"]["name"]: pod for pod in self.consumer_pods()}
        if set(pods) != set(consumers) or not all(pod_ready(pod) for pod in pods.values()):
            return None
        snapshot = self.snapshot()
        record = snapshot.assignment
        if record is None or record.generation != status.get("assignmentGeneration"):
            return None
        if snapshot.owners != dict(record.partitions) or len(record.partitions) != PARTITIONS:
            return None
        shares = Counter(record.partitions.values())
        if set(shares) != set(consumers) or max(shares.values()) - min(shares.values()) > 1:
            return None
        return snapshot

    def describe(self, what: str) -> str:
        """What a person would look at when `what` did not happen: status, pods, events, logs."""
        parts = [what]
        for args in (
            ("-n", self.namespace, "get", "pcon,sts,pods", "-o", "wide"),
            ("-n", self.system_namespace, "get", "pods", "-o", "wide"),
            ("-n", self.namespace, "get", "events", "--sort-by=.lastTimestamp"),
        ):
            result = self.cluster.kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{result.stdout[-3000:]}{result.stderr[-500:]}")
        status = self.cluster.kubectl(
            "-n", self.namespace, "get", "pcon", self.name, "-o", "json", check=False
        )
        if status.returncode == 0:
            parts.append("status: " + json.dumps(json.loads(status.stdout).get("status"), indent=1)[-2500:])
        for pod in self.operator_pods():
            parts.append(f"--- operator {pod['metadata']['name']}\n{self.operator_log(pod)[-3000:]}")
        for pod in self.consumer_pods():
            name = pod["metadata"]["name"]
            parts.append(f"--- {name}\n{self.cluster.logs(self.namespace, name)[-2000:]}")
        return "\n".join(parts)

    def operator_log(self, pod: JSON) -> str:
        return self.cluster.logs(self.system_namespace, pod["metadata"]["name"])

    def wait(self, probe: Any, timeout: float, what: str) -> Any:
        return eventually(probe, timeout, lambda: self.describe(what))


# --- the scenarios ----------------------------------------------------------------------------------------


class DeployedScenarios:
    """Subclass as `Test...` in a tier, with a `scenario_cluster` fixture; the methods run in this order."""

    @pytest.fixture(scope="class")
    def deployment(
        self, scenario_cluster: ScenarioCluster, tmp_path_factory: pytest.TempPathFactory, request: Any
    ) -> Iterator[Deployment]:
        deployment = Deployment.begin(scenario_cluster, tmp_path_factory, request, "deployed")
        try:
            yield deployment
        finally:
            deployment.stop()
            for namespace in (NAMESPACE, SYSTEM_NAMESPACE, monitoring.NAMESPACE):
                scenario_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)

    # 1 -------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(300)
    def test_helm_install_runs_the_operator_under_its_service_account(self, deployment: Deployment) -> None:
        cluster = deployment.cluster
        for namespace in (SYSTEM_NAMESPACE, NAMESPACE):  # both enforce the restricted profile
            metadata = {"name": namespace, "labels": RESTRICTED}
            cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": metadata})
        # As GitOps users deploy it: the chart a dependency of an umbrella chart, the image's registry
        # the umbrella's global.imageRegistry.
        deployment.chart = extending.umbrella_chart(deployment.workdir)
        stack = cluster.monitoring
        if stack is not None:  # its CRDs first: the chart's monitors and rules need them
            installing = time.monotonic()
            monitoring.install_operator(cluster, stack)
            deployment.figure("prometheus_operator_install_seconds", time.monotonic() - installing)
        started = time.monotonic()
        image = cluster.image
        # The chart's monitors and rules, as the umbrella's values for its hubshift subchart.
        monitored = [] if stack is None else monitoring.chart_values(LAG_ALERT_SECONDS, LAG_ALERT_FOR)
        monitored = [value if value == "--set" else f"hubshift.{value}" for value in monitored]
        cluster.helm(
            "install", RELEASE, str(deployment.chart), "--namespace", SYSTEM_NAMESPACE,
            *extending.umbrella_values(image), *monitored,
        )  # fmt: skip
        if stack is not None:
            monitoring.create_prometheus(cluster, stack)
            deployment.monitored_since = time.time()
        pods = deployment.wait(
            lambda: [p for p in deployment.operator_pods() if pod_ready(p)], 180, "the operator pod Ready"
        )
        deployment.figure("helm_install_to_operator_ready_seconds", time.monotonic() - started)
        (pod,) = pods
        spec = pod["spec"]
        assert spec["serviceAccountName"] == RELEASE
        assert spec["containers"][0]["image"] == extending.full_reference(image)
        # The CRD came with the release (a template Helm upgrades), kept when the release goes.
        crd = cluster.get("crd", "partitionedconsumers.hubshift.dev")["metadata"]
        assert crd["annotations"]["helm.sh/resource-policy"] == "keep", crd
        assert crd["annotations"]["meta.helm.sh/release-name"] == RELEASE, crd
        assert not any(e["name"] == "KUBECONFIG" for e in spec["containers"][0].get("env", []))
        # In-cluster config: the API server saw the operator as its ServiceAccount (the audit log), and
        # the operator listed PartitionedConsumers with it; never refused.
        events = eventually(
            lambda: [
                e
                for e in audit_events(cluster.audit_log(), OPERATOR_USER)
                if (e.get("objectRef") or {}).get("resource") == "partitionedconsumers"
            ],
            60,
            f"the operator's requests as {OPERATOR_USER} in the API server's audit log",
        )
        assert {e["verb"] for e in events} & {"list", "watch"}
        assert not refused(audit_events(cluster.audit_log(), OPERATOR_USER))
        log = deployment.operator_log(pod)
        assert not FORBIDDEN.search(log), log[-3000:]
        deployment.done.add("install")

    # 2 -------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(900)
    def test_kubectl_apply_of_the_example_makes_a_ready_pool_of_spark_pods(
        self, deployment: Deployment
    ) -> None:
        deployment.require("install")
        cluster = deployment.cluster
        deployment.start_servers()
        document = example(cluster)
        eventhubs_secret, storage_secret = secret_names(document)
        for secret, value in ((eventhubs_secret, deployment.eventhubs), (storage_secret, deployment.storage)):
            create = ["-n", NAMESPACE, "create", "secret", "generic", secret]
            cluster.kubectl(*create, f"--from-literal=connectionString={value}")
        manifest = deployment.workdir / "homes.yaml"
        manifest.write_text(yaml.safe_dump(document, sort_keys=False))
        deployment.manifest = document
        deployment.consumer = parse_manifest(
            {**document, "metadata": {**document["metadata"], "namespace": NAMESPACE}}
        )
        deployment.watch = PodWatch(cluster, NAMESPACE).start()
        deployment.stopping.append(deployment.watch.stop)

        started = time.monotonic()
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(manifest))
        deployment.wait(lambda: deployment.balanced([f"{NAME}-0"]), POD_START_SECONDS, "the pool Ready")
        deployment.figure("kubectl_apply_to_pool_ready_seconds", time.monotonic() - started)

        # `kubectl get pcon` as a user reads it: the printer columns with the real values.
        table = cluster.kubectl("-n", NAMESPACE, "get", "pcon", NAME, "-o", "wide").stdout
        row = columns(table)
        assert row["HUB"] == HUB and row["CONSUMER GROUP"] == "$Default", table
        assert (row["PARTITIONS"], row["REPLICAS"], row["DESIRED"], row["PHASE"]) == (
            str(PARTITIONS), "1", "1", "Ready",
        ), table  # fmt: skip
        assert row["BACKLOG"].isdigit(), table

        # A real Spark consumer, in the operator's own image (the resource names none): its log says so,
        # and events go through it into the Blob sink, exactly.
        (operator,) = deployment.operator_pods()
        consumer_pod = cluster.get("-n", NAMESPACE, "pod", f"{NAME}-0")
        assert consumer_pod["spec"]["containers"][0]["image"] == operator["spec"]["containers"][0]["image"]
        assert "spark engine starting" in cluster.logs(NAMESPACE, f"{NAME}-0")
        deployment.send(LoadSpec(homes=300, count=600, rate=2000, seed=1))
        deployment.assert_exact_totals()
        deployment.done.add("pool")

    # 2b ------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(900)
    def test_a_pod_template_runs_the_route_example_on_a_dedicated_node_with_its_lookup_file_and_a_sidecar(
        self, deployment: Deployment
    ) -> None:
        """examples/route.yaml with the pod template a platform team writes for it: scheduled only by its
        node selector and its toleration of a tainted node, its `enrich` step reading the lookup file a
        ConfigMap mounts at /config, the alarms hub's connection string from a Secret through a variable,
        a sidecar beside the consumer; the restricted Pod Security Standard enforced throughout."""
        deployment.require("pool")
        cluster, emulator = deployment.cluster, deployment.emulator
        assert emulator is not None
        document = extending.route_example(cluster.image)
        for secret in extending.route_secrets(document):
            if cluster.get_or_none("-n", NAMESPACE, "secret", secret) is None:
                create = ["-n", NAMESPACE, "create", "secret", "generic", secret]
                value = deployment.storage if "storage" in secret else deployment.eventhubs
                cluster.kubectl(*create, f"--from-literal=connectionString={value}")
        cluster.apply({**extending.sites_config_map(), "metadata": {"name": "sites", "namespace": NAMESPACE}})
        manifest = deployment.workdir / "route.yaml"
        manifest.write_text(yaml.safe_dump(document, sort_keys=False))
        name = extending.ROUTE_NAME
        started = time.monotonic()
        try:
            with extending.dedicated_nodes(cluster) as nodes:
                cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(manifest))
                pod = deployment.wait(
                    lambda: scheduled(cluster, f"{name}-0"), 120, f"{name}-0 scheduled onto the tainted node"
                )
            assert pod["spec"]["nodeName"] in nodes
            assert pod["metadata"]["labels"]["team"] == "readings"
            assert pod["metadata"]["annotations"]["example.com/owner"] == "readings"
            assert [c["name"] for c in pod["spec"]["containers"]] == [CONTAINER, extending.SIDECAR]

            def ready() -> bool:
                status = cluster.get("-n", NAMESPACE, "pcon", name).get("status") or {}
                return status.get("phase") == "Ready" and status.get("readyReplicas") == 1

            deployment.wait(ready, POD_START_SECONDS, f"{name} Ready")
            deployment.figure("pod_template_pool_ready_seconds", time.monotonic() - started)
            sidecar = cluster.kubectl("-n", NAMESPACE, "logs", f"{name}-0", "-c", extending.SIDECAR).stdout
            assert "consumer ready: 200" in sidecar, sidecar  # the pod's loopback, shared

            started = time.monotonic()
            send_events(emulator, "readings", extending.readings())
            for hub, expected in extending.EXPECTED.items():
                events = read_hub(emulator, hub, len(expected), timeout=180, settle=2)
                # Each once (the repeat deduplicated), with its site from the mounted file.
                assert len(events) == len(expected), (hub, events)
                assert extending.delivered(events) == expected, (hub, events, deployment.describe(hub))
            deployment.figure("pod_template_events_through_seconds", time.monotonic() - started)
        finally:
            # Its Spark pod goes, so the scenarios after this one have the node's CPU to themselves.
            cluster.kubectl("-n", NAMESPACE, "delete", "pcon", name, "--ignore-not-found", timeout=120)
        deployment.wait(
            lambda: cluster.get_or_none("-n", NAMESPACE, "pod", f"{name}-0") is None, 120, f"{name}-0 gone"
        )

    # 3 -------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(900)
    def test_a_backlog_scales_the_pool_out_and_hands_partitions_to_the_new_pod(
        self, deployment: Deployment
    ) -> None:
        deployment.require("pool")
        cluster = deployment.cluster
        before = deployment.pod_metrics(f"{NAME}-0")
        started = time.monotonic()
        sent = deployment.send(LoadSpec(homes=300, count=8 * PER_REPLICA, rate=20_000, seed=2))
        # The backlog is read every pollingInterval: more than one replica's share asks for a second pod.
        deployment.wait(
            lambda: cluster.get("-n", NAMESPACE, "statefulset", NAME)["spec"]["replicas"] == MAX_REPLICAS,
            60,
            f"the StatefulSet scaled to {MAX_REPLICAS} after a backlog of {sent} events",
        )
        scaled = time.monotonic()
        consumers = [f"{NAME}-{i}" for i in range(MAX_REPLICAS)]
        deployment.wait(
            lambda: deployment.balanced(consumers), POD_START_SECONDS, "the pool balanced over two"
        )
        deployment.figure("scale_out_decision_seconds", scaled - started)
        deployment.figure("scale_out_to_balanced_seconds", time.monotonic() - started)

        # The handoff was graceful: the new pod took released leases, none broken; the operator's nudges
        # reached the pods at their IPs (a pod counts each one it takes).
        after = {name: deployment.pod_metrics(name) for name in consumers}
        moved = PARTITIONS // MAX_REPLICAS
        acquired = "hubshift_consumer_partitions_acquired_total"
        assert metric(after[f"{NAME}-1"], acquired, how="released") == moved, after[f"{NAME}-1"]
        assert metric(after[f"{NAME}-1"], acquired, how="broken") == 0
        released = "hubshift_consumer_partitions_released_total"
        assert metric(after[f"{NAME}-0"], released) - metric(before, released) == moved
        nudges = "hubshift_consumer_nudges_total"
        assert metric(after[f"{NAME}-0"], nudges) > metric(before, nudges), "no nudge reached homes-0"
        assert metric(after[f"{NAME}-1"], nudges) >= 1, "no nudge reached homes-1"
        deployment.assert_exact_totals()
        deployment.done.add("scaled-out")

    # 4 -------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(1500)
    def test_a_pod_deleted_mid_batch_and_a_container_killed_lose_nothing_and_count_nothing_twice(
        self, deployment: Deployment
    ) -> None:
        deployment.require("scaled-out")
        cluster, watch = deployment.cluster, deployment.watch
        assert watch is not None and deployment.consumer is not None
        consumers = [f"{NAME}-{i}" for i in range(MAX_REPLICAS)]
        grace = termination_grace_seconds(deployment.consumer)
        load = Load(deployment.send, rate=150, seed=3).start()
        try:
            # homes-1 deleted while it commits batches (its batch counter moving under the load).
            victim = cluster.get("-n", NAMESPACE, "pod", f"{NAME}-1")
            batches = "hubshift_consumer_batches_total"
            first = metric(deployment.pod_metrics(victim["metadata"]["name"]), batches, result="ok")
            deployment.wait(
                lambda: metric(deployment.pod_metrics(f"{NAME}-1"), batches, result="ok") > first + 1,
                60,
                "homes-1 committing batches under the load",
            )
            started = time.monotonic()
            cluster.kubectl("-n", NAMESPACE, "delete", "pod", f"{NAME}-1", "--wait=false")
            uid = victim["metadata"]["uid"]
            gone = deployment.wait(lambda: watch.deleted(f"{NAME}-1", uid), grace + 30, "homes-1 deleted")
            ended = termination(gone, CONTAINER)
            assert ended is not None and ended[0] == 0, f"homes-1 did not exit 0 on SIGTERM: {ended}"
            assert ended[1] <= grace, f"homes-1 took {ended[1]:.1f} s, beyond its grace of {grace} s"
            deployment.figure("deleted_pod_exit_seconds", max(0.0, ended[1]))  # times in whole seconds
            deployment.wait(
                lambda: deployment.balanced(consumers), POD_START_SECONDS, "homes-1 back, balanced"
            )
            deployment.figure("deleted_pod_to_balanced_seconds", time.monotonic() - started)

            # homes-0's container SIGKILLed from the node side: no SIGTERM, no drain, no release.
            started = time.monotonic()
            last = deployment.kill_container(f"{NAME}-0", POD_START_SECONDS)
            assert last["lastState"]["terminated"]["exitCode"] == 137, last  # 128 + SIGKILL
            deployment.wait(
                lambda: deployment.balanced(consumers), POD_START_SECONDS, "homes-0 back, balanced"
            )
            deployment.figure("killed_container_to_balanced_seconds", time.monotonic() - started)
        finally:
            sent = load.finish()
        assert sent > 0
        counted = deployment.assert_exact_totals()
        print(f"{cluster.name}: {len(deployment.sent)} events sent, {counted} counted, exactly")
        deployment.done.add("survived")

    # 5 -------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(600)
    def test_an_idle_pool_scales_in_after_handing_the_partitions_off(self, deployment: Deployment) -> None:
        deployment.require("scaled-out")
        cluster, watch = deployment.cluster, deployment.watch
        assert watch is not None and deployment.consumer is not None
        leaving = cluster.get("-n", NAMESPACE, "pod", f"{NAME}-1")
        staying_before = deployment.pod_metrics(f"{NAME}-0")
        # Idle since the last scenario; the user shortens the scale-down window to see it scale in now.
        started = time.monotonic()
        patch = {"spec": {"scaling": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 5}}}}}
        cluster.kubectl("-n", NAMESPACE, "patch", "pcon", NAME, "--type", "merge", "-p", json.dumps(patch))
        uid = leaving["metadata"]["uid"]
        gone = deployment.wait(
            lambda: watch.deleted(f"{NAME}-1", uid), 240, "homes-1 removed by the scale-in"
        )
        deployment.wait(lambda: deployment.balanced([f"{NAME}-0"]), 120, "the pool balanced over homes-0")
        deployment.figure("scale_in_seconds", time.monotonic() - started)

        grace = termination_grace_seconds(deployment.consumer)
        ended = termination(gone, CONTAINER)
        assert ended is not None and ended[0] == 0, f"homes-1 did not exit 0: {ended}"
        assert ended[1] <= grace, f"homes-1 took {ended[1]:.1f} s to stop, beyond its grace of {grace} s"
        # Handed off before the pod was removed: the operator published the drain and saw every handoff
        # done before it scaled in, and homes-0 took released leases, none broken or expired.
        assert drained_before_scale_in(events_of(cluster)), [
            (e["reason"], e["message"]) for e in events_of(cluster)
        ]
        after = deployment.pod_metrics(f"{NAME}-0")
        acquired = "hubshift_consumer_partitions_acquired_total"
        for how, change in (("released", PARTITIONS // MAX_REPLICAS), ("broken", 0), ("expired", 0)):
            got = metric(after, acquired, how=how) - metric(staying_before, acquired, how=how)
            assert got == change, f"homes-0 acquired {got} partitions {how}, not {change}"
        deployment.assert_exact_totals()
        deployment.done.add("scaled-in")

    # 5b ------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(900)
    def test_dashboards_and_alerts_work_from_the_prometheus_operator_across_namespaces(
        self, deployment: Deployment
    ) -> None:
        deployment.require("scaled-in")
        cluster = deployment.cluster
        if cluster.monitoring is None or deployment.monitored_since is None:
            pytest.skip(f"the {cluster.name} cluster has no Prometheus Operator image (tools/monitoring)")
        prometheus = monitoring.ClusterPrometheus(cluster)
        started = time.monotonic()
        deployment.wait(prometheus.ready, 180, "the Prometheus Operator's Prometheus Ready")

        def scraped() -> bool:
            up = {
                (t["labels"].get("namespace"), t["labels"].get("pod"), t["health"])
                for t in prometheus.targets()
            }
            operator = {pod["metadata"]["name"] for pod in deployment.operator_pods()}
            return {(SYSTEM_NAMESPACE, name, "up") for name in operator} | {
                (NAMESPACE, f"{NAME}-0", "up")
            } <= up

        deployment.wait(scraped, 120, "the operator and homes-0 scraped through the chart's monitors")
        monitoring.assert_dashboards_draw(prometheus, NAMESPACE, NAME, deployment.monitored_since)
        monitoring.assert_rules_evaluate(prometheus, NAMESPACE, NAME)
        deployment.figure("monitoring_checks_seconds", time.monotonic() - started)
        assert_lag_alert_fires_for_a_stopped_consumer(deployment, prometheus)
        deployment.figure("monitoring_scenario_seconds", time.monotonic() - started)
        deployment.done.add("monitored")

    # 5c ------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(2400)
    def test_a_new_image_and_a_node_drain_replay_nothing_and_keep_every_pod_reading(
        self, deployment: Deployment
    ) -> None:
        """Two pools of SDK-engine pods side by side (tests/scenarios/rollouts.py): the StatefulSet's own
        RollingUpdate against the rollout the operator drives, then `kubectl drain` of both."""
        deployment.require("pool")
        assert deployment.manifest is not None
        started = time.monotonic()
        result = measure_rollouts(deployment, NAMESPACE, secret_names(deployment.manifest))
        deployment.figure("rollouts_and_drain_wall_seconds", time.monotonic() - started)
        print(f"{deployment.cluster.name}: rollouts {json.dumps(result, indent=1)}")
        for change in ("rollout", "drain"):
            for side, figures in result[change].items():
                deployment.figure(f"{side}_{change}_seconds", figures["seconds"])
                print(
                    f"{change} {side}: {figures['seconds']} s, {figures['eventsReplayed']} replayed, "
                    f"{figures['unownedPartitionSeconds']} unowned partition-s, handoffs p50/p99 "
                    f"{figures['handoffSecondsP50']}/{figures['handoffSecondsP99']} s, worst lag "
                    f"{figures['worstLagSecondsDuring']} s against {figures['worstLagSecondsBefore']} s "
                    "steady, "
                    f"fewest ready pods {figures['fewestReadyPods']}, targets {figures['targetsMet']}"
                )
        # The rollout the operator drives reads nothing twice. A drain (either pool) and the StatefulSet's
        # own RollingUpdate may: a pod whose handoff outlasts its follow time after SIGTERM releases at its
        # last checkpoint, and its batch in flight is read again (69 events once in five runs, a drain):
        # figures, not asserted; nothing is ever lost.
        assert result["rollout"]["fleet-operator"]["eventsReplayed"] == 0, result["rollout"]
        for change in ("rollout", "drain"):
            for side, figures in result[change].items():
                # Planned and graceful: nothing forced, no restart, no handoff near its bound.
                assert figures["forcedMoves"] == 0 and figures["containerRestarts"] == 0, (
                    change,
                    side,
                    figures,
                )
                assert figures["handoffSecondsMax"] is not None, (change, side, figures)
                assert figures["handoffSecondsMax"] < MAX_HANDOFF_SECONDS, (change, side, figures)
        for side, totals in result["totals"].items():
            assert totals["handled"] == totals["sent"], (side, totals)
        ours = result["rollout"]["fleet-operator"]
        # As many pods ready as before, throughout (the surge pod). The timing targets (p99 handoff
        # within 3 s, lag at most twice the steady one) are figures in `targetsMet`, not asserted: on this
        # shared 2-core machine a handoff's receiver start-up alone varies by seconds.
        assert ours["fewestReadyPods"] >= POOL_SIZE, ours

    # 6 -------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(120)
    def test_every_pod_passes_the_restricted_pod_security_standard(self, deployment: Deployment) -> None:
        deployment.require("pool")
        cluster = deployment.cluster
        minor = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["minor"]
        for namespace in (SYSTEM_NAMESPACE, NAMESPACE):
            labels = cluster.get("namespace", namespace)["metadata"]["labels"]
            assert labels.items() >= RESTRICTED.items()
            # The API server checks the running pods against a namespace's profile when it changes (the same
            # value again checks nothing): pinning `latest` to the server's own version, in a dry run, has it
            # warn about every running pod that violates `restricted`.
            check = cluster.kubectl(
                "label", "--dry-run=server", "--overwrite", "namespace", namespace,
                f"pod-security.kubernetes.io/enforce-version=v1.{minor.rstrip('+')}",
            )  # fmt: skip
            assert "labeled" in check.stdout and "violate" not in check.stderr, check.stderr
            pods = cluster.get("-n", namespace, "pods")["items"]
            assert pods, f"no pods in {namespace}"
            for pod in pods:
                for container in pod["spec"]["containers"]:
                    context = container.get("securityContext") or {}
                    assert context.get("readOnlyRootFilesystem") is True, (pod["metadata"]["name"], context)
                    assert context.get("allowPrivilegeEscalation") is False
                assert pod["spec"]["securityContext"].get("runAsNonRoot") is True
            reasons = {e["reason"] for e in events_of(cluster, namespace, kind=None)}
            assert "FailedCreate" not in reasons, f"a controller could not create a pod in {namespace}"

    # 7 -------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(600)
    def test_helm_upgrade_rolls_the_operator_and_moves_no_partition(self, deployment: Deployment) -> None:
        deployment.require("pool")
        cluster = deployment.cluster
        (old,) = deployment.operator_pods()
        deployment.operator_logs.append(deployment.operator_log(old))
        generation = (deployment.cr().get("status") or {}).get("assignmentGeneration")
        first = deployment.snapshot()
        assert first.assignment is not None and first.assignment.generation == generation
        pods = {p["metadata"]["name"]: p for p in deployment.consumer_pods()}

        def moment() -> tuple[int | None, dict[str, str]]:
            snapshot = deployment.snapshot()
            record = snapshot.assignment
            return (None if record is None else record.generation, snapshot.owners)

        with sampling(moment) as samples:
            started = time.monotonic()
            cluster.helm(
                "upgrade", RELEASE, str(deployment.chart), "--namespace", SYSTEM_NAMESPACE, "--reuse-values",
                "--set", "hubshift.operator.logFormat=json",
            )  # fmt: skip
            new = deployment.wait(
                lambda: [
                    p
                    for p in deployment.operator_pods()
                    if pod_ready(p) and p["metadata"]["uid"] != old["metadata"]["uid"]
                ],
                180,
                "the upgraded operator Ready",
            )
            deployment.figure("helm_upgrade_to_operator_ready_seconds", time.monotonic() - started)
            (pod,) = new

            def cycles() -> float:
                text = cluster.proxy_get(
                    SYSTEM_NAMESPACE, pod["metadata"]["name"], OPERATOR_METRICS_PORT, "/metrics"
                )
                return metric(text, "hubshift_cycle_duration_seconds_count", consumer=NAME)

            # The new operator has run its control loop a while (several backlog reads) before we judge.
            deployment.wait(lambda: cycles() >= 8, 180, "the upgraded operator running cycles")
        assert len(samples) >= 5
        assert {s for s, _ in samples} == {generation}, f"the assignment changed: {[s for s, _ in samples]}"
        assert all(owners == first.owners for _, owners in samples), samples
        assert (deployment.cr().get("status") or {}).get("assignmentGeneration") == generation
        # The consumers never noticed: same pods, no restarts.
        for name, before in pods.items():
            now = cluster.get("-n", NAMESPACE, "pod", name)
            assert now["metadata"]["uid"] == before["metadata"]["uid"], name
            restarts = [s["restartCount"] for s in now["status"]["containerStatuses"]]
            assert restarts == [s["restartCount"] for s in before["status"]["containerStatuses"]], name
        # The changed value took: the new operator logs JSON.
        lines = [line for line in deployment.operator_log(pod).splitlines() if line.strip()]
        assert lines and all(line.startswith("{") for line in lines[:5]), lines[:5]
        json.loads(lines[0])
        deployment.done.add("upgraded")

    # 7b ------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(900)
    def test_helm_upgrade_to_a_new_image_tag_rolls_the_pool_to_it(self, deployment: Deployment) -> None:
        """The consumer image is the release's: `helm upgrade --set image.tag=NEW` rolls the operator and
        then the pool, whose resource names no image, and the new pods count every event exactly."""
        deployment.require("pool")
        cluster = deployment.cluster
        new = cluster.tag_image(f"{cluster.image.tag}-next")
        reference = extending.full_reference(new)
        (old,) = deployment.operator_pods()
        deployment.operator_logs.append(deployment.operator_log(old))
        replicas = cluster.get("-n", NAMESPACE, "statefulset", NAME)["spec"]["replicas"]
        consumers = [f"{NAME}-{i}" for i in range(replicas)]
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in deployment.consumer_pods()}
        started = time.monotonic()
        cluster.helm(
            "upgrade", RELEASE, str(deployment.chart), "--namespace", SYSTEM_NAMESPACE, "--reuse-values",
            "--set", f"hubshift.image.tag={new.tag}",
        )  # fmt: skip

        def rolled() -> bool:
            pods = deployment.consumer_pods()
            images = {p["spec"]["containers"][0]["image"] for p in pods}
            fresh = all(before.get(p["metadata"]["name"]) != p["metadata"]["uid"] for p in pods)
            return images == {reference} and fresh and deployment.balanced(consumers) is not None

        deployment.wait(rolled, POD_START_SECONDS * 2, f"every consumer pod on {reference}, balanced")
        deployment.figure("helm_upgrade_image_to_pool_rolled_seconds", time.monotonic() - started)
        (operator,) = deployment.operator_pods()
        assert operator["spec"]["containers"][0]["image"] == reference
        # The Spark pool's handoffs in that rollout, as the new operator (which drove all of it) timed them.
        text = cluster.proxy_get(
            SYSTEM_NAMESPACE, operator["metadata"]["name"], OPERATOR_METRICS_PORT, "/metrics"
        )
        handoffs = metric(text, "hubshift_handoff_duration_seconds_count", consumer=NAME)
        if handoffs:
            total = metric(text, "hubshift_handoff_duration_seconds_sum", consumer=NAME)
            deployment.figure("spark_rollout_handoff_mean_seconds", total / handoffs)
            bound = within_bucket(text, "hubshift_handoff_duration_seconds", handoffs, consumer=NAME)
            print(f"{cluster.name}: {handoffs:g} Spark handoffs in the image rollout, all within {bound} s")
            if bound is not None:
                deployment.figure("spark_rollout_handoff_bound_seconds", bound)
        deployment.send(LoadSpec(homes=300, count=400, rate=2000, seed=7))
        deployment.assert_exact_totals()
        # Issue 23's bar on the Spark engine: a handoff within the time a Spark batch takes. The new pods'
        # micro-batches as Spark timed them (planning, reading, writing, committing), beside the handoffs.
        texts = [deployment.pod_metrics(p["metadata"]["name"]) for p in deployment.consumer_pods()]
        batches = sum(metric(t, "hubshift_consumer_spark_batch_duration_seconds_count") for t in texts)
        if batches:
            spent = sum(metric(t, "hubshift_consumer_spark_batch_duration_seconds_sum") for t in texts)
            deployment.figure("spark_batch_mean_seconds", spent / batches)
        deployment.done.add("image-upgraded")

    # 8 -------------------------------------------------------------------------------------------------

    @pytest.mark.timeout(600)
    def test_deleting_the_consumer_and_uninstalling_remove_everything(self, deployment: Deployment) -> None:
        deployment.require("install")
        cluster = deployment.cluster
        # Never refused, over the whole run (the operator pods' logs and the API server's audit log).
        refusals = refused(audit_events(cluster.audit_log(), OPERATOR_USER))
        assert not refusals, f"the API server refused the operator: {refusals[:10]}"
        for log in [
            *deployment.operator_logs,
            *(deployment.operator_log(p) for p in deployment.operator_pods()),
        ]:
            assert not FORBIDDEN.search(log), log[-3000:]

        children = ("statefulset", "controllerrevision", "service", "poddisruptionbudget", "configmap", "pod")
        selector = f"{CONSUMER_LABEL}={NAME}"

        def left() -> list[str]:
            found = cluster.get("-n", NAMESPACE, ",".join(children), "-l", selector)["items"]
            return [f"{item['kind']}/{item['metadata']['name']}" for item in found]

        if deployment.manifest is not None:
            assert len(left()) >= len(children), left()  # all of them were there
            pods = deployment.consumer_pods()
            started = time.monotonic()
            # Before the operator goes: its finalizer needs it.
            cluster.kubectl("-n", NAMESPACE, "delete", "pcon", NAME, "--wait=true", timeout=120)
            deployment.wait(lambda: not left(), 240, "every child of the PartitionedConsumer gone")
            deployment.figure("delete_consumer_to_children_gone_seconds", time.monotonic() - started)
            watch = deployment.watch
            assert watch is not None
            for pod in pods:
                name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
                # The list can be empty before the watch has delivered the DELETED events.
                gone = deployment.wait(lambda: watch.deleted(name, uid), 30, f"{name} seen deleted")  # noqa: B023
                ended = termination(gone, CONTAINER)
                assert ended is not None and ended[0] == 0, (pod["metadata"]["name"], ended)

        started = time.monotonic()
        cluster.helm("uninstall", RELEASE, "--namespace", SYSTEM_NAMESPACE, "--wait", "--timeout", "2m")
        kinds = "deployment,replicaset,pod,service,serviceaccount,role,rolebinding,configmap"
        release = f"app.kubernetes.io/instance={RELEASE}"
        deployment.wait(
            lambda: not cluster.get("-n", SYSTEM_NAMESPACE, kinds, "-l", release)["items"],
            120,
            "the release's objects gone",
        )
        for kind in ("clusterrole", "clusterrolebinding"):
            assert cluster.get_or_none(kind, RELEASE) is None, f"{kind} {RELEASE} left behind"
        deployment.figure("helm_uninstall_seconds", time.monotonic() - started)
        # Helm leaves the CRDs (documented in the chart's README).
        assert cluster.get_or_none("crd", "partitionedconsumers.hubshift.dev") is not None


def scheduled(cluster: ScenarioCluster, pod: str) -> JSON | None:
    """The pod once a node was chosen for it, else None."""
    found = cluster.get_or_none("-n", NAMESPACE, "pod", pod)
    return found if found and found.get("spec", {}).get("nodeName") else None


def assert_lag_alert_fires_for_a_stopped_consumer(
    deployment: Deployment, prometheus: monitoring.ClusterPrometheus
) -> None:
    """Under a load, homes-0 (the pool's one consumer) is stopped (SIGSTOP to every process of its
    container): HubshiftLagHigh fires for the pool; then it goes on (SIGCONT) and loses nothing."""
    cluster = deployment.cluster
    labels = {"namespace": NAMESPACE, "consumer": NAME}
    firing = "HubshiftLagHigh"

    def quiet() -> bool:
        return not [alert for alert in prometheus.alerts(firing, **labels) if alert["state"] == "firing"]

    deployment.wait(quiet, 120, f"{firing} quiet for {NAMESPACE}/{NAME} before the stop (an idle pool)")
    # Below one replica's share even after a minute stopped: the pool is not scaled out meanwhile.
    load = Load(deployment.send, rate=PER_REPLICA / 60, seed=5).start()
    try:
        own = f'hubshift_consumer_lag_seconds{{namespace="{NAMESPACE}", pod="{NAME}-0"}}'
        deployment.wait(lambda: prometheus.api().query(own), 60, "homes-0 reporting its own lag")
        pod = cluster.get("-n", NAMESPACE, "pod", f"{NAME}-0")
        node, container = pod["spec"]["nodeName"], pod["status"]["containerStatuses"][0]["containerID"]
        container = container.split("://", 1)[1]
        stopped = time.monotonic()
        cluster.signal_container(node, container, "SIGSTOP")
        try:
            deployment.wait(
                lambda: not quiet(), 180, f"{firing} firing for {NAMESPACE}/{NAME} with homes-0 stopped"
            )
            deployment.figure("stopped_consumer_to_lag_alert_seconds", time.monotonic() - stopped)
        finally:
            # Stopped, it fails its liveness probe: the kubelet may have restarted the container already.
            with contextlib.suppress(ScenarioError):
                cluster.signal_container(node, container, "SIGCONT")
        deployment.wait(
            lambda: deployment.balanced([f"{NAME}-0"]), POD_START_SECONDS, "homes-0 reading again"
        )
    finally:
        load.finish()
    deployment.assert_exact_totals()


def columns(table: str) -> dict[str, str]:
    """The first row of a `kubectl get` table by column title: titles start where the header has a word
    after two spaces or more (a title may hold one space: CONSUMER GROUP); values hold none."""
    header, row = table.splitlines()[:2]
    titles = [(match.group(), match.start()) for match in re.finditer(r"\S+(?: \S+)*", header)]
    ends = [start for _, start in titles[1:]] + [len(row)]
    return {title: row[start:end].strip() for (title, start), end in zip(titles, ends, strict=True)}


def drained_before_scale_in(events: Sequence[JSON]) -> bool:
    """The operator's Events show the drain published (a Rebalancing "before scale-in"), then every handoff
    done (Rebalanced), then the replicas lowered (ScalingIn), in that order."""
    reasons = iter((str(e["reason"]), str(e["message"])) for e in events)
    steps: list[Callable[[str, str], bool]] = [
        lambda r, m: r == "Rebalancing" and "before scale-in" in m,
        lambda r, m: r == "Rebalanced",
        lambda r, m: r == "ScalingIn",
    ]
    return all(any(step(r, m) for r, m in reasons) for step in steps)


def events_of(
    cluster: ScenarioCluster, namespace: str = NAMESPACE, kind: str | None = "PartitionedConsumer"
) -> list[JSON]:
    """The Events in `namespace` (of objects of `kind`), oldest first."""
    items: list[JSON] = cluster.get("-n", namespace, "events")["items"]
    if kind is not None:
        items = [e for e in items if e["involvedObject"]["kind"] == kind]

    def when(event: JSON) -> str:
        return str(
            event.get("lastTimestamp") or event.get("eventTime") or event["metadata"]["creationTimestamp"]
        )

    return sorted(items, key=lambda e: (when(e), e["metadata"]["name"]))


# --- the figures ------------------------------------------------------------------------------------------


def write_figures(config: pytest.Config, cluster: str) -> Path | None:
    """The scenarios' figures and the run's wall time (from `SESSION_STARTED`, set by tests/conftest.py) as
    bench/results/<cluster>_tier.json; None when no scenario ran."""
    figures = config.stash.get(FIGURES, {}).get(cluster)
    if not figures:
        return None
    started = config.stash.get(SESSION_STARTED, None)
    document: dict[str, Any] = {
        "cluster": cluster,
        "finishedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": dict(figures),
    }
    if started is not None:
        document["seconds"][f"{cluster}_tier_wall_seconds"] = round(time.monotonic() - started, 1)
    path = REPO_ROOT / "bench" / "results" / f"{cluster}_tier.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def summarize_figures(config: pytest.Config, cluster: str, write: Any) -> None:
    """At the end of the run (pytest_terminal_summary): the figures, and where they were written."""
    path = write_figures(config, cluster)
    if path is None:
        return
    write(f"\n{cluster} tier figures ({path.relative_to(REPO_ROOT)}):\n")
    for name, value in json.loads(path.read_text())["seconds"].items():
        write(f"  {name:<45} {value:>8.1f} s\n")
