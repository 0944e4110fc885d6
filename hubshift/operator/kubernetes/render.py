"""The child resources of a PartitionedConsumer as plain dicts: pure functions of the spec and the CR.

Children: the pods' ServiceAccount, the manifest the pods read (a ConfigMap, never a secret in it), a
StatefulSet of consumer pods (stable identities `<name>-<ordinal>`), a headless Service (stable DNS names), a
metrics Service and a PodDisruptionBudget. Each carries the standard `app.kubernetes.io/*` labels and an
owner reference to the CR, so deleting the CR garbage-collects them.

The pods run as a ServiceAccount of their own (`spec.consumer.serviceAccountName`, default the CR's name),
which the operator creates: never the namespace's `default` nor any other that exists already, unless an
administrator allowed it (`reconcile` checks; the chart's `operator.allowedServiceAccounts`). A spec with
token credentials gives its pods what Azure Workload Identity on AKS needs: that ServiceAccount annotated
with the identity's client id and the label `azure.workload.identity/use: "true"`, and no Secret at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from hubshift import __version__, sinks
from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumer, connections_of, credentials_of, parse_manifest

# The conditions of the status in a cluster, named with the others in `status.CONDITION_TYPES`.
from hubshift.operator.status import CHILDREN_APPLIED as CHILDREN_APPLIED
from hubshift.operator.status import OUTPUT_DURABLE as OUTPUT_DURABLE
from hubshift.operator.status import Condition
from hubshift.podtemplate import (
    CODE_DIR,
    CODE_VOLUME,
    CONTAINER_NAME,
    MANIFEST_DIR,
    MANIFEST_VOLUME,
    METRICS_PORT_NAME,
    SINK_VOLUME,
    TMP_DIR,
    TMP_VOLUME,
    WORK_DIR,
    WORK_VOLUME,
    container,
)
from hubshift.spec import API_VERSION, GROUP, KIND, STOP_FOLLOW_SECONDS

JSON = dict[str, Any]

APP_NAME = "hubshift"
MANAGER = "hubshift-operator"  # app.kubernetes.io/managed-by of every child, and the SSA field manager
CONSUMER_COMPONENT = "consumer"
METRICS_COMPONENT = "consumer-metrics"
CONSUMER_LABEL = f"{GROUP}/consumer"  # the owning PartitionedConsumer's name, on every child and pod
MANIFEST_HASH_ANNOTATION = f"{GROUP}/manifest-sha256"

MANIFEST_KEY = "manifest.yaml"
MANIFEST_PATH = f"{MANIFEST_DIR}/{MANIFEST_KEY}"
# The consumer image when a resource names none: the operator's own (the chart passes its image); outside
# the chart, the image `docker build -t hubshift:VERSION .` makes.
DEFAULT_IMAGE = f"hubshift:{__version__}"

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
    created: str = ""  # metadata.creationTimestamp (RFC 3339), when known

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Owner:
        metadata = body["metadata"]
        return cls(
            name=metadata["name"],
            namespace=metadata.get("namespace") or "default",
            uid=metadata["uid"],
            created=str(metadata.get("creationTimestamp") or ""),
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
    share, a folder sink with nowhere to write, and a template variable that would replace a connection
    string the operator fills from a Secret."""
    if consumer.spec.checkpoint_store.sqlite is not None:
        raise UserError(
            "spec.checkpointStore.sqlite: consumer pods cannot share a SQLite file; "
            "in a cluster use spec.checkpointStore.blob"
        )
    if consumer.spec.consumer.code.path is not None:
        raise UserError("spec.consumer.code.path: a folder of this machine; in a cluster use code.configMap")
    sink_storage(consumer)
    filled = {entry["name"] for entry in secret_env(consumer)}
    for index, variable in enumerate(consumer.spec.consumer.pod_template.env):
        if variable.name in filled:
            raise UserError(
                f"spec.consumer.podTemplate.env[{index}].name: {variable.name} holds a connection string the "
                "operator fills from the Secret a connectionStringSecretRef names; drop one of the two"
            )


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
    """Pod template labels: no version, so an operator upgrade restarts consumers only when it brings them
    a new image (the operator's own, for the resources that name none)."""
    labels = standard_labels(consumer_name)
    del labels["app.kubernetes.io/version"]
    return labels


def uses_workload_identity(consumer: PartitionedConsumer) -> bool:
    """Whether a credential of the spec reads the pod's workload identity (its pods get the label)."""
    return any(credential.type in WORKLOAD_IDENTITY_TYPES for credential in credentials_of(consumer.spec))


def service_account_name(consumer: PartitionedConsumer) -> str:
    """The consumer pods' ServiceAccount: the spec's, or the CR's name."""
    return consumer.spec.consumer.service_account_name or consumer.metadata.name


def render_service_account(consumer: PartitionedConsumer, owner: Owner) -> JSON:
    """The pods' ServiceAccount as the operator creates it when none of that name exists (an existing one an
    administrator allowed is used as it is): annotated with the workload identity's client id when the spec
    names exactly one."""
    name = service_account_name(consumer)
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

    Scaling, the pod template and the disruption budget are the operator's business and are left out, so
    changing scaling never restarts the consumers. Secrets are never in it: only the names of Secrets, which
    the pods see as environment variables.
    """
    document = consumer.model_dump(by_alias=True, mode="json", exclude_none=True)
    document["metadata"] = {"name": consumer.metadata.name, "namespace": consumer.metadata.namespace}
    document["spec"].pop("scaling", None)
    for key in ("podTemplate", "podDisruptionBudget"):
        document["spec"]["consumer"].pop(key, None)
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
    """Replicas of a new StatefulSet, before the control loop has read any backlog: the count `spec.replicas`
    fixes (a resource created at a count, or scaled before its StatefulSet existed, starts at it instead of
    at the autoscaler's minimum and then scaling out), else the autoscaler's minimum. The control loop
    trims either to the hub's partitions at its first cycle."""
    requested = consumer.spec.replicas
    return requested if requested is not None else consumer.spec.scaling.min_replicas


def _field_env(name: str, path: str) -> JSON:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def sink_storage(consumer: PartitionedConsumer) -> tuple[JSON | None, JSON | None, JSON | None]:
    """The pod's side of the sink's volume (`sinks.sink_volume`, e.g. a folder sink's): as (pod volume,
    volume mount, claim template), Nones when it needs none."""
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


def consumer_container(consumer: PartitionedConsumer, image: str = DEFAULT_IMAGE) -> JSON:
    """The consumer pods' own container: `hubshift consume` on the manifest, its environment (the Secrets
    of the resource's connections, then the template's variables), probes, the restricted security context
    and its mounts (then the template's). `image`: when the spec names none."""
    template = consumer.spec.consumer.pod_template
    port = consumer.spec.consumer.metrics_port
    probe_target = {"port": METRICS_PORT_NAME, "scheme": "HTTP"}
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": consumer.spec.consumer.image or image,
        "command": ["hubshift", "consume", "-f", MANIFEST_PATH, "--id", "$(POD_NAME)", *_stop_follow()],
        "workingDir": WORK_DIR,
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            _field_env("POD_IP", "status.podIP"),
            {"name": "PYSPARK_PYTHON", "value": "python3"},
            {"name": "PYSPARK_DRIVER_PYTHON", "value": "python3"},
            {"name": "HOME", "value": WORK_DIR},
            {"name": "SPARK_LOCAL_DIRS", "value": TMP_DIR},
            *secret_env(consumer),
            # After hubshift's own (the template may not repeat them), so they may refer to $(POD_NAME).
            *(variable.to_kubernetes() for variable in template.env),
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
            {"name": MANIFEST_VOLUME, "mountPath": MANIFEST_DIR, "readOnly": True},
            {"name": WORK_VOLUME, "mountPath": WORK_DIR},
            {"name": TMP_VOLUME, "mountPath": TMP_DIR},
        ],
    }
    if template.env_from:  # the variables in `env` (hubshift's) take precedence over these
        container["envFrom"] = list(template.env_from)
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


def render_statefulset(
    consumer: PartitionedConsumer, owner: Owner, replicas: int, image: str = DEFAULT_IMAGE
) -> JSON:
    """The pool's StatefulSet; `image`: the consumer image when the spec names none (the operator's)."""
    names = ChildNames.of(owner.name)
    _, _, sink_claim = sink_storage(consumer)
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
            "selector": {"matchLabels": selector_labels(owner.name)},
            "template": render_pod_template(consumer, owner, image),
            **({"volumeClaimTemplates": [sink_claim]} if sink_claim is not None else {}),
        },
    }


def _volumes(consumer: PartitionedConsumer, owner: Owner, container: JSON) -> list[JSON]:
    """The pod's volumes (hubshift's, the sink's, the code's, then the template's), each of hubshift's
    mounted in `container`, followed by the template's mounts."""
    volumes: list[JSON] = [
        {"name": MANIFEST_VOLUME, "configMap": {"name": ChildNames.of(owner.name).config_map}},
        {"name": WORK_VOLUME, "emptyDir": {}},
        {"name": TMP_VOLUME, "emptyDir": {}},
    ]
    sink, sink_mount, _ = sink_storage(consumer)
    if sink_mount is not None:
        container["volumeMounts"].append(sink_mount)
    if sink is not None:
        volumes.append(sink)
    code = consumer.spec.consumer.code.config_map
    if code is not None:
        # The job's files (`spec.consumer.code`): the consumer puts the folder on its PYTHONPATH.
        volumes.append({"name": CODE_VOLUME, "configMap": {"name": code}})
        container["volumeMounts"].append({"name": CODE_VOLUME, "mountPath": CODE_DIR, "readOnly": True})
    template = consumer.spec.consumer.pod_template
    container["volumeMounts"].extend(mount.to_kubernetes() for mount in template.volume_mounts)
    return volumes + [volume.to_kubernetes() for volume in template.volumes]


def _scheduling(consumer: PartitionedConsumer, selector: Mapping[str, str]) -> JSON:
    """Where the pods may run: the template's nodeSelector, tolerations, affinity and priority, and
    hubshift's spread (at most one pod more per node, as a preference) unless the template gives its own."""
    template = consumer.spec.consumer.pod_template
    spread = template.topology_spread_constraints
    if spread is None:
        spread = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": dict(selector)},
            }
        ]
    scheduling: JSON = {"topologySpreadConstraints": spread} if spread else {}
    if template.node_selector:
        scheduling["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        scheduling["tolerations"] = [
            toleration.model_dump(by_alias=True, mode="json", exclude_none=True)
            for toleration in template.tolerations
        ]
    if template.affinity:
        scheduling["affinity"] = template.affinity
    if template.priority_class_name is not None:
        scheduling["priorityClassName"] = template.priority_class_name
    return scheduling


def render_pod_template(consumer: PartitionedConsumer, owner: Owner, image: str = DEFAULT_IMAGE) -> JSON:
    """The consumer pods: hubshift's container, volumes and security context, with what the resource's
    `podTemplate` adds (labels and annotations under hubshift's own, which win)."""
    template = consumer.spec.consumer.pod_template
    own = consumer_container(consumer, image)
    volumes = _volumes(consumer, owner, own)
    labels = {**template.metadata.labels, **pod_labels(owner.name)}
    if uses_workload_identity(consumer):
        labels[WORKLOAD_IDENTITY_LABEL] = "true"
    # A changed manifest rolls the pods one by one (each returns within the holddown).
    annotations = {**template.metadata.annotations, MANIFEST_HASH_ANNOTATION: manifest_hash(consumer)}
    spec: JSON = {
        "serviceAccountName": service_account_name(consumer),
        "containers": [own, *(container(sidecar) for sidecar in template.sidecars)],
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
        **_scheduling(consumer, selector_labels(owner.name)),
        "volumes": volumes,
    }
    if template.init_containers:
        spec["initContainers"] = [container(init) for init in template.init_containers]
    if template.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret.name} for secret in template.image_pull_secrets]
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}


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
    # By default one consumer drained at a time: each voluntary eviction is one orderly handoff.
    budget = consumer.spec.consumer.pod_disruption_budget
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(ChildNames.of(owner.name).pod_disruption_budget, owner),
        "spec": {
            "maxUnavailable": budget.max_unavailable,
            "selector": {"matchLabels": selector_labels(owner.name)},
        },
    }


def render_children(
    consumer: PartitionedConsumer, owner: Owner, replicas: int, image: str = DEFAULT_IMAGE
) -> list[JSON]:
    """Every child, in the order to apply them (the ServiceAccount and the manifest before the pods);
    `image`: the consumer image when the spec names none (the operator's own)."""
    return [
        render_service_account(consumer, owner),
        render_config_map(consumer, owner),
        render_headless_service(consumer, owner),
        render_metrics_service(consumer, owner),
        render_pod_disruption_budget(consumer, owner),
        render_statefulset(consumer, owner, replicas, image),
    ]


# --- what the status says of the children ----------------------------------------------------------------


def applied_condition(refusal: str | None) -> Condition:
    """Whether the children the spec renders now were applied; False with the API server's refusal while
    the pool runs on the last ones it accepted."""
    if refusal is None:
        message = "the StatefulSet and the other children are as the spec says"
        return Condition(type=CHILDREN_APPLIED, status="True", reason="Applied", message=message)
    message = f"{refusal}; the pods run as the last accepted spec said"
    return Condition(type=CHILDREN_APPLIED, status="False", reason="Refused", message=message)


def output_condition(consumer: PartitionedConsumer) -> Condition:
    """Whether what the sink writes outlives a consumer pod: False for a folder sink on an emptyDir (gone
    with every pod deleted, evicted or moved), True on a volume claim or a storage service, Unknown for a
    sink Spark writes where its block says."""
    sink = consumer.spec.consumer.sink
    volume = sinks.sink_volume(sink, WORK_DIR)
    if volume is not None and volume.claim_name is None and volume.size is None:
        message = (
            f"spec.consumer.sink.{sink.type} writes to an emptyDir at {volume.mount_path}: its files are "
            f"gone whenever a pod is deleted, evicted or moved; set sink.{sink.type}.volume.claimName or "
            "size, or use a blob sink"
        )
        return Condition(type=OUTPUT_DURABLE, status="False", reason="EmptyDir", message=message)
    if volume is not None:
        message = f"the {sink.type} sink writes to a persistent volume mounted at {volume.mount_path}"
        return Condition(type=OUTPUT_DURABLE, status="True", reason="PersistentVolume", message=message)
    services = sorted({named.connection.SERVICE for named in sink.connections()})
    if services:
        message = f"the {sink.type} sink writes to {' and '.join(services)}"
        return Condition(type=OUTPUT_DURABLE, status="True", reason="StorageService", message=message)
    message = (
        f"the {sink.type} sink writes where its block says; hubshift cannot tell whether that outlives a pod"
    )
    return Condition(type=OUTPUT_DURABLE, status="Unknown", reason="NotChecked", message=message)
