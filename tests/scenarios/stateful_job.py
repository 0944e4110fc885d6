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
from typing import Any

import pytest
import yaml

from tests.harness.windows import Readings, windows
from tests.scenarios.cluster import JSON, ScenarioCluster, pod_ready
from tests.scenarios.deployed import HUB, PARTITIONS, Deployment
from tests.scenarios.spark_job import (
    REPO_ROOT,
    JobSite,
    begin,
    delta_table,
    install,
    keyed_example,
    tear_down,
)

EXAMPLE = REPO_ROOT / "examples" / "stateful.yaml"
SITE = JobSite(
    release="hubshift-stateful",
    system_namespace="stateful-system",
    namespace="stateful",
    name="homes-stateful",
    configmap="homes-stream",
    code=REPO_ROOT / "examples" / "stateful",
    table="home-windows",
)
NAMESPACE, NAME = SITE.namespace, SITE.name
POD_START_SECONDS = 420
WINDOWS_SECONDS = 420


def stateful_example(cluster: ScenarioCluster) -> JSON:
    """examples/stateful.yaml as this cluster runs it (its state beside the checkpoint store on Azurite), one
    Spark pod to begin with; a query per partition, each its own Python source runner beside the JVM (four
    at first, on one pod): hence the memory."""
    return keyed_example(
        EXAMPLE,
        cluster,
        SITE,
        spark={"master": "local[2]", "maxEventsPerTrigger": 2000},
        resources={"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}},
        max_handoff_seconds=60,
    )


class StatefulJobScenario:
    """Subclass as `Test...` in a tier, with a `scenario_cluster` fixture."""

    @pytest.fixture(scope="class")
    def deployment(
        self, scenario_cluster: ScenarioCluster, tmp_path_factory: pytest.TempPathFactory, request: Any
    ) -> Iterator[Deployment]:
        deployment = begin(scenario_cluster, tmp_path_factory, request, SITE)
        try:
            yield deployment
        finally:
            tear_down(deployment, SITE)

    @pytest.mark.timeout(2400)
    def test_a_streaming_jobs_windows_are_exact_through_a_scale_out_a_kill_9_and_a_rollout(
        self, deployment: Deployment
    ) -> None:
        cluster = deployment.cluster
        install(deployment, SITE)
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
            deployment.wait(lambda: ready_pods(deployment) == 2, POD_START_SECONDS, "two pods Ready")
            deployment.wait(
                lambda: each_pod_reads(deployment), POD_START_SECONDS, "each pod reading its share"
            )
            deployment.figure("stateful_scale_out_seconds", time.monotonic() - started)
            readings.wave(300, 599, repeat_every=5)

            # A kill -9 of a pod's container: its partitions' state restored from their checkpoints.
            started = time.monotonic()
            deployment.kill_container(f"{NAME}-0", POD_START_SECONDS)
            deployment.figure("stateful_killed_to_ready_seconds", time.monotonic() - started)
            readings.wave(600, 899, repeat_every=4)

            # A rollout: a new pod template, each pod replaced in turn, its partitions handed over first.
            before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in deployment.consumer_pods()}
            started = time.monotonic()
            cluster.kubectl(
                "-n", NAMESPACE, "patch", "pcon", NAME, "--type", "merge", "-p",
                '{"spec": {"consumer": {"podTemplate": {"metadata": {"annotations": {"rollout": "2"}}}}}}',
            )  # fmt: skip

            def rolled() -> bool:
                pods = deployment.consumer_pods()
                fresh = all(before.get(p["metadata"]["name"]) != p["metadata"]["uid"] for p in pods)
                return fresh and len(pods) == 2 and all(pod_ready(p) for p in pods)

            deployment.wait(rolled, POD_START_SECONDS * 2, "both pods replaced and Ready")
            deployment.wait(lambda: each_pod_reads(deployment), POD_START_SECONDS, "each new pod reading")
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


def ready_pods(deployment: Deployment) -> int:
    return sum(1 for pod in deployment.consumer_pods() if pod_ready(pod))


def each_pod_reads(deployment: Deployment) -> bool:
    """Every consumer pod's metrics say it owns partitions (its owned-partitions gauge above zero)."""
    from tests.scenarios.deployed import metric

    return all(
        metric(deployment.pod_metrics(pod["metadata"]["name"]), "hubshift_consumer_owned_partitions") > 0
        for pod in deployment.consumer_pods()
    )


def table(connection_string: str) -> list[dict[str, Any]]:
    """The job's rows in the Delta table, read by delta-rs from this machine: none of Spark's code."""
    found = delta_table(connection_string, SITE)
    rows: list[dict[str, Any]] = [] if found is None else found.to_pyarrow_table().to_pylist()
    return rows
