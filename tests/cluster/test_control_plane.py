"""Smoke tests of the cluster tier's platform: the control plane built from Go modules behaves like a
cluster for what the operator needs (CRDs and custom resources, StatefulSets whose pods run on KWOK nodes
with stable names, scale-in, garbage collection through owner references, RBAC), and pods can be backed by
local processes (PodProcessRunner), which is how the operator's tests run consumer pods here.

Pods as local processes: no kubelet and no container runtime run here, so a pod never executes anything;
KWOK reports it Running. A test that needs the pod's program starts `PodProcessRunner(plane, namespace,
selector, ["hubshift", "consume", "--identity", "{pod}", ...])`, which keeps one local process per Running
pod (the pod name is the identity) and terminates it when the pod goes. See
tests/harness/control_plane.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import eventually
from tests.harness.control_plane import ControlPlane, PodProcessRunner, start_control_plane

pytestmark = pytest.mark.timeout(180)


def statefulset(name: str, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "consumer", "image": "hubshift:never-pulled"}],
                },
            },
        },
    }


def running_pods(core: Any, namespace: str, selector: str) -> dict[str, str]:
    """Pod name -> node name, of the Running, not-deleting pods matching `selector`."""
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return {
        p.metadata.name: p.spec.node_name
        for p in pods
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
    }


def pod_names(core: Any, namespace: str, selector: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector=selector).items}


def test_server_is_the_pinned_version_and_ready(control_plane: ControlPlane) -> None:
    version = control_plane.request("GET", "/version")
    assert version["gitVersion"].startswith("v1."), version
    assert control_plane.readyz()
    nodes = control_plane.request("GET", "/api/v1/nodes")["items"]
    assert {n["metadata"]["name"] for n in nodes} >= set(control_plane.nodes)


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.smoke.hubshift.dev"},
    "spec": {
        "group": "smoke.hubshift.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["partitions"],
                                "properties": {"partitions": {"type": "integer", "minimum": 1}},
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def widget_crd(control_plane: ControlPlane) -> str:
    from tests.harness.control_plane import ApiError

    try:
        control_plane.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    except ApiError as error:
        if error.status != 409:
            raise

    def established() -> bool:
        crd = control_plane.request(
            "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.smoke.hubshift.dev"
        )
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    eventually(established, 30, "the CRD to be established")
    return "widgets"


def test_crd_and_custom_resource(kube_api: Any, kube_namespace: str, widget_crd: str) -> None:
    import kubernetes

    custom = kubernetes.client.CustomObjectsApi(kube_api)
    body = {"apiVersion": "smoke.hubshift.dev/v1", "kind": "Widget", "metadata": {"name": "w"}}

    def create(spec: dict[str, Any]) -> Any:
        return custom.create_namespaced_custom_object(
            "smoke.hubshift.dev", "v1", kube_namespace, widget_crd, {**body, "spec": spec}
        )

    # The structural schema is enforced by the API server, with a message naming the field.
    with pytest.raises(kubernetes.client.ApiException) as refused:
        create({"partitions": 0})
    assert refused.value.status == 422
    assert "spec.partitions" in str(refused.value.body)

    create({"partitions": 4})
    got = custom.get_namespaced_custom_object("smoke.hubshift.dev", "v1", kube_namespace, widget_crd, "w")
    assert got["spec"] == {"partitions": 4}
    custom.patch_namespaced_custom_object_status(
        "smoke.hubshift.dev", "v1", kube_namespace, widget_crd, "w", {"status": {"phase": "Ready"}}
    )
    got = custom.get_namespaced_custom_object("smoke.hubshift.dev", "v1", kube_namespace, widget_crd, "w")
    assert got["status"] == {"phase": "Ready"}


def test_statefulset_pods_run_on_kwok_nodes_scale_in_and_garbage_collection(
    control_plane: ControlPlane, kube_api: Any, kube_namespace: str
) -> None:
    import kubernetes

    apps = kubernetes.client.AppsV1Api(kube_api)
    core = kubernetes.client.CoreV1Api(kube_api)
    selector = "app=smoke"
    apps.create_namespaced_stateful_set(kube_namespace, statefulset("smoke", 3, {"app": "smoke"}))

    expected = {"smoke-0", "smoke-1", "smoke-2"}
    placed = eventually(
        lambda: (pods := running_pods(core, kube_namespace, selector)) and set(pods) == expected and pods,
        90,
        "3 Running pods",
    )
    assert set(placed.values()) <= set(control_plane.nodes), placed
    sts = eventually(
        lambda: (
            (s := apps.read_namespaced_stateful_set("smoke", kube_namespace)).status.ready_replicas == 3 and s
        ),
        30,
        "the StatefulSet to report 3 ready replicas",
    )
    assert sts.status.ready_replicas == 3

    apps.patch_namespaced_stateful_set_scale("smoke", kube_namespace, {"spec": {"replicas": 1}})
    eventually(lambda: pod_names(core, kube_namespace, selector) == {"smoke-0"}, 60, "scale-in to smoke-0")
    assert set(running_pods(core, kube_namespace, selector)) == {"smoke-0"}

    # Deleting the owner: the garbage collector follows the pods' ownerReferences.
    apps.delete_namespaced_stateful_set("smoke", kube_namespace, propagation_policy="Background")
    eventually(lambda: not pod_names(core, kube_namespace, selector), 60, "garbage collection of smoke-0")


def test_garbage_collection_of_children_owned_by_a_custom_resource(
    kube_api: Any, kube_namespace: str, widget_crd: str
) -> None:
    """The operator's pattern: children carry an ownerReference to the custom resource."""
    import kubernetes

    custom = kubernetes.client.CustomObjectsApi(kube_api)
    core = kubernetes.client.CoreV1Api(kube_api)
    owner = custom.create_namespaced_custom_object(
        "smoke.hubshift.dev",
        "v1",
        kube_namespace,
        widget_crd,
        {
            "apiVersion": "smoke.hubshift.dev/v1",
            "kind": "Widget",
            "metadata": {"name": "owner"},
            "spec": {"partitions": 2},
        },
    )
    reference = {
        "apiVersion": "smoke.hubshift.dev/v1",
        "kind": "Widget",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    core.create_namespaced_config_map(
        kube_namespace, {"metadata": {"name": "child", "ownerReferences": [reference]}, "data": {"a": "b"}}
    )
    custom.delete_namespaced_custom_object(
        "smoke.hubshift.dev", "v1", kube_namespace, widget_crd, "owner", propagation_policy="Foreground"
    )

    def child_gone() -> bool:
        return not [
            c for c in core.list_namespaced_config_map(kube_namespace).items if c.metadata.name == "child"
        ]

    eventually(child_gone, 60, "the ConfigMap owned by the custom resource to be collected")


def test_rbac_refuses_what_an_identity_may_not_do(control_plane: ControlPlane, kube_namespace: str) -> None:
    import kubernetes

    admin = kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(
        kube_namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        kube_namespace,
        {
            "metadata": {"name": "pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [
                {"kind": "ServiceAccount", "name": "reader", "namespace": kube_namespace},
                {"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"},
            ],
        },
    )
    service_account = control_plane.kubeconfig_for_service_account(kube_namespace, "reader")
    alice = control_plane.kubeconfig_for_user("alice", groups=["smoke-testers"])
    bob = control_plane.kubeconfig_for_user("bob")
    try:
        for kubeconfig in (service_account, alice):
            client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
            core = kubernetes.client.CoreV1Api(client)
            # RBAC bindings apply at once, but allow the authorizer's informer a moment to see them.
            eventually(
                lambda core=core: _allowed(lambda: core.list_namespaced_pod(kube_namespace)), 10, "list"
            )
            with pytest.raises(kubernetes.client.ApiException) as refused:
                core.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "nope"}})
            assert refused.value.status == 403
            with pytest.raises(kubernetes.client.ApiException) as refused:
                core.list_namespaced_pod("default")
            assert refused.value.status == 403
            client.close()
        nobody = kubernetes.config.new_client_from_config(config_file=str(bob))
        with pytest.raises(kubernetes.client.ApiException) as refused:
            kubernetes.client.CoreV1Api(nobody).list_namespaced_pod(kube_namespace)
        assert refused.value.status == 403
        assert "bob" in str(refused.value.body)
        nobody.close()
    finally:
        admin.close()


def _allowed(call: Callable[[], object]) -> bool:
    import kubernetes

    try:
        call()
        return True
    except kubernetes.client.ApiException as error:
        if error.status == 403:
            return False
        raise


def test_pods_run_as_local_processes(control_plane: ControlPlane, kube_api: Any, kube_namespace: str) -> None:
    import kubernetes

    apps = kubernetes.client.AppsV1Api(kube_api)
    apps.create_namespaced_stateful_set(kube_namespace, statefulset("consumer", 2, {"app": "consumer"}))
    with PodProcessRunner(
        control_plane,
        kube_namespace,
        "app=consumer",
        ["sleep", "300"],
        env={"HUBSHIFT_IDENTITY": "{pod}", "HUBSHIFT_ORDINAL": "{ordinal}"},
    ) as runner:
        pids = runner.wait_for_pods({"consumer-0", "consumer-1"}, timeout=90)
        # /proc/<pid>/environ is filled in a moment after exec returns to the parent: poll it.
        environ = eventually(lambda: (env := _environ(pids["consumer-1"])) and "POD_NAME" in env and env, 10)
        assert environ["HUBSHIFT_IDENTITY"] == "consumer-1"
        assert environ["HUBSHIFT_ORDINAL"] == "1"
        assert environ["POD_NAME"] == "consumer-1"
        assert environ["POD_NAMESPACE"] == kube_namespace

        # A process that dies while its pod runs is restarted (restartPolicy Always), same identity.
        os.kill(pids["consumer-0"], signal.SIGKILL)
        restarted = eventually(
            lambda: (now := runner.pids()).get("consumer-0") not in (None, pids["consumer-0"]) and now,
            30,
            "consumer-0's process to be restarted",
        )
        assert restarted["consumer-1"] == pids["consumer-1"]

        # A pod deleted and recreated under the same name (new UID) gets a new process.
        control_plane.kubectl("delete", "pod", "consumer-1", "-n", kube_namespace, "--wait=false")
        replaced = eventually(
            lambda: (now := runner.pids()).get("consumer-1") not in (None, pids["consumer-1"]) and now,
            60,
            "consumer-1's process to be replaced",
        )
        assert ("stopping", "consumer-1") in [(e.kind, e.pod) for e in runner.events]

        # Scale-in: the pod goes, so does its process (SIGTERM).
        apps.patch_namespaced_stateful_set_scale("consumer", kube_namespace, {"spec": {"replicas": 1}})
        runner.wait_for_pods({"consumer-0"}, timeout=60)
        # SIGTERM was sent when the pod went; the process is gone (or a zombie until reaped) a moment later.
        eventually(lambda: _is_gone(replaced["consumer-1"]), 10, "consumer-1's process to end")
        kinds = [(e.kind, e.pod) for e in runner.events]
        assert kinds.count(("stopping", "consumer-1")) == 2
        assert ("exited", "consumer-0") in kinds
        last = runner.pids()
    for pid in last.values():
        assert _is_gone(pid)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _is_gone(pid: int) -> bool:
    """The process has ended: no longer in /proc, or a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def test_start_and_stop_a_second_control_plane(tmp_path: Path, control_plane: ControlPlane) -> None:
    """Start-up time of a fresh control plane (reported), and stop() leaves no process behind."""
    plane = start_control_plane(tmp_path, bin_dir=control_plane.bin_dir, nodes=1)
    try:
        print(f"second control plane ready in {plane.startup_seconds:.1f} s")
        assert plane.readyz()
        pids = {name: p.pid for name, p in plane.processes.items()}
    finally:
        plane.stop()
    for name, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) still running"
    assert not (tmp_path / "etcd-data").exists()
