"""A Spark team's job as a user deploys it on a scenario cluster (tests/scenarios/delta_job.py,
tests/scenarios/stateful_job.py): namespaces enforcing the restricted profile, `helm install` of the chart,
`kubectl create secret` of the connection strings and `kubectl create configmap --from-file=` of the job's
folder, the example with keys instead of Workload Identity and its Delta table on Azure storage over ABFS
(Azurite's Blob endpoint), read back with delta-rs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.manifest import ConsumerSpec
from tests.scenarios.cluster import JSON, ScenarioCluster
from tests.scenarios.deployed import CHART, RESTRICTED, Deployment

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class JobSite:
    """Where a job scenario installs its release and resource, and what it names its Secrets, ConfigMap and
    table."""

    release: str
    system_namespace: str
    namespace: str
    name: str
    configmap: str
    code: Path  # the folder the ConfigMap is made from
    table: str
    container: str = "lake"  # the Blob container holding the table
    secrets: dict[str, str] = field(
        default_factory=lambda: {"eventhubs": "telemetry-eventhubs", "storage": "lake-storage"}
    )

    @property
    def table_url(self) -> str:
        return f"abfs://{self.container}@devstoreaccount1.dfs.core.windows.net/{self.table}"


def keyed_example(
    example: Path,
    cluster: ScenarioCluster,
    site: JobSite,
    *,
    spark: dict[str, Any],
    resources: dict[str, Any],
    max_handoff_seconds: int,
) -> JSON:
    """`example` as this cluster runs it: connection strings (the site's Secrets) for the emulator and Azurite
    in place of Workload Identity, the table at abfs:// (Azurite speaks plain http), one pod to begin with
    and short timings; `spark` and `resources` for the consumer's size."""
    document: JSON = yaml.safe_load(example.read_text())
    spec = document["spec"]
    eventhubs = spec["eventHubs"]
    eventhubs.pop("namespace")
    eventhubs.pop("credential")
    eventhubs["consumerGroup"] = "$Default"  # the one the deployed scenarios' emulator serves
    eventhubs["connectionStringSecretRef"] = {"name": site.secrets["eventhubs"], "key": "connectionString"}
    storage_ref = {"name": site.secrets["storage"], "key": "connectionString"}
    blob = spec["checkpointStore"]["blob"]
    for key in ("accountUrl", "credential"):
        blob.pop(key)
    blob["connectionStringSecretRef"] = storage_ref
    consumer = spec["consumer"]
    delta = consumer["sink"]["delta"]
    delta.pop("credential")
    delta["path"] = site.table_url
    delta["connectionStringSecretRef"] = storage_ref
    if cluster.image.reference != ConsumerSpec().image:
        consumer["image"] = cluster.image.reference
    consumer["resources"] = resources
    consumer["spark"].update(driverMemory="512m", shufflePartitions=1, triggerIntervalSeconds=2, **spark)
    consumer["checkpoint"] = {"everySeconds": 5, "everyEvents": 1000}
    spec["scaling"].update(minReplicas=1, maxReplicas=1, pollingIntervalSeconds=2)
    spec["rebalance"].update(delaySeconds=2, maxHandoffSeconds=max_handoff_seconds)
    return document


def begin(
    scenario_cluster: ScenarioCluster, tmp_path_factory: pytest.TempPathFactory, request: Any, site: JobSite
) -> Deployment:
    """The scenario's deployment, naming the site's namespaces, release and resource."""
    deployment = Deployment.begin(scenario_cluster, tmp_path_factory, request, site.namespace)
    deployment.namespace, deployment.system_namespace = site.namespace, site.system_namespace
    deployment.release, deployment.name = site.release, site.name
    return deployment


def tear_down(deployment: Deployment, site: JobSite) -> None:
    """The resource first, while its operator still runs (it holds kopf's finalizer); then the release,
    then the CRD the release keeps (the next release installs its own), then the namespaces."""
    cluster = deployment.cluster
    deployment.stop()
    cluster.kubectl(
        "-n", site.namespace, "delete", "partitionedconsumers", "--all", "--wait", timeout=180, check=False
    )
    cluster.helm("uninstall", site.release, "-n", site.system_namespace, "--wait", check=False)
    cluster.kubectl("delete", "crd", "partitionedconsumers.hubshift.dev", "--wait", timeout=120, check=False)
    for namespace in (site.namespace, site.system_namespace):
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def install(deployment: Deployment, site: JobSite) -> None:
    """What the user does before `kubectl apply`: the namespaces, the chart, the servers (the emulator and
    Azurite), the table's container, the connection strings' Secrets and the code's ConfigMap (every file of
    the job's folder a key of it)."""
    cluster = deployment.cluster
    for namespace in (site.system_namespace, site.namespace):
        cluster.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": RESTRICTED}}
        )
    image = cluster.image
    cluster.helm(
        "install", site.release, str(CHART), "--namespace", site.system_namespace,
        "--set", f"image.repository={image.repository}", "--set", f"image.tag={image.tag}",
        "--set", f"image.pullPolicy={image.pull_policy}",
    )  # fmt: skip
    deployment.start_servers()
    create_container(deployment.storage, site.container)
    for secret, value in (
        (site.secrets["eventhubs"], deployment.eventhubs),
        (site.secrets["storage"], deployment.storage),
    ):
        cluster.kubectl(
            "-n",
            site.namespace,
            "create",
            "secret",
            "generic",
            secret,
            f"--from-literal=connectionString={value}",
        )
    cluster.kubectl("-n", site.namespace, "create", "configmap", site.configmap, f"--from-file={site.code}")


def create_container(connection_string: str, name: str) -> None:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(connection_string)
    if not service.get_container_client(name).exists():
        service.create_container(name)


def delta_table(connection_string: str, site: JobSite) -> Any:
    """The site's Delta table, opened by delta-rs from this machine (none of Spark's code); None before
    its first commit."""
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
        return DeltaTable(f"az://{site.container}/{site.table}", storage_options=options)
    except TableNotFoundError:
        return None
