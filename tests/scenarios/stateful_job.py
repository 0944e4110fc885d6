"""A Spark team's streaming job as a user deploys it (examples/stateful.yaml): `helm install` the chart,
`kubectl create configmap homes-stream --from-file=examples/stateful/`, `kubectl apply` of the example with
keys instead of Workload Identity (its state beside the checkpoint store, the Delta table, both on Azure
storage over ABFS: Azurite's Blob endpoint). The pool is scaled out from one pod to two (half its partitions
handed over with their state), a pod's container is SIGKILLed (its partitions' state restored by the pod
that comes back), and the pool rolls to a new pod template; an independent reader (delta-rs, none of Spark's
code) then finds every window the watermark has passed once, with the count of the distinct readings sent.

Each tier subclasses `StatefulJobScenario` with a `scenario_cluster` fixture
(tests/node/test_node_stateful.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.manifest import ConsumerSpec
from hubshift.operator.kubernetes.render import CONSUMER_LABEL
from tests.harness.windows import Readings, windows
from tests.scenarios.cluster import JSON, ScenarioCluster, pod_ready
from tests.scenarios.deployed import CHART, HUB, PARTITIONS, RESTRICTED, Deployment

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "stateful.yaml"
CODE = REPO_ROOT / "examples" / "stateful"

RELEASE = "hubshift-stateful"
SYSTEM_NAMESPACE = "stateful-system"
NAMESPACE = "stateful"
NAME = "homes-stateful"
CONTAINER_NAME = "lake"  # the Blob container holding the table
TABLE = "home-windows"
SECRETS = {"eventhubs": "telemetry-eventhubs", "storage": "lake-storage"}
POD_START_SECONDS = 420
WINDOWS_SECONDS = 420


def stateful_example(cluster: ScenarioCluster) -> JSON:
    """examples/stateful.yaml as this cluster runs it: connection strings (Secrets) for the emulator and
    Azurite in place of Workload Identity, the table at abfs:// (Azurite speaks plain http), one small Spark
    pod to begin with."""
    document: JSON = yaml.safe_load(EXAMPLE.read_text())
    spec = document["spec"]
    eventhubs = spec["eventHubs"]
    eventhubs.pop("namespace")
    eventhubs.pop("credential")
    eventhubs["consumerGroup"] = "$Default"
    eventhubs["connectionStringSecretRef"] = {"name": SECRETS["eventhubs"], "key": "connectionString"}
    storage_ref = {"name": SECRETS["storage"], "key": "connectionString"}
    blob = spec["checkpointStore"]["blob"]
    for key in ("accountUrl", "credential"):
        blob.pop(key)
    blob["connectionStringSecretRef"] = storage_ref
    consumer = spec["consumer"]
    delta = consumer["sink"]["delta"]
    delta.pop("credential")
    delta["path"] = f"abfs://{CONTAINER_NAME}@devstoreaccount1.dfs.core.windows.net/{TABLE}"
    delta["connectionStringSecretRef"] = storage_ref
    if cluster.image.reference != ConsumerSpec().image:
        consumer["image"] = cluster.image.reference
    # a query per partition: each its own Python source runner beside the JVM (four at first, on one pod)
    consumer["resources"] = {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}}
    consumer["spark"].update(
        master="local[2]", driverMemory="512m", shufflePartitions=1, triggerIntervalSeconds=2,
        maxEventsPerTrigger=2000,
    )  # fmt: skip
    consumer["checkpoint"] = {"everySeconds": 5, "everyEvents": 1000}
    spec["scaling"].update(minReplicas=1, maxReplicas=1, pollingIntervalSeconds=2)
    spec["rebalance"].update(delaySeconds=2, maxHandoffSeconds=60)
    return document


class StatefulJobScenario:
    """Subclass as `Test...` in a tier, with a `scenario_cluster` fixture."""

    @pytest.fixture(scope="class")
    def deployment(
        self, scenario_cluster: ScenarioCluster, tmp_path_factory: pytest.TempPathFactory, request: Any
    ) -> Iterator[Deployment]:
        deployment = Deployment.begin(scenario_cluster, tmp_path_factory, request, "stateful")
        deployment.namespace, deployment.system_namespace = NAMESPACE, SYSTEM_NAMESPACE
        deployment.release, deployment.name = RELEASE, NAME
        try:
            yield deployment
        finally:
            deployment.stop()
            scenario_cluster.kubectl(
                "-n", NAMESPACE, "delete", "partitionedconsumers", "--all", "--wait", timeout=180, check=False
            )
            scenario_cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NAMESPACE, "--wait", check=False)
            scenario_cluster.kubectl(
                "delete", "crd", "partitionedconsumers.hubshift.dev", "--wait", timeout=120, check=False
            )
            for namespace in (NAMESPACE, SYSTEM_NAMESPACE):
                scenario_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)

    @pytest.mark.timeout(2400)
    def test_a_streaming_jobs_windows_are_exact_through_a_scale_out_a_kill_9_and_a_rollout(
        self, deployment: Deployment
    ) -> None:
        cluster = deployment.cluster
        for namespace in (SYSTEM_NAMESPACE, NAMESPACE):
            cluster.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": RESTRICTED},
                }
            )
        image = cluster.image
        cluster.helm(
            "install", RELEASE, str(CHART), "--namespace", SYSTEM_NAMESPACE,
            "--set", f"image.repository={image.repository}", "--set", f"image.tag={image.tag}",
            "--set", f"image.pullPolicy={image.pull_policy}",
        )  # fmt: skip
        deployment.start_servers()
        create_container(deployment.storage, CONTAINER_NAME)
        for secret, value in (
            (SECRETS["eventhubs"], deployment.eventhubs),
            (SECRETS["storage"], deployment.storage),
        ):
            cluster.kubectl(
                "-n",
                NAMESPACE,
                "create",
                "secret",
                "generic",
                secret,
                f"--from-literal=connectionString={value}",
            )
        cluster.kubectl("-n", NAMESPACE, "create", "configmap", "homes-stream", f"--from-file={CODE}")
        manifest = deployment.workdir / "stateful.yaml"
        manifest.write_text(yaml.safe_dump(stateful_example(cluster), sort_keys=False))

        readings = Readings(deployment.eventhubs, HUB, [str(p) for p in range(PARTITIONS)])
        try:
            started = time.monotonic()
            cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(manifest))
            readings.wave(0, 299, repeat_every=7)
            deployment.wait(lambda: table(deployment.storage), POD_START_SECONDS, "the first windows")
            deployment.figure("stateful_apply_to_first_windows_seconds", time.monotonic() - started)

            # A scale-out: half the partitions, and their state, handed over to the new pod.
            started = time.monotonic()
            cluster.kubectl(
                "-n", NAMESPACE, "patch", "pcon", NAME, "--type", "merge", "-p",
                '{"spec": {"scaling": {"minReplicas": 2, "maxReplicas": 2}}}',
            )  # fmt: skip
            deployment.wait(lambda: ready_pods(cluster) == 2, POD_START_SECONDS, "two pods Ready")
            deployment.wait(lambda: each_pod_reads(cluster), POD_START_SECONDS, "each pod reading its share")
            deployment.figure("stateful_scale_out_seconds", time.monotonic() - started)
            readings.wave(300, 599, repeat_every=5)

            # A kill -9 of a pod's container: its partitions' state restored from their checkpoints.
            pod = cluster.get("-n", NAMESPACE, "pod", f"{NAME}-0")
            (status,) = pod["status"]["containerStatuses"]
            restarts = status["restartCount"]
            started = time.monotonic()
            cluster.kill_container(pod["spec"]["nodeName"], status["containerID"].split("://", 1)[1])

            def restarted() -> bool:
                again = cluster.get("-n", NAMESPACE, "pod", f"{NAME}-0")
                (now,) = again["status"]["containerStatuses"]
                return bool(now["restartCount"] > restarts and pod_ready(again))

            deployment.wait(restarted, POD_START_SECONDS, f"{NAME}-0's container restarted and Ready")
            deployment.figure("stateful_killed_to_ready_seconds", time.monotonic() - started)
            readings.wave(600, 899, repeat_every=4)

            # A rollout: a new pod template, each pod replaced in turn, its partitions handed over first.
            before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in consumer_pods(cluster)}
            started = time.monotonic()
            cluster.kubectl(
                "-n", NAMESPACE, "patch", "pcon", NAME, "--type", "merge", "-p",
                '{"spec": {"consumer": {"podTemplate": {"metadata": {"annotations": {"rollout": "2"}}}}}}',
            )  # fmt: skip

            def rolled() -> bool:
                pods = consumer_pods(cluster)
                fresh = all(before.get(p["metadata"]["name"]) != p["metadata"]["uid"] for p in pods)
                return fresh and len(pods) == 2 and all(pod_ready(p) for p in pods)

            deployment.wait(rolled, POD_START_SECONDS * 2, "both pods replaced and Ready")
            deployment.wait(lambda: each_pod_reads(cluster), POD_START_SECONDS, "each new pod reading")
            deployment.figure("stateful_rollout_seconds", time.monotonic() - started)
            readings.wave(900, 1199, repeat_every=6)
            readings.wave(1300, 1300)  # every partition's watermark past what came before
            expected = readings.expected(1300)
            deployment.wait(
                lambda: windows(table(deployment.storage))[0] == expected,
                WINDOWS_SECONDS,
                "every window the watermark passed, with its count",
            )
        finally:
            readings.close()
        time.sleep(5)  # a batch written twice would show now
        counts, twice = windows(table(deployment.storage))
        assert twice == 0
        assert counts == expected
        logs = cluster.logs(NAMESPACE, f"{NAME}-0")
        assert "its job's query starts from" in logs
        assert "AccountKey" not in logs and "SharedAccessKey" not in logs
        cluster.kubectl("-n", NAMESPACE, "delete", "pcon", NAME, "--wait=true", timeout=120)


def consumer_pods(cluster: ScenarioCluster) -> list[JSON]:
    items: list[JSON] = cluster.get("-n", NAMESPACE, "pods", "-l", f"{CONSUMER_LABEL}={NAME}")["items"]
    return items


def ready_pods(cluster: ScenarioCluster) -> int:
    return sum(1 for pod in consumer_pods(cluster) if pod_ready(pod))


def each_pod_reads(cluster: ScenarioCluster) -> bool:
    """Every consumer pod's metrics say it owns partitions (its owned-partitions gauge above zero)."""
    from tests.scenarios.deployed import metric

    for pod in consumer_pods(cluster):
        text = cluster.proxy_get(NAMESPACE, pod["metadata"]["name"], 9090, "/metrics")
        if metric(text, "hubshift_consumer_owned_partitions") <= 0:
            return False
    return True


def create_container(connection_string: str, name: str) -> None:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(connection_string)
    if not service.get_container_client(name).exists():
        service.create_container(name)


def table(connection_string: str) -> list[dict[str, Any]]:
    """The job's rows in the Delta table, read by delta-rs from this machine: none of Spark's code."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    parts = dict(part.split("=", 1) for part in connection_string.split(";") if "=" in part)
    options = {
        "account_name": parts["AccountName"],
        "account_key": parts["AccountKey"],
        "endpoint": parts["BlobEndpoint"],
        "allow_http": "true",
    }
    try:
        rows: list[dict[str, Any]] = (
            DeltaTable(f"az://{CONTAINER_NAME}/{TABLE}", storage_options=options)
            .to_pyarrow_table()
            .to_pylist()
        )
    except TableNotFoundError:
        return []
    return rows
