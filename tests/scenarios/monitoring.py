"""The Prometheus Operator on a scenario cluster, as kube-prometheus-stack users run it: its CRDs and its
own ClusterRoles (the operator module's manifests), the operator in the `monitoring` namespace, and one
Prometheus resource selecting monitors and rules labelled `release: monitoring` in every namespace (what
kube-prometheus-stack does with its release label). The chart is then installed with its ServiceMonitor,
PodMonitor and PrometheusRule on, and the operator turns them into that Prometheus' scrape configuration
and rules, with its own relabelling.

The test reads that Prometheus through the API server's pod proxy (`kubectl get --raw`), as it reads the
pods' metrics: it never needs a route to the pod network.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness.dashboards import PrometheusApi, dashboards, has_value, panel_queries, resolve_variables
from tests.scenarios.cluster import JSON, ScenarioCluster, ScenarioError

TOOLS = Path(__file__).resolve().parents[2] / "tools"

RULES = Path(__file__).resolve().parents[2] / "charts" / "hubshift" / "rules" / "hubshift.rules.yaml"
NAMESPACE = "monitoring"
SELECTED = {"release": "monitoring"}  # the label the Prometheus selects monitors and rules by
PROMETHEUS = "hubshift"  # the Prometheus resource; the operator names its pod prometheus-hubshift-0
POD = f"prometheus-{PROMETHEUS}-0"
SCRAPE_SECONDS = 5
OPERATOR_ACCOUNT, PROMETHEUS_ACCOUNT = "prometheus-operator", "prometheus"


@dataclass(frozen=True)
class MonitoringStack:
    """What a cluster has for the Prometheus Operator: the image holding Prometheus, the operator and the
    config reloader (tools/image's `monitoring`), the operator module's manifests (tools/monitoring's
    folder: crds/, rbac/), and the Prometheus version in that image."""

    image: str
    manifests: Path
    prometheus_version: str


def built_stack(image: str) -> MonitoringStack | None:
    """The Prometheus Operator's stack when tools/monitoring built it (tools/node build does): `image`, the
    reference of tools/image's `monitoring` image as the cluster holds it, its manifests, and the
    Prometheus version pinned beside them; None when it is not built."""
    built = subprocess.run(
        [str(TOOLS / "monitoring"), "--cached"], capture_output=True, text=True, check=False
    )
    if built.returncode != 0:
        return None
    pins = (TOOLS / "kube" / "versions-monitoring").read_text()
    (version,) = re.findall(r"^PROMETHEUS_VERSION=(\S+)$", pins, re.MULTILINE)
    return MonitoringStack(image, Path(built.stdout.strip()).parent, version)


def chart_values(lag_alert_seconds: int, lag_alert_for: str) -> list[str]:
    """`helm install` arguments: the chart's monitors and rules on, labelled for the Prometheus, scraped every
    SCRAPE_SECONDS, HubshiftLagHigh at a threshold a test can reach."""
    label = "additionalLabels.release=" + SELECTED["release"]
    values = [
        "metrics.serviceMonitor.enabled=true", f"metrics.serviceMonitor.{label}",
        f"metrics.serviceMonitor.interval={SCRAPE_SECONDS}s", "metrics.serviceMonitor.scrapeTimeout=4s",
        "metrics.podMonitor.enabled=true", f"metrics.podMonitor.{label}",
        f"metrics.podMonitor.interval={SCRAPE_SECONDS}s", "metrics.podMonitor.scrapeTimeout=4s",
        "metrics.prometheusRule.enabled=true", f"metrics.prometheusRule.{label}",
        f"metrics.prometheusRule.alerts.HubshiftLagHigh.threshold={lag_alert_seconds}",
        f"metrics.prometheusRule.alerts.HubshiftLagHigh.for={lag_alert_for}",
    ]  # fmt: skip
    return [argument for value in values for argument in ("--set", value)]


def _documents(path: Path) -> list[JSON]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _binding(name: str, account: str) -> JSON:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
    }


def _account(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NAMESPACE}}


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
NOBODY = {
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "runAsGroup": 65534,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def install_operator(cluster: ScenarioCluster, stack: MonitoringStack) -> None:
    """The CRDs (server-side: the Prometheus CRD is too large for a client-side apply's annotation), the
    ClusterRoles the operator module publishes, and the operator's Deployment. Returns once applied; the
    operator starts in the background."""
    cluster.kubectl("apply", "--server-side", "-f", str(stack.manifests / "crds"), timeout=120)
    roles = [
        document
        for path in sorted((stack.manifests / "rbac").glob("*.yaml"))
        for document in _documents(path)
    ]
    names = {document["metadata"]["name"] for document in roles}
    assert names == {OPERATOR_ACCOUNT, PROMETHEUS_ACCOUNT}, names  # the module's two ClusterRoles
    labels = {"app.kubernetes.io/name": "prometheus-operator"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "prometheus-operator", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": OPERATOR_ACCOUNT,
                    "securityContext": NOBODY,
                    "containers": [{
                        "name": "prometheus-operator",
                        "image": stack.image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["/bin/operator"],
                        # The reloader comes from the same image (it has /bin/prometheus-config-reloader).
                        "args": [f"--prometheus-config-reloader={stack.image}", "--log-level=info"],
                        "securityContext": RESTRICTED_CONTAINER,
                    }],
                },
            },
        },
    }  # fmt: skip
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        _account(OPERATOR_ACCOUNT),
        _account(PROMETHEUS_ACCOUNT),
        *roles,
        _binding(OPERATOR_ACCOUNT, OPERATOR_ACCOUNT),
        _binding(PROMETHEUS_ACCOUNT, PROMETHEUS_ACCOUNT),
        deployment,
    )


def create_prometheus(cluster: ScenarioCluster, stack: MonitoringStack) -> None:
    """The Prometheus resource: monitors and rules labelled SELECTED from every namespace."""
    everywhere: JSON = {}
    selected = {"matchLabels": SELECTED}
    cluster.apply({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": PROMETHEUS, "namespace": NAMESPACE},
        "spec": {
            "image": stack.image,
            "version": stack.prometheus_version,
            "imagePullPolicy": "IfNotPresent",
            "serviceAccountName": PROMETHEUS_ACCOUNT,
            "replicas": 1,
            "scrapeInterval": f"{SCRAPE_SECONDS}s",
            "evaluationInterval": f"{SCRAPE_SECONDS}s",
            "serviceMonitorSelector": selected, "serviceMonitorNamespaceSelector": everywhere,
            "podMonitorSelector": selected, "podMonitorNamespaceSelector": everywhere,
            "ruleSelector": selected, "ruleNamespaceSelector": everywhere,
            "securityContext": {**NOBODY, "fsGroup": 65534},
            "resources": {"requests": {"cpu": "50m", "memory": "200Mi"}},
        },
    })  # fmt: skip


class ClusterPrometheus:
    """The Prometheus the operator runs, through the API server's pod proxy."""

    def __init__(self, cluster: ScenarioCluster) -> None:
        self.cluster = cluster
        self.base = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}:9090/proxy"

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        result = self.cluster.kubectl("get", "--raw", f"{self.base}{path}{query}", timeout=30, check=False)
        if result.returncode != 0:
            raise ScenarioError(f"Prometheus {path}: {result.stderr.strip()[-500:]}")
        document = json.loads(result.stdout)
        if document.get("status") != "success":
            raise ScenarioError(f"Prometheus {path} {params}: {document}")
        return document["data"]

    def api(self) -> PrometheusApi:
        return PrometheusApi(self.get)

    def ready(self) -> bool:
        pod = self.cluster.get_or_none("-n", NAMESPACE, "pod", POD)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        return bool(statuses) and all(status.get("ready") for status in statuses)

    def targets(self) -> list[JSON]:
        """The active scrape targets: their labels, health and last error."""
        found: list[JSON] = self.get("/api/v1/targets", {"state": "active"})["activeTargets"]
        return found

    def alerts(self, name: str, **labels: str) -> list[JSON]:
        """The alerts named `name` (pending or firing) whose labels include `labels`."""
        return [
            alert
            for alert in self.get("/api/v1/alerts")["alerts"]
            if alert["labels"].get("alertname") == name and labels.items() <= alert["labels"].items()
        ]


def assert_dashboards_draw(prometheus: ClusterPrometheus, namespace: str, name: str, since: float) -> None:
    """Both dashboards as a person opens them: the variables resolved by label_values (the pool's namespace,
    not the operator's, is the one namespace: the ServiceMonitor honours the operator's labels), then every
    query of every panel draws data over the time the Prometheus has been scraping."""
    api = prometheus.api()
    assert api.label_values("namespace", "hubshift_partitions") == [namespace]
    assert not api.query('{__name__=~"hubshift_.+", exported_namespace!=""}'), "a namespace label was renamed"
    empty = []
    for board, dashboard in dashboards().items():
        chosen = resolve_variables(dashboard, api, {"consumer": name}, rate_interval="1m")
        for title, expression in panel_queries(dashboard, chosen):
            if not has_value(api.query_range(expression, since, time.time(), SCRAPE_SECONDS)):
                empty.append(f"{board}: {title}: {expression}")
    assert not empty, "panels that draw nothing:\n" + "\n".join(empty)


def assert_rules_evaluate(prometheus: ClusterPrometheus, namespace: str, name: str) -> None:
    """The operator loaded the chart's PrometheusRule: every alert of the rule file is there and healthy, its
    expression evaluates, and every hubshift series it reads exists for the pool."""
    source = yaml.safe_load(RULES.read_text())
    wanted = {rule["alert"] for group in source["groups"] for rule in group["rules"]}
    rules = [rule for group in prometheus.get("/api/v1/rules")["groups"] for rule in group["rules"]]
    assert {rule["name"] for rule in rules} == wanted
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        prometheus.api().query(rule["query"])  # an error would raise
        for metric in set(re.findall(r"\bhubshift_[a-z_]+", rule["query"])):
            found = prometheus.api().query(f'{metric}{{namespace="{namespace}", consumer="{name}"}}')
            assert found, f"{rule['name']}: no {metric} for {namespace}/{name}"
