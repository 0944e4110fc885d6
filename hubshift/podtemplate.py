"""What a PartitionedConsumer may add to its consumer pods (`spec.consumer.podTemplate`), in the shape
Kubernetes users know from a Pod's spec (spark-operator's driver fields, Strimzi's pod `template`): pod
labels and annotations, scheduling (nodeSelector, tolerations, affinity, topologySpreadConstraints,
priorityClassName), imagePullSecrets, the consumer container's env, envFrom and volumeMounts, volumes, init
containers and sidecars; and the PodDisruptionBudget's `maxUnavailable` (`spec.consumer.podDisruptionBudget`).

What hubshift's own pod relies on is not offered (the consumer container's command, ports, probes,
resources and security context, the pod's security context) or is refused, by the model and by the API
server (each rule in `CEL`): its container's name, its volumes' names and mount paths (the manifest, the
code ConfigMap at /opt/hubshift/code, the working directory, /tmp), the environment variables it sets, its
pods' selector labels, the metrics port and its name; a volume source the restricted Pod Security Standard
forbids (hostPath and the other node-bound kinds); a container that could escalate privileges (a container's
`securityContext` takes only a user, a group and readOnlyRootFilesystem; the operator adds no privilege
escalation and drops every capability).

Deep Kubernetes types (affinity, a topology spread constraint, envFrom, a volume's source, the rest of a
container) are kept as written (`x-kubernetes-preserve-unknown-fields` in the CRD) and checked by the API
server when the operator applies the StatefulSet: a refusal there is the resource's status (`Invalid`) with
the server's message.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from hubshift.spec.base import DNS_SUBDOMAIN, Model, cel

# --- the consumer pod's own layout (render.py builds it; what the template may not take over) ---------

CONTAINER_NAME = "consumer"
METRICS_PORT_NAME = "metrics"
MANIFEST_DIR = "/etc/hubshift"
WORK_DIR = "/var/lib/hubshift"  # writable scratch: Spark's working directory and HOME
TMP_DIR = "/tmp"
CODE_DIR = "/opt/hubshift/code"  # the files of `spec.consumer.code.configMap`
MANIFEST_VOLUME, WORK_VOLUME, TMP_VOLUME, SINK_VOLUME, CODE_VOLUME = "manifest", "work", "tmp", "sink", "code"
OWN_VOLUMES = (MANIFEST_VOLUME, WORK_VOLUME, TMP_VOLUME, SINK_VOLUME, CODE_VOLUME)
# Mount paths the consumer container has: nothing may be mounted at them or above them (a mount at /etc
# would hide the manifest), and nothing inside the two read-only ones.
OWN_MOUNT_PATHS = (MANIFEST_DIR, WORK_DIR, TMP_DIR, CODE_DIR)
READ_ONLY_MOUNT_PATHS = (MANIFEST_DIR, CODE_DIR)
# The variables the consumer container always gets (render.consumer_container); the connection strings the
# operator fills from Secrets are refused by `render.check_for_cluster`, since they depend on the spec.
OWN_ENV = (
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "HOME",
    "SPARK_LOCAL_DIRS",
)
# The labels that select a pool's pods (render.pod_labels) and the annotation that rolls them.
OWN_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "hubshift.dev/consumer",
)
OWN_ANNOTATIONS = ("hubshift.dev/manifest-sha256",)
# The volume sources the restricted Pod Security Standard allows.
VOLUME_SOURCES = (
    "configMap",
    "secret",
    "persistentVolumeClaim",
    "emptyDir",
    "csi",
    "ephemeral",
    "projected",
    "downwardAPI",
)

# Kubernetes' own name rules: a DNS label (a container, a volume, a port), a label value, an env name.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# An absolute path without '.', '..' or empty segments and without a trailing '/'.
ABSOLUTE_PATH = r"^(/([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+))+$"

# Bounds the API server needs to price the rules below (CEL's cost budget); far above any real pod.
MAX_ITEMS = 64
MAX_CONTAINERS = 16


def _quoted(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{name}'" for name in names) + "]"


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names)


OWN_LABEL_MESSAGE = f"labels: hubshift sets {_listed(OWN_LABELS)} (they select the pool's pods)"
OWN_ANNOTATION_MESSAGE = f"annotations: hubshift sets {_listed(OWN_ANNOTATIONS)} (it rolls the pods)"
OWN_VOLUME_MESSAGE = f"name: hubshift's own volumes are {_listed(OWN_VOLUMES)}; choose another name"
ONE_SOURCE_MESSAGE = f"a volume needs exactly one source: {_listed(VOLUME_SOURCES)}"
OWN_MOUNT_MESSAGE = (
    f"mountPath: hubshift mounts {_listed(OWN_MOUNT_PATHS)}; mount elsewhere (not above them, nor inside "
    f"{_listed(READ_ONLY_MOUNT_PATHS)})"
)
OWN_ENV_MESSAGE = f"name: hubshift sets {_listed(OWN_ENV)}"
OWN_CONTAINER_MESSAGE = f"name: '{CONTAINER_NAME}' is hubshift's container"
OWN_PORT_NAME_MESSAGE = (
    f"name: '{METRICS_PORT_NAME}' is the consumer's port name (the operator finds it by it)"
)


class KubeObject(Model):
    """A Kubernetes object hubshift passes on as written: the fields declared here are checked, any other
    field is kept (`x-kubernetes-preserve-unknown-fields`) for the API server to check in the pod."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)

    def to_kubernetes(self) -> dict[str, Any]:
        """The object as the pod spec takes it (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


# Free-form Kubernetes objects (an affinity, a topology spread constraint, an envFrom entry, a source).
KubeDict = dict[str, Any]


class PodMetadataSpec(Model):
    """Labels and annotations added to every consumer pod (the StatefulSet's pod template)."""

    labels: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="Pod labels (not hubshift's own selector labels).",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="Pod annotations (e.g. a service mesh's, a log shipper's).",
    )

    CEL = (
        cel(
            f"!has(self.labels) || !self.labels.exists(k, k in {_quoted(OWN_LABELS)})",
            OWN_LABEL_MESSAGE,
            ".labels",
        ),
        cel(
            f"!has(self.annotations) || !self.annotations.exists(k, k in {_quoted(OWN_ANNOTATIONS)})",
            OWN_ANNOTATION_MESSAGE,
            ".annotations",
        ),
    )

    @model_validator(mode="after")
    def _not_hubshifts(self) -> PodMetadataSpec:
        if set(self.labels) & set(OWN_LABELS):
            raise ValueError(OWN_LABEL_MESSAGE)
        if set(self.annotations) & set(OWN_ANNOTATIONS):
            raise ValueError(OWN_ANNOTATION_MESSAGE)
        return self


class TolerationSpec(Model):
    """A toleration of a node taint (a Pod's `tolerations[]`): e.g. a spot or a dedicated Spark node pool."""

    key: str | None = Field(default=None, max_length=317, description="The taint's key; none: every key.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Default Equal.")
    value: str | None = Field(
        default=None, max_length=63, description="The taint's value, with operator Equal."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="None: every effect."
    )
    toleration_seconds: int | None = Field(default=None, description="With NoExecute: how long to stay.")


class LocalObjectReferenceSpec(Model):
    """An object in the resource's namespace, by name (an image pull Secret)."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="The object's name, in the resource's namespace.",
    )


class EnvVarSpec(KubeObject):
    """An environment variable of the consumer container (`value` or `valueFrom`, as in a Pod), e.g. from a
    Secret: `{name: API_TOKEN, valueFrom: {secretKeyRef: {name: api, key: token}}}`."""

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME, description="The variable's name.")

    CEL = (cel(f"!(self.name in {_quoted(OWN_ENV)})", OWN_ENV_MESSAGE, ".name"),)

    @model_validator(mode="after")
    def _not_hubshifts(self) -> EnvVarSpec:
        if self.name in OWN_ENV:
            raise ValueError(OWN_ENV_MESSAGE)
        return self


def _source(description: str) -> Any:
    return Field(default=None, description=description)


NO_TOKEN_MESSAGE = (
    "serviceAccountToken: a pod template may not project a ServiceAccount token (the consumer pods never "
    "talk to Kubernetes; the token would be their ServiceAccount's identity)"
)


class VolumeProjectionSpec(Model):
    """One source of a projected volume (a Pod's `projected.sources[]`): a Secret's, a ConfigMap's, the pod's
    own fields or a ClusterTrustBundle (certificate authorities), each kept as Kubernetes writes it. A
    ServiceAccount token is refused, and every other kind (a pod certificate) is an unknown field: each is
    a credential of the pods' ServiceAccount."""

    secret: KubeDict | None = _source("A Secret's keys: `{name: ca-bundle}`.")
    config_map: KubeDict | None = _source("A ConfigMap's keys: `{name: sites}`.")
    downward_api: KubeDict | None = Field(
        default=None, alias="downwardAPI", description="The pod's own fields."
    )
    cluster_trust_bundle: KubeDict | None = _source("Certificate authorities of a ClusterTrustBundle.")
    service_account_token: KubeDict | None = _source("Refused: " + NO_TOKEN_MESSAGE.partition(": ")[2] + ".")

    CEL = (cel("!has(self.serviceAccountToken)", NO_TOKEN_MESSAGE, ".serviceAccountToken"),)

    @model_validator(mode="after")
    def _no_token(self) -> VolumeProjectionSpec:
        if self.service_account_token is not None:
            raise ValueError(NO_TOKEN_MESSAGE)
        return self


class ProjectedVolumeSpec(KubeObject):
    """A projected volume: several sources in one folder (`defaultMode` as in a Pod)."""

    sources: list[VolumeProjectionSpec] = Field(default_factory=list, max_length=MAX_ITEMS)


class VolumeSpec(Model):
    """A pod volume (a Pod's `volumes[]`) with one of the sources the restricted Pod Security Standard
    allows, each kept as Kubernetes writes it; mount it with `volumeMounts` (or in a sidecar)."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The volume's name, as volumeMounts name it.",
    )
    config_map: KubeDict | None = _source("A ConfigMap's keys as files: `{name: sites}`.")
    secret: KubeDict | None = _source("A Secret's keys as files: `{secretName: ca-bundle}`.")
    persistent_volume_claim: KubeDict | None = _source("An existing claim: `{claimName: data}`.")
    empty_dir: KubeDict | None = _source("Scratch space, gone with the pod: `{}`.")
    csi: KubeDict | None = _source("A CSI driver's inline volume (e.g. the Secrets Store CSI driver).")
    ephemeral: KubeDict | None = _source("A claim made for the pod and deleted with it.")
    projected: ProjectedVolumeSpec | None = _source(
        "Several sources in one folder (not a ServiceAccount token)."
    )
    downward_api: KubeDict | None = Field(
        default=None, alias="downwardAPI", description="The pod's own fields."
    )

    CEL = (
        cel(f"!(self.name in {_quoted(OWN_VOLUMES)})", OWN_VOLUME_MESSAGE, ".name"),
        cel(
            "["
            + ", ".join(f"has(self.{source})" for source in VOLUME_SOURCES)
            + "].filter(x, x).size() == 1",
            ONE_SOURCE_MESSAGE,
        ),
    )

    @model_validator(mode="after")
    def _one_source_not_hubshifts(self) -> VolumeSpec:
        if self.name in OWN_VOLUMES:
            raise ValueError(OWN_VOLUME_MESSAGE)
        given = self.model_dump(by_alias=True, exclude_none=True).keys() & set(VOLUME_SOURCES)
        if len(given) != 1:
            raise ValueError(ONE_SOURCE_MESSAGE)
        return self

    def to_kubernetes(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


def _mount_rule() -> str:
    path = "self.mountPath"
    return (
        f"!({path} in {_quoted(OWN_MOUNT_PATHS)})"
        f" && !{_quoted(OWN_MOUNT_PATHS)}.exists(p, p.startsWith({path} + '/'))"
        f" && !{_quoted(READ_ONLY_MOUNT_PATHS)}.exists(p, {path}.startsWith(p + '/'))"
    )


def takes_own_path(mount_path: str) -> bool:
    """Whether a mount at `mount_path` would take one of the consumer container's own paths over."""
    return (
        mount_path in OWN_MOUNT_PATHS
        or any(own.startswith(mount_path + "/") for own in OWN_MOUNT_PATHS)
        or any(mount_path.startswith(own + "/") for own in READ_ONLY_MOUNT_PATHS)
    )


class VolumeMountSpec(KubeObject):
    """A volume mounted in the consumer container (`readOnly`, `subPath` as in a Pod)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="A volume of `volumes`.")
    mount_path: str = Field(
        min_length=2,
        max_length=1024,
        pattern=ABSOLUTE_PATH,
        description="An absolute path in the container (not one of hubshift's own).",
    )

    CEL = (cel(_mount_rule(), OWN_MOUNT_MESSAGE, ".mountPath"),)

    @model_validator(mode="after")
    def _not_hubshifts(self) -> VolumeMountSpec:
        if takes_own_path(self.mount_path):
            raise ValueError(OWN_MOUNT_MESSAGE)
        return self


NO_HOST_PORT_MESSAGE = (
    "hostPort: a pod template may not bind a port of the node (the baseline Pod Security Standard forbids it)"
)
NO_HOST_IP_MESSAGE = "hostIP: a pod template may not bind an address of the node (it goes with hostPort)"


class ContainerPortSpec(Model):
    """A port a sidecar or init container listens on, in the pod's network only: a node's port or address
    (`hostPort`, `hostIP`) is refused."""

    container_port: int = Field(ge=1, le=65535, description="The port the container listens on.")
    name: str | None = Field(
        default=None, min_length=1, max_length=15, description="A name a Service or a probe may use."
    )
    protocol: Literal["TCP", "UDP", "SCTP"] | None = Field(default=None, description="Default TCP.")
    host_port: int | None = Field(default=None, description="Refused: a port of the node.")
    host_ip: str | None = Field(default=None, alias="hostIP", description="Refused: an address of the node.")

    CEL = (
        cel(f"!has(self.name) || self.name != '{METRICS_PORT_NAME}'", OWN_PORT_NAME_MESSAGE, ".name"),
        cel("!has(self.hostPort)", NO_HOST_PORT_MESSAGE, ".hostPort"),
        cel("!has(self.hostIP)", NO_HOST_IP_MESSAGE, ".hostIP"),
    )

    @model_validator(mode="after")
    def _not_hubshifts(self) -> ContainerPortSpec:
        if self.name == METRICS_PORT_NAME:
            raise ValueError(OWN_PORT_NAME_MESSAGE)
        if self.host_port is not None:
            raise ValueError(NO_HOST_PORT_MESSAGE)
        if self.host_ip is not None:
            raise ValueError(NO_HOST_IP_MESSAGE)
        return self


class ContainerSecuritySpec(Model):
    """What a sidecar's or init container's security context may say; the operator adds
    `allowPrivilegeEscalation: false` and drops every capability, and the pod runs as a non-root user
    (the restricted Pod Security Standard)."""

    run_as_user: int | None = Field(default=None, ge=1, description="Another non-root user id.")
    run_as_group: int | None = Field(default=None, ge=0, description="The primary group id.")
    read_only_root_filesystem: bool | None = Field(
        default=None, description="Mount the container's root filesystem read-only."
    )


class ContainerSpec(KubeObject):
    """A sidecar or an init container, as in a Pod (`command`, `args`, `env`, `resources`, probes,
    `volumeMounts` of `volumes` or of hubshift's own volumes, `restartPolicy: Always` for a native sidecar
    among init containers), with the restricted security context."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The container's name (not the consumer's).",
    )
    image: str = Field(min_length=1, pattern=r"^\S+$", description="The container's image.")
    ports: list[ContainerPortSpec] = Field(default_factory=list, max_length=MAX_ITEMS)
    security_context: ContainerSecuritySpec | None = None

    CEL = (cel(f"self.name != '{CONTAINER_NAME}'", OWN_CONTAINER_MESSAGE, ".name"),)

    @model_validator(mode="after")
    def _not_hubshifts(self) -> ContainerSpec:
        if self.name == CONTAINER_NAME:
            raise ValueError(OWN_CONTAINER_MESSAGE)
        return self


RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def container(spec: ContainerSpec) -> dict[str, Any]:
    """A sidecar or init container as the pod runs it: as written, with the restricted security context."""
    out = spec.to_kubernetes()
    if not out.get("ports"):
        out.pop("ports", None)
    out["securityContext"] = {**RESTRICTED_CONTAINER, **out.get("securityContext", {})}
    return out


class PodTemplateSpec(Model):
    """What the consumer pods get besides hubshift's own: the shape of a Pod's spec (spark-operator's driver
    fields, Strimzi's pod template). Not offered: the consumer container's command, ports, probes,
    resources (`spec.consumer.resources`) and security context, the pod's security context."""

    metadata: PodMetadataSpec = Field(default_factory=PodMetadataSpec)
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Run only on nodes with these labels (e.g. a Spark node pool)."
    )
    tolerations: list[TolerationSpec] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Taints the pods tolerate (spot nodes)."
    )
    affinity: KubeDict | None = Field(
        default=None, description="A Pod's affinity (nodeAffinity, podAffinity, podAntiAffinity), as written."
    )
    topology_spread_constraints: list[KubeDict] | None = Field(
        default=None,
        max_length=MAX_ITEMS,
        description="Replaces hubshift's spread (at most one pod more per node than on any other, as a "
        "preference); [] for none. Select the pool's pods with the label hubshift.dev/consumer: NAME.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="The pods' PriorityClass (which pods a full node evicts first).",
    )
    image_pull_secrets: list[LocalObjectReferenceSpec] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Secrets to pull the images with."
    )
    env: list[EnvVarSpec] = Field(
        default_factory=list,
        max_length=MAX_ITEMS * 4,
        description="More variables of the consumer container.",
    )
    env_from: list[KubeDict] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="ConfigMaps and Secrets whose keys become variables of the consumer container "
        "(`[{secretRef: {name: x}}]`); hubshift's own variables take precedence.",
    )
    volumes: list[VolumeSpec] = Field(default_factory=list, max_length=MAX_ITEMS)
    volume_mounts: list[VolumeMountSpec] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Volumes mounted in the consumer container (e.g. a lookup file from a ConfigMap).",
    )
    init_containers: list[ContainerSpec] = Field(
        default_factory=list, max_length=MAX_CONTAINERS, description="Run before the consumer starts."
    )
    sidecars: list[ContainerSpec] = Field(
        default_factory=list, max_length=MAX_CONTAINERS, description="Containers beside the consumer's."
    )

    def listening(self) -> list[tuple[str, ContainerPortSpec]]:
        """Every port the template's containers declare, with the container's name."""
        return [(c.name, port) for c in (*self.init_containers, *self.sidecars) for port in c.ports]


class PodDisruptionBudgetSpec(Model):
    """The pool's PodDisruptionBudget: how many consumer pods a node drain may evict at once."""

    max_unavailable: int = Field(
        default=1,
        ge=0,
        description="Each eviction is one orderly handoff; more go faster on large pools. 0 blocks every "
        "voluntary eviction (a node drain then waits for you).",
    )


PORT_TAKEN = "podTemplate: a sidecar or init container declares the consumer's metricsPort"


def port_rule(default_metrics_port: int) -> str:
    """The CEL rule, at `spec.consumer`, that no container of the template declares the metrics port."""
    metrics = f"(has(self.metricsPort) ? self.metricsPort : {default_metrics_port})"
    # Two lists of two CEL types (one per field): each searched on its own.
    taken = " || ".join(
        f"(has(self.podTemplate.{field}) && self.podTemplate.{field}"
        f".exists(c, has(c.ports) && c.ports.exists(p, p.containerPort == {metrics})))"
        for field in ("initContainers", "sidecars")
    )
    return f"!has(self.podTemplate) || !({taken})"
