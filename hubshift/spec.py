"""The blocks of the `PartitionedConsumer` model that every part reads: how a connection authenticates, the
hub, the checkpoint store, the consumers' Spark and start position, scaling and rebalancing.

The resource itself (`hubshift.manifest`) puts these together with the blocks each pipeline and sink
declares in its own module (`hubshift.pipelines`, `hubshift.sinks`). The same YAML a user `kubectl apply`s
runs on this machine with `hubshift run -f`; the CRD schema in `crds/` is generated from the model
(`hubshift.operator.kubernetes.crd`), with each model's cross-field rules (`CEL`, declared beside its
validator) for the API server.

Every Azure connection (`ConnectionSpec`: the Event Hubs source, the Blob checkpoint store, a Blob sink, a
target hub) authenticates one of two ways:

- a connection string with a shared key. It never appears in the manifest: in a cluster the operator maps
  the `connectionStringSecretRef` into the pod's environment under the variable `connectionStringEnv`
  names (or the block's default); outside a cluster the process reads that environment variable directly;
- a Microsoft Entra ID token `credential` (workload identity, managed identity or azure-identity's
  `DefaultAzureCredential`) with the block's address (the namespace, the storage account URL): no secret
  anywhere.

`NamedConnection` is one connection of a resource with the path of its block; `resolve` is the one way
from a connection and an environment to a connection string or a credential.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from hubshift.errors import UserError
from hubshift.ownership.store import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from hubshift.ownership.timing import DEFAULT_TIMING, Timing

GROUP = "hubshift.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PartitionedConsumer"
PLURAL = "partitionedconsumers"
SHORT_NAME = "pcon"

# KEDA's pause annotations, under our group (`operator/autoscaler.py` parses them).
PAUSED_ANNOTATION = f"autoscaling.{GROUP}/paused"
PAUSED_REPLICAS_ANNOTATION = f"autoscaling.{GROUP}/paused-replicas"
PAUSED_SCALE_IN_ANNOTATION = f"autoscaling.{GROUP}/paused-scale-in"
PAUSED_SCALE_OUT_ANNOTATION = f"autoscaling.{GROUP}/paused-scale-out"
FORCE_ACTIVATION_ANNOTATION = f"autoscaling.{GROUP}/force-activation"
# Pauses a rollout the operator drives (`operator/rollout.py`): no pod is replaced while it says "true".
ROLLOUT_PAUSED_ANNOTATION = f"rollout.{GROUP}/paused"

# A Kubernetes resource quantity (what `kubectl` accepts for sizes and CPUs: 512Mi, 1Gi, 10G, 250m, 1.5).
QUANTITY = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[KMGTPE]i?|[mkMGTPE])?$"

# A JVM memory size as Spark takes it (512m, 1g).
JVM_SIZE = r"^[0-9]+[kKmMgGtT]?$"

# The longest PartitionedConsumer name: its StatefulSet's pods carry a `controller-revision-hash` label of
# `<name>-<10 characters>`, and a label value has at most 63.
MAX_NAME_LENGTH = 52
# Settings maps (Spark conf, writer options): bounded, so the API server can bound its CEL rules' cost.
MAX_SETTINGS = 64

DEFAULT_EVENTHUBS_ENV = "HUBSHIFT_EVENTHUBS_CONNECTION_STRING"
DEFAULT_STORAGE_ENV = "HUBSHIFT_STORAGE_CONNECTION_STRING"
DEFAULT_SINK_STORAGE_ENV = "HUBSHIFT_SINK_CONNECTION_STRING"
DEFAULT_REPLICATE_ENV = "HUBSHIFT_REPLICATE_CONNECTION_STRING"
DEFAULT_PROJECTION_ENV = "HUBSHIFT_PROJECTION_CONNECTION_STRING"
DEFAULT_PROXY_ENV = "HUBSHIFT_PROXY_CREDENTIALS"

# A Kubernetes object name (DNS subdomain, at most 253 characters), e.g. a Secret's, a ConfigMap's, a
# ServiceAccount's: never a path (the API client joins a name into the request's URL as it is).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_OBJECT_NAME = 253
# A key of a Secret's or ConfigMap's data, as Kubernetes allows it.
DATA_KEY = r"^[-._a-zA-Z0-9]+$"
# A host as the SDKs dial it: DNS labels of lower-case letters, digits and '-', or an IPv4 address, with an
# optional port; nothing an SDK's URL parser would read as the end of the host (`#`, `/`, `?`, `\`, `@`).
HOST = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(:[0-9]{1,5})?"
# A fully qualified Event Hubs namespace (myns.servicebus.windows.net, or HOST:PORT for a local emulator).
EVENTHUBS_NAMESPACE = f"^{HOST}$"
MAX_HOST_LENGTH = 253 + len(":65535")
# A storage account's Blob endpoint: https://HOST[:PORT], optionally one path segment (an emulator's
# account, https://127.0.0.1:10000/devstoreaccount1); no user, query or fragment.
STORAGE_ACCOUNT_URL = f"^https://{HOST}(/[a-z0-9]{{1,63}})?/?$"
# An HTTP proxy's address, without credentials (they come from a Secret): http://HOST:PORT.
PROXY_URL = r"^http://[A-Za-z0-9._-]+:[0-9]{1,5}/?$"

# A CEL rule of a model, for the API server: `rule`, `message` (the model's own), optionally `fieldPath`.
CelRule = dict[str, str]


def cel(rule: str, message: str, field_path: str | None = None) -> CelRule:
    """One CEL rule. A rule guards every optional field it reads with has(): the API server also checks rules
    against defaults such as `{}`."""
    return {"rule": rule, "message": message, **({"fieldPath": field_path} if field_path else {})}


class Model(BaseModel):
    """camelCase in YAML, snake_case in Python; unknown fields are refused (a typo is an error).

    `CEL`: the model's cross-field validators restated for the API server, declared beside them (a unit
    test requires them for every `@model_validator`); `cel_rules()` adds those a model inherits."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    CEL: ClassVar[tuple[CelRule, ...]] = ()

    @classmethod
    def cel_rules(cls) -> list[CelRule]:
        rules: list[CelRule] = []
        for klass in reversed(cls.__mro__):
            rules.extend(klass.__dict__.get("CEL", ()))
        return rules


class SecretKeyRefSpec(Model):
    """A key of a Kubernetes Secret in the PartitionedConsumer's namespace."""

    name: str = Field(
        min_length=1,
        max_length=MAX_OBJECT_NAME,
        pattern=DNS_SUBDOMAIN,
        description="Secret name (a DNS subdomain: lower-case letters, digits, '-' and '.'), in the "
        "resource's namespace.",
    )
    key: str = Field(
        min_length=1, max_length=MAX_OBJECT_NAME, pattern=DATA_KEY, description="Key inside the Secret."
    )


# --- connections -------------------------------------------------------------------------------------

CredentialType = Literal["workloadIdentity", "managedIdentity", "default"]


class TokenCredentialSpec(Model):
    """A Microsoft Entra ID token credential from azure-identity, instead of a connection string: no key
    and no Secret. The identity needs a data role on what it reads or writes (Azure Event Hubs Data
    Receiver or Sender, Storage Blob Data Contributor)."""

    type: CredentialType = Field(
        description="workloadIdentity: Azure Workload Identity on AKS (the pods get the label "
        "azure.workload.identity/use and a ServiceAccount, spec.consumer.serviceAccountName, federated with "
        "the identity); managedIdentity: the node's or machine's managed identity; default: azure-identity's "
        "DefaultAzureCredential chain."
    )
    client_id: str | None = Field(
        default=None,
        min_length=1,
        description="Client id of the user-assigned managed identity or app registration (default: "
        "AZURE_CLIENT_ID, or the system-assigned identity).",
    )

    def describe(self) -> str:
        """`workloadIdentity`, or `workloadIdentity (client id ...)`: a client id is no secret."""
        return self.type if self.client_id is None else f"{self.type} (client id {self.client_id})"


# The messages of the refusals below, shared by the models and their CEL rules.
BOTH_CREDENTIALS = (
    "set a connection string (connectionStringSecretRef, connectionStringEnv) or a credential, not both"
)
CREDENTIAL_NEEDS_NAMESPACE = (
    "a credential needs namespace, the fully qualified namespace (myns.servicebus.windows.net)"
)
CREDENTIAL_NEEDS_ACCOUNT_URL = "a credential needs accountUrl, the storage account's Blob endpoint (https://ACCOUNT.blob.core.windows.net)"


def _describe_connection(schema: dict[str, Any], model: type[Any]) -> None:
    """The connection fields' descriptions name the block's service and default variable (the fields are
    declared once, in `SecretConnectionSpec`)."""
    properties = schema.get("properties", {})
    service, default = model.SERVICE, model.DEFAULT_VARIABLE
    if "connectionStringSecretRef" in properties:
        properties["connectionStringSecretRef"]["description"] = (
            f"Secret holding the {service} connection string (in a cluster)."
        )
    if "connectionStringEnv" in properties:
        properties["connectionStringEnv"]["description"] = (
            f"Environment variable the consumer reads the {service} connection string from (default "
            f"{default})."
        )


class SecretConnectionSpec(Model):
    """A connection with a connection string: from the Secret `connectionStringSecretRef` names (in a
    cluster the operator puts it into the pods' environment), or from the environment variable
    `connectionStringEnv` names (or the block's default) outside a cluster."""

    model_config = ConfigDict(json_schema_extra=_describe_connection)

    SERVICE: ClassVar[str] = "the"
    DEFAULT_VARIABLE: ClassVar[str] = ""
    TAKES_CREDENTIAL: ClassVar[bool] = False

    connection_string_secret_ref: SecretKeyRefSpec | None = Field(default=None)
    connection_string_env: str | None = Field(default=None, min_length=1)

    @property
    def connection_string_variable(self) -> str:
        """The environment variable the connection string is read from."""
        return self.connection_string_env or self.DEFAULT_VARIABLE

    @property
    def token_credential(self) -> TokenCredentialSpec | None:
        return None

    def resolve(
        self, environ: Mapping[str, str], path: str, *, identity: TokenCredentialSpec | None = None
    ) -> Resolved:
        """The connection string from the environment (`UserError` naming the variable and the fields to set
        when it is not there); `path`: the block's place in the resource, for the message."""
        variable = self.connection_string_variable
        connection_string = environ.get(variable, "").strip()
        if not connection_string:
            credential_hint = (
                f"; or use a token credential, {path}.credential" if self.TAKES_CREDENTIAL else ""
            )
            raise UserError(
                f"environment variable {variable} is not set: it must hold the {self.SERVICE} connection "
                f"string of {path} (in a cluster, set {path}.connectionStringSecretRef{credential_hint})"
            )
        return Resolved(connection_string, None, variable)


class ConnectionSpec(SecretConnectionSpec):
    """A connection string, or a Microsoft Entra ID token `credential` with the block's address (`ADDRESS`:
    the field naming the namespace or the storage account URL)."""

    ADDRESS: ClassVar[str] = ""  # the address field's Python name
    ADDRESS_MESSAGE: ClassVar[str] = ""
    TAKES_CREDENTIAL: ClassVar[bool] = True

    credential: TokenCredentialSpec | None = Field(
        default=None, description="A Microsoft Entra ID token credential instead of a connection string."
    )

    @property
    def address(self) -> str | None:
        value: str | None = getattr(self, self.ADDRESS)
        return value

    @property
    def token_credential(self) -> TokenCredentialSpec | None:
        return self.credential

    @classmethod
    def cel_rules(cls) -> list[CelRule]:
        address = to_camel(cls.ADDRESS)
        rules = [
            cel(
                "!has(self.credential) || "
                "(!has(self.connectionStringSecretRef) && !has(self.connectionStringEnv))",
                BOTH_CREDENTIALS,
                ".credential",
            )
        ]
        # A required address (a Spark sink's path) is the schema's to demand: the API server runs no rule
        # while a required field is missing, so a rule asking for it would never fire.
        if not cls.model_fields[cls.ADDRESS].is_required():
            rules.append(
                cel(f"!has(self.credential) || has(self.{address})", cls.ADDRESS_MESSAGE, f".{address}")
            )
        return [*rules, *super().cel_rules()]

    @model_validator(mode="after")
    def _one_way_in(self) -> ConnectionSpec:
        """One connection, one way to authenticate: a connection string or a token credential with the
        address it is for."""
        if self.credential is None:
            return self
        if self.connection_string_secret_ref is not None or self.connection_string_env is not None:
            raise ValueError(BOTH_CREDENTIALS)
        if self.address is None:
            raise ValueError(self.ADDRESS_MESSAGE)
        return self

    def resolve(
        self, environ: Mapping[str, str], path: str, *, identity: TokenCredentialSpec | None = None
    ) -> Resolved:
        """The block's token credential (`identity` in its place when given), or its connection string."""
        if self.credential is not None:
            return Resolved(None, identity or self.credential, None)
        return super().resolve(environ, path)


@dataclass(frozen=True)
class Resolved:
    """A connection, ready to open: its connection string (never printed) or its token credential;
    `variable`: where the connection string came from, for messages."""

    connection_string: str | None = field(repr=False)
    identity: TokenCredentialSpec | None
    variable: str | None


Role = Literal["source", "store", "sink", "pipeline", "failover"]


@dataclass(frozen=True)
class NamedConnection:
    """One connection of a resource: its block and where the block is (`location`: the document's keys,
    `spec`, `eventHubs`; list indexes as ints); `role`: what the consumers use it for."""

    location: tuple[str | int, ...]
    connection: SecretConnectionSpec
    role: Role

    @property
    def path(self) -> str:
        """`spec.consumer.pipeline.route.targets[1]`: the block as a person finds it in the manifest."""
        out = ""
        for key in self.location:
            out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
        return out

    def resolve(self, environ: Mapping[str, str], *, identity: TokenCredentialSpec | None = None) -> Resolved:
        return self.connection.resolve(environ, self.path, identity=identity)

    def at(self, *keys: str | int) -> NamedConnection:
        """The same connection under a deeper place (a block's nested connection)."""
        return NamedConnection((*self.location, *keys), self.connection, self.role)


def named(
    location: tuple[str | int, ...], connection: SecretConnectionSpec | None, role: Role
) -> list[NamedConnection]:
    """`[NamedConnection]`, or `[]` when the block is absent."""
    return [] if connection is None else [NamedConnection(location, connection, role)]


# --- where events come from -------------------------------------------------------------------------

Transport = Literal["amqp", "amqpWebSockets"]
PROXY_NEEDS_WEBSOCKETS = (
    "a proxy carries AMQP over WebSockets: set transport to amqpWebSockets (or leave it out) with a proxy"
)


class ProxySpec(SecretConnectionSpec):
    """An HTTP proxy that Event Hubs is reached through (HTTP CONNECT to the namespace's port 443, AMQP over
    WebSockets inside), with the user name and password it asks for, if any, kept in a Secret."""

    SERVICE = "HTTP proxy"
    DEFAULT_VARIABLE = DEFAULT_PROXY_ENV

    url: str = Field(
        pattern=PROXY_URL,
        description="The proxy, http://HOST:PORT (no credentials here: credentialsSecretRef holds them).",
    )
    # The connection's two fields under the names a proxy's user and password go by.
    connection_string_secret_ref: SecretKeyRefSpec | None = Field(
        default=None,
        alias="credentialsSecretRef",
        description="Secret key holding the proxy's USER:PASSWORD (in a cluster); none: the proxy asks for "
        "no credentials.",
    )
    connection_string_env: str | None = Field(
        default=None,
        min_length=1,
        alias="credentialsEnv",
        description=f"Environment variable the consumer reads the proxy's USER:PASSWORD from (default "
        f"{DEFAULT_PROXY_ENV} when credentialsSecretRef is set; neither set: no credentials).",
    )

    @property
    def has_credentials(self) -> bool:
        return self.connection_string_secret_ref is not None or self.connection_string_env is not None

    def resolve(
        self, environ: Mapping[str, str], path: str, *, identity: TokenCredentialSpec | None = None
    ) -> Resolved:
        """The proxy's USER:PASSWORD from the environment (`connection_string`); none without credentials.
        `UserError` naming the variable and the field to set when it is not there."""
        if not self.has_credentials:
            return Resolved(None, None, None)
        variable = self.connection_string_variable
        credentials = environ.get(variable, "").strip()
        if not credentials:
            raise UserError(
                f"environment variable {variable} is not set: it must hold the USER:PASSWORD of the proxy "
                f"{path} names (in a cluster, set {path}.credentialsSecretRef)"
            )
        return Resolved(credentials, None, variable)


class HubConnectionSpec(ConnectionSpec):
    """An Event Hub, reached with a connection string or a token credential: the source (`EventHubsSpec`) or
    a hub events are sent to (a pipeline's target); over AMQP (port 5671) or AMQP over WebSockets (443),
    directly or through an HTTP proxy."""

    SERVICE = "Event Hubs"
    DEFAULT_VARIABLE = DEFAULT_EVENTHUBS_ENV
    ADDRESS = "namespace"
    ADDRESS_MESSAGE = CREDENTIAL_NEEDS_NAMESPACE

    namespace: str | None = Field(
        default=None,
        max_length=MAX_HOST_LENGTH,
        pattern=EVENTHUBS_NAMESPACE,
        description="Fully qualified Event Hubs namespace (e.g. myns.servicebus.windows.net: a host name in "
        "lower case, optionally :PORT); taken from the connection string's Endpoint when omitted (with a "
        "connection string it must be that Endpoint); required with a credential.",
    )
    hub: str = Field(min_length=1, description="Event Hub name.")
    transport: Transport | None = Field(
        default=None,
        description="amqp: AMQP over TLS on port 5671; amqpWebSockets: AMQP over WebSockets on port 443 "
        "(path /$servicebus/websocket), for networks that let only HTTPS out. Default: amqp, or "
        "amqpWebSockets with a proxy.",
    )
    proxy: ProxySpec | None = Field(
        default=None, description="An HTTP proxy to reach Event Hubs through (AMQP over WebSockets)."
    )

    CEL = (
        cel(
            "!has(self.proxy) || !has(self.transport) || self.transport == 'amqpWebSockets'",
            PROXY_NEEDS_WEBSOCKETS,
            ".transport",
        ),
    )

    @model_validator(mode="after")
    def _proxy_over_websockets(self) -> HubConnectionSpec:
        """The SDK speaks AMQP over WebSockets through a proxy, whatever the transport says: say so."""
        if self.proxy is not None and self.transport == "amqp":
            raise ValueError(PROXY_NEEDS_WEBSOCKETS)
        return self

    @property
    def websockets(self) -> bool:
        """Whether AMQP goes over WebSockets (asked for, or through a proxy)."""
        return self.transport == "amqpWebSockets" or self.proxy is not None

    def proxy_connection(self, location: tuple[str | int, ...], role: Role) -> list[NamedConnection]:
        """The proxy's credentials as a connection of the resource (a Secret the pods need), when it has
        some."""
        if self.proxy is None or not self.proxy.has_credentials:
            return []
        return [NamedConnection((*location, "proxy"), self.proxy, role)]


class EventHubsSpec(HubConnectionSpec):
    """The Event Hub the consumers read."""

    consumer_group: str = Field(default="$Default", min_length=1, description="Consumer group.")


# --- where ownership and checkpoints live ------------------------------------------------------------


class BlobStoreSpec(ConnectionSpec):
    """A Blob container: the checkpoint store's, or a Blob sink's (`BlobSinkSpec`)."""

    SERVICE = "Azure Storage"
    DEFAULT_VARIABLE = DEFAULT_STORAGE_ENV
    ADDRESS = "account_url"
    ADDRESS_MESSAGE = CREDENTIAL_NEEDS_ACCOUNT_URL

    container: str = Field(
        min_length=3, max_length=63, description="Blob container, one per PartitionedConsumer."
    )
    account_url: str | None = Field(
        default=None,
        max_length=len("https://") + MAX_HOST_LENGTH + len("/") + 63 + len("/"),
        pattern=STORAGE_ACCOUNT_URL,
        description="The storage account's Blob endpoint (https://ACCOUNT.blob.core.windows.net), required "
        "with a credential (and with a command line's --credential); a connection string names its own.",
    )


class SqliteStoreSpec(Model):
    path: str = Field(min_length=1, description="SQLite database file (one machine only).")


class CheckpointStoreSpec(Model):
    blob: BlobStoreSpec | None = Field(default=None, description="Azure Blob storage (leases, checkpoints).")
    sqlite: SqliteStoreSpec | None = Field(default=None, description="A local SQLite file instead of Blob.")

    CEL = (cel("has(self.blob) != has(self.sqlite)", "set exactly one of blob or sqlite"),)

    @model_validator(mode="after")
    def _exactly_one(self) -> CheckpointStoreSpec:
        if (self.blob is None) == (self.sqlite is None):
            raise ValueError("set exactly one of blob or sqlite")
        return self

    def connections(self, location: tuple[str | int, ...], role: Role) -> list[NamedConnection]:
        return named((*location, "blob"), self.blob, role)


# --- what each consumer does ----------------------------------------------------------------------

ENQUEUED_TIME_REQUIRED = "enqueuedTime is required when type is enqueuedTime"


class StartPositionSpec(Model):
    """Where a partition with no checkpoint starts."""

    type: Literal["earliest", "latest", "enqueuedTime"] = "earliest"
    enqueued_time: datetime | None = Field(default=None, description="For type enqueuedTime (RFC 3339).")

    CEL = (
        cel(
            "!has(self.type) || self.type != 'enqueuedTime' || has(self.enqueuedTime)",
            ENQUEUED_TIME_REQUIRED,
            ".enqueuedTime",
        ),
    )

    @model_validator(mode="after")
    def _time_for_enqueued(self) -> StartPositionSpec:
        if self.type == "enqueuedTime" and self.enqueued_time is None:
            raise ValueError(ENQUEUED_TIME_REQUIRED)
        return self


class FailoverSpec(Model):
    """After a failover to a replica hub: the checkpoints of the hub switched away from. Events that carry
    repl-sequence at or below the old checkpoint of their partition were handled there and are skipped."""

    checkpoint_store: CheckpointStoreSpec = Field(description="The old hub's checkpoint store.")
    namespace: str = Field(min_length=1, description="The old hub's namespace, as its checkpoints name it.")
    hub: str = Field(min_length=1, description="The old hub.")
    consumer_group: str = Field(default="$Default", min_length=1, description="The old consumer group.")


class CheckpointPolicySpec(Model):
    """A partition's checkpoint is written after Spark committed a batch, at most this often."""

    every_seconds: float = Field(
        default=DEFAULT_TIMING.checkpoint_interval_seconds,
        gt=0,
        description="Write at least this often while events flow.",
    )
    every_events: int = Field(default=50_000, ge=1, description="...or after this many events, if sooner.")


# Spark settings the spec's own fields (their place under spec.consumer; None: hubshift) set: `spark.conf`
# may not set them again.
OWN_SPARK_CONF = {
    "spark.master": "spark.master",
    "spark.app.name": None,
    "spark.driver.memory": "spark.driverMemory",
    "spark.sql.shuffle.partitions": "spark.shufflePartitions",
    "spark.ui.enabled": "spark.ui.enabled",
    "spark.ui.port": "spark.ui.port",
    "spark.local.dir": None,
    "spark.sql.warehouse.dir": None,
    "spark.driver.extraJavaOptions": None,
    "spark.driver.extraClassPath": None,
    "spark.sql.session.timeZone": None,
    # a local-mode driver's RPC and block manager listen on 127.0.0.1 only (they have no authentication
    # and deserialize what they are sent), and the UI has no kill buttons
    "spark.driver.bindAddress": None,
    "spark.driver.host": None,
    "spark.ui.killEnabled": None,
}


class SparkUiSpec(Model):
    """Spark's web UI of each consumer's driver: off unless asked for (`kubectl port-forward pod/NAME
    4040`)."""

    enabled: bool = Field(default=False, description="Serve Spark's UI.")
    port: int = Field(default=4040, ge=1024, le=65535, description="Its port in the pod.")


class SparkSpec(Model):
    master: str = Field(default="local[*]", description="Spark master; consumers run a local-mode driver.")
    trigger_interval_seconds: float = Field(default=1.0, gt=0, description="Micro-batch trigger interval.")
    max_events_per_trigger: int = Field(
        default=100_000, ge=1, description="Admission control: events per micro-batch, over all partitions."
    )
    shuffle_partitions: int = Field(default=2, ge=1, description="spark.sql.shuffle.partitions.")
    driver_memory: str = Field(default="1g", pattern=JVM_SIZE, description="spark.driver.memory (512m, 1g).")
    conf: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=MAX_SETTINGS,
        description="More of Spark's settings (spark.*), passed to each consumer's Spark session as they "
        "are; those the fields above (or hubshift) set are refused.",
    )
    ui: SparkUiSpec = Field(default_factory=SparkUiSpec)

    CEL = (
        cel(
            "!has(self.conf) || self.conf.all(k, k.startsWith('spark.') && !(k in ["
            + ", ".join(f"'{key}'" for key in OWN_SPARK_CONF)
            + "]))",
            "conf: Spark settings start with spark., and those hubshift sets (spark.master, "
            "spark.driver.memory, ...) have fields of their own",
            ".conf",
        ),
    )

    @model_validator(mode="after")
    def _own_settings_stay_own(self) -> SparkSpec:
        for key in self.conf:
            if not key.startswith("spark."):
                raise ValueError(f"conf: {key!r} is not a Spark setting (they start with spark.)")
            if key in OWN_SPARK_CONF:
                field = OWN_SPARK_CONF[key]
                where = f"set spec.consumer.{field} instead" if field else "hubshift sets it"
                raise ValueError(f"conf: {key} cannot be set here: {where}")
        return self


class ResourceListSpec(Model):
    cpu: str | None = Field(default=None, pattern=QUANTITY, description="A quantity: 500m, 1, 2.")
    memory: str | None = Field(default=None, pattern=QUANTITY, description="A quantity: 512Mi, 2Gi.")


class ResourcesSpec(Model):
    requests: ResourceListSpec = Field(default_factory=lambda: ResourceListSpec(cpu="1", memory="2Gi"))
    limits: ResourceListSpec = Field(default_factory=lambda: ResourceListSpec(memory="3Gi"))


# --- how many consumers, and how partitions move between them --------------------------------------


class ScalingPolicySpec(Model):
    """One HPA scaling policy: at most `value` pods (or percent) per `periodSeconds`."""

    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1)
    period_seconds: int = Field(ge=1, le=1800)


class ScalingRulesSpec(Model):
    stabilization_window_seconds: int = Field(ge=0, le=3600)
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"
    policies: list[ScalingPolicySpec] = Field(default_factory=list)


def _default_scale_up() -> ScalingRulesSpec:
    # HPA's own default: the higher of +4 pods or +100% per 60 s, no stabilisation.
    return ScalingRulesSpec(
        stabilization_window_seconds=0,
        select_policy="Max",
        policies=[
            ScalingPolicySpec(type="Pods", value=4, period_seconds=60),
            ScalingPolicySpec(type="Percent", value=100, period_seconds=60),
        ],
    )


def _default_scale_down() -> ScalingRulesSpec:
    # HPA's own default: 300 s stabilisation, any amount per 15 s.
    return ScalingRulesSpec(
        stabilization_window_seconds=300,
        select_policy="Max",
        policies=[ScalingPolicySpec(type="Percent", value=100, period_seconds=15)],
    )


class ScalingBehaviorSpec(Model):
    scale_up: ScalingRulesSpec = Field(default_factory=_default_scale_up)
    scale_down: ScalingRulesSpec = Field(default_factory=_default_scale_down)


class ScalingGoalSpec(Model):
    unprocessed_events_per_replica: int = Field(
        default=1000, ge=1, description="Backlog one replica is expected to carry (KEDA: 64)."
    )
    lag_seconds: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="Lag target in seconds: replicas from each consumer's measured capacity and each "
        "partition's incoming rate and backlog, so that the worst partition's lag stays under this. Until "
        "a capacity is measured, unprocessedEventsPerReplica decides.",
    )


class ActivationSpec(Model):
    unprocessed_events: int = Field(
        default=0, ge=0, description="Scale from zero only when the backlog exceeds this."
    )


class FallbackSpec(Model):
    failure_threshold: int = Field(default=3, ge=1, description="Failed backlog reads before falling back.")
    replicas: int = Field(default=1, ge=0, description="Replica count while the backlog cannot be read.")
    behavior: Literal["static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"] = (
        "static"
    )


MAX_BELOW_MIN = "maxReplicas must be at least minReplicas"


class ScalingSpec(Model):
    """At least KEDA ScaledObject's capabilities, for Event Hubs backlog."""

    min_replicas: int = Field(default=1, ge=0, description="0 allows scale to zero.")
    max_replicas: int = Field(default=32, ge=1, description="Never more than the partition count either.")
    idle_replicas: int | None = Field(default=None, ge=0, le=0, description="KEDA idleReplicaCount (only 0).")
    polling_interval_seconds: float = Field(default=15.0, ge=1, description="How often the backlog is read.")
    cooldown_period_seconds: int = Field(default=300, ge=0, description="Idle time before scaling to zero.")
    initial_cooldown_period_seconds: int = Field(default=0, ge=0)
    target: ScalingGoalSpec = Field(default_factory=ScalingGoalSpec)
    activation: ActivationSpec = Field(default_factory=ActivationSpec)
    behavior: ScalingBehaviorSpec = Field(default_factory=ScalingBehaviorSpec)
    fallback: FallbackSpec | None = None
    align_to_partitions: bool = Field(
        default=True,
        description="Round replica counts to ones that spread partitions evenly (e.g. 32 partitions: "
        "1,2,3,4,5,6,7,8,11,16,32).",
    )

    @property
    def may_scale_to_zero(self) -> bool:
        return self.min_replicas == 0 or self.idle_replicas == 0

    CEL = (
        cel(
            "!has(self.maxReplicas) || !has(self.minReplicas) || self.maxReplicas >= self.minReplicas",
            MAX_BELOW_MIN,
            ".maxReplicas",
        ),
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScalingSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError(MAX_BELOW_MIN)
        return self


# SIGTERM: a consumer hands off within maxHandoffSeconds plus this; its pod gets EXIT_MARGIN_SECONDS more.
STOP_MARGIN_SECONDS = 10.0
EXIT_MARGIN_SECONDS = 20.0
# SIGTERM with an operator's assignment: keep reading this long at most while the operator moves the
# partitions (a planned handoff to consumers ready for them), then hand off whatever is left. Inside the
# stop margin, so the grace period is unchanged.
STOP_FOLLOW_SECONDS = 5.0


class RolloutSpec(Model):
    """How consumer pods are replaced when a change needs new ones (the image, the manifest they read)."""

    strategy: Literal["Operator", "RollingUpdate"] = Field(
        default="Operator",
        description="Operator: the control loop replaces the pods one at a time (StatefulSet OnDelete), each "
        "pod's partitions handed to the others before it is deleted and its replacement given its planned "
        "share when ready. RollingUpdate: the StatefulSet replaces them itself; each pod stopped hands its "
        "partitions off on SIGTERM and gets its share back when its replacement is ready.",
    )
    max_surge: int = Field(
        default=1,
        ge=0,
        le=1,
        description="Operator strategy: one extra pod during a rollout when scaling.maxReplicas allows it, "
        "so as many pods read as before while each one is replaced; 0: none (one pod fewer reads meanwhile).",
    )


RebalanceStrategy = Literal["balanced", "loadAware"]


class LoadAwareSpec(Model):
    """How `strategy: loadAware` weighs partitions and when their load moves them (docs/decisions.md,
    "Load-aware packing")."""

    window_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="A partition's load is the median of its rates between the probes of this window (a "
        "burst covering fewer than half of those intervals does not change it), or the nearer of the last "
        "two probes' rates when both moved the same way.",
    )
    tolerance: float = Field(
        default=0.2,
        gt=0,
        le=4,
        description="A consumer's partitions move for load when it carries more than (1 + tolerance) x the "
        "mean; they move until it carries at most (1 + tolerance / 2) x the mean.",
    )
    max_moves: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="Partitions moved for load alone per publication (a change of the consumers or "
        "partitions moves what it must).",
    )


class RebalanceSpec(Model):
    strategy: RebalanceStrategy = Field(
        default="balanced",
        description="balanced: every consumer reads as many partitions as the others (+-1); loadAware: "
        "partitions are packed by their measured incoming rate, moving as few as keep every consumer near "
        "the mean load.",
    )
    load_aware: LoadAwareSpec = Field(default_factory=LoadAwareSpec)
    delay_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="Holddown: after a change of the consumers nobody planned (a pod lost or back), wait "
        "this long for the set to settle before any handoff. A scale the operator decides does not wait; "
        "a partition it plans for a new consumer that nobody reads waits at most this long for it.",
    )
    max_handoff_seconds: float = Field(
        default=15.0,
        gt=0,
        le=600,
        description="After this long, a partition not released by its old owner is taken by force.",
    )
    lease_duration_seconds: int = Field(
        default=DEFAULT_TIMING.membership_lease_seconds,
        ge=MIN_LEASE_SECONDS,
        le=MAX_LEASE_SECONDS,
        description="Membership lease (Azure's bounds: 15-60 s).",
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)

    @property
    def stop_budget_seconds(self) -> float:
        """On SIGTERM a consumer hands every partition off within this: a handoff, plus a margin for the
        batch in flight to commit."""
        return self.max_handoff_seconds + STOP_MARGIN_SECONDS

    @property
    def termination_grace_seconds(self) -> int:
        """A consumer pod's grace period: the stop budget, then time for Spark to stop and the process to
        exit after its last release, before the kubelet's SIGKILL."""
        return math.ceil(self.stop_budget_seconds + EXIT_MARGIN_SECONDS)

    def timing(self, list_interval_seconds: float | None = None) -> Timing:
        """The consumer's ownership timings for this lease: renewed at half of it, stopped a safety margin
        before it could expire; the rest are the protocol's defaults."""
        lease = self.lease_duration_seconds
        return Timing(
            membership_lease_seconds=lease,
            renew_interval_seconds=lease / 2,
            safety_margin_seconds=min(DEFAULT_TIMING.safety_margin_seconds, lease / 2 - 1),
            list_interval_seconds=list_interval_seconds or DEFAULT_TIMING.list_interval_seconds,
        )
