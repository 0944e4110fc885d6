"""The `PartitionedConsumer` resource: its model, put together from the shared blocks (`hubshift.spec`) and
the blocks every pipeline and sink declares (`hubshift.pipelines`, `hubshift.sinks`); its connections, the
one list of them that credentials, Secrets and the operator's reads all come from; and reading a manifest
(a YAML file or a parsed document) into it, or every problem, one line each, naming the field (and line)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from hubshift.errors import UserError
from hubshift.pipelines import PIPELINES, PipelineSpec
from hubshift.podtemplate import CODE_DIR, PORT_TAKEN, PodDisruptionBudgetSpec, PodTemplateSpec, port_rule
from hubshift.sinks import SINKS, SinkSpec
from hubshift.spec import (
    DNS_SUBDOMAIN,
    KIND,
    MAX_NAME_LENGTH,
    SOURCE_OPTION_HINTS,
    CheckpointPolicySpec,
    CheckpointStoreSpec,
    EventHubsSpec,
    FailoverSpec,
    HubConnectionSpec,
    Model,
    NamedConnection,
    RebalanceSpec,
    ResourcesSpec,
    Role,
    ScalingSpec,
    SparkSpec,
    SparkUiSpec,
    StartPositionSpec,
    TokenCredentialSpec,
    cel,
)

_CONNECTION_STRING_FIELDS = ("connectionStringSecretRef", "connectionStringEnv")


UI_PORT_TAKEN = "spark.ui.port: the Spark UI and metricsPort need ports of their own"
_ROWS_ONLY = SINKS.names(lambda kind: not kind.writes_lines)
_ROW_PIPELINES = PIPELINES.names(lambda kind: kind.shape in ("frames", "stream"))
FRAMES_ONLY = (
    f"a sink Spark writes ({', '.join(_ROWS_ONLY)}) takes pipeline type {', '.join(_ROW_PIPELINES[:-1])} "
    f"or {_ROW_PIPELINES[-1]}"
)
STREAM_SINKS = f"pipeline type stream writes to a sink Spark writes ({', '.join(_ROWS_ONLY)})"
# What a streaming job's output mode update may go into, as each sink declares it (`SinkKind.update`).
_KEYED = SINKS.names(lambda kind: kind.update == "keyed")
_ANY_UPDATE = SINKS.names(lambda kind: kind.update == "any")
_APPEND_ONLY = SINKS.names(lambda kind: not kind.writes_lines and kind.update is None)
UPDATE_MODE = (
    f"stream.outputMode update goes into {' or '.join(_KEYED)} with stream.keyColumns (the rows' key), or "
    f"into your {' or '.join(_ANY_UPDATE)} function; {' and '.join(_APPEND_ONLY)} take append"
)


def _sink_is(names: list[str]) -> str:
    """CEL: the sink's type is one of `names` (set)."""
    if len(names) == 1:
        return f"self.sink.type == '{names[0]}'"
    return f"self.sink.type in [{', '.join(repr(name) for name in names)}]"


class CodeSpec(Model):
    """The job's Python files, without rebuilding the image: modules (`.py`), packages (`.zip`) and their data
    files, on the consumers' `PYTHONPATH` (a `function`'s module, a `foreachBatch` handler, an editor's
    function)."""

    config_map: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description=f"A ConfigMap in the resource's namespace, each key a file, mounted at {CODE_DIR} (a "
        "`.zip` key goes to binaryData).",
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        description="A folder on this machine instead (hubshift run, hubshift consume).",
    )

    CEL = (cel("!(has(self.configMap) && has(self.path))", "set configMap or path, not both"),)

    @model_validator(mode="after")
    def _one_place(self) -> CodeSpec:
        if self.config_map is not None and self.path is not None:
            raise ValueError("set configMap or path, not both")
        return self

    def folder(self) -> str | None:
        """Where the files are for the consumer reading this spec (a pod: where the ConfigMap is mounted)."""
        return self.path if self.path is not None else CODE_DIR if self.config_map is not None else None


DEFAULT_METRICS_PORT = 9090


class ConsumerSpec(Model):
    image: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^\S+$",
        description="Container image of the consumer pods. Default: the operator's own image (the chart's "
        "`image`), so upgrading the operator upgrades the pools; set it to pin one.",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    engine: Literal["spark", "sdk"] = Field(
        default="spark",
        description="spark: the pipeline on a Spark streaming query; sdk: the same ownership over plain SDK "
        "receivers, logging the batch ranges it read (no pipeline, no Spark).",
    )
    spark: SparkSpec = Field(default_factory=SparkSpec)
    start_position: StartPositionSpec = Field(default_factory=StartPositionSpec)
    failover: FailoverSpec | None = Field(
        default=None,
        description="Skip the events a previous consumer of the hub this one replicates already handled.",
    )
    checkpoint: CheckpointPolicySpec = Field(default_factory=CheckpointPolicySpec)
    fail_on_data_loss: bool = Field(
        default=True,
        description="What the pool does when events expired from the hub before they were read (the hub's "
        "retention passed a partition's checkpoint), Spark's Kafka source's option of the same name: true "
        "stops the pool (0 replicas, the DataLoss condition and a warning Event name the partitions and "
        "sequence numbers) until the checkpoints are moved on by hand or this is set to false; false goes on "
        "past them, counting them (hubshift_consumer_events_expired_total) and reporting them the same way. "
        "Default true, as Spark's: a pool that had silently skipped data before now says so, and no existing "
        "pool relied on going on. The control loop checks on every probe of the hub, before consumers start; "
        "a consumer that meets expired events while reading counts them and goes on.",
    )
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)
    sink: SinkSpec = Field(default_factory=SinkSpec)
    code: CodeSpec = Field(default_factory=CodeSpec)
    metrics_port: int = Field(
        default=DEFAULT_METRICS_PORT,
        ge=1,
        le=65535,
        description="/metrics, /healthz, /readyz and the operator's nudges.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="The consumer pods' ServiceAccount, the subject a workload identity is federated with "
        "(system:serviceaccount:NAMESPACE:NAME). Default: the PartitionedConsumer's name. The operator "
        "creates it (annotated with the workload identity's client id); one that exists already and that the "
        "operator did not create for this resource is refused, unless an administrator allowed it for the "
        "namespace (the chart's operator.allowedServiceAccounts), and then used as it is.",
    )
    pod_template: PodTemplateSpec = Field(
        default_factory=PodTemplateSpec,
        description="What the consumer pods get besides hubshift's own: labels, annotations, scheduling, "
        "image pull Secrets, env, volumes, init containers and sidecars.",
    )
    pod_disruption_budget: PodDisruptionBudgetSpec = Field(default_factory=PodDisruptionBudgetSpec)

    CEL = (
        cel(
            "!has(self.sink) || !has(self.sink.type) || !(self.sink.type in ["
            + ", ".join(f"'{name}'" for name in _ROWS_ONLY)
            + "]) || (has(self.pipeline) && has(self.pipeline.type) && self.pipeline.type in ["
            + ", ".join(f"'{name}'" for name in _ROW_PIPELINES)
            + "])",
            FRAMES_ONLY,
            ".pipeline",
        ),
        cel(
            "!has(self.pipeline) || !has(self.pipeline.type) || self.pipeline.type != 'stream' || "
            "(has(self.sink) && has(self.sink.type) && self.sink.type in ["
            + ", ".join(f"'{name}'" for name in _ROWS_ONLY)
            + "])",
            STREAM_SINKS,
            ".sink",
        ),
        cel(
            "!has(self.pipeline) || !has(self.pipeline.stream) || !has(self.pipeline.stream.outputMode) || "
            "self.pipeline.stream.outputMode != 'update' || (has(self.sink) && has(self.sink.type) && "
            f"({_sink_is(_ANY_UPDATE)} || ({_sink_is(_KEYED)} && "
            "has(self.pipeline.stream.keyColumns) && size(self.pipeline.stream.keyColumns) > 0)))",
            UPDATE_MODE,
            ".pipeline.stream.outputMode",
        ),
        cel(
            "!has(self.spark) || !has(self.spark.ui) || !has(self.spark.ui.enabled) || !self.spark.ui.enabled"
            f" || (has(self.spark.ui.port) ? self.spark.ui.port : {SparkUiSpec().port})"
            f" != (has(self.metricsPort) ? self.metricsPort : {DEFAULT_METRICS_PORT})",
            UI_PORT_TAKEN,
            ".spark.ui.port",
        ),
        cel(port_rule(DEFAULT_METRICS_PORT), PORT_TAKEN, ".podTemplate"),
    )

    @model_validator(mode="after")
    def _frames_for_spark_sinks(self) -> ConsumerSpec:
        shape = self.pipeline.kind.shape
        if not self.sink.kind.writes_lines and shape not in ("frames", "stream"):
            raise ValueError(FRAMES_ONLY)
        if shape == "stream":
            if self.sink.kind.writes_lines:
                raise ValueError(STREAM_SINKS)
            job = self.pipeline.block
            update = self.sink.kind.update
            if job.output_mode == "update" and not (
                update == "any" or (update == "keyed" and job.key_columns)
            ):
                raise ValueError(UPDATE_MODE)
        # On one port the metrics server, started first, keeps it and Spark's UI moves on unannounced.
        if self.spark.ui.enabled and self.spark.ui.port == self.metrics_port:
            raise ValueError(UI_PORT_TAKEN)
        return self

    @model_validator(mode="after")
    def _metrics_port_free(self) -> ConsumerSpec:
        if any(port.container_port == self.metrics_port for _, port in self.pod_template.listening()):
            raise ValueError(PORT_TAKEN)
        return self


class PartitionedConsumerSpec(Model):
    """What the pool reads, where it keeps its checkpoints, what each consumer runs, and how the pool is sized
    and rebalanced."""

    event_hubs: EventHubsSpec
    checkpoint_store: CheckpointStoreSpec
    consumer: ConsumerSpec = Field(
        default_factory=ConsumerSpec,
        description="What each consumer pod runs: its image and resources, the engine, the pipeline and "
        "sink, where a partition starts, how often it checkpoints.",
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        description="Exactly this many consumers (never more than the hub's partitions), instead of "
        "hubshift's autoscaler: what `kubectl scale pcon/NAME --replicas=N`, an HPA or a KEDA ScaledObject "
        "set through the scale subresource. Unset (the default): spec.scaling decides. A change is planned "
        "at once, like a scale the autoscaler decides (no holddown); scaling's min and max do not bound it; "
        "the pause annotations still win. The API server answers a read of /scale only once this is set (an "
        "HPA or KEDA reads it first, and an HPA leaves a target at 0 alone): set a count (kubectl scale) "
        "before handing the pool to one.",
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    rebalance: RebalanceSpec = Field(
        default_factory=RebalanceSpec,
        description="How partitions move between consumers: the strategy, the holddown and handoff times, "
        "the pods' rollout.",
    )


def connections_of(spec: PartitionedConsumerSpec) -> list[NamedConnection]:
    """Every connection of a resource, in this order: the source, the checkpoint store, the sink's, the
    pipeline's (its target hubs, its database), the old hub's store after a failover, then the proxies of
    those hubs that ask for credentials (their role is their hub's). Blocks a type leaves unused (a
    `replicate:` under `type: route`) make no connection."""
    consumer = spec.consumer
    connections = [
        NamedConnection(("spec", "eventHubs"), spec.event_hubs, "source"),
        *spec.checkpoint_store.connections(("spec", "checkpointStore"), "store"),
        *consumer.sink.connections(),
        *consumer.pipeline.connections(),
    ]
    if consumer.failover is not None:
        location = ("spec", "consumer", "failover", "checkpointStore")
        connections.extend(consumer.failover.checkpoint_store.connections(location, "failover"))
    connections.extend(
        proxy
        for named in list(connections)
        if isinstance(named.connection, HubConnectionSpec)
        for proxy in named.connection.proxy_connection(named.location, named.role)
    )
    return connections


def credentials_of(spec: PartitionedConsumerSpec) -> list[TokenCredentialSpec]:
    """The token credentials of the resource's connections, in `connections_of`'s order."""
    return [
        credential
        for connection in connections_of(spec)
        if (credential := connection.connection.token_credential) is not None
    ]


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


def parse_manifest(
    document: Mapping[str, Any], source: str = "manifest", node: yaml.Node | None = None
) -> PartitionedConsumer:
    """Validate a manifest; a bad one raises `UserError` with every problem, one line each, naming the field
    (and, given the document's YAML `node`, its line: `source:LINE: field: what is wrong`)."""
    try:
        return PartitionedConsumer.model_validate(document)
    except ValidationError as exc:
        raise UserError(
            "\n".join(
                f"{source}{_line_suffix(node, loc)}: {problem}" for loc, problem in validation_problems(exc)
            )
        ) from None


def load_manifest(path: str | os.PathLike[str]) -> PartitionedConsumer:
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise UserError(f"cannot read manifest {file}: {exc.strerror}") from None
    try:
        documents = list(yaml.safe_load_all(text))
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise UserError(f"{file}{yaml_error_where(exc)}: not valid YAML: {yaml_error_reason(exc)}") from None
    consumers = [
        (document, node)
        for document, node in zip(documents, nodes, strict=False)
        if isinstance(document, dict) and document.get("kind") == KIND
    ]
    if len(consumers) != 1:
        raise UserError(f"{file}: expected exactly one {KIND} document, found {len(consumers)}")
    document, node = consumers[0]
    return parse_manifest(document, source=str(file), node=node)


def yaml_error_where(exc: yaml.YAMLError) -> str:
    """`:LINE:COLUMN` of a YAML error (1-based, as editors count), or nothing when the parser gave none."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def yaml_error_reason(exc: yaml.YAMLError) -> str:
    """What the parser found wrong, in its words ("mapping values are not allowed here"), and what it was
    reading ("while scanning a quoted scalar"). Never the marks' snippets of the file: a line may hold a
    secret."""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    parts = [str(problem)] if problem else []
    if problem and str(problem).startswith("expected <block end>"):
        parts.append("a line indented differently from the lines beside it")
    if context:
        began = f" that began on line {context_mark.line + 1}" if context_mark else ""
        parts.append(f"{context}{began}")
    return "; ".join(parts) if parts else type(exc).__name__


def validation_problems(exc: ValidationError) -> list[tuple[tuple[str | int, ...], str]]:
    """Every problem of a validation error, in document order, each as its location and one line: the
    field's path in manifest spelling, and what is wrong with it. Never the input itself (it may hold a
    secret)."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for error in exc.errors():
        loc = tuple(part for part in error["loc"] if not str(part).startswith("function-after"))
        path = ".".join(str(part) for part in loc)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field" + _unknown_field_hint(loc)
        elif error["type"] == "missing":
            message = "required field is missing"
        elif error["type"] in ("model_type", "dict_type"):
            message = "expected a map of fields"
        line = f"{path or 'document'}: {message}"
        if all(line != seen for _, seen in problems):
            problems.append((loc, line))
    return problems


def _unknown_field_hint(loc: tuple[str | int, ...]) -> str:
    """What an unknown field probably meant: hubshift's name for a Spark source option
    (`maxOffsetsPerTrigger`), else the block's field spelled most like it (`minReplica`: `minReplicas`);
    nothing when neither."""
    name = str(loc[-1]) if loc else ""
    if name in SOURCE_OPTION_HINTS:
        return f" (Spark's Kafka source option; here: {SOURCE_OPTION_HINTS[name]})"
    fields = _block_fields(PartitionedConsumer, loc[:-1])
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _block_fields(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """The field names (as written in YAML) of the block at `path` below `model`; none when the path leads
    through a list, a map or a union the walk cannot follow."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return []
        field = next((f for n, f in current.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        annotation = field.annotation
        members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        current = models[0] if len(models) == 1 else None
    if current is None:
        return []
    return [field.alias or name for name, field in current.model_fields.items()]


def _line_suffix(node: yaml.Node | None, loc: tuple[str | int, ...]) -> str:
    """`:LINE` of the field at `loc` in the document's YAML node: the key's line where the field is written,
    else the line of the nearest enclosing block that is (a missing field: the block it belongs in)."""
    if node is None:
        return ""
    line = node.start_mark.line
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            entry = next(
                (
                    (key, value)
                    for key, value in node.value
                    if isinstance(key, yaml.ScalarNode) and key.value == str(part)
                ),
                None,
            )
            if entry is None:
                continue  # a union's tag in the path, or a field not written
            line, node = entry[0].start_mark.line, entry[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
    return f":{line + 1}"


def with_credential(
    consumer: PartitionedConsumer, credential: TokenCredentialSpec, roles: Collection[Role] | None = None
) -> PartitionedConsumer:
    """The manifest with every connection that takes a token credential (`connections_of`: the source, a
    Blob store, a Blob sink, target hubs, a failover's store) authenticated by `credential` instead of a
    connection string: what a command line's `--credential` means. The manifest must name the namespaces and
    account URLs (`UserError`). A PostgreSQL database keeps its connection string. `roles`: only the
    connections of these roles (a command that opens only the sink)."""
    document = consumer.model_dump(by_alias=True, mode="json", exclude_none=True)
    chosen = credential.model_dump(by_alias=True, mode="json", exclude_none=True)
    for connection in connections_of(consumer.spec):
        if not connection.connection.TAKES_CREDENTIAL or (roles is not None and connection.role not in roles):
            continue
        block: Any = document
        for key in connection.location:
            block = block[key]
        for name in _CONNECTION_STRING_FIELDS:
            block.pop(name, None)
        block["credential"] = chosen
    return parse_manifest(document, source=f"--credential {credential.type}")
