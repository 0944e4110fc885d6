"""The `PartitionedConsumer` manifest: one typed model that the CLI, the consumer and the operator all read.

The same YAML a user `kubectl apply`s runs on this machine with `hubshift run -f`. The CRD schema in
`crds/` is generated from this model (`hubshift.operator.kubernetes.crd`), and a test proves they do not
drift.

Each Azure connection (the Event Hubs source, the Blob checkpoint store, the Blob sink, the replicate
target) authenticates one of two ways:

- a connection string with a shared key. It never appears in the manifest: in a cluster the operator maps
  the `connectionStringSecretRef` into the pod's environment under the variable `connectionStringEnv`
  names (or its default); outside a cluster the consumer reads that environment variable directly;
- a Microsoft Entra ID token `credential` (workload identity, managed identity or azure-identity's
  `DefaultAzureCredential`) with the namespace or the storage account URL: no secret anywhere.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from hubshift.ownership.store import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from hubshift.ownership.timing import DEFAULT_TIMING, Timing

GROUP = "hubshift.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PartitionedConsumer"
PLURAL = "partitionedconsumers"
SHORT_NAME = "pcon"

# KEDA's pause annotations, under our group.
PAUSED_ANNOTATION = f"autoscaling.{GROUP}/paused"
PAUSED_REPLICAS_ANNOTATION = f"autoscaling.{GROUP}/paused-replicas"
PAUSED_SCALE_IN_ANNOTATION = f"autoscaling.{GROUP}/paused-scale-in"
PAUSED_SCALE_OUT_ANNOTATION = f"autoscaling.{GROUP}/paused-scale-out"
FORCE_ACTIVATION_ANNOTATION = f"autoscaling.{GROUP}/force-activation"

# A Kubernetes resource quantity (what `kubectl` accepts for sizes and CPUs: 512Mi, 1Gi, 10G, 250m, 1.5).
QUANTITY = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[KMGTPE]i?|[mkMGTPE])?$"
# A JVM memory size as Spark takes it (512m, 1g).
JVM_SIZE = r"^[0-9]+[kKmMgGtT]?$"
# The longest PartitionedConsumer name: its StatefulSet's pods carry a `controller-revision-hash` label of
# `<name>-<10 characters>`, and a label value has at most 63.
MAX_NAME_LENGTH = 52

DEFAULT_EVENTHUBS_ENV = "HUBSHIFT_EVENTHUBS_CONNECTION_STRING"
DEFAULT_STORAGE_ENV = "HUBSHIFT_STORAGE_CONNECTION_STRING"
DEFAULT_SINK_STORAGE_ENV = "HUBSHIFT_SINK_CONNECTION_STRING"
DEFAULT_REPLICATE_ENV = "HUBSHIFT_REPLICATE_CONNECTION_STRING"
DEFAULT_PROJECTION_ENV = "HUBSHIFT_PROJECTION_CONNECTION_STRING"

# A table or column name in a projection's database (optionally schema-qualified for a table).
SQL_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
SQL_TABLE = r"^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$"
# A field of a JSON body: names separated by dots (`a.b.c`), optionally after `$.`.
JSON_PATH = r"^(\$\.)?[^.\s]+(\.[^.\s]+)*$"
# Bounds that keep the API server's CEL cost estimates small.
MAX_TARGETS = 16
MAX_RULES = 64
MAX_STEPS = 32
NAME_LENGTH = 63


class Model(BaseModel):
    """camelCase in YAML, snake_case in Python; unknown fields are refused (a typo is an error)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class SecretKeyRefSpec(Model):
    """A key of a Kubernetes Secret in the PartitionedConsumer's namespace."""

    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field(min_length=1, description="Key inside the Secret.")


# A Kubernetes object name (DNS subdomain), e.g. a ServiceAccount's.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
STORAGE_ACCOUNT_URL = r"^https://[^/\s]+(/[^/\s]+)?/?$"


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


# The messages of the refusals below, shared by the model and the CRD's CEL rules.
BOTH_CREDENTIALS = (
    "set a connection string (connectionStringSecretRef, connectionStringEnv) or a credential, not both"
)
CREDENTIAL_NEEDS_NAMESPACE = (
    "a credential needs namespace, the fully qualified namespace (myns.servicebus.windows.net)"
)
CREDENTIAL_NEEDS_ACCOUNT_URL = "a credential needs accountUrl, the storage account's Blob endpoint (https://ACCOUNT.blob.core.windows.net)"


def _check_credentials(
    credential: TokenCredentialSpec | None,
    secret_ref: SecretKeyRefSpec | None,
    env: str | None,
    address: str | None,
    address_message: str,
) -> None:
    """One connection, one way to authenticate: a connection string or a token credential with the address
    (namespace, account URL) it is for."""
    if credential is None:
        return
    if secret_ref is not None or env is not None:
        raise ValueError(BOTH_CREDENTIALS)
    if address is None:
        raise ValueError(address_message)


# --- where events come from -------------------------------------------------------------------------


class EventHubsSpec(Model):
    namespace: str | None = Field(
        default=None,
        description="Fully qualified Event Hubs namespace (e.g. myns.servicebus.windows.net); "
        "taken from the connection string's Endpoint when omitted; required with a credential.",
    )
    hub: str = Field(min_length=1, description="Event Hub name.")
    consumer_group: str = Field(default="$Default", min_length=1, description="Consumer group.")
    connection_string_secret_ref: SecretKeyRefSpec | None = Field(
        default=None, description="Secret holding the Event Hubs connection string (in a cluster)."
    )
    connection_string_env: str | None = Field(
        default=None,
        min_length=1,
        description=f"Environment variable the consumer reads the connection string from (default "
        f"{DEFAULT_EVENTHUBS_ENV}).",
    )
    credential: TokenCredentialSpec | None = Field(
        default=None, description="A Microsoft Entra ID token credential instead of a connection string."
    )

    @property
    def connection_string_variable(self) -> str:
        return self.connection_string_env or DEFAULT_EVENTHUBS_ENV

    @model_validator(mode="after")
    def _one_way_in(self) -> EventHubsSpec:
        _check_credentials(
            self.credential,
            self.connection_string_secret_ref,
            self.connection_string_env,
            self.namespace,
            CREDENTIAL_NEEDS_NAMESPACE,
        )
        return self


# --- where ownership and checkpoints live ------------------------------------------------------------


class BlobStoreSpec(Model):
    container: str = Field(
        min_length=3, max_length=63, description="Blob container, one per PartitionedConsumer."
    )
    account_url: str | None = Field(
        default=None,
        pattern=STORAGE_ACCOUNT_URL,
        description="The storage account's Blob endpoint (https://ACCOUNT.blob.core.windows.net), required "
        "with a credential (and with a command line's --credential); a connection string names its own.",
    )
    connection_string_secret_ref: SecretKeyRefSpec | None = Field(
        default=None, description="Secret holding the Azure Storage connection string (in a cluster)."
    )
    connection_string_env: str | None = Field(
        default=None,
        min_length=1,
        description=f"Environment variable the consumer reads the storage connection string from (default "
        f"{DEFAULT_STORAGE_ENV}).",
    )
    credential: TokenCredentialSpec | None = Field(
        default=None, description="A Microsoft Entra ID token credential instead of a connection string."
    )

    @property
    def connection_string_variable(self) -> str:
        return self.connection_string_env or DEFAULT_STORAGE_ENV

    @model_validator(mode="after")
    def _one_way_in(self) -> BlobStoreSpec:
        _check_blob_credentials(self)
        return self


class SqliteStoreSpec(Model):
    path: str = Field(min_length=1, description="SQLite database file (one machine only).")


class CheckpointStoreSpec(Model):
    blob: BlobStoreSpec | None = Field(default=None, description="Azure Blob storage (leases, checkpoints).")
    sqlite: SqliteStoreSpec | None = Field(default=None, description="A local SQLite file instead of Blob.")

    @model_validator(mode="after")
    def _exactly_one(self) -> CheckpointStoreSpec:
        if (self.blob is None) == (self.sqlite is None):
            raise ValueError("set exactly one of blob or sqlite")
        return self


# --- what each consumer does ----------------------------------------------------------------------


class StartPositionSpec(Model):
    """Where a partition with no checkpoint starts."""

    type: Literal["earliest", "latest", "enqueuedTime"] = "earliest"
    enqueued_time: datetime | None = Field(default=None, description="For type enqueuedTime (RFC 3339).")

    @model_validator(mode="after")
    def _time_for_enqueued(self) -> StartPositionSpec:
        if self.type == "enqueuedTime" and self.enqueued_time is None:
            raise ValueError("enqueuedTime is required when type is enqueuedTime")
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


class SparkSpec(Model):
    master: str = Field(default="local[*]", description="Spark master; consumers run a local-mode driver.")
    trigger_interval_seconds: float = Field(default=1.0, gt=0, description="Micro-batch trigger interval.")
    max_events_per_trigger: int = Field(
        default=100_000, ge=1, description="Admission control: events per micro-batch, over all partitions."
    )
    shuffle_partitions: int = Field(default=2, ge=1, description="spark.sql.shuffle.partitions.")
    driver_memory: str = Field(default="1g", pattern=JVM_SIZE, description="spark.driver.memory (512m, 1g).")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark configuration.")


class AggregateSpec(Model):
    """Home-security events counted per home and sensor type per time window."""

    window_seconds: int = Field(default=60, ge=1, description="Tumbling window length.")
    sensor_types: list[str] = Field(
        default_factory=list, description="Keep only these sensor types (empty: all)."
    )
    event_types: list[str] = Field(
        default_factory=list, description="Keep only these event types (empty: all)."
    )


class TargetHubSpec(Model):
    """An Event Hub that events are forwarded to, with its connection string from an environment variable."""

    hub: str = Field(min_length=1, description="Target Event Hub.")
    namespace: str | None = Field(
        default=None,
        description="Target namespace; taken from the connection string when omitted; required with a "
        "credential.",
    )
    connection_string_secret_ref: SecretKeyRefSpec | None = Field(
        default=None, description="Secret holding the target's Event Hubs connection string (in a cluster)."
    )
    connection_string_env: str | None = Field(
        default=None,
        min_length=1,
        description=f"Environment variable the consumer reads the target's connection string from (default "
        f"{DEFAULT_REPLICATE_ENV}).",
    )
    credential: TokenCredentialSpec | None = Field(
        default=None, description="A Microsoft Entra ID token credential instead of a connection string."
    )
    keep_partition: bool = Field(
        default=False,
        description="Events without a partition key go to the target partition of the same id (the target "
        "needs at least as many partitions); otherwise the service spreads them.",
    )

    @property
    def connection_string_variable(self) -> str:
        return self.connection_string_env or DEFAULT_REPLICATE_ENV

    @model_validator(mode="after")
    def _one_way_in(self) -> TargetHubSpec:
        _check_credentials(
            self.credential,
            self.connection_string_secret_ref,
            self.connection_string_env,
            self.namespace,
            CREDENTIAL_NEEDS_NAMESPACE,
        )
        return self


class ReplicateSpec(TargetHubSpec):
    """Every event forwarded to another Event Hub, partition key, body and properties kept, the source's
    enqueued time, sequence number and offset added as `repl-enqueue-time`, `repl-sequence` and
    `repl-offset` (appended after a `;` when the event was replicated before)."""

    skip_replicated: bool = Field(
        default=False,
        description="Do not forward events that carry repl-sequence (the merge pattern: hubs mirrored both "
        "ways never send an event back).",
    )


# --- route: rules pick the target hubs ---------------------------------------------------------------


class TextMatchSpec(Model):
    """Tests on a text value; every test set must hold. None set: the value is present."""

    equals: str | None = Field(default=None, description="Exactly this text.")
    one_of: list[str] | None = Field(default=None, max_length=256, description="Any of these texts.")
    prefix: str | None = Field(default=None, description="Starts with this text.")
    regex: str | None = Field(
        default=None, min_length=1, description="A Python regular expression found in the text (re.search)."
    )
    exists: bool | None = Field(default=None, description="false: the value is absent (no other test).")


class PropertyMatchSpec(TextMatchSpec):
    name: str = Field(min_length=1, description="The application property.")


class JsonMatchSpec(TextMatchSpec):
    """A field of the JSON body; numbers and booleans compare as their JSON text (5, 2.5, true)."""

    path: str = Field(pattern=JSON_PATH, description="The field: names separated by dots (a.b.c).")


class SequenceMatchSpec(Model):
    """The event's sequence number in its source partition."""

    modulo: int | None = Field(default=None, ge=1, description="With remainder: sequence % modulo.")
    remainder: int | None = Field(default=None, ge=0, description="sequence % modulo == remainder.")
    min: int | None = Field(default=None, ge=0, description="At least this.")
    max: int | None = Field(default=None, ge=0, description="At most this.")

    @model_validator(mode="after")
    def _remainder_below_modulo(self) -> SequenceMatchSpec:
        if (self.modulo is None) != (self.remainder is None):
            raise ValueError("set modulo and remainder together")
        if self.modulo is not None and self.remainder is not None and self.remainder >= self.modulo:
            raise ValueError("remainder must be below modulo")
        return self


class RouteRuleSpec(Model):
    """Every condition set must hold (none: every event); `to` names the targets of a matching event."""

    partition_key: TextMatchSpec | None = Field(default=None, description="The event's partition key.")
    property: PropertyMatchSpec | None = Field(default=None, description="An application property.")
    sequence_number: SequenceMatchSpec | None = Field(default=None, description="The source sequence number.")
    json_field: JsonMatchSpec | None = Field(
        default=None, alias="json", description="A field of the JSON body."
    )
    sql: str | None = Field(
        default=None,
        min_length=1,
        description="A Spark SQL boolean expression over the event columns (partition, sequence_number, "
        "offset, enqueued_time, partition_key, body, properties).",
    )
    to: list[str] = Field(
        min_length=1,
        max_length=MAX_TARGETS,
        description="Names of the targets an event matching this rule goes to.",
    )


class RouteTargetSpec(TargetHubSpec):
    name: str = Field(min_length=1, max_length=NAME_LENGTH, description="The name rules use for this target.")


class RouteSpec(Model):
    """Events forwarded (like replicate, with the repl-* metadata) to the targets their rules pick."""

    targets: list[RouteTargetSpec] = Field(
        min_length=1, max_length=MAX_TARGETS, description="The target hubs."
    )
    rules: list[RouteRuleSpec] = Field(
        min_length=1, max_length=MAX_RULES, description="Rules in order (see match)."
    )
    match: Literal["first", "all"] = Field(
        default="first",
        description="first: the first matching rule picks the targets; all: every matching rule adds its "
        "own.",
    )
    default_target: str | None = Field(
        default=None,
        max_length=NAME_LENGTH,
        description="Where events that match no rule go (absent: they are dropped).",
    )
    skip_replicated: bool = Field(
        default=False, description="Do not forward events that carry repl-sequence (as replicate)."
    )

    @model_validator(mode="after")
    def _targets_named(self) -> RouteSpec:
        names = [target.name for target in self.targets]
        if len(set(names)) != len(names):
            raise ValueError("target names must be unique")
        known = set(names)
        if any(name not in known for rule in self.rules for name in rule.to) or (
            self.default_target is not None and self.default_target not in known
        ):
            raise ValueError("rules and defaultTarget must name declared targets")
        return self


# --- editor: steps applied before the events are forwarded ------------------------------------------


class EventFieldSpec(Model):
    """One value of an event: its partition key, an application property, or a field of its JSON body."""

    partition_key: bool | None = Field(default=None, description="true: the partition key.")
    property: str | None = Field(default=None, min_length=1, description="An application property.")
    json_field: str | None = Field(
        default=None, alias="json", pattern=JSON_PATH, description="A field of the JSON body (a.b.c)."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EventFieldSpec:
        if sum((bool(self.partition_key), self.property is not None, self.json_field is not None)) != 1:
            raise ValueError("set exactly one of partitionKey (true), property or json")
        return self


class FlattenStepSpec(Model):
    separator: str = Field(default=".", min_length=1, description="Joins nested names (a.b).")


class ValidateStepSpec(Model):
    json_schema: dict[str, Any] = Field(
        description="A JSON Schema (draft 2020-12) the JSON body must satisfy; other events are dead "
        "letters with the reason."
    )


class DedupeStepSpec(Model):
    key: EventFieldSpec = Field(description="Events with the same key...")
    window_seconds: float = Field(
        gt=0, le=7 * 86400, description="...enqueued within this many seconds of the first are dropped."
    )


class EnrichStepSpec(Model):
    key: EventFieldSpec = Field(description="Looked up in the table.")
    table: dict[str, dict[str, str]] | None = Field(
        default=None, description="Key -> fields added to the JSON body."
    )
    path: str | None = Field(
        default=None, min_length=1, description="A JSON file holding the table instead (read at start-up)."
    )
    into: str | None = Field(
        default=None, min_length=1, description="Add the fields under this name (absent: at the top)."
    )
    on_missing: Literal["keep", "drop", "deadLetter"] = Field(
        default="keep",
        description="An event whose key is not in the table: kept as it is, dropped, or a dead letter.",
    )

    @model_validator(mode="after")
    def _one_table(self) -> EnrichStepSpec:
        if (self.table is None) == (self.path is None):
            raise ValueError("set exactly one of table or path")
        return self


class GzipStepSpec(Model):
    level: int = Field(default=6, ge=1, le=9, description="Compression level.")


class GunzipStepSpec(Model):
    max_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1,
        description="A body that decompresses to more than this is a dead letter (a decompression bomb).",
    )


class EditorStepSpec(Model):
    """One step of an editor; set exactly one field."""

    function: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="Your module:function taking and returning a DataFrame (Spark runs it).",
    )
    filter: str | None = Field(
        default=None, min_length=1, description="Keep the events for which this Spark SQL expression is true."
    )
    select: dict[str, str] | None = Field(
        default=None, description="A new JSON body of these fields: output name -> path in the body (a.b)."
    )
    flatten: FlattenStepSpec | None = Field(default=None, description="Nested JSON objects to dotted names.")
    validate_: ValidateStepSpec | None = Field(
        default=None, alias="validate", description="Check the JSON body against a JSON Schema."
    )
    dedupe: DedupeStepSpec | None = Field(default=None, description="Drop repeats of a key within a window.")
    enrich: EnrichStepSpec | None = Field(default=None, description="Add fields from a static lookup table.")
    gzip: GzipStepSpec | None = Field(default=None, description="Compress the body.")
    gunzip: GunzipStepSpec | None = Field(default=None, description="Decompress the body.")

    @model_validator(mode="after")
    def _exactly_one(self) -> EditorStepSpec:
        if sum(getattr(self, name) is not None for name in type(self).model_fields) != 1:
            raise ValueError("set exactly one step per editor entry")
        return self


# --- log projection: the latest event per key in a database table ------------------------------------


class PostgresSpec(Model):
    connection_string_secret_ref: SecretKeyRefSpec | None = Field(
        default=None, description="Secret holding the PostgreSQL connection string (in a cluster)."
    )
    connection_string_env: str = Field(
        default=DEFAULT_PROJECTION_ENV,
        description="Environment variable holding the connection string (postgresql://... or key=value).",
    )


class SqliteDatabaseSpec(Model):
    path: str = Field(default="hubshift-projection.db", min_length=1, description="The SQLite file.")


class ProjectionSpec(Model):
    """The latest event per key kept in a table (a compacted view), optionally every event in a history
    table; replays never overwrite a newer event with an older one."""

    database: Literal["sqlite", "postgres"] = Field(
        default="sqlite", description="sqlite (embedded, one machine) or postgres."
    )
    sqlite: SqliteDatabaseSpec = Field(default_factory=SqliteDatabaseSpec)
    postgres: PostgresSpec | None = None
    table: str = Field(pattern=SQL_TABLE, description="The latest event per key.")
    key_column: str = Field(default="key", pattern=SQL_NAME, description="The key's column (primary key).")
    payload_column: str = Field(default="payload", pattern=SQL_NAME, description="The body's column.")
    payload_type: Literal["json", "text", "binary"] = Field(
        default="json",
        description="json (jsonb; events whose body is not JSON are dead letters), text (UTF-8) or binary.",
    )
    key: EventFieldSpec = Field(
        default_factory=lambda: EventFieldSpec(partition_key=True),
        description="The value that identifies a record (default: the partition key; events without one "
        "are skipped).",
    )
    history_table: str | None = Field(
        default=None,
        pattern=SQL_TABLE,
        description="Also every event here, once (a time-series historian).",
    )
    create_tables: bool = Field(default=True, description="Create the tables at start-up when missing.")

    @model_validator(mode="after")
    def _postgres_configured(self) -> ProjectionSpec:
        if self.database == "postgres" and self.postgres is None:
            raise ValueError("postgres is required when database is postgres")
        return self


FORWARDING = ("replicate", "route", "projection")


class PipelineSpec(Model):
    type: Literal["aggregate", "function", "replicate", "route", "projection"] = "aggregate"
    aggregate: AggregateSpec = Field(default_factory=AggregateSpec)
    function: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="module:function taking and returning a DataFrame (type function).",
    )
    replicate: ReplicateSpec | None = Field(
        default=None, description="The target Event Hub (type replicate)."
    )
    route: RouteSpec | None = Field(default=None, description="Targets and rules (type route).")
    projection: ProjectionSpec | None = Field(
        default=None, description="The database table (type projection)."
    )
    editor: list[EditorStepSpec] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Steps applied in order before replicate, route or projection, in the same consumer.",
    )

    @model_validator(mode="after")
    def _function_named(self) -> PipelineSpec:
        if self.type == "function" and not self.function:
            raise ValueError("function (module:function) is required when type is function")
        if self.type == "replicate" and self.replicate is None:
            raise ValueError("replicate (the target hub) is required when type is replicate")
        if self.type == "route" and self.route is None:
            raise ValueError("route (targets and rules) is required when type is route")
        if self.type == "projection" and self.projection is None:
            raise ValueError("projection (the table) is required when type is projection")
        if self.editor and self.type not in FORWARDING:
            raise ValueError("editor goes with type replicate, route or projection")
        return self


class FolderVolumeSpec(Model):
    """In a cluster, the volume a folder sink lives on (the pods' root file system is read-only). Neither
    field: an emptyDir, gone with the pod."""

    claim_name: str | None = Field(
        default=None,
        min_length=1,
        description="An existing PersistentVolumeClaim every pod mounts (ReadWriteMany shares one folder).",
    )
    size: str | None = Field(
        default=None,
        pattern=QUANTITY,
        description="A volume of this size per pod, from a claim template (it outlives the pod).",
    )
    storage_class_name: str | None = Field(
        default=None, min_length=1, description="With size: the claim template's StorageClass."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> FolderVolumeSpec:
        if self.claim_name is not None and self.size is not None:
            raise ValueError("set claimName or size, not both")
        if self.storage_class_name is not None and self.size is None:
            raise ValueError("storageClassName goes with size")
        return self


class FolderSinkSpec(Model):
    path: str = Field(default="hubshift-output", description="Folder the results are written under.")
    volume: FolderVolumeSpec = Field(
        default_factory=FolderVolumeSpec,
        description="In a cluster: the volume mounted at path (default: an emptyDir).",
    )


class BlobSinkSpec(Model):
    container: str = Field(min_length=3, max_length=63)
    prefix: str = Field(default="", description="Blob name prefix.")
    account_url: str | None = Field(
        default=None,
        pattern=STORAGE_ACCOUNT_URL,
        description="The storage account's Blob endpoint (https://ACCOUNT.blob.core.windows.net), required "
        "with a credential (and with a command line's --credential); a connection string names its own.",
    )
    connection_string_secret_ref: SecretKeyRefSpec | None = Field(
        default=None, description="Secret holding the Azure Storage connection string (in a cluster)."
    )
    connection_string_env: str | None = Field(
        default=None,
        min_length=1,
        description=f"Environment variable the consumer reads the storage connection string from (default "
        f"{DEFAULT_SINK_STORAGE_ENV}).",
    )
    credential: TokenCredentialSpec | None = Field(
        default=None, description="A Microsoft Entra ID token credential instead of a connection string."
    )

    @property
    def connection_string_variable(self) -> str:
        return self.connection_string_env or DEFAULT_SINK_STORAGE_ENV

    @model_validator(mode="after")
    def _one_way_in(self) -> BlobSinkSpec:
        _check_blob_credentials(self)
        return self


def _check_blob_credentials(blob: BlobStoreSpec | BlobSinkSpec) -> None:
    _check_credentials(
        blob.credential,
        blob.connection_string_secret_ref,
        blob.connection_string_env,
        blob.account_url,
        CREDENTIAL_NEEDS_ACCOUNT_URL,
    )


class SinkSpec(Model):
    type: Literal["folder", "blob"] = "folder"
    folder: FolderSinkSpec = Field(default_factory=FolderSinkSpec)
    blob: BlobSinkSpec | None = None
    dead_letter_path: str | None = Field(
        default=None,
        description="Where unparsable events go, with the reason (default: <sink>/dead-letter).",
    )

    @model_validator(mode="after")
    def _blob_configured(self) -> SinkSpec:
        if self.type == "blob" and self.blob is None:
            raise ValueError("blob is required when type is blob")
        return self


class ResourceListSpec(Model):
    cpu: str | None = Field(default=None, pattern=QUANTITY, description="A quantity: 500m, 1, 2.")
    memory: str | None = Field(default=None, pattern=QUANTITY, description="A quantity: 512Mi, 2Gi.")


class ResourcesSpec(Model):
    requests: ResourceListSpec = Field(default_factory=lambda: ResourceListSpec(cpu="1", memory="2Gi"))
    limits: ResourceListSpec = Field(default_factory=lambda: ResourceListSpec(memory="3Gi"))


class ConsumerSpec(Model):
    image: str = Field(
        default="hubshift:0.1.0",
        min_length=1,
        pattern=r"^\S+$",
        description="Container image of the consumer pods.",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    spark: SparkSpec = Field(default_factory=SparkSpec)
    start_position: StartPositionSpec = Field(default_factory=StartPositionSpec)
    failover: FailoverSpec | None = Field(
        default=None,
        description="Skip the events a previous consumer of the hub this one replicates already handled.",
    )
    checkpoint: CheckpointPolicySpec = Field(default_factory=CheckpointPolicySpec)
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)
    sink: SinkSpec = Field(default_factory=SinkSpec)
    metrics_port: int = Field(
        default=9090, ge=1, le=65535, description="/metrics, /healthz, /readyz and the operator's nudges."
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="The consumer pods' ServiceAccount, the subject a workload identity is federated with "
        "(system:serviceaccount:NAMESPACE:NAME). Default: the PartitionedConsumer's name when the spec uses "
        "a credential, the namespace's default otherwise. The operator creates it when it does not exist "
        "(annotated with the workload identity's client id) and uses an existing one as it is.",
    )


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

    @model_validator(mode="after")
    def _bounds(self) -> ScalingSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError("maxReplicas must be at least minReplicas")
        return self


class RebalanceSpec(Model):
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


class PartitionedConsumerSpec(Model):
    event_hubs: EventHubsSpec
    checkpoint_store: CheckpointStoreSpec
    consumer: ConsumerSpec = Field(default_factory=ConsumerSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    rebalance: RebalanceSpec = Field(default_factory=RebalanceSpec)


def credentials_of(spec: PartitionedConsumerSpec) -> list[TokenCredentialSpec]:
    """The token credentials of every connection the consumers make (the source, the Blob store, the Blob
    sink, the replicate or route targets, an old hub's store after a failover), in that order."""
    consumer = spec.consumer
    blocks: list[TokenCredentialSpec | None] = [
        spec.event_hubs.credential,
        spec.checkpoint_store.blob.credential if spec.checkpoint_store.blob is not None else None,
        consumer.sink.blob.credential if consumer.sink.type == "blob" and consumer.sink.blob else None,
        consumer.pipeline.replicate.credential
        if consumer.pipeline.type == "replicate" and consumer.pipeline.replicate
        else None,
    ]
    if consumer.pipeline.type == "route" and consumer.pipeline.route is not None:
        blocks.extend(target.credential for target in consumer.pipeline.route.targets)
    if consumer.failover is not None and consumer.failover.checkpoint_store.blob is not None:
        blocks.append(consumer.failover.checkpoint_store.blob.credential)
    return [credential for credential in blocks if credential is not None]


class ObjectMeta(Model):
    model_config = ConfigDict(extra="allow", frozen=True, alias_generator=to_camel, populate_by_name=True)
    # A DNS-1035 label (its Services' names start with a letter), short enough for its children's names.
    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    namespace: str = "default"
    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)


class PartitionedConsumer(Model):
    api_version: Annotated[Literal["hubshift.dev/v1alpha1"], Field(alias="apiVersion")]
    kind: Literal["PartitionedConsumer"]
    metadata: ObjectMeta
    spec: PartitionedConsumerSpec
