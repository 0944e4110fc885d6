"""The Helm chart: values against their schema, template syntax, dashboards and alerts against the metrics
that exist, and, where a `helm` binary is available, `helm lint` and `helm template` of several setups."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from hubshift import __version__
from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.manifest import parse_manifest
from hubshift.operator.kubernetes.crd import CRD_PATHS, custom_resource_definition
from hubshift.operator.kubernetes.render import output_condition
from hubshift.operator.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "hubshift"
# No `--kube-version`: `helm template` offline assumes an old Kubernetes, and the chart must render anyway
# (tools that render charts offline do exactly this).


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return copy.deepcopy(loaded)


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema())
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "hubshift"
    # One version (pyproject.toml's): the release packages the chart and tags the image with it.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == chart["version"] == __version__ == project
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])


def test_the_release_can_point_the_chart_at_its_image() -> None:
    """.github/workflows/release.yml rewrites this line to the image it pushed (ghcr.io/OWNER/hubshift)."""
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert r"s#^  repository: hubshift\$#  repository: $IMAGE#" in workflow
    lines = (CHART / "values.yaml").read_text().splitlines()
    assert lines.count("  repository: hubshift") == 1


def test_default_values_match_their_schema() -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    assert schema_errors(values()) == []


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda v: v["operator"].update(replicas=2), "operator.replicas"),
        (lambda v: v["operator"].update(watchNamespaces=["Not_A_Namespace"]), "operator.watchNamespaces.0"),
        (lambda v: v["operator"].update(metricsPort=0), "operator.metricsPort"),
        (lambda v: v["metrics"]["serviceMonitor"].update(interval="soon"), "metrics.serviceMonitor.interval"),
        (lambda v: v.update(unknown=True), "Additional properties"),
        (lambda v: v["image"].update(pullPolicy="Sometimes"), "image.pullPolicy"),
        (lambda v: v["azure"].update(credential="keys"), "azure.credential"),
        (lambda v: v["azure"]["workloadIdentity"].update(enabled=True), "azure.workloadIdentity"),
        (lambda v: v["image"].update(digest="latest"), "image.digest"),
        (lambda v: v["operator"]["podDisruptionBudget"].update(maxUnavailable="half"), "maxUnavailable"),
        (lambda v: v["crds"].update(install="yes"), "crds.install"),
        (lambda v: v["metrics"]["serviceMonitor"].update(honorLabels="yes"), "honorLabels"),
        (
            lambda v: v["operator"].update(allowedServiceAccounts={"team-a": ["../default"]}),
            "operator.allowedServiceAccounts.team-a.0",
        ),
        (
            lambda v: v["operator"].update(allowedServiceAccounts={"team-a": "spark"}),
            "allowedServiceAccounts",
        ),
    ],
)
def test_bad_values_are_refused(change: Any, fragment: str) -> None:
    document = values()
    change(document)
    errors = schema_errors(document)
    assert any(fragment in error for error in errors), errors


def test_an_umbrella_charts_global_values_are_accepted() -> None:
    document = values()
    document["global"] = {
        "imageRegistry": "ghcr.io/acme",
        "imagePullSecrets": ["pull", {"name": "more"}],
        "x": 1,
    }
    assert schema_errors(document) == []


def test_two_replicas_are_allowed_with_peering() -> None:
    document = values()
    document["operator"].update(replicas=2, peering={"enabled": True, "name": "hubshift"})
    assert schema_errors(document) == []


def test_every_values_key_is_documented_in_the_schema() -> None:
    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if "$ref" in node:
            node = schema()["definitions"][node["$ref"].rsplit("/", 1)[-1]]
        if isinstance(value, dict) and "properties" in node:
            for key, child in value.items():
                assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
                walk(child, node["properties"][key], f"{path}.{key}")

    walk(values(), schema(), "values")


BLOCK = re.compile(r"\{\{-?\s*(if|with|range|define|block)\b")
END = re.compile(r"\{\{-?\s*end\s*-?\}\}")


TEMPLATES = sorted(path for path in (CHART / "templates").rglob("*") if path.is_file())


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_template_actions_are_balanced(template: Path) -> None:
    text = template.read_text()
    outside_actions = re.sub(r"\{\{.*?\}\}", "", text, flags=re.S)
    assert "{{" not in outside_actions, "an action that is never closed"
    assert len(BLOCK.findall(text)) == len(END.findall(text)), "every if/with/range/define needs an end"


def test_peering_crds_are_kopfs() -> None:
    documents = list(yaml.safe_load_all((CHART / "crds" / "kopf-peerings.yaml").read_text()))
    assert {d["metadata"]["name"] for d in documents} == {
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    for document in documents:
        status = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True  # kopf keeps its peers there


# --- dashboards and alerts read only metrics that exist ---------------------------------------------------


def exported_names() -> set[str]:
    names: set[str] = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    consumer = ConsumerMetrics("c", process_metrics=False)
    consumer.enable_spark()  # the Spark engine's own figures too
    for registry in (OperatorMetrics().registry, consumer.registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(family.name + suffix for suffix in suffixes.get(family.type, []))
    return names


def referenced_metrics(expression: str) -> set[str]:
    return set(re.findall(r"\bhubshift_[a-z_]+", expression))


def dashboards() -> dict[str, dict[str, Any]]:
    found = {p.name: json.loads(p.read_text()) for p in sorted((CHART / "dashboards").glob("*.json"))}
    assert set(found) == {"hubshift-overview.json", "hubshift-consumer.json"}
    return found


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def test_dashboards_are_what_tools_dashboards_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "dashboards.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_dashboards_are_valid_grafana_json() -> None:
    for name, dashboard in dashboards().items():
        assert dashboard["schemaVersion"] >= 36, name
        assert dashboard["uid"] and len(dashboard["uid"]) <= 40
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert {"namespace", "hub", "consumer"} <= set(variables)
        for panel in dashboard["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, f"{name}: {panel['title']}"
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs))
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}"
                assert 'namespace=~"$namespace"' in target["expr"], target["expr"]
                assert 'consumer=~"$consumer"' in target["expr"], target["expr"]


def dashboards_tool() -> Any:
    """tools/dashboards.py as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("dashboards_tool", ROOT / "tools" / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_grafanas_schema_refuses_what_grafana_would_not_load() -> None:
    """The lint tier's check (`tools/dashboards.py --schema`) finds a dashboard that breaks Grafana's schema:
    a panel without its width, a variable's current value without its text, a legend Grafana cannot place."""
    tool = dashboards_tool()
    folder = tool.schema_path()
    if not (folder / ".made").exists():
        pytest.skip(f"Grafana's schema is not made yet ({folder}; the lint tier makes it)")
    good = dashboards()["hubshift-consumer.json"]
    assert tool.schema_errors(good, folder) == []
    bad = copy.deepcopy(good)
    panel = next(p for p in bad["panels"] if p["type"] == "timeseries")
    del panel["gridPos"]["w"]
    panel["options"]["legend"]["placement"] = "top"
    bad["templating"]["list"][1]["current"] = {"selected": True}
    errors = tool.schema_errors(bad, folder)
    assert len(errors) == 4, errors  # `current` lacks both text and value
    assert any(e.endswith("gridPos: 'w' is a required property") for e in errors), errors
    assert any(f"({panel['title']!r}): options/legend/placement" in e for e in errors), errors


def test_every_query_reads_a_metric_that_is_exported() -> None:
    known = exported_names()
    for name, dashboard in dashboards().items():
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                assert referenced_metrics(variable["query"]["query"]) <= known
        for title, expression in panel_queries(dashboard):
            names = referenced_metrics(expression)
            assert names, f"{name}: {title} reads no hubshift metric"
            for metric in names:
                assert metric in known, f"{name}: {title}: {metric} is not exported"


def test_the_dashboards_cover_what_people_ask_for() -> None:
    titles = {name: {panel["title"] for panel in d["panels"]} for name, d in dashboards().items()}
    assert {
        "Lag in seconds (worst partition)",
        "Lag in events",
        "Replicas: desired, current, ready",
        "Phase",
        "Rebalances by reason",
    } <= titles["hubshift-overview.json"]
    assert {
        "Lag in seconds per partition",
        "Owner over time",
        "Handoff duration (operator: publication to new owner)",
        "Handoff duration (consumer: drain to release)",
        "Events per second per pod",
        "Batch duration (p95)",
        "Checkpoint age",
        "Lease failures",
    } <= titles["hubshift-consumer.json"]


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((CHART / "rules" / "hubshift.rules.yaml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_alert_rules_are_one_source_and_read_exported_metrics() -> None:
    known = exported_names()
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    assert {
        "HubshiftLagHigh",
        "HubshiftLagGrowing",
        "HubshiftPartitionWithoutOwner",
        "HubshiftRebalanceStuck",
        "HubshiftLeaseRenewalFailures",
        "HubshiftConsumerRestarting",
    } <= set(names)
    for rule in rules:
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule["annotations"]["summary"]
        metrics = referenced_metrics(rule["expr"])
        assert metrics and metrics <= known, f"{rule['alert']}: {metrics - known}"
    template = (CHART / "templates" / "prometheusrule.yaml").read_text()
    assert '.Files.Get "rules/hubshift.rules.yaml"' in template
    assert "expr:" not in template  # no rule is written twice


RUNBOOKS = CHART.parents[1] / "docs" / "runbooks.md"
RUNBOOK_PAGE = "https://github.com/hubshift/hubshift/blob/main/docs/runbooks.md"


def test_every_alert_links_its_runbook_section_which_says_what_it_means_and_what_to_do() -> None:
    page = RUNBOOKS.read_text()
    sections = dict(
        (match.group(1), match.group(2))
        for match in re.finditer(r"^## (\w+)\n(.*?)(?=^## |\Z)", page, re.M | re.S)
    )
    names = [rule["alert"] for rule in alert_rules()]
    assert sorted(sections) == sorted(names)  # one section per alert, none left over
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_PAGE}#{name.lower()}"  # GitHub's anchor
        for part in ("**Means.**", "**Check.**", "**Do.**"):
            assert part in sections[name], f"{name}: its runbook has no {part}"


def test_alerts_for_data_loss_dead_letters_failed_batches_and_failed_checkpoint_writes() -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    assert "hubshift_expired_unread_events" in exprs["HubshiftDataLoss"]
    assert "hubshift_consumer_events_expired_total" in exprs["HubshiftDataLoss"]
    assert "hubshift_consumer_dead_letters_total" in exprs["HubshiftDeadLetters"]
    assert 'hubshift_consumer_batches_total{result="failed"}' in exprs["HubshiftBatchesFailing"]
    assert 'hubshift_consumer_checkpoints_total{result="failed"}' in exprs["HubshiftCheckpointWritesFailing"]


# --- with a helm binary -----------------------------------------------------------------------------------


def helm_binary() -> str | None:
    found = shutil.which("helm")
    if found:
        return found
    try:
        result = subprocess.run(
            [str(ROOT / "tools" / "control-plane"), "--dir"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    candidate = Path(result.stdout.strip()) / "helm"
    return str(candidate) if result.returncode == 0 and candidate.is_file() else None


DIGEST = "sha256:" + "0123456789abcdef" * 4
ZONES = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
SETUPS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced-with-peering": {
        "operator": {"replicas": 2, "watchNamespaces": ["team-a", "team-b"], "peering": {"enabled": True}},
        "networkPolicy": {"enabled": True, "from": [PROMETHEUS_PEER]},
    },
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
        },
        "dashboards": {"enabled": True},
    },
    "workload-identity": {
        "azure": {"workloadIdentity": {"enabled": True, "clientId": "cid-1", "tenantId": "tid-1"}},
    },
    "release-namespace": {"operator": {"watchReleaseNamespace": True, "watchNamespaces": ["ops", "team-a"]}},
    "gitops": {
        "global": {"imageRegistry": "ghcr.io/acme", "imagePullSecrets": ["pull"]},
        "image": {"digest": DIGEST},
        "operator": {
            "replicas": 2,
            "peering": {"enabled": True},
            "topologySpreadConstraints": [ZONES],
            "extraVolumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
            "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
        },
        "metrics": {"serviceMonitor": {"enabled": True, "honorLabels": False}},
    },
}


@pytest.fixture(scope="module")
def helm() -> str:
    binary = helm_binary()
    if binary is None:
        pytest.skip(
            "no helm binary (PATH or tools/control-plane); the schema and syntax checks above still ran"
        )
    return binary


def helm_env(tmp_path: Path) -> dict[str, str]:
    """os.environ with helm's cache and configuration under `tmp_path` (none of the user's repositories)."""
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
    }


def render(helm: str, tmp_path: Path, overrides: dict[str, Any]) -> list[dict[str, Any]]:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(overrides))
    result = subprocess.run(
        [
            helm,
            "template",
            "rel",
            str(CHART),
            "--namespace",
            "ops",
            "-f",
            str(values_file),
            "--include-crds",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=helm_env(tmp_path),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_the_operator_reads_its_access_and_allowed_service_accounts_from_one_file(
    helm: str, tmp_path: Path
) -> None:
    """operator.access and operator.allowedServiceAccounts reach `hubshift operator --access` as one file,
    and a change to either restarts the operator (which reads it once)."""
    from hubshift.operator.cli import load_access

    def rendered(overrides: dict[str, Any], where: Path) -> tuple[Path, str]:
        where.mkdir()
        documents = render(helm, where, overrides)
        config_map = next(
            d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-access")
        )
        deployment = next(d for d in documents if d["kind"] == "Deployment")
        assert (
            "--access=/etc/hubshift-operator/access.yaml"
            in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        )
        path = where / "access.yaml"
        path.write_text(config_map["data"]["access.yaml"])
        return path, deployment["spec"]["template"]["metadata"]["annotations"]["hubshift.dev/access-sha256"]

    none, plain = rendered({}, tmp_path / "defaults")
    assert load_access(str(none)).service_accounts == {}
    overrides = {"operator": {"allowedServiceAccounts": {"team-a": ["spark-jobs"], "*": ["mesh"]}}}
    allowed, changed = rendered(overrides, tmp_path / "allowed")
    policy = load_access(str(allowed))
    assert policy.allows_service_account("team-a", "spark-jobs")
    assert policy.allows_service_account("team-b", "mesh")
    assert not policy.allows_service_account("team-b", "spark-jobs")
    assert changed != plain


def test_helm_lint(helm: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [helm, "lint", str(CHART), "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
        env=helm_env(tmp_path),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_helm_template(helm: str, tmp_path: Path, setup: str) -> None:
    documents = render(helm, tmp_path, SETUPS[setup])
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert ("CustomResourceDefinition", "partitionedconsumers.hubshift.dev") in kinds
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["hubshift", "operator"]
    # The consumer pods run the operator's own image, unless a resource pins one.
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert env["HUBSHIFT_CONSUMER_IMAGE"] == container["image"]
    budgets = [d for d in documents if d["kind"] == "PodDisruptionBudget"]
    pod = deployment["spec"]["template"]["spec"]
    if deployment["spec"]["replicas"] > 1:  # a standby always survives a drain, on another node
        (budget,) = budgets
        assert budget["spec"] == {"maxUnavailable": 1, "selector": deployment["spec"]["selector"]}
        anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["podAffinityTerm"]["labelSelector"] == deployment["spec"]["selector"]
    else:
        assert not budgets and "affinity" not in pod
    for document in documents:
        if document["kind"] == "CustomResourceDefinition":
            continue
        labels = document["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == "rel", document["kind"]
        assert "helm.sh/chart" in labels
    rules = [rule for d in documents if d["kind"] in ("Role", "ClusterRole") for rule in d["rules"]]
    secrets = [rule for rule in rules if "secrets" in rule["resources"]]
    assert secrets and all(rule["verbs"] == ["get"] for rule in secrets)
    accounts = [rule for rule in rules if "serviceaccounts" in rule["resources"]]
    assert accounts and all(rule["verbs"] == ["get", "create", "patch"] for rule in accounts)
    if setup == "defaults":
        assert "--all-namespaces" in container["args"] and "--standalone" in container["args"]
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
        assert "--credential=default" in container["args"]
        assert "azure.workload.identity/use" not in deployment["spec"]["template"]["metadata"]["labels"]
    if setup == "workload-identity":
        assert "--credential=workloadIdentity" in container["args"]
        assert deployment["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"
        account = next(d for d in documents if d["kind"] == "ServiceAccount")
        assert account["metadata"]["annotations"] == {
            "azure.workload.identity/client-id": "cid-1",
            "azure.workload.identity/tenant-id": "tid-1",
        }
    if setup == "release-namespace":  # the release's namespace joins the list, once
        assert [a for a in container["args"] if a.startswith("--namespace")] == [
            "--namespace=ops",
            "--namespace=team-a",
        ]
        assert {d["metadata"]["namespace"] for d in documents if d["kind"] == "Role"} == {"ops", "team-a"}
    if setup == "namespaced-with-peering":
        assert "--peering=hubshift" in container["args"]
        assert {d["metadata"]["namespace"] for d in documents if d["kind"] == "Role"} == {"team-a", "team-b"}
        assert [d["kind"] for d in documents].count("KopfPeering") == 2
        policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
        assert {d["metadata"]["namespace"] for d in policies} == {"team-a", "team-b"}
        for policy in policies:
            assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "consumer"
            (rule,) = policy["spec"]["ingress"]
            assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
            operator_peer, prometheus_peer = rule["from"]
            assert (
                operator_peer["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
            )
            assert operator_peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}
            assert prometheus_peer == PROMETHEUS_PEER
    else:
        assert not [d for d in documents if d["kind"] == "NetworkPolicy"]
    if setup == "gitops":
        assert container["image"] == f"ghcr.io/acme/hubshift@{DIGEST}"
        assert pod["imagePullSecrets"] == [{"name": "pull"}]
        assert pod["topologySpreadConstraints"] == [ZONES]
        assert {"name": "ca", "configMap": {"name": "corporate-ca"}} in pod["volumes"]
        assert {"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True} in container[
            "volumeMounts"
        ]
        monitor = next(d for d in documents if d["kind"] == "ServiceMonitor")
        assert monitor["spec"]["endpoints"][0]["honorLabels"] is False
    else:
        assert container["image"] == f"hubshift:{__version__}"
    if setup == "monitoring":
        monitor = next(d for d in documents if d["kind"] == "ServiceMonitor")
        assert (
            monitor["spec"]["endpoints"][0]["honorLabels"] is True
        )  # the default: the namespace label is the resource's (docs/observability.md)
        assert monitor["metadata"]["labels"]["release"] == "kps"
        dashboards = [
            d
            for d in documents
            if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
        ]
        uids = {json.loads(next(iter(d["data"].values())))["uid"] for d in dashboards}
        assert uids == {"hubshift-overview", "hubshift-consumer"}
        rule = next(d for d in documents if d["kind"] == "PrometheusRule")
        source = yaml.safe_load((CHART / "rules" / "hubshift.rules.yaml").read_text())
        assert rule["spec"]["groups"] == source["groups"]  # the plain file, as it is
        pods = next(d for d in documents if d["kind"] == "PodMonitor")
        relabel = pods["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
        assert relabel["targetLabel"] == "consumer"


def test_the_crd_is_a_template_kept_on_uninstall_and_equal_to_the_generated_one(
    helm: str, tmp_path: Path
) -> None:
    """Helm installs and upgrades templates (never crds/): a new version's fields reach the API server with
    `helm upgrade`, and the keep policy leaves the CRD, and every PartitionedConsumer, on uninstall."""
    documents = render(helm, tmp_path, {})
    (definition,) = [
        d for d in documents if d["kind"] == "CustomResourceDefinition" and "hubshift" in d["spec"]["group"]
    ]
    assert definition["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert definition["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"
    assert definition["spec"] == custom_resource_definition()["spec"]
    assert not (CHART / "crds" / CRD_PATHS[0].name).exists()  # Helm would install it once, then never again
    (tmp_path / "without").mkdir()
    without = render(helm, tmp_path / "without", {"crds": {"install": False}})
    assert not [
        d for d in without if d["kind"] == "CustomResourceDefinition" and d["spec"]["group"] == "hubshift.dev"
    ]


def test_the_chart_works_as_a_subchart_with_global_values(helm: str, tmp_path: Path) -> None:
    """An umbrella chart (as Argo CD and Flux users build them) with the chart as a dependency and `global`
    values: `helm lint --strict` passes and the operator's image comes from global.imageRegistry."""
    umbrella = tmp_path / "platform"
    (umbrella / "charts").mkdir(parents=True)
    shutil.copytree(CHART, umbrella / "charts" / "hubshift")
    chart = {"apiVersion": "v2", "name": "platform", "version": "1.0.0", "dependencies": [
        {"name": "hubshift", "version": yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]}
    ]}  # fmt: skip
    (umbrella / "Chart.yaml").write_text(yaml.safe_dump(chart))
    umbrella_values = {
        "global": {"imageRegistry": "registry.example", "imagePullSecrets": ["pull"], "domain": "x"},
        "hubshift": {"operator": {"watchReleaseNamespace": True}},
    }
    (umbrella / "values.yaml").write_text(yaml.safe_dump(umbrella_values))
    environ = helm_env(tmp_path)
    lint = subprocess.run(
        [helm, "lint", str(umbrella), "--strict", "--with-subcharts"],
        capture_output=True, text=True, timeout=120, env=environ, check=False,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = subprocess.run(
        [helm, "template", "platform", str(umbrella), "-n", "ops"],
        capture_output=True, text=True, timeout=120, env=environ, check=False,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    documents = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"registry.example/hubshift:{__version__}"
    assert pod["imagePullSecrets"] == [{"name": "pull"}]


def test_helm_refuses_two_replicas_without_peering(helm: str, tmp_path: Path) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump({"operator": {"replicas": 2}}))
    result = subprocess.run(
        [helm, "template", "rel", str(CHART), "-f", str(values_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=helm_env(tmp_path),
    )
    assert result.returncode != 0
    # The schema refuses it first (maximum 1 without peering); the template's own `fail` is the fallback.
    assert "/operator/replicas" in result.stderr, result.stderr


# What each install grants where: (apiGroup, resource, verb) per namespace ("*": cluster-wide).
DISCOVERY = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
}


def grants(documents: list[dict[str, Any]]) -> dict[str, set[tuple[str, str, str]]]:
    """Where the chart's roles apply, and what they grant there (bindings followed to their roles)."""
    roles = {(d["kind"], d["metadata"].get("namespace", "*"), d["metadata"]["name"]): d for d in documents}
    where: dict[str, set[tuple[str, str, str]]] = {}
    for binding in documents:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        scope = binding["metadata"].get("namespace", "*")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], "*" if ref["kind"] == "ClusterRole" else scope, ref["name"])]
        where.setdefault(scope, set()).update(
            (group, resource, verb)
            for rule in role["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        )
    return where


@pytest.mark.parametrize(
    ("overrides", "namespaces"),
    [
        ({"operator": {"watchReleaseNamespace": True}}, {"ops"}),
        ({"operator": {"watchNamespaces": ["team-a", "team-b"]}}, {"team-a", "team-b"}),
    ],
)
def test_a_namespaced_install_grants_nothing_cluster_wide_but_discovery(
    helm: str, tmp_path: Path, overrides: dict[str, Any], namespaces: set[str]
) -> None:
    where = grants(render(helm, tmp_path, overrides))
    assert where.pop("*") == DISCOVERY
    assert set(where) == namespaces
    for granted in where.values():
        assert ("", "secrets", "get") in granted and ("apps", "statefulsets", "create") in granted


def test_a_cluster_wide_install_grants_secrets_and_workloads_everywhere(helm: str, tmp_path: Path) -> None:
    where = grants(render(helm, tmp_path, {}))
    assert set(where) == {"*"}  # one ClusterRole, bound cluster-wide: every namespace, kube-system too
    granted = where["*"]
    # What values.yaml, the README, NOTES.txt and docs/security.md say a cluster-wide install grants.
    assert {
        ("", "secrets", "get"),
        ("apps", "statefulsets", "create"),
        ("apps", "statefulsets", "patch"),
        ("", "serviceaccounts", "create"),
        ("", "serviceaccounts", "patch"),
        ("", "services", "create"),
        ("", "configmaps", "create"),
        ("policy", "poddisruptionbudgets", "create"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods/eviction", "create"),
    } <= granted
    assert (
        not {
            ("", "secrets", "list"),
            ("", "secrets", "watch"),
            ("apps", "statefulsets", "delete"),
            ("", "pods", "delete"),
        }
        & granted
    )


def rendered_notes(helm: str, tmp_path: Path, overrides: dict[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` skips NOTES.txt, and `helm install --dry-run`
    wants a cluster: a copy of the chart renders it under another name (not YAML, hence --debug)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "templates" / "notes-as-text.txt")
    values_file = tmp_path / "notes-values.yaml"
    values_file.write_text(yaml.safe_dump(overrides))
    command = [helm, "template", "rel", str(chart), "-n", "ops", "-f", str(values_file), "--debug"]
    result = subprocess.run(
        [*command, "--show-only", "templates/notes-as-text.txt"],
        capture_output=True,
        text=True,
        timeout=120,
        env=helm_env(tmp_path),
        check=False,
    )
    output = result.stdout + result.stderr
    marker = "# Source: hubshift/templates/notes-as-text.txt\n"
    assert marker in output, output
    return output.split(marker, 1)[1]


def test_the_notes_example_writes_somewhere_that_survives_a_pod(helm: str, tmp_path: Path) -> None:
    notes = rendered_notes(helm, tmp_path, {})
    start = notes.index("     apiVersion: hubshift.dev/v1alpha1")
    block = notes[start:].split("\n\n", 1)[0]  # the example, up to the first blank line
    example = parse_manifest(yaml.safe_load(textwrap.dedent(block)), source="NOTES.txt")
    output = output_condition(example)
    assert output.status == "True", output.message
    assert f"hubshift:{__version__}" in notes  # the image the pools run unless they pin one


def test_the_notes_warn_of_a_cluster_wide_install_and_say_how_to_confine_it(
    helm: str, tmp_path: Path
) -> None:
    notes = rendered_notes(helm, tmp_path, {})
    assert "every namespace" in notes and "WARNING: cluster-wide install" in notes
    assert "get any Secret by name" in notes and "kube-system" in notes
    assert "--set operator.watchReleaseNamespace=true" in notes
    confined = rendered_notes(
        tmp_path=tmp_path / "confined", helm=helm, overrides={"operator": {"watchReleaseNamespace": True}}
    )
    assert "The operator manages PartitionedConsumers in: ops." in confined
    assert "WARNING" not in confined


def test_runbook_base_url_points_every_alert_at_a_copy_of_the_runbooks(helm: str, tmp_path: Path) -> None:
    wiki = "https://wiki.example.com/hubshift/runbooks"
    values = {"metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": wiki}}}
    (rule,) = [d for d in render(helm, tmp_path, values) if d["kind"] == "PrometheusRule"]
    links = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    names = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert links == [f"{wiki}#{name.lower()}" for name in names]
