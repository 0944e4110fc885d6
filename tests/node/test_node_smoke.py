"""Smoke tests of the node tier's platform: real pods from the image built here (tools/image), run by a
real kubelet and containerd on one node inside a network namespace (tools/node). What the later scenarios
rely on: the image's entry point works in a container, a pod reaches the API server through the
`kubernetes` Service with its ServiceAccount token, and a pod under the restricted Pod Security Standard
with a read-only root file system runs."""

from __future__ import annotations

import json
import socket
from importlib.metadata import version
from typing import Any

import pytest

from tests.harness.node import NodeCluster, NodeClusterError, image_ref

pytestmark = pytest.mark.timeout(180)


def pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image_ref("hubshift"),
        # Imported into containerd by tools/node; no registry is reachable.
        "imagePullPolicy": "Never",
        "command": command,
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
            **spec,
        },
    }


def test_image_runs_hubshift_version(node_cluster: NodeCluster, node_namespace: str) -> None:
    node_cluster.apply(pod("version", ["hubshift", "--version"]), namespace=node_namespace)
    done = node_cluster.wait_for_pod(node_namespace, "version")
    assert done["spec"]["nodeName"] == node_cluster.node_name
    assert node_cluster.logs(node_namespace, "version").strip() == f"hubshift, version {version('hubshift')}"


# Runs in the pod: a SelfSubjectReview through the Service address the pod was given, with the mounted
# token and CA; prints where it went and who the API server says the pod is.
WHO_AM_I = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
request = urllib.request.Request(
    f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read(), "Content-Type": "application/json"},
    method="POST",
)
context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
review = json.load(urllib.request.urlopen(request, context=context, timeout=20))
print(json.dumps({"host": host, "port": port, "user": review["status"]["userInfo"]["username"]}))
"""


def test_pod_reaches_api_server_through_cluster_ip(node_cluster: NodeCluster, node_namespace: str) -> None:
    node_cluster.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "probe"}},
        pod("whoami", ["python", "-c", WHO_AM_I], serviceAccountName="probe"),
        namespace=node_namespace,
    )
    node_cluster.wait_for_pod(node_namespace, "whoami")
    answer = json.loads(node_cluster.logs(node_namespace, "whoami").strip().splitlines()[-1])
    service = node_cluster.get("-n", "default", "service", "kubernetes")
    assert answer["host"] == service["spec"]["clusterIP"]
    assert answer["user"] == f"system:serviceaccount:{node_namespace}:probe"
    # The Service leads to the API server's advertise address inside the namespace.
    slices = node_cluster.get(
        "-n", "default", "endpointslices", "-l", "kubernetes.io/service-name=kubernetes"
    )
    addresses = {a for item in slices["items"] for e in item["endpoints"] for a in e["addresses"]}
    assert addresses == {node_cluster.node_ip}


# As the operator's consumer pods run (hubshift/operator/render.py): read-only root, writable emptyDirs
# for HOME (Spark's working directory) and /tmp (Spark's local directories).
RESTRICTED_CONTAINER = {
    "env": [{"name": "HOME", "value": "/var/lib/hubshift"}, {"name": "SPARK_LOCAL_DIRS", "value": "/tmp"}],
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    },
    "volumeMounts": [
        {"name": "work", "mountPath": "/var/lib/hubshift"},
        {"name": "tmp", "mountPath": "/tmp"},
    ],
}

SPARK_JOB = (
    "from pyspark.sql import SparkSession; "
    "spark = SparkSession.builder.master('local[1]').getOrCreate(); "
    "print('spark-count', spark.range(1000).count()); spark.stop()"
)

# Runs in the pod: the image's user, its entry point, which places are writable, the seccomp mode, and a
# local Spark job (the JRE and PySpark of the image under these restrictions).
CHECK_RESTRICTED = (
    "id -u; hubshift --version; "
    "if touch /probe 2>/dev/null; then echo root-writable; else echo root-read-only; fi; "
    "touch /tmp/probe && echo tmp-writable; grep '^Seccomp:' /proc/self/status; "
    f'python -c "{SPARK_JOB}" 2>/dev/null'
)


def test_restricted_pod_with_read_only_root(node_cluster: NodeCluster) -> None:
    namespace = node_cluster.create_namespace(
        f"restricted-{node_cluster.name}", labels={"pod-security.kubernetes.io/enforce": "restricted"}
    )
    try:
        # The namespace really enforces the profile: a pod without the security context is refused.
        with pytest.raises(NodeClusterError, match="violates PodSecurity"):
            node_cluster.apply(pod("plain", ["true"]), namespace=namespace)
        node_cluster.apply(
            pod(
                "restricted",
                ["sh", "-c", CHECK_RESTRICTED],
                securityContext={
                    "runAsNonRoot": True,
                    "fsGroup": 10001,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                volumes=[{"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                container=RESTRICTED_CONTAINER,
            ),
            namespace=namespace,
        )
        node_cluster.wait_for_pod(namespace, "restricted", timeout=150)
        lines = node_cluster.logs(namespace, "restricted").splitlines()
        assert lines[0] == "10001"  # the Dockerfile's USER, numeric so runAsNonRoot can be verified
        assert "root-read-only" in lines and "tmp-writable" in lines
        assert "Seccomp:\t2" in lines  # filter mode: RuntimeDefault
        assert lines[-1] == "spark-count 1000"
    finally:
        node_cluster.delete_namespace(namespace)


# Runs in the pod: a TCP connection to each address given, 3 s each; prints one line per address.
CONNECT = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(target, "connected")
    except OSError as error:
        print(target, "refused" if isinstance(error, ConnectionRefusedError) else "unreachable", error)
"""


def test_pods_reach_nothing_outside_the_namespace(node_cluster: NodeCluster, node_namespace: str) -> None:
    """The namespace's link to this side carries the test's API traffic, never a pod's: a server listening on
    this side's end of it is reachable from the node's namespace but not from a pod, and an address beyond
    this machine is unreachable (no route)."""
    host_ip = node_cluster.state["host_ip"]
    with socket.create_server((host_ip, 0)) as server:
        port = server.getsockname()[1]
        from_node = node_cluster.in_node("python3", "-c", CONNECT, f"{host_ip}:{port}")
        assert "connected" in from_node.stdout, from_node
        node_cluster.apply(
            pod("outside", ["python", "-c", CONNECT, f"{host_ip}:{port}", "192.0.2.1:80"]),
            namespace=node_namespace,
        )
        node_cluster.wait_for_pod(node_namespace, "outside")
    lines = node_cluster.logs(node_namespace, "outside").splitlines()
    assert lines[0].startswith(f"{host_ip}:{port} unreachable"), lines
    assert lines[1].startswith("192.0.2.1:80 unreachable"), lines
