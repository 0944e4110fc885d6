"""The chart's NetworkPolicy for the consumer pods, accepted by a real API server: rendered for the
namespaces the operator watches, created there, and selecting exactly the pods the operator labels.
(Enforcement is the network plugin's; the cluster tier has none, the kind suite's kindnet does.)"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from hubshift.operator.kubernetes.render import pod_labels
from tests.fixtures.operator import CHART
from tests.harness.control_plane import ControlPlane


def test_the_consumer_network_policy_is_accepted_and_selects_the_consumer_pods(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    helm = control_plane.bin_dir / "helm"
    if not helm.is_file():
        pytest.skip(f"no helm in {control_plane.bin_dir}")
    rendered = subprocess.run(
        [
            str(helm),
            "template",
            "np",
            str(CHART),
            "--namespace",
            "ops",
            "--set",
            f"operator.watchNamespaces={{{kube_namespace}}}",
            "--set",
            "networkPolicy.enabled=true",
            "--show-only",
            "templates/networkpolicy.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    control_plane.kubectl("apply", "-f", "-", input=rendered)
    (policy,) = json.loads(
        control_plane.kubectl("get", "networkpolicies", "-n", kube_namespace, "-o", "json").stdout
    )["items"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    wanted = yaml.safe_load(rendered)["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == wanted
    assert wanted.items() <= pod_labels("homes").items()  # the labels the operator gives consumer pods
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
