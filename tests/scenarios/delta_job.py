"""A Spark team's own job as a user deploys it (examples/delta.yaml): `helm install` the chart, `kubectl
create configmap homes-job --from-file=examples/delta/` (the job's module and its lookup file), `kubectl
apply` of the example with keys instead of Workload Identity (the only change besides sizes and timings),
the Delta table on Azure storage over ABFS (Azurite's Blob endpoint). A consumer pod is deleted mid-run;
an independent reader (delta-rs, none of Spark's code) then finds every event sent in exactly one row.

Each tier subclasses `DeltaJobScenario` with a `scenario_cluster` fixture (tests/node/test_node_delta.py).
Figures go to bench/results/<cluster>_tier.json with the deployed scenarios'.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.apps.produce import LoadSpec
from hubshift.manifest import ConsumerSpec
from hubshift.operator.kubernetes.render import CONSUMER_LABEL
from tests.scenarios.cluster import JSON, ScenarioCluster, pod_ready
from tests.scenarios.deployed import CHART, RESTRICTED, Deployment

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "delta.yaml"
CODE = REPO_ROOT / "examples" / "delta"

RELEASE = "hubshift-delta"
SYSTEM_NAMESPACE = "delta-system"
NAMESPACE = "delta"
NAME = "homes-delta"
CONTAINER_NAME = "lake"  # the Blob container holding the table
TABLE = "homes"
SECRETS = {"eventhubs": "telemetry-eventhubs", "storage": "lake-storage"}
POD_START_SECONDS = 360
ROWS_SECONDS = 300


def delta_example(cluster: ScenarioCluster) -> JSON:
    """examples/delta.yaml as this cluster runs it: connection strings (Secrets) for the emulator and Azurite
    in place of Workload Identity, the table at abfs:// (Azurite speaks plain http), one small Spark pod."""
    document: JSON = yaml.safe_load(EXAMPLE.read_text())
    spec = document["spec"]
    eventhubs = spec["eventHubs"]
    eventhubs.pop("namespace")
    eventhubs.pop("credential")
    eventhubs["consumerGroup"] = "$Default"  # the one the deployed scenarios' emulator serves
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
    consumer["resources"] = {"requests": {"cpu": "100m", "memory": "768Mi"}, "limits": {"memory": "1536Mi"}}
    consumer["spark"].update(
        master="local[1]", driverMemory="512m", shufflePartitions=1, triggerIntervalSeconds=2,
        maxEventsPerTrigger=1000,
    )  # fmt: skip
    consumer["checkpoint"] = {"everySeconds": 5, "everyEvents": 1000}
    spec["scaling"].update(minReplicas=1, maxReplicas=1, pollingIntervalSeconds=2)
    spec["rebalance"].update(delaySeconds=2, maxHandoffSeconds=30)
    return document


class DeltaJobScenario:
    """Subclass as `Test...` in a tier, with a `scenario_cluster` fixture."""

    @pytest.fixture(scope="class")
    def deployment(
        self, scenario_cluster: ScenarioCluster, tmp_path_factory: pytest.TempPathFactory, request: Any
    ) -> Iterator[Deployment]:
        deployment = Deployment.begin(scenario_cluster, tmp_path_factory, request, "delta")
        try:
            yield deployment
        finally:
            deployment.stop()
            # The resource first, while its operator still runs (it holds kopf's finalizer); then the
            # release, then the CRD the release keeps: the next release installs its own.
            scenario_cluster.kubectl(
                "-n", NAMESPACE, "delete", "partitionedconsumers", "--all", "--wait", timeout=180, check=False
            )
            scenario_cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NAMESPACE, "--wait", check=False)
            scenario_cluster.kubectl(
                "delete", "crd", "partitionedconsumers.hubshift.dev", "--wait", timeout=120, check=False
            )
            for namespace in (NAMESPACE, SYSTEM_NAMESPACE):
                scenario_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)

    @pytest.mark.timeout(1200)
    def test_a_spark_teams_delta_job_from_a_configmap_writes_every_event_once(
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
        # The user's own command for the code: every file of the folder a key of the ConfigMap.
        cluster.kubectl("-n", NAMESPACE, "create", "configmap", "homes-job", f"--from-file={CODE}")
        manifest = deployment.workdir / "delta.yaml"
        manifest.write_text(yaml.safe_dump(delta_example(cluster), sort_keys=False))

        total = 0
        started = time.monotonic()
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(manifest))
        total += deployment.send(LoadSpec(homes=300, count=1500, rate=3000, seed=21))
        deployment.wait(
            lambda: table_rows(deployment.storage)[0] > 0, POD_START_SECONDS, "the first rows in the table"
        )
        deployment.figure("delta_apply_to_first_rows_seconds", time.monotonic() - started)

        # Deleted mid-run, as a node drain or `kubectl delete pod` does: the replacement resumes from the
        # checkpoints, replays what came after them, and the table keeps one row per event.
        total += deployment.send(LoadSpec(homes=300, count=1500, rate=3000, seed=22))
        (pod,) = consumer_pods(cluster)
        deleted = time.monotonic()
        cluster.kubectl("-n", NAMESPACE, "delete", "pod", pod["metadata"]["name"], "--wait=false")
        deployment.wait(
            lambda: [
                p
                for p in consumer_pods(cluster)
                if pod_ready(p) and p["metadata"]["uid"] != pod["metadata"]["uid"]
            ],
            POD_START_SECONDS,
            "the replacement pod Ready",
        )
        deployment.figure("delta_pod_deleted_to_ready_seconds", time.monotonic() - deleted)
        total += deployment.send(LoadSpec(homes=300, count=1000, rate=3000, seed=23))
        deployment.wait(
            lambda: table_rows(deployment.storage)[0] >= total, ROWS_SECONDS, f"{total} rows in the table"
        )
        time.sleep(5)  # a batch written twice would show now
        assert table_rows(deployment.storage) == (total, total)
        logs = cluster.logs(NAMESPACE, f"{NAME}-0")
        assert "spark engine starting" in logs
        assert "AccountKey" not in logs and "SharedAccessKey" not in logs
        cluster.kubectl("-n", NAMESPACE, "delete", "pcon", NAME, "--wait=true", timeout=120)


def consumer_pods(cluster: ScenarioCluster) -> list[JSON]:
    items: list[JSON] = cluster.get("-n", NAMESPACE, "pods", "-l", f"{CONSUMER_LABEL}={NAME}")["items"]
    return items


def create_container(connection_string: str, name: str) -> None:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(connection_string)
    if not service.get_container_client(name).exists():
        service.create_container(name)


def table_rows(connection_string: str) -> tuple[int, int]:
    """(rows, distinct events) of the table, read by delta-rs from this machine: none of Spark's code."""
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
        table = DeltaTable(f"az://{CONTAINER_NAME}/{TABLE}", storage_options=options)
    except TableNotFoundError:
        return 0, 0
    rows = table.to_pyarrow_table(columns=["partition", "sequence_number"]).to_pylist()
    return len(rows), len({(r["partition"], r["sequence_number"]) for r in rows})
