"""Security issue 35 on a real kube-apiserver: what a PartitionedConsumer may make the operator read and
run, proven with the API server's audit log (what the operator's ServiceAccount asked for) and the objects it
made.

- A Secret name is never a path: lightkube joins it into the request's URL as it is, so
  `../../team-b/secrets/eh` named in team-a read team-b's Secret (`read_secret` now refuses it first).
- A control loop runs only the spec whose children the API server accepted: a refused edit no longer
  reopens it with the Secrets the refused spec names.
- Consumer pods run as the ServiceAccount the operator creates for their resource, or one an administrator
  allowed (`operator.allowedServiceAccounts`); never another that exists.
- The operator serves no resource in its own namespace unless it watches that namespace by name.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from hubshift.operator.kubernetes.api import KubeAdapter, SecretUnavailable
from hubshift.operator.kubernetes.render import CHILDREN_APPLIED, MANAGER
from hubshift.spec import SecretKeyRefSpec
from tests.fixtures.cluster import eventually
from tests.fixtures.operator import CRS, example_manifest
from tests.harness.control_plane import ApiError, ControlPlane
from tests.harness.report_only import SECRET_READING_OPENER

pytestmark = pytest.mark.timeout(240)

STOLEN = "Endpoint=sb://team-b.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=STOLEN-c0ffee"


def secret(name: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"connectionString": value},
    }


@pytest.fixture
def other_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A second namespace (another team's), deleted after the test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    try:
        yield name
    finally:
        try:
            control_plane.request("DELETE", f"/api/v1/namespaces/{name}")
        except ApiError:
            pass


def secret_gets(plane: ControlPlane, user: str) -> list[tuple[str, str]]:
    """(namespace, name) of every Secret `user` asked the API server for, in order."""
    return [(r.namespace, r.name) for r in plane.audited() if r.user == user and r.resource == "secrets"]


async def test_a_secret_name_that_is_a_path_reads_no_other_namespaces_secret(
    control_plane: ControlPlane, kube_namespace: str, other_namespace: str
) -> None:
    """The reproduction: a ServiceAccount that may `get` Secrets everywhere (the chart's default, cluster-wide
    install) reads, for a resource in team-a, `../../team-b/secrets/eh`: the request went to
    /api/v1/namespaces/team-b/secrets/eh and returned team-b's connection string. Now nothing is asked."""
    ns, other = kube_namespace, other_namespace
    control_plane.request("POST", f"/api/v1/namespaces/{other}/secrets", secret("eh", STOLEN))
    control_plane.request("POST", f"/api/v1/namespaces/{ns}/secrets", secret("eh", "Endpoint=sb://own/;x=y"))
    role = f"secret-reader-{ns}"
    control_plane.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
        },
    )
    control_plane.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
        },
    )
    kubeconfig = control_plane.kubeconfig_for_service_account(ns, "reader")
    kube = KubeAdapter(AsyncClient(config=KubeConfig.from_file(str(kubeconfig)), field_manager=MANAGER))
    try:
        # The model and the CRD refuse such a name; an old CRD or a hand-made spec is what reaches here.
        for name in (
            f"../../{other}/secrets/eh",
            f"eh/../../../{other}/secrets/eh",
            f"..%2F..%2F{other}%2Fsecrets%2Feh",
        ):
            ref = SecretKeyRefSpec.model_construct(name=name, key="connectionString")
            with pytest.raises(SecretUnavailable) as refused:
                await kube.read_secret(ns, ref)
            assert "STOLEN" not in str(refused.value) and "nothing was read" in str(refused.value)
        own = await kube.read_secret(ns, SecretKeyRefSpec(name="eh", key="connectionString"))
        assert own.get_secret_value() == "Endpoint=sb://own/;x=y"
    finally:
        await kube.close()
        for kind in ("clusterrolebindings", "clusterroles"):
            control_plane.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{role}")
    # The audit log: the one Secret read was the resource's own namespace's.
    assert secret_gets(control_plane, f"system:serviceaccount:{ns}:reader") == [(ns, "eh")]


def _condition(plane: ControlPlane, ns: str, name: str, kind: str) -> dict[str, Any] | None:
    status = plane.request("GET", f"{CRS.format(ns=ns)}/{name}").get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


def test_a_refused_edit_leaves_the_control_loop_on_the_accepted_spec(
    control_plane: ControlPlane, kube_namespace: str, start_operator: Any
) -> None:
    """The precondition of the issue's exfiltration: when the API server refused a running pool's new
    StatefulSet, the pods stayed as they were (docs/kubernetes.md) but the control loop reopened with the
    new spec and read the Secret it names. Here the loop is opened as the operator's own opener is, up to its
    first request (reading the spec's Secrets), and the audit log shows which Secrets it read."""
    ns = kube_namespace
    operator = start_operator(control_loop=SECRET_READING_OPENER)
    user = f"system:serviceaccount:{ns}:op-{ns}-hubshift"
    for name in ("telemetry-eventhubs", "telemetry-storage", "other-hub"):
        control_plane.request(
            "POST", f"/api/v1/namespaces/{ns}/secrets", secret(name, f"Endpoint=sb://{name}/")
        )
    control_plane.request("POST", CRS.format(ns=ns) + "?fieldValidation=Strict", example_manifest(ns))
    eventually(
        lambda: (ns, "telemetry-eventhubs") in secret_gets(control_plane, user),
        what=f"the control loop opened with the spec's Secrets\n{operator.log()[-3000:]}",
    )

    # One edit: another Secret for the hub, and a pod template the API server refuses in the StatefulSet.
    never = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    edit = {
        "spec": {
            "eventHubs": {"connectionStringSecretRef": {"name": "other-hub", "key": "connectionString"}},
            "consumer": {"podTemplate": {"affinity": {"nodeAffinity": never}}},
        }
    }
    control_plane.request("PATCH", f"{CRS.format(ns=ns)}/homes", edit)
    refused = eventually(
        lambda: (
            (found := _condition(control_plane, ns, "homes", CHILDREN_APPLIED))
            and found["status"] == "False"
            and found
        ),
        what=f"ChildrenApplied False\n{operator.log()[-3000:]}",
    )
    assert "nodeSelectorTerms" in refused["message"]
    time.sleep(5)  # cycles run every second while woken; the loop had every chance to reopen
    assert (ns, "other-hub") not in secret_gets(control_plane, user), operator.log()[-3000:]

    # A restarted operator never saw the accepted spec: it runs no loop, and the status says why.
    operator.stop()
    operator = start_operator(control_loop=SECRET_READING_OPENER)
    waiting = eventually(
        lambda: (
            (found := _condition(control_plane, ns, "homes", "Ready"))
            and found["reason"] == "SpecRefused"
            and found
        ),
        what=f"Ready False, SpecRefused\n{operator.log()[-3000:]}",
    )
    assert waiting["status"] == "False" and "no control loop runs" in waiting["message"]
    time.sleep(3)
    assert (ns, "other-hub") not in secret_gets(control_plane, user), operator.log()[-3000:]

    # The same Secret change, accepted: now the loop runs it (so the audit above could see it).
    control_plane.request(
        "PATCH", f"{CRS.format(ns=ns)}/homes", {"spec": {"consumer": {"podTemplate": {"affinity": None}}}}
    )
    eventually(
        lambda: (ns, "other-hub") in secret_gets(control_plane, user),
        what=f"the loop on the accepted spec\n{operator.log()[-3000:]}",
    )
    assert operator.process.poll() is None, operator.log()


def _invalid(plane: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    status = plane.request("GET", f"{CRS.format(ns=ns)}/{name}").get("status") or {}
    return status if status.get("phase") == "Invalid" else None


def _absent(plane: ControlPlane, path: str) -> bool:
    try:
        plane.request("GET", path)
    except ApiError as error:
        return error.status == 404
    return False


def test_pods_run_only_as_their_own_service_account_or_an_allowed_one(
    control_plane: ControlPlane, kube_namespace: str, start_operator: Any
) -> None:
    """Any existing ServiceAccount a resource named was used: in the operator's namespace its own (with
    cluster-wide Secret reads and its Azure identity), elsewhere any workload's. Now an existing one must be
    listed in the chart's operator.allowedServiceAccounts for the namespace."""
    ns = kube_namespace
    operator = start_operator(access={"allowedServiceAccounts": {ns: ["allowed"]}})
    accounts = f"/api/v1/namespaces/{ns}/serviceaccounts"
    statefulsets = f"/apis/apps/v1/namespaces/{ns}/statefulsets"
    for name in ("privileged", "allowed", "namesake"):
        control_plane.request("POST", accounts, {"metadata": {"name": name}})

    def resource(name: str, account: str | None) -> None:
        document = example_manifest(ns)
        document["metadata"]["name"] = name
        if account is not None:
            document["spec"]["consumer"]["serviceAccountName"] = account
        control_plane.request("POST", CRS.format(ns=ns) + "?fieldValidation=Strict", document)

    resource("taker", "privileged")
    resource("namesake", None)  # the default, its own name: a ServiceAccount of that name exists
    resource("porch", "allowed")
    resource("homes", None)

    status = eventually(
        lambda: _invalid(control_plane, ns, "taker"), what=f"taker Invalid\n{operator.log()[-3000:]}"
    )
    assert status["message"].startswith(
        "spec.consumer.serviceAccountName: the ServiceAccount privileged exists and the operator did not "
        "create it for this PartitionedConsumer"
    ), status
    assert _absent(control_plane, f"{statefulsets}/taker")
    status = eventually(lambda: _invalid(control_plane, ns, "namesake"), what="namesake Invalid")
    assert "the ServiceAccount namesake (the default: the resource's name) exists" in status["message"]
    assert _absent(control_plane, f"{statefulsets}/namesake")
    assert "ownerReferences" not in control_plane.request("GET", f"{accounts}/namesake")["metadata"]

    # An allowed one is used as it is; a resource's own is created and owned, for connection strings too.
    porch = eventually(
        lambda: control_plane.request("GET", f"{statefulsets}/porch"), what="porch's StatefulSet"
    )
    assert porch["spec"]["template"]["spec"]["serviceAccountName"] == "allowed"
    assert "ownerReferences" not in control_plane.request("GET", f"{accounts}/allowed")["metadata"]
    homes = eventually(
        lambda: control_plane.request("GET", f"{statefulsets}/homes"), what="homes' StatefulSet"
    )
    assert homes["spec"]["template"]["spec"]["serviceAccountName"] == "homes"
    own = control_plane.request("GET", f"{accounts}/homes")
    assert own["metadata"]["ownerReferences"][0]["name"] == "homes"
    assert own["automountServiceAccountToken"] is False
    assert operator.process.poll() is None, operator.log()


def test_the_operator_serves_no_resource_in_its_own_namespace(
    control_plane: ControlPlane, kube_namespace: str, start_operator: Any
) -> None:
    """In the chart's default (every namespace) install a resource in the operator's namespace could run its
    pods as the operator's ServiceAccount. Here the operator's pod namespace is the test's and it watches it
    through a glob, not by name: the resource is Invalid, and nothing is made or read for it."""
    ns = kube_namespace
    operator = start_operator(namespaces=(f"{ns[:-2]}*",), environ={"POD_NAMESPACE": ns})
    user = f"system:serviceaccount:{ns}:op-{ns}-hubshift"
    control_plane.request("POST", CRS.format(ns=ns) + "?fieldValidation=Strict", example_manifest(ns))
    status = eventually(
        lambda: _invalid(control_plane, ns, "homes"), what=f"homes Invalid\n{operator.log()[-3000:]}"
    )
    assert status["message"] == (
        f"metadata.namespace: {ns} is the operator's own namespace; it serves no PartitionedConsumer there "
        "unless it watches that namespace by name (the chart's operator.watchReleaseNamespace or "
        "operator.watchNamespaces)"
    )
    assert _absent(control_plane, f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes")
    assert _absent(control_plane, f"/api/v1/namespaces/{ns}/serviceaccounts/homes")
    assert secret_gets(control_plane, user) == []
    assert operator.process.poll() is None, operator.log()
