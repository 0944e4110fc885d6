"""The parts of the deployed scenarios (tests/scenarios/deployed.py) that show a platform team's own
additions on real pods: the chart as a subchart of an umbrella chart with `global` values, and
examples/route.yaml run with a `podTemplate` that a team would write for it: a node selector and a
toleration of a tainted node, the lookup file its `enrich` step reads mounted from a ConfigMap at /config,
a target hub's connection string from a Secret through an environment variable, and a sidecar.

Only plain data and the cluster's own commands; the scenarios call these in order."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.scenarios.cluster import JSON, Image, ScenarioCluster

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "hubshift"
ROUTE_EXAMPLE = REPO_ROOT / "examples" / "route.yaml"

# The route example's hubs, beside the scenarios' own: what it reads, and its three targets.
ROUTE_HUBS = ("readings:2", "alarms:1", "hot-readings:1", "archive:1")
ROUTE_NAME = "readings-router"
SIDECAR = "readiness-watch"
# A node label the template selects and a taint it tolerates: a dedicated Spark node pool.
POOL_LABEL, POOL = "hubshift.dev/pool", "spark"
TAINT = "hubshift.dev/dedicated"
SITES = {"h1": {"city": "Oslo"}, "h2": {"city": "Lima"}}
ALARMS_SECRET = "alarms-eventhubs"

# The sidecar, in the hubshift image (the only one the nodes have): it reads the consumer's /readyz over
# the pod's own loopback, says when it answered, then waits to be stopped with the pod.
WATCH = """
import time, urllib.request
while True:
    try:
        with urllib.request.urlopen("http://127.0.0.1:9090/readyz", timeout=2) as answer:
            print("consumer ready:", answer.status, flush=True)
            break
    except Exception as error:
        print("consumer not ready yet:", error, flush=True)
    time.sleep(2)
while True:
    time.sleep(3600)
"""


def umbrella_chart(workdir: Path) -> Path:
    """The chart as GitOps users hold it: the dependency of an umbrella chart (`platform`), in charts/."""
    umbrella = workdir / "platform"
    shutil.copytree(CHART, umbrella / "charts" / "hubshift")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    chart = {
        "apiVersion": "v2",
        "name": "platform",
        "version": "1.0.0",
        "dependencies": [{"name": "hubshift", "version": version}],
    }
    (umbrella / "Chart.yaml").write_text(yaml.safe_dump(chart))
    return umbrella


def umbrella_values(image: Image) -> list[str]:
    """`helm --set` arguments: the image's registry as the umbrella's global.imageRegistry, the rest as the
    subchart's values."""
    registry, name = image.registry_and_name
    return [
        *("--set", f"global.imageRegistry={registry}"),
        *("--set", f"hubshift.image.repository={name}", "--set", f"hubshift.image.tag={image.tag}"),
        *("--set", f"hubshift.image.pullPolicy={image.pull_policy}"),
    ]


def full_reference(image: Image) -> str:
    """The image as the chart names it under global.imageRegistry (registry/name:tag)."""
    registry, name = image.registry_and_name
    return f"{registry}/{name}:{image.tag}"


def route_example(image: Image) -> JSON:
    """examples/route.yaml as a platform team deploys it on the scenarios' cluster: sizes that fit two
    cores, one replica, and more in its pod template (which mounts the lookup file). The alarms target
    names only its variable: the pod template fills it from a Secret."""
    document: JSON = yaml.safe_load(ROUTE_EXAMPLE.read_text())
    spec = document["spec"]
    consumer = spec["consumer"]
    consumer["resources"] = {"requests": {"cpu": "100m", "memory": "640Mi"}, "limits": {"memory": "1536Mi"}}
    consumer["spark"] = {"master": "local[1]", "driverMemory": "512m", "shufflePartitions": 1}
    consumer["checkpoint"] = {"everySeconds": 2, "everyEvents": 5000}
    alarms = consumer["pipeline"]["route"]["targets"][0]
    assert alarms["name"] == "alarms"
    del alarms["connectionStringSecretRef"]
    watch = {
        "name": SIDECAR,
        "image": image.reference,
        "imagePullPolicy": image.pull_policy,
        "command": ["python3", "-c", WATCH],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
    }
    template = consumer["podTemplate"]  # the example's own: the lookup file's ConfigMap at /config
    assert {"name": "sites", "mountPath": "/config", "readOnly": True} in template["volumeMounts"]
    template.update(
        metadata={"labels": {"team": "readings"}, "annotations": {"example.com/owner": "readings"}},
        nodeSelector={POOL_LABEL: POOL},
        tolerations=[{"key": TAINT, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}],
        env=[
            {
                "name": alarms["connectionStringEnv"],
                "valueFrom": {"secretKeyRef": {"name": ALARMS_SECRET, "key": "connectionString"}},
            }
        ],
        sidecars=[watch],
    )
    spec["scaling"] = {"minReplicas": 1, "maxReplicas": 1, "pollingIntervalSeconds": 2}
    spec["rebalance"] = {"delaySeconds": 5, "maxHandoffSeconds": 15}
    return document


def route_secrets(document: JSON) -> list[str]:
    """The Secrets the route example names (each holds a connection string), and the alarms Secret."""
    names: set[str] = {ALARMS_SECRET}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            reference = node.get("connectionStringSecretRef")
            if reference:
                names.add(reference["name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document["spec"])
    return sorted(names)


def sites_config_map() -> JSON:
    """The lookup file the example's `enrich` step reads at /config/sites.json."""
    data = {"sites.json": json.dumps(SITES)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sites"}, "data": data}


def readings() -> list[tuple[str | None, bytes, dict[str, str] | None]]:
    """(partition key, body, properties) for the example's `readings` hub: two alarms (one of a home the
    table lacks), a hot reading, a plain one, a heartbeat (filtered out), a repeat (deduplicated), a body
    that is not gzip (a dead letter)."""

    def reading(home: str, kind: str, temperature: float, reading_id: str) -> bytes:
        body = {"homeId": home, "kind": kind, "temperature": temperature, "readingId": reading_id}
        return gzip.compress(json.dumps(body).encode())

    return [
        ("h1", reading("h1", "alarm", 21, "r1"), {"kind": "alarm"}),
        ("h2", reading("h2", "reading", 35, "r2"), {"kind": "reading"}),
        ("h1", reading("h1", "reading", 20, "r3"), {"kind": "reading"}),
        ("h2", reading("h2", "heartbeat", 0, "r4"), {"kind": "heartbeat"}),
        ("h1", reading("h1", "alarm", 21, "r1"), {"kind": "alarm"}),
        ("h9", reading("h9", "alarm", 23, "r5"), {"kind": "alarm"}),
        ("h2", b"not gzip", {"kind": "reading"}),
    ]


# What reaches each target: reading ids, with the site `enrich` added from the mounted file.
EXPECTED = {
    "alarms": {"r1": {"city": "Oslo"}, "r5": None},
    "hot-readings": {"r2": {"city": "Lima"}},
    "archive": {"r1": {"city": "Oslo"}, "r3": {"city": "Oslo"}, "r5": None},
}


def delivered(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Reading id -> the site each event at a target carries (None without one)."""
    bodies = [json.loads(event["body"]) for event in events]
    return {body["readingId"]: body.get("site") for body in bodies}


@contextmanager
def dedicated_nodes(cluster: ScenarioCluster) -> Iterator[list[str]]:
    """Every node labelled as the Spark pool and tainted NoSchedule for it while the block runs: only pods
    that tolerate the taint start there meanwhile (the running ones stay). The taint goes at the end, the
    label too."""
    nodes = [node["metadata"]["name"] for node in cluster.get("nodes")["items"]]
    for node in nodes:
        cluster.kubectl("label", "node", node, f"{POOL_LABEL}={POOL}", "--overwrite")
        cluster.kubectl("taint", "node", node, f"{TAINT}={POOL}:NoSchedule", "--overwrite")
    try:
        yield nodes
    finally:
        for node in nodes:
            cluster.kubectl("taint", "node", node, f"{TAINT}-", check=False)
            cluster.kubectl("label", "node", node, f"{POOL_LABEL}-", check=False)
