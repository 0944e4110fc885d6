"""What the sinks Spark writes itself share (`delta`, `parquet`, `json`, `jdbc`, `foreachBatch`): the block of
a table or folder at a path (`SparkPathSpec`: `path`, `partitionBy`, `options`, and how an Azure path
authenticates), the Hadoop settings hadoop-azure reads for it, leaving out what a replay finds already
written, and the dead letters.

A path is a folder (`/data/orders`, on a volume the pods mount) or Azure storage through hadoop-azure's ABFS
driver (`abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/orders`: Data Lake Storage Gen2, or a Blob account
through its Blob endpoint). An Azure path authenticates with the account's connection string (its key) or a
token `credential`: workload identity (hadoop-azure's `WorkloadIdentityTokenProvider`, from the federated
token the pod is given) or managed identity (`MsiTokenProvider`); `default` takes workload identity where
the pod has it, managed identity otherwise.

PySpark is imported only in the functions a consumer runs: the operator reads this module's declarations.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Field, model_validator

from hubshift.azure_storage import parse_connection_string
from hubshift.errors import UserError
from hubshift.sinks.base import (
    DEAD_LETTER_REASON,
    DEFAULT_SINK_STORAGE_ENV,
    PipelineResult,
    RowSink,
    SinkContext,
    dead_letter_line,
)
from hubshift.sinks.commits import PartitionRange, WrittenFile
from hubshift.spec import (
    MAX_SETTINGS,
    CelRule,
    ConnectionSpec,
    NamedConnection,
    Resolved,
    TokenCredentialSpec,
    cel,
)
from hubshift.spec.kinds import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameWriter, SparkSession

# abfs[s]://CONTAINER@ACCOUNT.dfs.core.windows.net[/path]: the account is the host's first label (one '@').
ABFS_PATH = re.compile(
    r"^abfss?://(?P<container>[^@/\s]+)@(?P<host>(?P<account>[^./@\s]+)\.[^/@\s]+)(?P<path>/\S*)?$"
)
AZURE_PATH = "path: an Azure path is abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/folder"
LAKE_ONLY = "connectionStringSecretRef, connectionStringEnv and credential go with an abfss:// path"
PATH_NEEDED = "a credential needs path, an abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/... path"
# Spark options a block may not set itself: hubshift sets them (the mode, the path), or they would let two
# writers take each other's progress for their own (Delta's idempotent write options).
RESERVED_OPTIONS = frozenset({"path", "mode", "txnappid", "txnversion", "checkpointlocation"})
# A path's length is bounded: the API server prices a rule matching it by the longest it can be.
MAX_PATH = 1024
RESERVED = "options: path, mode, txnAppId, txnVersion and checkpointLocation are hubshift's to set"


PATH_CEL = (
    cel(
        "self.path.startsWith('abfs://') || self.path.startsWith('abfss://') || (!has(self.credential) "
        "&& !has(self.connectionStringSecretRef) && !has(self.connectionStringEnv))",
        LAKE_ONLY,
        ".path",
    ),
    cel(
        "!(self.path.startsWith('abfs://') || self.path.startsWith('abfss://')) || "
        f"self.path.matches(r'{ABFS_PATH.pattern}')",
        AZURE_PATH,
        ".path",
    ),
)


class AzurePathSpec(ConnectionSpec):
    """A folder Spark reaches (on a volume the pods mount) or Azure storage over ABFS, with an Azure path's
    connection string or credential."""

    SERVICE = "Azure Storage"
    DEFAULT_VARIABLE = DEFAULT_SINK_STORAGE_ENV
    ADDRESS = "path"
    ADDRESS_MESSAGE = PATH_NEEDED

    path: str = Field(
        min_length=1,
        max_length=MAX_PATH,
        description="A folder (/data/orders, on a volume the pods mount) or an Azure path "
        "(abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/orders).",
    )

    CEL: ClassVar[tuple[CelRule, ...]] = PATH_CEL

    @model_validator(mode="after")
    def _azure_auth_with_an_azure_path(self) -> AzurePathSpec:
        if not is_azure(self.path) and (
            self.credential is not None
            or self.connection_string_secret_ref is not None
            or self.connection_string_env is not None
        ):
            raise ValueError(LAKE_ONLY)
        if is_azure(self.path) and ABFS_PATH.match(self.path) is None:
            raise ValueError(AZURE_PATH)
        return self


class SparkPathSpec(AzurePathSpec):
    """A table or folder Spark writes: its path (a folder, or Azure storage over ABFS), the columns its rows
    are partitioned by, Spark's writer options, and for an Azure path its connection string or credential."""

    partition_by: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Columns the rows are partitioned by (Spark's partitionBy).",
    )
    options: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=MAX_SETTINGS,
        description='Spark\'s writer options for the format (e.g. mergeSchema: "true").',
    )

    CEL = (  # beside the path's rules, which it inherits
        cel(
            "!has(self.options) || self.options.all(k, !(k.lowerAscii() in ["
            + ", ".join(f"'{key}'" for key in sorted(RESERVED_OPTIONS))
            + "]))",
            RESERVED,
            ".options",
        ),
    )

    @model_validator(mode="after")
    def _options_left_to_hubshift(self) -> SparkPathSpec:
        if any(key.lower() in RESERVED_OPTIONS for key in self.options):
            raise ValueError(RESERVED)
        return self


def is_azure(path: str) -> bool:
    return path.startswith(("abfs://", "abfss://"))


def path_connections(block: AzurePathSpec, location: Location) -> list[NamedConnection]:
    """An Azure path's connection (its connection string or credential); a folder makes none."""
    return [NamedConnection(location, block, "sink")] if is_azure(block.path) else []


# --- hadoop-azure ---------------------------------------------------------------------------------------

_WORKLOAD = "org.apache.hadoop.fs.azurebfs.oauth2.WorkloadIdentityTokenProvider"
_MANAGED = "org.apache.hadoop.fs.azurebfs.oauth2.MsiTokenProvider"
# hadoop-azure (3.5) aggregates its own request metrics and sends them to the storage account, the last
# ones from a JVM shutdown hook that retries when the account cannot be reached: in a CI rehearsal a test
# session's JVM was still in that hook's retry sleep (AbfsRestOperation) over 10 minutes after its Python
# ended and Azurite with it. They are storage transactions of no use to hubshift, so they are off.
ABFS_SETTINGS = {"fs.azure.metrics.collection.enabled": "false"}


def hadoop_settings(path: str, resolved: Resolved, environ: Mapping[str, str]) -> dict[str, str]:
    """The Hadoop settings with which hadoop-azure reaches an Azure path: per account (`...<host>` keys), so
    several accounts can be written by one consumer. Nothing for a folder."""
    match = ABFS_PATH.match(path)
    if match is None:
        return {}
    host = match["host"]
    if resolved.connection_string is not None:
        settings = _key_settings(
            host, resolved.connection_string, resolved.variable or "the connection string"
        )
        if path.startswith("abfss://") and settings.get("fs.azure.always.use.https") == "false":
            # abfss:// is TLS whatever the endpoint says; hadoop-azure would retry a handshake for minutes
            raise UserError(
                f"{path}: the storage endpoint in {resolved.variable or 'the connection string'} is plain "
                "http, which abfss:// (TLS) cannot reach: write abfs:// for a plain-http endpoint (Azurite)"
            )
        return {**ABFS_SETTINGS, **settings}
    assert resolved.identity is not None
    return {**ABFS_SETTINGS, **_token_settings(path, host, resolved.identity, environ)}


def _key_settings(host: str, connection_string: str, variable: str) -> dict[str, str]:
    account = parse_connection_string(connection_string, variable)
    if account.key is None:
        raise UserError(
            f"{variable}: hadoop-azure needs the account's key (AccountKey=...) in the connection string"
        )
    settings = {
        f"fs.azure.account.auth.type.{host}": "SharedKey",
        f"fs.azure.account.key.{host}": account.key,
    }
    if account.own_endpoint:
        # A storage endpoint of its own (Azurite, a private endpoint): ABFS talks to its Blob API there.
        settings.update(
            {
                "fs.azure.abfs.endpoint": account.endpoint_host,
                "fs.azure.always.use.https": "true" if account.secure else "false",
                "fs.azure.networking.library": "JDK_HTTP_URL_CONNECTION",
                f"fs.azure.account.hns.enabled.{host}": "false",
                "fs.azure.fns.account.service.type": "BLOB",
                "fs.azure.ingress.service.type": "BLOB",
            }
        )
    return settings


def _token_settings(
    path: str, host: str, identity: TokenCredentialSpec, environ: Mapping[str, str]
) -> dict[str, str]:
    workload = identity.type == "workloadIdentity" or (
        identity.type == "default" and bool(environ.get("AZURE_FEDERATED_TOKEN_FILE"))
    )
    client_id = identity.client_id or environ.get("AZURE_CLIENT_ID", "")
    if workload:
        # hadoop-azure would take them empty and fail only when writing, in words of its own
        missing = [
            name for name in ("AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE") if not environ.get(name)
        ]
        missing += [] if client_id else ["a client id (credential.clientId or AZURE_CLIENT_ID)"]
        if missing:
            raise UserError(
                f"{path}: workload identity needs {', '.join(missing)} (on AKS: the pod label "
                "azure.workload.identity/use=true and a ServiceAccount federated with the identity)"
            )
    settings = {
        f"fs.azure.account.auth.type.{host}": "OAuth",
        f"fs.azure.account.oauth.provider.type.{host}": _WORKLOAD if workload else _MANAGED,
    }
    if client_id:
        settings[f"fs.azure.account.oauth2.client.id.{host}"] = client_id
    if workload:
        settings[f"fs.azure.account.oauth2.msi.tenant.{host}"] = environ.get("AZURE_TENANT_ID", "")
        settings[f"fs.azure.account.oauth2.token.file.{host}"] = environ.get("AZURE_FEDERATED_TOKEN_FILE", "")
        authority = environ.get("AZURE_AUTHORITY_HOST")
        if authority:
            settings[f"fs.azure.account.oauth2.msi.authority.{host}"] = authority
    elif environ.get("IDENTITY_ENDPOINT"):
        settings[f"fs.azure.account.oauth2.msi.endpoint.{host}"] = environ["IDENTITY_ENDPOINT"]
    return settings


# --- one batch ------------------------------------------------------------------------------------------


def check_writable(spark: SparkSession, path: str, sink: str) -> None:
    """A folder or Azure path this consumer can write: a probe file under `_hubshift/` written and removed
    (`UserError` naming the path and the reason: no such account, a refused key or token, no permission)."""
    jvm: Any = spark._jvm
    try:
        probe = jvm.org.apache.hadoop.fs.Path(f"{path.rstrip('/')}/_hubshift/probe-{uuid.uuid4().hex}")
        fs = probe.getFileSystem(spark._jsc.hadoopConfiguration())
        fs.create(probe, True).close()
        fs.delete(probe, False)
    except Exception as error:
        raise UserError(f"sink {sink}: cannot write {path}: {java_reason(error)}") from None


# py4j's preamble, and a Java exception's package: `...calling o82.create. : java.io.IOException: ...`
_PY4J_CALL = re.compile(r"^An error occurred while calling [\w.$]+\. : ")
_JAVA_CLASS = re.compile(r"^(?:[a-z_][\w$]*\.)+(?=[A-Z][\w$]*(?:Exception|Error)\b)")


def java_reason(error: BaseException, limit: int = 300) -> str:
    """A failure from the JVM as a person reads it: the exception's simple name and message, without py4j's
    preamble or the stack trace."""
    text = " ".join(str(error).split()).split(" at ", 1)[0]
    text = _JAVA_CLASS.sub("", _PY4J_CALL.sub("", text))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def not_yet_written(events: DataFrame, written: Mapping[str, int]) -> DataFrame:
    """The events after each partition's high-water mark (the last sequence number the sink has of it)."""
    from pyspark.sql import functions as F

    if not written:
        return events
    known = F.col("partition").isin(list(written))
    condition = ~known
    for partition, last in sorted(written.items()):
        condition = condition | ((F.col("partition") == partition) & (F.col("sequence_number") > last))
    return events.where(condition)


def to_write(ranges: Mapping[str, PartitionRange], written: Mapping[str, int]) -> dict[str, int]:
    """Per partition, the last sequence number this batch adds (those a replay finds written are left out)."""
    return {
        partition: done.last_sequence_number
        for partition, done in ranges.items()
        if done.last_sequence_number > written.get(partition, -1)
    }


def single_output(result: PipelineResult, sink: str) -> DataFrame | None:
    """The one frame a pipeline's result writes to a Spark sink; None when it wrote none."""
    if len(result.outputs) > 1:
        raise UserError(
            f"sink {sink} takes one DataFrame; the pipeline returned {len(result.outputs)} outputs "
            f"({', '.join(sorted(result.outputs))})"
        )
    for output in result.outputs.values():
        frame = output.frame
        return frame.drop(DEAD_LETTER_REASON) if DEAD_LETTER_REASON in frame.columns else frame
    return None


def configured_writer(frame: DataFrame, format_name: str, block: SparkPathSpec) -> DataFrameWriter:
    writer = frame.write.format(format_name).mode("append")
    if block.partition_by:
        writer = writer.partitionBy(*block.partition_by)
    for key, value in block.options.items():
        writer = writer.option(key, value)
    return writer


def write_dead_letters(result: PipelineResult, folder: str) -> list[WrittenFile]:
    """The batch's dead letters as JSON lines in `folder` (at least once: a replay may write them again)."""
    letters = result.dead_letters
    if letters is None:
        return []
    lines = letters.select(dead_letter_line(letters).alias("value")).cache()
    try:
        count = lines.count()
        if count:
            lines.write.mode("append").text(folder)
    finally:
        lines.unpersist()
    return [WrittenFile("dead-letter", "dead-letter", folder, count)] if count else []


class PathSink(RowSink):
    """What the sinks Spark writes at a path share (`delta`, `parquet`, `json`): the block, where dead letters
    go, the Hadoop settings with which an Azure path is reached, and the start-up check that the path is
    writable. A subclass sets `name` and `path`."""

    name: str
    path: str

    def __init__(self, block: SparkPathSpec, context: SinkContext) -> None:
        self.block = block
        self.dead_letters = dead_letter_folder(block.path, context.dead_letter_path)
        connections = path_connections(block, context.location)
        resolved = connections[0].resolve(context.environ) if connections else None
        self.settings = {} if resolved is None else hadoop_settings(block.path, resolved, context.environ)

    def check(self, spark: SparkSession) -> None:
        check_writable(spark, self.path, self.name)

    def hadoop_conf(self) -> dict[str, str]:
        """The Hadoop settings as the Spark session takes them (`spark.hadoop.*`)."""
        return {f"spark.hadoop.{key}": value for key, value in self.settings.items()}


def rows_to_write(
    result: PipelineResult, sink: str, dead_letters: str
) -> tuple[DataFrame | None, list[WrittenFile]]:
    """A pipeline's result in a Spark sink: the one frame to write (`single_output`; None: none), once its
    dead letters are written to `dead_letters` (the files written)."""
    return single_output(result, sink), write_dead_letters(result, dead_letters)


def dead_letter_folder(path: str, configured: str | None) -> str:
    """Where a Spark sink's dead letters go: `deadLetterPath`, or `_dead_letters` inside its path (readers
    of the table or folder skip `_` folders, and Delta's VACUUM leaves them)."""
    return configured or f"{path.rstrip('/')}/_dead_letters"
