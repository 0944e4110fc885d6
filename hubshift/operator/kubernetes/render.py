"""The child resources of a PartitionedConsumer as plain dicts: pure functions of the spec and the CR.

Children: the manifest the pods read (a ConfigMap, never a secret in it), a StatefulSet of consumer pods
(stable identities `<name>-<ordinal>`), a headless Service (stable DNS names), a metrics Service and a
PodDisruptionBudget; with a token credential, the pods' ServiceAccount. Each carries the standard
`app.kubernetes.io/*` labels and an owner reference to the CR, so deleting the CR garbage-collects them.

A spec with token credentials gives its pods what Azure Workload Identity on AKS needs: a ServiceAccount
(`spec.consumer.serviceAccountName`, default the CR's name; annotated with the identity's client id when
the operator creates it) and the label `azure.workload.identity/use: "true"`, and no Secret at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from hubshift import __version__, sinks
from hubshift.errors import UserError
from hubshift.manifest import CODE_DIR, PartitionedConsumer, connections_of, credentials_of, parse_manifest
from hubshift.spec import API_VERSION, GROUP, KIND, STOP_FOLLOW_SECONDS

JSON = dict[str, Any]

APP_NAME = "hubshift"
MANAGER = "hubshift-operator"  # app.kubernetes.io/managed-by of every child, and the SSA field manager
CONSUMER_COMPONENT = "consumer"
METRICS_COMPONENT = "consumer-metrics"
CONSUMER_LABEL = f"{GROUP}/consumer"  # the owning PartitionedConsumer's name, on every child and pod
MANIFEST_HASH_ANNOTATION = f"{GROUP}/manifest-sha256"

MANIFEST_DIR = "/etc/hubshift"
MANIFEST_KEY = "manifest.yaml"
MANIFEST_PATH = f"{MANIFEST_DIR}/{MANIFEST_KEY}"
WORK_DIR = "/var/lib/hubshift"  # writable scratch: Spark's working directory and HOME
CONTAINER_NAME = "consumer"
METRICS_PORT_NAME = "metrics"

RUN_AS_USER = 10001  # the image's `hubshift` user (Dockerfile)
# Azure Workload Identity: the webhook injects the federated token and AZURE_* into pods with this label,
# for the client id its ServiceAccount carries in this annotation.
WORKLOAD_IDENTITY_LABEL = "azure.workload.identity/use"
WORKLOAD_IDENTITY_CLIENT_ID = "azure.workload.identity/client-id"
# Credential types that use the pod's workload identity (DefaultAzureCredential tries it first on AKS).
WORKLOAD_IDENTITY_TYPES = frozenset(("workloadIdentity", "default"))


@dataclass(frozen=True)
class Owner:
    """The PartitionedConsumer that owns the children."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Owner:
        metadata = body["metadata"]
        return cls(
            name=metadata["name"], namespace=metadata.get("namespace") or "default", uid=metadata["uid"]
        )


@dataclass(frozen=True)
class ChildNames:
    statefulset: str
    headless_service: str
    metrics_service: str
    pod_disruption_budget: str
    config_map: str

    @classmethod
    def of(cls, consumer_name: str) -> ChildNames:
        return cls(
            statefulset=consumer_name,
            headless_service=consumer_name,  # the StatefulSet's serviceName: <pod>.<name>.<ns>.svc
            metrics_service=f"{consumer_name}-metrics",
            pod_disruption_budget=consumer_name,
            config_map=f"{consumer_name}-manifest",
        )


def consumer_from_body(body: Mapping[str, Any]) -> PartitionedConsumer:
    """The typed manifest of a CR as the API server returns it; raises `UserError` naming the field.

    Server-side metadata (uid, annotations such as kopf's, managedFields) and the status are left out:
    the manifest is what the user wrote, after the CRD's defaults.
    """
    metadata = body.get("metadata", {})
    document = {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", KIND),
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace") or "default",
            "labels": dict(metadata.get("labels") or {}),
        },
        "spec": body.get("spec"),
    }
    where = f"{KIND} {document['metadata']['namespace']}/{document['metadata']['name']}"
    consumer = parse_manifest(document, source=where)
    try:
        check_for_cluster(consumer)
    except UserError as error:
        raise UserError(f"{where}: {error}") from None
    return consumer


def check_for_cluster(consumer: PartitionedConsumer) -> None:
    """What only a cluster refuses (`UserError`): a SQLite store, which pods on different nodes cannot
    share, and a folder sink with nowhere to write."""
    if consumer.spec.checkpoint_store.sqlite is not None:
        raise UserError(
            "spec.checkpointStore.sqlite: consumer pods cannot share a SQLite file; "
            "in a cluster use spec.checkpointStore.blob"
        )
    if consumer.spec.consumer.code.path is not None:
        raise UserError("spec.consumer.code.path: a folder of this machine; in a cluster use code.configMap")
    sink_volume(consumer)


# --- labels and ownership --------------------------------------------------------------------------


def selector_labels(consumer_name: str, component: str = CONSUMER_COMPONENT) -> dict[str, str]:
    """The immutable subset used in selectors."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": consumer_name,
        "app.kubernetes.io/component": component,
    }


def standard_labels(consumer_name: str, component: str = CONSUMER_COMPONENT) -> dict[str, str]:
    return {
        **selector_labels(consumer_name, component),
        "app.kubernetes.io/part-of": APP_NAME,
        "app.kubernetes.io/managed-by": MANAGER,
        "app.kubernetes.io/version": __version__,
        CONSUMER_LABEL: consumer_name,
    }


def pod_labels(consumer_name: str) -> dict[str, str]:
    """Pod template labels: no version, so an operator upgrade alone never restarts consumers."""
    labels = standard_labels(consumer_name)
    del labels["app.kubernetes.io/version"]
    return labels


def uses_workload_identity(consumer: PartitionedConsumer) -> bool:
    """Whether a credential of the spec reads the pod's workload identity (its pods get the label)."""
    return any(credential.type in WORKLOAD_IDENTITY_TYPES for credential in credentials_of(consumer.spec))


def service_account_name(consumer: PartitionedConsumer) -> str | None:
    """The consumer pods' ServiceAccount: the spec's, or the CR's name when the spec uses a token credential;
    None: the namespace's default (connection strings only)."""
    named = consumer.spec.consumer.service_account_name
    if named is not None:
        return named
    return consumer.metadata.name if credentials_of(consumer.spec) else None


def render_service_account(consumer: PartitionedConsumer, owner: Owner) -> JSON | None:
    """The pods' ServiceAccount as the operator creates it when none of that name exists (an existing one
    is used as it is): annotated with the workload identity's client id when the spec names exactly one."""
    name = service_account_name(consumer)
    if name is None:
        return None
    metadata = _metadata(name, owner)
    client_ids = {
        credential.client_id
        for credential in credentials_of(consumer.spec)
        if credential.type in WORKLOAD_IDENTITY_TYPES and credential.client_id is not None
    }
    if len(client_ids) == 1:
        metadata["annotations"] = {WORKLOAD_IDENTITY_CLIENT_ID: client_ids.pop()}
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata,
        "automountServiceAccountToken": False,  # consumers never talk to Kubernetes
    }


def owner_reference(owner: Owner) -> JSON:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(name: str, owner: Owner, component: str = CONSUMER_COMPONENT) -> JSON:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": standard_labels(owner.name, component),
        "ownerReferences": [owner_reference(owner)],
    }


# --- the manifest the pods read ---------------------------------------------------------------------


def manifest_text(consumer: PartitionedConsumer) -> str:
    """The manifest as `hubshift consume -f` reads it in a pod.

    Scaling is the operator's business and is left out, so changing it never restarts the consumers.
    Secrets are never in it: only the names of Secrets, which the pods see as environment variables.
    """
    document = consumer.model_dump(by_alias=True, mode="json", exclude_none=True)
    document["metadata"] = {"name": consumer.metadata.name, "namespace": consumer.metadata.namespace}
    document["spec"].pop("scaling", None)
    document["spec"].get("rebalance", {}).pop("rollout", None)  # how pods are replaced: the operator's
    header = (
        f"# Written by the hubshift operator from {KIND} {consumer.metadata.namespace}/"
        f"{consumer.metadata.name}; edit the {KIND}, not this.\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False)


def manifest_hash(consumer: PartitionedConsumer) -> str:
    return hashlib.sha256(manifest_text(consumer).encode()).hexdigest()


def render_config_map(consumer: PartitionedConsumer, owner: Owner) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ChildNames.of(owner.name).config_map, owner),
        "data": {MANIFEST_KEY: manifest_text(consumer)},
    }


# --- the consumer pods -------------------------------------------------------------------------------


def secret_env(consumer: PartitionedConsumer) -> list[JSON]:
    """Each Secret reference of the resource's connections (`connections_of`), as the environment variable
    the connection names for it."""
    pairs = [
        (named.connection.connection_string_variable, named.connection.connection_string_secret_ref)
        for named in connections_of(consumer.spec)
    ]
    env: list[JSON] = []
    seen: set[str] = set()
    for name, ref in pairs:
        if ref is None or name in seen:
            continue
        seen.add(name)
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def _resources(consumer: PartitionedConsumer) -> JSON:
    out: JSON = {}
    for kind, values in (
        ("requests", consumer.spec.consumer.resources.requests),
        ("limits", consumer.spec.consumer.resources.limits),
    ):
        present = {name: value for name, value in values.model_dump().items() if value is not None}
        if present:
            out[kind] = present
    return out


def termination_grace_seconds(consumer: PartitionedConsumer) -> int:
    return consumer.spec.rebalance.termination_grace_seconds


def initial_replicas(consumer: PartitionedConsumer) -> int:
    """Replicas of a new StatefulSet, before the control loop has read any backlog."""
    return consumer.spec.scaling.min_replicas


def _field_env(name: str, path: str) -> JSON:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


SINK_VOLUME = "sink"
CODE_VOLUME = "code"


def sink_volume(consumer: PartitionedConsumer) -> tuple[JSON | None, JSON | None, JSON | None]:
    """What the sink needs mounted (its `volume`, e.g. a folder sink's), as (volume, volume mount, claim
    template); Nones when it needs none."""
    volume = sinks.sink_volume(consumer.spec.consumer.sink, WORK_DIR)
    if volume is None:
        return None, None, None
    mount = {"name": SINK_VOLUME, "mountPath": volume.mount_path}
    if volume.claim_name is not None:
        return {"name": SINK_VOLUME, "persistentVolumeClaim": {"claimName": volume.claim_name}}, mount, None
    if volume.size is not None:
        claim: JSON = {
            "metadata": {"name": SINK_VOLUME},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": volume.size}}},
        }
        if volume.storage_class_name is not None:
            claim["spec"]["storageClassName"] = volume.storage_class_name
        return None, mount, claim
    return {"name": SINK_VOLUME, "emptyDir": {}}, mount, None


def consumer_container(consumer: PartitionedConsumer) -> JSON:
    """The consumer pods' one container: `hubshift consume` on the manifest, its environment (the Secrets
    of the resource's connections), probes, the restricted security context and its mounts."""
    port = consumer.spec.consumer.metrics_port
    probe_target = {"port": METRICS_PORT_NAME, "scheme": "HTTP"}
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": consumer.spec.consumer.image,
        "command": ["hubshift", "consume", "-f", MANIFEST_PATH, "--id", "$(POD_NAME)", *_stop_follow()],
        "workingDir": WORK_DIR,
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            _field_env("POD_IP", "status.podIP"),
            {"name": "PYSPARK_PYTHON", "value": "python3"},
            {"name": "PYSPARK_DRIVER_PYTHON", "value": "python3"},
            {"name": "HOME", "value": WORK_DIR},
            {"name": "SPARK_LOCAL_DIRS", "value": "/tmp"},
            *secret_env(consumer),
        ],
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        # The JVM and Spark take a while to start; liveness only counts once /healthz first answered.
        "startupProbe": {
            "httpGet": {"path": "/healthz", **probe_target},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 60,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", **probe_target},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", **probe_target},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "manifest", "mountPath": MANIFEST_DIR, "readOnly": True},
            {"name": "work", "mountPath": WORK_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    resources = _resources(consumer)
    if resources:
        container["resources"] = resources
    ui = consumer.spec.consumer.spark.ui
    if ui.enabled:  # reached with `kubectl port-forward pod/NAME PORT`
        container["ports"].append({"name": "spark-ui", "containerPort": ui.port, "protocol": "TCP"})
    return container


def update_strategy(consumer: PartitionedConsumer) -> JSON:
    """OnDelete when the operator replaces the pods itself (hubshift/operator/rollout.py), one at a time and
    each only once it holds no partition; else the StatefulSet's own RollingUpdate."""
    if consumer.spec.rebalance.rollout.strategy == "Operator":
        return {"type": "OnDelete"}
    return {"type": "RollingUpdate"}


def _stop_follow() -> list[str]:
    """On SIGTERM a pod keeps reading while the operator moves its partitions (an eviction's planned
    handoff), at most this long; off a cluster nobody may be there to move them."""
    return ["--stop-follow-seconds", f"{STOP_FOLLOW_SECONDS:g}"]


def render_statefulset(consumer: PartitionedConsumer, owner: Owner, replicas: int) -> JSON:
    names = ChildNames.of(owner.name)
    container = consumer_container(consumer)
    volumes: list[JSON] = [
        {"name": "manifest", "configMap": {"name": names.config_map}},
        {"name": "work", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    sink, sink_mount, sink_claim = sink_volume(consumer)
    if sink_mount is not None:
        container["volumeMounts"].append(sink_mount)
    if sink is not None:
        volumes.append(sink)
    code = consumer.spec.consumer.code.config_map
    if code is not None:
        # The job's files (`spec.consumer.code`): the consumer puts the folder on its PYTHONPATH.
        volumes.append({"name": CODE_VOLUME, "configMap": {"name": code}})
        container["volumeMounts"].append({"name": CODE_VOLUME, "mountPath": CODE_DIR, "readOnly": True})
    selector = selector_labels(owner.name)
    template_labels = pod_labels(owner.name)
    if uses_workload_identity(consumer):
        template_labels[WORKLOAD_IDENTITY_LABEL] = "true"
    account = service_account_name(consumer)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(names.statefulset, owner),
        "spec": {
            "replicas": replicas,
            "serviceName": names.headless_service,
            # Consumers start and stop together; ownership, not start order, keeps partitions safe.
            "podManagementPolicy": "Parallel",
            "updateStrategy": update_strategy(consumer),
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": template_labels,
                    # A changed manifest makes a new revision: the pods are replaced (`update_strategy`).
                    "annotations": {MANIFEST_HASH_ANNOTATION: manifest_hash(consumer)},
                },
                "spec": {
                    **({"serviceAccountName": account} if account is not None else {}),
                    "containers": [container],
                    "terminationGracePeriodSeconds": termination_grace_seconds(consumer),
                    "automountServiceAccountToken": False,  # consumers never talk to Kubernetes
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS_USER,
                        "runAsGroup": RUN_AS_USER,
                        "fsGroup": RUN_AS_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": selector},
                        }
                    ],
                    "volumes": volumes,
                },
            },
            **({"volumeClaimTemplates": [sink_claim]} if sink_claim is not None else {}),
        },
    }


# --- services and disruption budget -------------------------------------------------------------------


def _metrics_port(consumer: PartitionedConsumer) -> JSON:
    port = consumer.spec.consumer.metrics_port
    return {"name": METRICS_PORT_NAME, "port": port, "targetPort": METRICS_PORT_NAME, "protocol": "TCP"}


def render_headless_service(consumer: PartitionedConsumer, owner: Owner) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ChildNames.of(owner.name).headless_service, owner),
        "spec": {
            "clusterIP": "None",
            # The operator nudges pods that are still starting, so their names resolve before readiness.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(owner.name),
            "ports": [_metrics_port(consumer)],
        },
    }


def render_metrics_service(consumer: PartitionedConsumer, owner: Owner) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ChildNames.of(owner.name).metrics_service, owner, METRICS_COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name),
            "ports": [_metrics_port(consumer)],
        },
    }


def render_pod_disruption_budget(consumer: PartitionedConsumer, owner: Owner) -> JSON:
    # One consumer drained at a time: each voluntary eviction is one orderly handoff, never a stampede.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(ChildNames.of(owner.name).pod_disruption_budget, owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name)}},
    }


def render_children(consumer: PartitionedConsumer, owner: Owner, replicas: int) -> list[JSON]:
    """Every child, in the order to apply them (the manifest and the ServiceAccount before the pods)."""
    account = render_service_account(consumer, owner)
    return [
        *([account] if account is not None else []),
        render_config_map(consumer, owner),
        render_headless_service(consumer, owner),
        render_metrics_service(consumer, owner),
        render_pod_disruption_budget(consumer, owner),
        render_statefulset(consumer, owner, replicas),
    ]
