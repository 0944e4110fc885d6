"""A Spark team's own job as a user deploys it (examples/delta.yaml): `helm install` the chart, `kubectl
create configmap homes-job --from-file=examples/delta/` (the job's module and its lookup file), `kubectl
apply` of the example with keys instead of Workload Identity (the only change besides sizes and timings),
the Delta table on Azure storage over ABFS (Azurite's Blob endpoint; tests/scenarios/spark_job.py). A
consumer pod is deleted mid-run; an independent reader (delta-rs, none of Spark's code) then finds every
event sent in exactly one row.

Each tier subclasses `DeltaJobScenario` with a `scenario_cluster` fixture (tests/node/test_node_delta.py).
Figures go to bench/results/<cluster>_tier.json with the deployed scenarios'.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from hubshift.apps.produce import LoadSpec
from tests.scenarios.cluster import JSON, ScenarioCluster, pod_ready
from tests.scenarios.deployed import Deployment
from tests.scenarios.spark_job import (
    REPO_ROOT,
    JobSite,
    begin,
    delta_table,
    install,
    keyed_example,
    tear_down,
)

EXAMPLE = REPO_ROOT / "examples" / "delta.yaml"
SITE = JobSite(
    release="hubshift-delta",
    system_namespace="delta-system",
    namespace="delta",
    name="homes-delta",
    configmap="homes-job",
    code=REPO_ROOT / "examples" / "delta",
    table="homes",
)
POD_START_SECONDS = 360
ROWS_SECONDS = 300


def delta_example(cluster: ScenarioCluster) -> JSON:
    """examples/delta.yaml as this cluster runs it, with one small Spark pod."""
    return keyed_example(
        EXAMPLE,
        cluster,
        SITE,
        spark={"master": "local[1]", "maxEventsPerTrigger": 1000},
        resources={"requests": {"cpu": "100m", "memory": "768Mi"}, "limits": {"memory": "1536Mi"}},
        max_handoff_seconds=30,
    )


class DeltaJobScenario:
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

    @pytest.mark.timeout(1200)
    def test_a_spark_teams_delta_job_from_a_configmap_writes_every_event_once(
        self, deployment: Deployment
    ) -> None:
        cluster = deployment.cluster
        install(deployment, SITE)
        manifest = deployment.workdir / "delta.yaml"
        manifest.write_text(yaml.safe_dump(delta_example(cluster), sort_keys=False))

        total = 0
        started = time.monotonic()
        cluster.kubectl("-n", SITE.namespace, "apply", "-f", str(manifest))
        total += deployment.send(LoadSpec(homes=300, count=1500, rate=3000, seed=21))
        deployment.wait(
            lambda: table_rows(deployment.storage)[0] > 0, POD_START_SECONDS, "the first rows in the table"
        )
        deployment.figure("delta_apply_to_first_rows_seconds", time.monotonic() - started)

        # Deleted mid-run, as a node drain or `kubectl delete pod` does: the replacement resumes from the
        # checkpoints, replays what came after them, and the table keeps one row per event.
        total += deployment.send(LoadSpec(homes=300, count=1500, rate=3000, seed=22))
        (pod,) = deployment.consumer_pods()
        deleted = time.monotonic()
        cluster.kubectl("-n", SITE.namespace, "delete", "pod", pod["metadata"]["name"], "--wait=false")
        deployment.wait(
            lambda: [
                p
                for p in deployment.consumer_pods()
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
        logs = cluster.logs(SITE.namespace, f"{SITE.name}-0")
        assert "spark engine starting" in logs
        assert "AccountKey" not in logs and "SharedAccessKey" not in logs
        cluster.kubectl("-n", SITE.namespace, "delete", "pcon", SITE.name, "--wait=true", timeout=120)


def table_rows(connection_string: str) -> tuple[int, int]:
    """(rows, distinct events) of the table, read by delta-rs from this machine: none of Spark's code."""
    table = delta_table(connection_string, SITE)
    if table is None:
        return 0, 0
    rows = table.to_pyarrow_table(columns=["partition", "sequence_number"]).to_pylist()
    return len(rows), len({(r["partition"], r["sequence_number"]) for r in rows})
