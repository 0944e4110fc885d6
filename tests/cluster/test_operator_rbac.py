"""Least privilege, proven: every request the operators of this session made (each under exactly the chart's
role, `tests/fixtures/operator.py`) is compared with what the chart grants. A request refused is a missing
grant; a grant never used is one too many. The API server's audit log says what was asked.

This module runs after the other operator tests of the tier (pytest runs files in name order) and skips
when no operator ran in the session."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.fixtures.operator import _render_chart
from tests.harness.control_plane import ControlPlane

# The chart's ServiceAccounts in the cluster tier: op-<namespace>-hubshift.
OPERATOR_USER = re.compile(r"system:serviceaccount:[^:]+:op-[^:]+-hubshift")

# Granted without being a request of the operator's: with the OwnerReferencesPermissionEnforcement
# admission plugin (OpenShift, some managed clusters) setting `blockOwnerDeletion` on a child needs
# `update` on the owner's finalizers.
NEEDED_BY_ADMISSION = {("hubshift.dev", "partitionedconsumers/finalizers", "update")}
# The children the operator applies server-side: the first apply creates them.
CREATED_BY_APPLY = {
    ("apps", "statefulsets"),
    ("", "services"),
    ("", "configmaps"),
    ("", "serviceaccounts"),
    ("policy", "poddisruptionbudgets"),
}


def granted(rendered: str) -> set[tuple[str, str, str]]:
    rules = []
    for document in yaml.safe_load_all(rendered):
        if document and document["kind"] in ("Role", "ClusterRole"):
            rules.extend(document["rules"])
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_chart_grants_exactly_what_the_operator_asks(control_plane: ControlPlane) -> None:
    requests = [r for r in control_plane.audited() if OPERATOR_USER.fullmatch(r.user)]
    if not requests:
        pytest.skip("no operator ran in this session (run the cluster tier whole)")
    denied = sorted({(r.verb, r.group or "core", r.resource) for r in requests if r.code == 403})
    assert denied == [], f"the operator was refused (a grant is missing): {denied}"
    used = {(r.group, r.resource, r.verb) for r in requests}
    # A server-side apply that creates a child is also authorized as `create`; the audit logs a patch.
    used |= {
        (group, resource, "create")
        for group, resource in CREATED_BY_APPLY
        if (group, resource, "patch") in used
    }
    grants: set[tuple[str, str, str]] = set()
    for peering in (False, True):
        grants |= granted(_render_chart(control_plane, "audit", "audit-ns", peering))
    unused = sorted(grants - used - NEEDED_BY_ADMISSION)
    assert unused == [], f"granted and never used (cut them from the chart): {unused}"
    ungranted = sorted(used - grants)
    assert ungranted == [], f"used without a grant of the chart: {ungranted}"


def test_the_audit_sees_a_refusal(control_plane: ControlPlane, kube_namespace: str) -> None:
    """The check above can fail: a request the role does not allow shows up as refused."""
    account = "nobody"
    kubeconfig = control_plane.kubeconfig_for_service_account(kube_namespace, account)
    with pytest.raises(subprocess.CalledProcessError):
        control_plane.kubectl("get", "secrets", "-n", kube_namespace, kubeconfig=kubeconfig)
    refused = [
        r
        for r in control_plane.audited()
        if r.user == f"system:serviceaccount:{kube_namespace}:{account}" and r.code == 403
    ]
    assert any(r.resource == "secrets" and r.verb == "list" for r in refused), refused
