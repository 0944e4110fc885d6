"""The PartitionedConsumer's /scale subresource on a real kube-apiserver: the CRD with its schema (spec
replicas, status replicas and selector, conditions as a list-map) is accepted; a scale through /scale (what
`kubectl scale`, an HPA or KEDA do) sets spec.replicas, and the operator's control loop plans exactly that
many consumers; `hubshift status pcon/NAME` reads the resource with the person's kubeconfig."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hubshift.operator.kubernetes.api import consumer_pod_selector
from hubshift.operator.kubernetes.crd import CRD_NAME
from tests.fixtures.cluster import eventually
from tests.fixtures.operator import CRS, example_manifest
from tests.harness import fixed_hub
from tests.harness.control_plane import ApiError

pytestmark = pytest.mark.timeout(240)


def resource(namespace: str) -> dict[str, Any]:
    document = example_manifest(namespace)
    document["spec"]["scaling"].update(minReplicas=1, maxReplicas=2, pollingIntervalSeconds=1)
    document["spec"]["rebalance"] = {"delaySeconds": 2, "maxHandoffSeconds": 5}
    return document


def test_the_crd_declares_scale_and_the_server_keeps_one_condition_per_type(
    control_plane: Any, kube_namespace: str, hubshift_crd: str
) -> None:
    stored = control_plane.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    )
    version = stored["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    conditions = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"

    ns = kube_namespace
    control_plane.request("POST", CRS.format(ns=ns), resource(ns))
    twice = {
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}]}
    }
    with pytest.raises(ApiError) as refused:
        control_plane.request("PATCH", f"{CRS.format(ns=ns)}/homes/status", twice)
    assert refused.value.status == 422 and "Duplicate value" in str(refused.value)
    with pytest.raises(ApiError) as negative:
        control_plane.request("PATCH", f"{CRS.format(ns=ns)}/homes", {"spec": {"replicas": -1}})
    assert negative.value.status == 422


def test_a_scale_through_the_subresource_is_planned_by_the_operator(
    control_plane: Any, kube_namespace: str, start_operator: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    operator = start_operator(control_loop=fixed_hub.OPENER, environ={fixed_hub.STORE_DIR_ENV: str(tmp_path)})
    control_plane.request("POST", CRS.format(ns=ns), resource(ns))
    scale_path = f"{CRS.format(ns=ns)}/homes/scale"

    def reported() -> dict[str, Any] | None:
        status: dict[str, Any] = control_plane.request("GET", f"{CRS.format(ns=ns)}/homes").get("status", {})
        return status if status.get("replicas") == 1 and status.get("selector") else None

    # spec.replicas unset: the autoscaler decides (minReplicas 1); /scale has no count to show yet.
    status = eventually(reported, timeout=90, what=lambda: f"status.replicas 1\n{operator.log()[-3000:]}")
    assert status["selector"] == consumer_pod_selector("homes")
    with pytest.raises(ApiError, match="spec replicas field"):
        control_plane.request("GET", scale_path)

    # kubectl scale pcon/homes --replicas=3 (a patch of /scale): above maxReplicas (2), which does not
    # bound a manual count.
    control_plane.request("PATCH", scale_path, {"spec": {"replicas": 3}})
    stored = control_plane.request("GET", f"{CRS.format(ns=ns)}/homes")
    assert stored["spec"]["replicas"] == 3

    def planned_for_three() -> dict[str, Any] | None:
        status: dict[str, Any] = control_plane.request("GET", f"{CRS.format(ns=ns)}/homes").get("status", {})
        named = {entry["consumer"] for key in ("assignment", "planned") for entry in status.get(key, [])}
        done = status.get("desiredReplicas") == 3 and named == {"homes-0", "homes-1", "homes-2"}
        return status if done else None

    status = eventually(planned_for_three, timeout=90, what=lambda: f"a plan for 3\n{operator.log()[-3000:]}")
    active = next(c for c in status["conditions"] if c["type"] == "Active")
    assert active["reason"] == "SpecReplicas" and "spec.replicas 3" in active["message"]
    statefulset = control_plane.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes")
    assert statefulset["spec"]["replicas"] == 3
    scale = eventually(
        lambda: (s := control_plane.request("GET", scale_path))["status"]["replicas"] == 3 and s
    )
    assert scale["spec"]["replicas"] == 3


def test_a_resource_created_at_a_count_gets_a_statefulset_created_at_it(
    control_plane: Any, kube_namespace: str, start_operator: Any, tmp_path: Path
) -> None:
    """`spec.replicas` set when the resource is created (a manifest with a count, a pool scaled before the
    operator saw it): the StatefulSet is created at that count, not at the autoscaler's minimum and then
    scaled (one generation of its spec, never a replica count below it)."""
    ns = kube_namespace
    operator = start_operator(control_loop=fixed_hub.OPENER, environ={fixed_hub.STORE_DIR_ENV: str(tmp_path)})
    document = resource(ns)
    document["spec"]["replicas"] = 2
    control_plane.request("POST", CRS.format(ns=ns), document)
    path = f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes"

    def created() -> dict[str, Any] | None:
        try:
            return dict(control_plane.request("GET", path))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    statefulset = eventually(created, timeout=90, what=lambda: f"the StatefulSet\n{operator.log()[-3000:]}")
    assert statefulset["spec"]["replicas"] == 2
    assert statefulset["metadata"]["generation"] == 1


def test_hubshift_status_of_a_resource_reads_it_with_the_kubeconfig_and_says_what_is_missing(
    control_plane: Any, kube_namespace: str, hubshift_crd: str
) -> None:
    ns = kube_namespace
    environ = control_plane.environ()

    def status(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hubshift.cli", "status", *args]
        return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=60, check=False)

    absent = status("pcon/homes", "-n", ns)
    assert absent.returncode != 0 and "Traceback" not in absent.stderr
    assert absent.stderr.strip() == f"hubshift: error: PartitionedConsumer {ns}/homes: not found"

    control_plane.request("POST", CRS.format(ns=ns), resource(ns))
    no_secret = status("pcon/homes", "-n", ns, "--output", "json")
    assert no_secret.returncode != 0 and "Traceback" not in no_secret.stderr
    assert no_secret.stderr.strip() == f"hubshift: error: Secret {ns}/telemetry-eventhubs: not found"

    wrong = status("deployment/homes", "-n", ns)
    assert wrong.returncode != 0 and "expected pcon/NAME" in wrong.stderr
