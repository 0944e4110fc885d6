"""The operator's Kubernetes edge on a real kube-apiserver: the CRD's validation and defaults, and
`hubshift operator` (as the chart's ServiceAccount, with the chart's RBAC) creating the children of a
PartitionedConsumer with owner references, reporting status and Events, keeping the replica count on a
spec change, and leaving garbage collection to delete the children with the CR."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift import podtemplate as pod
from hubshift.manifest import FRAMES_ONLY, STREAM_SINKS, UI_PORT_TAKEN, UPDATE_MODE, PartitionedConsumerSpec
from hubshift.operator.kubernetes import crd
from hubshift.operator.kubernetes.render import (
    CHILDREN_APPLIED,
    DEFAULT_IMAGE,
    OUTPUT_DURABLE,
    consumer_from_body,
)
from hubshift.sinks.jdbc import NO_SECRET_OPTIONS
from hubshift.sinks.spark_writer import AZURE_PATH, LAKE_ONLY, RESERVED
from hubshift.spec import (
    BOTH_CREDENTIALS,
    CREDENTIAL_NEEDS_ACCOUNT_URL,
    CREDENTIAL_NEEDS_NAMESPACE,
    PROXY_NEEDS_WEBSOCKETS,
    SparkSpec,
)
from tests.fixtures.cluster import eventually
from tests.fixtures.operator import CRS, example_manifest
from tests.harness.control_plane import ApiError

pytestmark = pytest.mark.timeout(240)


def create(plane: Any, namespace: str, document: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    query = "?fieldValidation=Strict" if strict else ""
    result: dict[str, Any] = plane.request("POST", CRS.format(ns=namespace) + query, document)
    return result


def _set(path: str, value: Any) -> Any:
    """A mutation of the example: the field at the dotted `path` (under spec) set to `value`."""

    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = document["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return mutate


def _rename(name: str) -> Any:
    return lambda d: d["metadata"].update(name=name)


def _route(**changes: Any) -> dict[str, Any]:
    """A route pipeline with one target `a` and one rule to it, `changes` applied."""
    editor = changes.pop("editor", [])
    return {"type": "route", "editor": editor, "route": {**ROUTE, **changes}}


ROUTE: dict[str, Any] = {"targets": [{"name": "a", "hub": "x"}], "rules": [{"to": ["a"]}]}


def _job(sink: dict[str, Any], pipeline: dict[str, Any] | None = None) -> Any:
    """A Spark job: the events pipeline (or `pipeline`) into `sink` (its type and block)."""

    def mutate(document: dict[str, Any]) -> None:
        document["spec"]["consumer"]["pipeline"] = pipeline or {"type": "events"}
        document["spec"]["consumer"]["sink"] = sink

    return mutate


LAKE = "abfss://tables@lake.dfs.core.windows.net/homes"


def _token_instead(block: str, *, drop: tuple[str, ...] = ("connectionStringSecretRef",)) -> Any:
    """The example with a workload identity credential in `block` (a dotted path under spec), less `drop`."""

    def mutate(document: dict[str, Any]) -> None:
        node = document["spec"]
        for key in block.split("."):
            node = node[key]
        for key in drop:
            node.pop(key, None)
        node["credential"] = {"type": "workloadIdentity"}

    return mutate


# Every CEL rule of the CRD (the models' `cel_rules()` and the name rule) and every kind of value the schema
# bounds, refused by the API server with the field named.
BAD_RESOURCES: list[tuple[str, Any, list[str]]] = [
    (
        "lease-out-of-range",
        _set("rebalance.leaseDurationSeconds", 90),
        ["spec.rebalance.leaseDurationSeconds"],
    ),
    ("hub-missing", lambda d: d["spec"]["eventHubs"].pop("hub"), ["spec.eventHubs.hub", "Required value"]),
    (
        "blob-and-sqlite",
        _set("checkpointStore.sqlite", {"path": "/tmp/x.db"}),
        ["spec.checkpointStore", "set exactly one of blob or sqlite"],
    ),
    (
        "max-below-min",
        lambda d: d["spec"]["scaling"].update(minReplicas=8, maxReplicas=4),
        ["spec.scaling.maxReplicas", "maxReplicas must be at least minReplicas"],
    ),
    (
        "enqueued-time-missing",
        _set("consumer.startPosition.type", "enqueuedTime"),
        ["spec.consumer.startPosition.enqueuedTime", "enqueuedTime is required when type is enqueuedTime"],
    ),
    (
        "partition-id-not-a-number",
        _set("consumer.startPosition.partitions", {"p1": {"type": "earliest"}}),
        [
            "spec.consumer.startPosition.partitions",
            "partitions: keys are partition ids (0, 1, ... up to 4 digits)",
        ],
    ),
    (
        "partition-sequence-number-missing",
        _set("consumer.startPosition.partitions", {"3": {"type": "sequenceNumber"}}),
        ["spec.consumer.startPosition.partitions", "sequenceNumber is required when type is sequenceNumber"],
    ),
    (
        "function-missing",
        _set("consumer.pipeline", {"type": "function"}),
        ["spec.consumer.pipeline.function", "function (module:function) is required when type is function"],
    ),
    (
        "replicate-target-missing",
        _set("consumer.pipeline", {"type": "replicate"}),
        ["spec.consumer.pipeline.replicate", "replicate (the target hub) is required when type is replicate"],
    ),
    (
        "blob-sink-missing",
        _set("consumer.sink", {"type": "blob"}),
        ["spec.consumer.sink.blob", "blob is required when type is blob"],
    ),
    (
        "claim-and-size",
        _set("consumer.sink", {"type": "folder", "folder": {"volume": {"claimName": "c", "size": "1Gi"}}}),
        ["spec.consumer.sink.folder.volume", "set claimName or size, not both"],
    ),
    (
        "storage-class-without-size",
        _set("consumer.sink", {"type": "folder", "folder": {"volume": {"storageClassName": "fast"}}}),
        ["spec.consumer.sink.folder.volume.storageClassName", "storageClassName goes with size"],
    ),
    (
        "proxy-over-plain-amqp",
        lambda d: d["spec"]["eventHubs"].update(transport="amqp", proxy={"url": "http://proxy.corp:3128"}),
        ["spec.eventHubs.transport", PROXY_NEEDS_WEBSOCKETS],
    ),
    (
        "proxy-with-credentials-in-its-url",
        _set("eventHubs.proxy", {"url": "http://user:secret@proxy.corp:3128"}),
        ["spec.eventHubs.proxy.url"],
    ),
    ("unknown-field", _set("scaling.maxReplcas", 3), ['unknown field "spec.scaling.maxReplcas"']),
    ("idle-replicas-not-zero", _set("scaling.idleReplicas", 1), ["spec.scaling.idleReplicas"]),
    ("port-out-of-range", _set("consumer.metricsPort", 70000), ["spec.consumer.metricsPort"]),
    (
        "name-too-long",
        _rename("h" * 53),
        ["metadata.name must be a DNS label: lower-case letters, digits and '-', at most 52 characters"],
    ),
    ("name-starts-with-a-digit", _rename("1homes"), ["metadata.name"]),
    ("empty-image", _set("consumer.image", ""), ["spec.consumer.image"]),
    (
        "malformed-cpu",
        _set("consumer.resources.requests.cpu", "two cores"),
        ["spec.consumer.resources.requests.cpu"],
    ),
    (
        "malformed-memory",
        _set("consumer.resources.limits.memory", "3 GB"),
        ["spec.consumer.resources.limits.memory"],
    ),
    (
        "malformed-driver-memory",
        _set("consumer.spark.driverMemory", "1.5GB"),
        ["spec.consumer.spark.driverMemory"],
    ),
    (
        "credential-and-connection-string",
        _token_instead("eventHubs", drop=()),
        ["spec.eventHubs.credential", BOTH_CREDENTIALS],
    ),
    (
        "credential-without-namespace",
        _token_instead("eventHubs", drop=("connectionStringSecretRef", "namespace")),
        ["spec.eventHubs.namespace", CREDENTIAL_NEEDS_NAMESPACE],
    ),
    (
        "credential-without-account-url",
        _token_instead("checkpointStore.blob"),
        ["spec.checkpointStore.blob.accountUrl", CREDENTIAL_NEEDS_ACCOUNT_URL],
    ),
    (
        "unknown-credential-type",
        _set("eventHubs.credential", {"type": "sharedKey"}),
        ["spec.eventHubs.credential.type"],
    ),
    (
        "account-url-without-tls",
        _set("checkpointStore.blob.accountUrl", "http://acct.blob.core.windows.net"),
        ["spec.checkpointStore.blob.accountUrl"],
    ),
    (
        "bad-service-account-name",
        _set("consumer.serviceAccountName", "Not_A_Name"),
        ["spec.consumer.serviceAccountName"],
    ),
    (
        "bad-function-name",
        _set("consumer.pipeline", {"type": "function", "function": "no colon"}),
        ["spec.consumer.pipeline.function"],
    ),
    (
        "route-missing",
        _set("consumer.pipeline", {"type": "route"}),
        ["spec.consumer.pipeline.route", "route (targets and rules) is required when type is route"],
    ),
    (
        "projection-missing",
        _set("consumer.pipeline", {"type": "projection"}),
        ["spec.consumer.pipeline.projection", "projection (the table) is required when type is projection"],
    ),
    (
        "editor-before-aggregate",
        _set("consumer.pipeline", {"type": "aggregate", "editor": [{"gzip": {}}]}),
        ["spec.consumer.pipeline.editor", "editor goes with type replicate, route or projection"],
    ),
    (
        "remainder-without-modulo",
        _set("consumer.pipeline", _route(rules=[{"sequenceNumber": {"remainder": 1}, "to": ["a"]}])),
        ["spec.consumer.pipeline.route.rules[0].sequenceNumber", "set modulo and remainder together"],
    ),
    (
        "remainder-not-below-modulo",
        _set(
            "consumer.pipeline",
            _route(rules=[{"sequenceNumber": {"modulo": 2, "remainder": 2}, "to": ["a"]}]),
        ),
        ["spec.consumer.pipeline.route.rules[0].sequenceNumber.remainder", "remainder must be below modulo"],
    ),
    (
        "route-targets-twice",
        _set("consumer.pipeline", _route(targets=[{"name": "a", "hub": "x"}, {"name": "a", "hub": "y"}])),
        ["spec.consumer.pipeline.route.targets", "target names must be unique"],
    ),
    (
        "route-to-unknown-target",
        _set("consumer.pipeline", _route(rules=[{"to": ["b"]}])),
        ["spec.consumer.pipeline.route", "rules and defaultTarget must name declared targets"],
    ),
    (
        "editor-step-with-two-kinds",
        _set("consumer.pipeline", _route(editor=[{"gzip": {}, "gunzip": {}}])),
        ["spec.consumer.pipeline.editor[0]", "set exactly one step per editor entry"],
    ),
    (
        "dedupe-key-unset",
        _set("consumer.pipeline", _route(editor=[{"dedupe": {"key": {}, "windowSeconds": 60}}])),
        [
            "spec.consumer.pipeline.editor[0].dedupe.key",
            "set exactly one of partitionKey (true), property or json",
        ],
    ),
    (
        "enrich-table-and-path",
        _set(
            "consumer.pipeline",
            _route(
                editor=[{"enrich": {"key": {"json": "id"}, "table": {"a": {"b": "c"}}, "path": "/t.json"}}]
            ),
        ),
        ["spec.consumer.pipeline.editor[0].enrich", "set exactly one of table or path"],
    ),
    (
        "spark-sink-after-aggregate",
        _job({"type": "delta", "delta": {"path": "/data/homes"}}, {"type": "aggregate"}),
        ["spec.consumer.pipeline", FRAMES_ONLY],
    ),
    (
        "stream-missing",
        _job({"type": "delta", "delta": {"path": "/data/homes"}}, {"type": "stream"}),
        ["spec.consumer.pipeline.stream", "stream (its function) is required when type is stream"],
    ),
    (
        "stream-into-folder",
        _job({"type": "folder"}, {"type": "stream", "stream": {"function": "jobs:windows"}}),
        ["spec.consumer.sink", STREAM_SINKS],
    ),
    (
        "stream-update-into-parquet",
        _job(
            {"type": "parquet", "parquet": {"path": "/data/p"}},
            {"type": "stream", "stream": {"function": "jobs:windows", "outputMode": "update"}},
        ),
        ["spec.consumer.pipeline.stream.outputMode", UPDATE_MODE],
    ),
    *[
        (
            f"{kind}-missing",
            _job({"type": kind}),
            [f"spec.consumer.sink.{kind}", f"{kind} ({what}) is required when type is {kind}"],
        )
        for kind, what in [
            ("delta", "the table's path"),
            ("parquet", "the folder's path"),
            ("json", "the folder's path"),
            ("jdbc", "the table"),
            ("foreachBatch", "the function"),
        ]
    ],
    (
        "lake-credential-on-a-folder",
        _job({"type": "delta", "delta": {"path": "/data/homes", "credential": {"type": "workloadIdentity"}}}),
        ["spec.consumer.sink.delta.path", LAKE_ONLY],
    ),
    (
        "lake-connection-string-on-a-folder",
        _job({"type": "parquet", "parquet": {"path": "/data/homes", "connectionStringEnv": "LAKE"}}),
        ["spec.consumer.sink.parquet.path", LAKE_ONLY],
    ),
    (
        "lake-credential-without-path",
        _job({"type": "json", "json": {"credential": {"type": "workloadIdentity"}}}),
        ["spec.consumer.sink.json.path", "Required value"],
    ),
    (
        "jdbc-password-in-options",
        _job({"type": "jdbc", "jdbc": {"table": "homes", "options": {"Password": "hunter2"}}}),
        ["spec.consumer.sink.jdbc.options", NO_SECRET_OPTIONS],
    ),
    (
        "lake-path-without-account",
        _job({"type": "delta", "delta": {"path": "abfss://homes-without-an-account"}}),
        ["spec.consumer.sink.delta.path", AZURE_PATH],
    ),
    (
        "lake-path-with-two-accounts",
        _job({"type": "parquet", "parquet": {"path": LAKE.replace("@", "@other@")}}),
        ["spec.consumer.sink.parquet.path", AZURE_PATH],
    ),
    (
        "spark-sink-sets-hubshifts-options",
        _job({"type": "delta", "delta": {"path": LAKE, "options": {"txnVersion": "7"}}}),
        ["spec.consumer.sink.delta.options", RESERVED],
    ),
    (
        "jdbc-key-column-not-a-name",
        _job({"type": "jdbc", "jdbc": {"table": "homes", "keyColumns": ["id; drop table homes"]}}),
        ["spec.consumer.sink.jdbc.keyColumns[0]"],
    ),
    (
        "spark-ui-on-the-metrics-port",
        lambda d: d["spec"]["consumer"].update(metricsPort=4040, spark={"ui": {"enabled": True}}),
        ["spec.consumer.spark.ui.port", UI_PORT_TAKEN],
    ),
    (
        "code-configmap-and-path",
        _set("consumer.code", {"configMap": "homes-job", "path": "/home/me/job"}),
        ["spec.consumer.code", "set configMap or path, not both"],
    ),
    (
        "spark-conf-owned-setting",
        _set("consumer.spark.conf", {"spark.master": "local[4]"}),
        ["spec.consumer.spark.conf", SparkSpec.cel_rules()[0]["message"]],
    ),
    (
        "spark-conf-not-spark",
        _set("consumer.spark.conf", {"hadoop.fs.defaultFS": "file:///"}),
        ["spec.consumer.spark.conf"],
    ),
    (
        "pod-label-of-hubshift",
        _set("consumer.podTemplate", {"metadata": {"labels": {"hubshift.dev/consumer": "other"}}}),
        ["spec.consumer.podTemplate.metadata.labels", pod.OWN_LABEL_MESSAGE],
    ),
    (
        "pod-label-value-malformed",
        _set("consumer.podTemplate", {"metadata": {"labels": {"team": "a b"}}}),
        ["spec.consumer.podTemplate.metadata.labels.team"],
    ),
    (
        "pod-annotation-of-hubshift",
        _set("consumer.podTemplate", {"metadata": {"annotations": {"hubshift.dev/manifest-sha256": "x"}}}),
        ["spec.consumer.podTemplate.metadata.annotations", pod.OWN_ANNOTATION_MESSAGE],
    ),
    (
        "env-of-hubshift",
        _set("consumer.podTemplate", {"env": [{"name": "HOME", "value": "/root"}]}),
        ["spec.consumer.podTemplate.env[0].name", pod.OWN_ENV_MESSAGE],
    ),
    (
        "volume-of-hubshift",
        _set("consumer.podTemplate", {"volumes": [{"name": "manifest", "emptyDir": {}}]}),
        ["spec.consumer.podTemplate.volumes[0].name", pod.OWN_VOLUME_MESSAGE],
    ),
    (
        "volume-host-path",
        _set("consumer.podTemplate", {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}),
        ['unknown field "spec.consumer.podTemplate.volumes[0].hostPath"'],
    ),
    (
        "volume-without-source",
        _set("consumer.podTemplate", {"volumes": [{"name": "nothing"}]}),
        ["spec.consumer.podTemplate.volumes[0]", pod.ONE_SOURCE_MESSAGE],
    ),
    (
        "mount-over-the-manifest",
        _set("consumer.podTemplate", {"volumeMounts": [{"name": "x", "mountPath": "/etc"}]}),
        ["spec.consumer.podTemplate.volumeMounts[0].mountPath", pod.OWN_MOUNT_MESSAGE],
    ),
    (
        "mount-path-relative",
        _set("consumer.podTemplate", {"volumeMounts": [{"name": "x", "mountPath": "config/../etc"}]}),
        ["spec.consumer.podTemplate.volumeMounts[0].mountPath"],
    ),
    (
        "sidecar-named-consumer",
        _set("consumer.podTemplate", {"sidecars": [{"name": "consumer", "image": "busybox"}]}),
        ["spec.consumer.podTemplate.sidecars[0].name", pod.OWN_CONTAINER_MESSAGE],
    ),
    (
        "sidecar-privileged",
        _set(
            "consumer.podTemplate",
            {"sidecars": [{"name": "s", "image": "busybox", "securityContext": {"privileged": True}}]},
        ),
        ['unknown field "spec.consumer.podTemplate.sidecars[0].securityContext.privileged"'],
    ),
    (
        "init-container-as-root",
        _set(
            "consumer.podTemplate",
            {"initContainers": [{"name": "i", "image": "busybox", "securityContext": {"runAsUser": 0}}]},
        ),
        ["spec.consumer.podTemplate.initContainers[0].securityContext.runAsUser"],
    ),
    (
        "sidecar-port-named-metrics",
        _set(
            "consumer.podTemplate",
            {
                "sidecars": [
                    {"name": "s", "image": "busybox", "ports": [{"name": "metrics", "containerPort": 80}]}
                ]
            },
        ),
        ["spec.consumer.podTemplate.sidecars[0].ports[0].name", pod.OWN_PORT_NAME_MESSAGE],
    ),
    (
        "sidecar-on-the-metrics-port",
        _set(
            "consumer.podTemplate",
            {"sidecars": [{"name": "s", "image": "busybox", "ports": [{"containerPort": 9090}]}]},
        ),
        ["spec.consumer.podTemplate", pod.PORT_TAKEN],
    ),
    (
        "toleration-operator-unknown",
        _set("consumer.podTemplate", {"tolerations": [{"key": "spot", "operator": "Maybe"}]}),
        ["spec.consumer.podTemplate.tolerations[0].operator"],
    ),
    (
        "max-unavailable-negative",
        _set("consumer.podDisruptionBudget", {"maxUnavailable": -1}),
        ["spec.consumer.podDisruptionBudget.maxUnavailable"],
    ),
    (
        "secret-name-a-path",
        _set("eventHubs.connectionStringSecretRef", {"name": "../../team-b/secrets/eh", "key": "k"}),
        ["spec.eventHubs.connectionStringSecretRef.name"],
    ),
    (
        "proxy-secret-name-a-path",
        _set(
            "eventHubs.proxy",
            {"url": "http://proxy.corp:3128", "credentialsSecretRef": {"name": "a/../b", "key": "k"}},
        ),
        ["spec.eventHubs.proxy.credentialsSecretRef.name"],
    ),
    (
        "namespace-with-a-fragment",
        _set("eventHubs.namespace", "evil.example#.servicebus.windows.net"),
        ["spec.eventHubs.namespace"],
    ),
    (
        "account-url-with-a-backslash",
        _set("checkpointStore.blob.accountUrl", "https://evil.example\\.blob.core.windows.net"),
        ["spec.checkpointStore.blob.accountUrl"],
    ),
    (
        "projected-service-account-token",
        _set(
            "consumer.podTemplate",
            {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]},
        ),
        [
            "spec.consumer.podTemplate.volumes[0].projected.sources[0].serviceAccountToken",
            pod.NO_TOKEN_MESSAGE,
        ],
    ),
    (
        "sidecar-on-a-host-port",
        _set(
            "consumer.podTemplate",
            {"sidecars": [{"name": "s", "image": "b", "ports": [{"containerPort": 80, "hostPort": 80}]}]},
        ),
        ["spec.consumer.podTemplate.sidecars[0].ports[0].hostPort", pod.NO_HOST_PORT_MESSAGE],
    ),
    (
        "init-container-on-a-host-address",
        _set(
            "consumer.podTemplate",
            {
                "initContainers": [
                    {"name": "i", "image": "b", "ports": [{"containerPort": 80, "hostIP": "::"}]}
                ]
            },
        ),
        ["spec.consumer.podTemplate.initContainers[0].ports[0].hostIP", pod.NO_HOST_IP_MESSAGE],
    ),
    (
        "projection-postgres-missing",
        _set(
            "consumer.pipeline", {"type": "projection", "projection": {"table": "t", "database": "postgres"}}
        ),
        ["spec.consumer.pipeline.projection.postgres", "postgres is required when database is postgres"],
    ),
]


def _rules_in(schema: Any) -> list[dict[str, Any]]:
    """Every `x-kubernetes-validations` rule anywhere in a schema."""
    if isinstance(schema, list):
        return [rule for item in schema for rule in _rules_in(item)]
    if not isinstance(schema, dict):
        return []
    own = list(schema.get("x-kubernetes-validations", []))
    return own + [
        rule
        for key, value in schema.items()
        if key != "x-kubernetes-validations"
        for rule in _rules_in(value)
    ]


def test_every_rule_of_the_crd_has_a_bad_resource_above() -> None:
    expected = " ".join(fragment for _, _, fragments in BAD_RESOURCES for fragment in fragments)
    for rule in _rules_in(crd.custom_resource_definition()):
        assert rule["message"] in expected, f"no bad resource shows the rule {rule['message']!r}"
    assert len(BAD_RESOURCES) >= 15


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [pytest.param(mutate, expected, id=name) for name, mutate, expected in BAD_RESOURCES],
)
def test_a_bad_resource_is_refused_naming_the_field(
    control_plane: Any, kube_namespace: str, hubshift_crd: str, mutate: Any, expected: list[str]
) -> None:
    document = example_manifest(kube_namespace)
    mutate(document)
    with pytest.raises(ApiError) as refused:
        create(control_plane, kube_namespace, document)
    assert refused.value.status in (400, 422), refused.value.body  # 400: strict decoding (unknown field)
    message = json.loads(refused.value.body)["message"]
    for fragment in expected:
        assert fragment in message, message


def test_the_server_fills_the_models_defaults(
    control_plane: Any, kube_namespace: str, hubshift_crd: str
) -> None:
    minimal = {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "minimal", "namespace": kube_namespace},
        "spec": {
            "eventHubs": {"hub": "telemetry"},
            "checkpointStore": {"blob": {"container": "checkpoints"}},
        },
    }
    stored = create(control_plane, kube_namespace, minimal)
    assert stored["spec"]["rebalance"] == {
        "delaySeconds": 10,
        "maxHandoffSeconds": 15,
        "leaseDurationSeconds": 30,
        "strategy": "balanced",
        "loadAware": {"maxMoves": 4, "tolerance": 0.2, "windowSeconds": 60},
        "rollout": {"maxSurge": 1, "strategy": "Operator"},
    }
    assert stored["spec"]["consumer"]["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert stored["spec"]["scaling"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    # What the operator parses from the stored object is exactly what the model makes of the minimal one.
    assert consumer_from_body(stored).spec == PartitionedConsumerSpec.model_validate(minimal["spec"])


def test_the_operator_creates_owned_children_reports_status_and_lets_gc_delete_them(
    control_plane: Any, kube_namespace: str, hubshift_operator: Any
) -> None:
    ns = kube_namespace
    created = create(control_plane, ns, example_manifest(ns))
    uid = created["metadata"]["uid"]
    children = {
        f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes": "StatefulSet",
        f"/api/v1/namespaces/{ns}/services/homes": "Service",
        f"/api/v1/namespaces/{ns}/services/homes-metrics": "Service",
        f"/api/v1/namespaces/{ns}/configmaps/homes-manifest": "ConfigMap",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/homes": "PodDisruptionBudget",
    }
    for path, kind in children.items():
        child = eventually(lambda p=path: control_plane.request("GET", p), what=kind)  # type: ignore[misc]
        owner = child["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("PartitionedConsumer", uid, True)

    # KWOK runs the StatefulSet's pod; the pod watch wakes the control loop, which reports it ready.
    def ready_status() -> dict[str, Any] | None:
        status: dict[str, Any] = control_plane.request("GET", f"{CRS.format(ns=ns)}/homes").get("status", {})
        return status if status.get("phase") == "Ready" and status.get("readyReplicas") == 1 else None

    status = eventually(
        ready_status, timeout=90, what=f"status Ready with one ready pod\n{hubshift_operator.log()}"
    )
    assert status["currentReplicas"] == 1
    assert status["observedGeneration"] == created["metadata"]["generation"]
    assert status["conditions"][0]["type"] == "Ready"
    events = control_plane.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    assert any(e["reason"] == "ChildrenCreated" and e["involvedObject"]["uid"] == uid for e in events)
    metrics = hubshift_operator.metrics()
    assert f'hubshift_current_replicas{{consumer="homes",namespace="{ns}"}} 1.0' in metrics

    # A spec change re-renders the children; the replica count stays the control loop's.
    scale = f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes/scale"
    control_plane.request("PATCH", scale, {"spec": {"replicas": 2}})
    control_plane.request(
        "PATCH",
        f"{CRS.format(ns=ns)}/homes",
        {"spec": {"consumer": {"image": "registry.example/hubshift:0.2.0"}}},
    )

    def rerendered() -> dict[str, Any] | None:
        sts: dict[str, Any] = control_plane.request(
            "GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes"
        )
        image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
        return sts if image == "registry.example/hubshift:0.2.0" else None

    assert eventually(rerendered, what="the new image")["spec"]["replicas"] == 2

    # Deleting the CR: the operator releases it, garbage collection removes the children.
    control_plane.request("DELETE", f"{CRS.format(ns=ns)}/homes")

    def gone(path: str) -> bool:
        try:
            control_plane.request("GET", path)
        except ApiError as error:
            return error.status == 404
        return False

    eventually(lambda: gone(f"{CRS.format(ns=ns)}/homes"), what="the CR gone (its finalizer released)")
    for path, kind in children.items():
        eventually(lambda p=path: gone(p), timeout=90, what=f"{kind} garbage-collected")  # type: ignore[misc]
    assert hubshift_operator.process.poll() is None, hubshift_operator.log()


def test_a_keyless_resource_gets_its_service_account_and_labelled_pods_and_no_secret(
    control_plane: Any, kube_namespace: str, start_operator: Any
) -> None:
    """examples/homes-keyless.yaml: the operator creates the pods' ServiceAccount (owned, annotated with
    the workload identity's client id), labels the pods for Azure Workload Identity and renders no Secret;
    a ServiceAccount that exists already and that an administrator allowed is used as it is, never changed
    or owned."""
    ns = kube_namespace
    hubshift_operator = start_operator(access={"allowedServiceAccounts": {ns: ["theirs"]}})
    accounts = f"/api/v1/namespaces/{ns}/serviceaccounts"
    control_plane.request(
        "POST", accounts, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "theirs"}}
    )
    keyless = yaml.safe_load((Path(crd.REPO_ROOT) / "examples" / "homes-keyless.yaml").read_text())
    keyless["metadata"]["namespace"] = ns
    uid = create(control_plane, ns, keyless)["metadata"]["uid"]
    account = eventually(lambda: control_plane.request("GET", f"{accounts}/homes"), what="the ServiceAccount")
    assert account["metadata"]["annotations"]["azure.workload.identity/client-id"] == (
        "00000000-0000-0000-0000-000000000001"
    )
    assert account["metadata"]["ownerReferences"][0]["uid"] == uid
    sts = eventually(
        lambda: control_plane.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes"),
        what="the StatefulSet",
    )
    template = sts["spec"]["template"]
    assert template["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert template["spec"]["serviceAccountName"] == "homes"
    assert "secretKeyRef" not in json.dumps(template)

    def pod() -> dict[str, Any] | None:
        items = control_plane.request(
            "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=hubshift.dev/consumer=homes"
        )
        return items["items"][0] if items["items"] else None

    running = eventually(pod, timeout=90, what="a consumer pod (KWOK)")
    assert running["spec"]["serviceAccountName"] == "homes"
    assert running["metadata"]["labels"]["azure.workload.identity/use"] == "true"

    porch = copy.deepcopy(keyless)
    porch["metadata"]["name"] = "porch"
    porch["spec"]["consumer"]["serviceAccountName"] = "theirs"
    create(control_plane, ns, porch)
    sts = eventually(
        lambda: control_plane.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/porch"),
        what="the second StatefulSet",
    )
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "theirs"
    theirs = control_plane.request("GET", f"{accounts}/theirs")
    assert "ownerReferences" not in theirs["metadata"] and "annotations" not in theirs["metadata"]
    assert hubshift_operator.process.poll() is None, hubshift_operator.log()


POD_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "homes"}, "annotations": {"example.com/scrape": "false"}},
    "nodeSelector": {"type": "kwok"},
    "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    "priorityClassName": "system-node-critical",
    "imagePullSecrets": [{"name": "registry"}],
    "env": [{"name": "SITES", "value": "/config/sites.json"}],
    "envFrom": [{"secretRef": {"name": "extra", "optional": True}}],
    "volumes": [{"name": "sites", "configMap": {"name": "sites", "optional": True}}],
    "volumeMounts": [{"name": "sites", "mountPath": "/config", "readOnly": True}],
    "sidecars": [{"name": "shipper", "image": "busybox:1.36", "command": ["sleep", "infinity"]}],
    "topologySpreadConstraints": [],
}


def test_a_pod_template_reaches_the_pods_and_a_refused_child_is_the_status(
    control_plane: Any, kube_namespace: str, hubshift_operator: Any
) -> None:
    """The operator renders `podTemplate` into the StatefulSet the API server accepts and KWOK runs (the
    image the operator's own default, no spec.consumer.image); a folder sink on an emptyDir is a Warning
    Event and the condition OutputDurable False; a pod template the API server refuses in the StatefulSet
    (an affinity the CRD keeps as written) is the resource's status, with the server's words."""
    ns = kube_namespace
    document = example_manifest(ns)
    document["spec"]["consumer"].update(podTemplate=POD_TEMPLATE, podDisruptionBudget={"maxUnavailable": 2})
    create(control_plane, ns, document)
    sts = eventually(
        lambda: control_plane.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes"),
        what="the StatefulSet",
    )
    template = sts["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "homes"
    assert template["metadata"]["annotations"]["example.com/scrape"] == "false"
    spec = template["spec"]
    assert "topologySpreadConstraints" not in spec  # [] replaced hubshift's own spread
    consumer, shipper = spec["containers"]
    assert consumer["image"] == DEFAULT_IMAGE
    assert {"name": "sites", "mountPath": "/config", "readOnly": True} in consumer["volumeMounts"]
    assert consumer["env"][-1] == {"name": "SITES", "value": "/config/sites.json"}
    assert shipper["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }

    def pod() -> dict[str, Any] | None:
        found = control_plane.request("GET", f"/api/v1/namespaces/{ns}/pods/homes-0")
        return found if found.get("spec", {}).get("nodeName") else None

    scheduled = eventually(pod, timeout=90, what="homes-0 scheduled on a KWOK node (nodeSelector type: kwok)")
    assert [c["name"] for c in scheduled["spec"]["containers"]] == ["consumer", "shipper"]
    assert scheduled["spec"]["priorityClassName"] == "system-node-critical"
    budget = control_plane.request("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/homes")
    assert budget["spec"]["maxUnavailable"] == 2

    scratch = example_manifest(ns)
    scratch["metadata"]["name"] = "scratch"
    del scratch["spec"]["consumer"]["sink"]  # the folder sink, on an emptyDir
    create(control_plane, ns, scratch)

    def warned() -> list[dict[str, Any]]:
        events = control_plane.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        return [
            e
            for e in events
            if e["reason"] == "OutputNotDurable" and e["involvedObject"]["name"] == "scratch"
        ]

    (event,) = eventually(warned, what="the OutputNotDurable Event")[:1]
    assert event["type"] == "Warning" and "emptyDir" in event["message"]

    def output(name: str) -> dict[str, Any] | None:
        status = control_plane.request("GET", f"{CRS.format(ns=ns)}/{name}").get("status") or {}
        return next((c for c in status.get("conditions", []) if c["type"] == OUTPUT_DURABLE), None)

    assert eventually(lambda: output("scratch"), what="OutputDurable on scratch")["status"] == "False"
    assert eventually(lambda: output("homes"), what="OutputDurable on homes")["reason"] == "StorageService"

    broken = example_manifest(ns)
    broken["metadata"]["name"] = "broken"
    never = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    broken["spec"]["consumer"]["podTemplate"] = {"affinity": {"nodeAffinity": never}}
    create(control_plane, ns, broken)  # the CRD keeps an affinity as written: the StatefulSet is refused

    def invalid() -> dict[str, Any] | None:
        status = control_plane.request("GET", f"{CRS.format(ns=ns)}/broken").get("status") or {}
        return status if status.get("phase") == "Invalid" else None

    status = eventually(invalid, what=f"broken Invalid\n{hubshift_operator.log()[-3000:]}")
    assert "the API server refused the StatefulSet broken" in status["message"], status
    assert "nodeSelectorTerms" in status["message"], status

    # The same change to a running pool: it keeps its last accepted pods and its control loop, and its
    # status says the spec was not applied, until the spec is fixed.
    def applied(name: str) -> dict[str, Any] | None:
        status = control_plane.request("GET", f"{CRS.format(ns=ns)}/{name}").get("status") or {}
        return next((c for c in status.get("conditions", []) if c["type"] == CHILDREN_APPLIED), None)

    def patch_affinity(value: Any) -> None:
        change = {"spec": {"consumer": {"podTemplate": {"affinity": value}}}}
        control_plane.request("PATCH", f"{CRS.format(ns=ns)}/homes", change)

    patch_affinity({"nodeAffinity": never})
    refused = eventually(
        lambda: (found := applied("homes")) and found["status"] == "False" and found,
        what=f"homes' ChildrenApplied False\n{hubshift_operator.log()[-3000:]}",
    )
    assert "nodeSelectorTerms" in refused["message"] and refused["reason"] == "Refused"
    current = control_plane.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes")
    assert "affinity" not in current["spec"]["template"]["spec"]  # the last accepted pods
    patch_affinity(None)
    eventually(lambda: (found := applied("homes")) and found["status"] == "True", what="applied again")
    assert hubshift_operator.process.poll() is None, hubshift_operator.log()


def test_two_operators_with_peering_one_works_the_other_stands_by(
    control_plane: Any, kube_namespace: str, start_operator: Any
) -> None:
    ns = kube_namespace
    # kopf starts a peered operator paused; the highest priority resumes, the others stay paused.
    primary = start_operator(priority=100)
    standby = start_operator(priority=10)
    eventually(lambda: "Resuming operations" in primary.log(), what=f"the primary resuming\n{primary.log()}")

    create(control_plane, ns, example_manifest(ns))
    statefulset = f"/apis/apps/v1/namespaces/{ns}/statefulsets/homes"
    eventually(lambda: control_plane.request("GET", statefulset), what="the children, from the primary")
    # Logged once its Events are posted, a moment after the StatefulSet exists.
    created = "created the consumer StatefulSet"
    eventually(lambda: created in primary.log(), what=f"the log line\n{primary.log()}")
    assert created not in standby.log()
    assert "Resuming operations" not in standby.log()

    # The primary goes; the standby takes over and acts on the next change.
    primary.stop()
    eventually(
        lambda: "Resuming operations" in standby.log(),
        timeout=90,
        what=f"the standby resuming\n{standby.log()}",
    )
    control_plane.request(
        "PATCH", f"{CRS.format(ns=ns)}/homes", {"spec": {"consumer": {"image": "hubshift:0.3.0"}}}
    )

    def image() -> str:
        return str(
            control_plane.request("GET", statefulset)["spec"]["template"]["spec"]["containers"][0]["image"]
        )

    eventually(lambda: image() == "hubshift:0.3.0", what=f"the standby reconciling\n{standby.log()}")


def test_the_chart_installs_on_the_api_server_without_warnings(
    control_plane: Any, kube_namespace: str, hubshift_crd: str, tmp_path: Path
) -> None:
    """Every manifest the chart renders is accepted as it is (strict field validation would refuse a typo,
    here kubectl's and helm's warnings are errors); KWOK reports the operator's pod running, so the
    Deployment becomes available (no image runs here)."""
    helm = control_plane.bin_dir / "helm"
    if not helm.is_file():
        pytest.skip(f"no helm in {control_plane.bin_dir}")
    release = f"chart-{kube_namespace}"
    env = {
        **control_plane.environ(),
        "HELM_CACHE_HOME": str(tmp_path / "c"),
        "HELM_CONFIG_HOME": str(tmp_path / "g"),
    }
    values = {"operator": {"watchNamespaces": [kube_namespace]}, "dashboards": {"enabled": True}}
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    chart = Path(__file__).resolve().parents[2] / "charts" / "hubshift"
    command = [str(helm), "install", release, str(chart), "-n", kube_namespace, "-f", str(values_file)]
    # The session applied the CRD with kubectl (hubshift_crd): the chart's template adopts it.
    command.append("--take-ownership")
    try:
        result = subprocess.run(
            [*command, "--wait", "--timeout", "90s"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "warning" not in result.stderr.lower(), result.stderr
        assert "kubectl get pcon" in result.stdout  # NOTES.txt
        deployment = control_plane.request(
            "GET", f"/apis/apps/v1/namespaces/{kube_namespace}/deployments/{release}-hubshift"
        )
        assert deployment["status"].get("availableReplicas") == 1
        definition = control_plane.request(
            "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/partitionedconsumers.hubshift.dev"
        )
        assert definition["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert definition["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
    finally:
        subprocess.run(
            [str(helm), "uninstall", release, "-n", kube_namespace, "--wait", "--timeout", "60s"],
            capture_output=True,
            timeout=90,
            env=env,
            check=False,
        )
