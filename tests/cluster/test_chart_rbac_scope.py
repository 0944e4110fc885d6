"""What the chart's RBAC lets the operator's ServiceAccount do, and where, asked of a real API server's
authorizer (SubjectAccessReview): a namespaced install reaches only its namespaces; a cluster-wide install
reaches Secrets and workloads in every namespace, kube-system included (what the chart's README, NOTES.txt
and docs/security.md say)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
import yaml

from tests.fixtures.operator import CHART
from tests.harness.control_plane import ControlPlane

RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# (verb, group, resource): reading a Secret, and what running a pod as any ServiceAccount takes.
REACH = [
    ("get", "", "secrets"),
    ("create", "apps", "statefulsets"),
    ("patch", "apps", "statefulsets"),
    ("create", "", "serviceaccounts"),
]
NEVER = [("list", "", "secrets"), ("delete", "apps", "statefulsets"), ("delete", "", "secrets")]


def allowed(plane: ControlPlane, user: str, namespace: str, verb: str, group: str, resource: str) -> bool:
    review = plane.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "name": "anything",
                },
            },
        },
    )
    return bool(review["status"].get("allowed"))


class Install:
    """The chart's RBAC objects of one release, applied; removed after (cluster-scoped ones included)."""

    def __init__(self, plane: ControlPlane, release: str, namespace: str, *sets: str) -> None:
        helm = plane.bin_dir / "helm"
        if not helm.is_file():
            pytest.skip(f"no helm in {plane.bin_dir}")
        arguments = [arg for value in sets for arg in ("--set", value)]
        rendered = subprocess.run(
            [str(helm), "template", release, str(CHART), "--namespace", namespace, *arguments],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        documents = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in RBAC_KINDS]
        self.plane = plane
        self.manifest = yaml.safe_dump_all(documents)
        (account,) = {s["name"] for d in documents if "subjects" in d for s in d["subjects"]}
        self.user = f"system:serviceaccount:{namespace}:{account}"

    def __enter__(self) -> Install:
        self.plane.kubectl("apply", "-f", "-", input=self.manifest)
        return self

    def __exit__(self, *_: object) -> None:
        self.plane.kubectl("delete", "--ignore-not-found", "-f", "-", input=self.manifest)

    def can(self, namespace: str, verb: str, group: str, resource: str) -> bool:
        return allowed(self.plane, self.user, namespace, verb, group, resource)


@pytest.fixture
def other_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"o-{uuid.uuid4().hex[:10]}"
    control_plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    try:
        yield name
    finally:
        control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


def test_a_namespaced_install_reaches_only_its_namespace(
    control_plane: ControlPlane, kube_namespace: str, other_namespace: str
) -> None:
    release = f"scope-{uuid.uuid4().hex[:6]}"
    with Install(control_plane, release, kube_namespace, "operator.watchReleaseNamespace=true") as install:
        for verb, group, resource in REACH:
            assert install.can(kube_namespace, verb, group, resource), (verb, resource)
            for elsewhere in (other_namespace, "kube-system", "default"):
                assert not install.can(elsewhere, verb, group, resource), (elsewhere, verb, resource)
        for verb, group, resource in NEVER:
            assert not install.can(kube_namespace, verb, group, resource), (verb, resource)


def test_a_cluster_wide_install_reaches_secrets_and_workloads_in_every_namespace(
    control_plane: ControlPlane, kube_namespace: str, other_namespace: str
) -> None:
    release = f"scope-{uuid.uuid4().hex[:6]}"
    with Install(control_plane, release, kube_namespace) as install:
        for namespace in (kube_namespace, other_namespace, "kube-system", "default"):
            for verb, group, resource in REACH:
                assert install.can(namespace, verb, group, resource), (namespace, verb, resource)
            for verb, group, resource in NEVER:
                assert not install.can(namespace, verb, group, resource), (namespace, verb, resource)
