"""The `jdbc` sink: a database table through JDBC, upserted by the event's coordinates, so a replay rewrites
the rows it wrote instead of adding them again.

Each batch's rows go into a staging table of the consumer's own (Spark's JDBC writer, truncated and filled),
then one `MERGE` statement upserts them into the table by `keyColumns` (default: the event's `partition` and
`sequence_number`, which the transform keeps), in one transaction. The table is created on the first batch,
with the rows' columns and a primary key on `keyColumns`, where it does not exist. `MERGE` is standard SQL
(PostgreSQL 15 and later, SQL Server, Oracle, Db2); the JDBC URL (with its user and password) is a secret,
from the environment variable or Secret the block names. The PostgreSQL driver is on the consumers'
classpath (`tools/spark-jars`); another database's driver comes with a derived image.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, model_validator

from hubshift.errors import UserError, one_line
from hubshift.sinks.base import RowSink, SinkContext, SinkKind, StreamBatch, Transform, WriterBatch
from hubshift.sinks.commits import WrittenFile
from hubshift.sinks.spark_writer import dead_letter_folder, rows_to_write
from hubshift.spec import MAX_SETTINGS, SQL_NAME, SQL_TABLE, NamedConnection, SecretConnectionSpec, cel
from hubshift.spec.kinds import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_JDBC_ENV = "HUBSHIFT_JDBC_URL"
# Options that would put a secret in the manifest, or that hubshift sets itself.
REFUSED_OPTIONS = frozenset({"url", "dbtable", "query", "password", "user"})
NO_SECRET_OPTIONS = (
    "options: the URL, user and password come from the connection string (a Secret), not options"
)
# JDBC URL prefixes -> the driver class, for the drivers a consumer's classpath has.
DRIVERS = {"jdbc:postgresql:": "org.postgresql.Driver"}


class JdbcSinkSpec(SecretConnectionSpec):
    """A database table upserted by `keyColumns` through JDBC; its URL (with the user and password) is the
    connection string."""

    SERVICE = "JDBC"
    DEFAULT_VARIABLE = DEFAULT_JDBC_ENV

    table: str = Field(pattern=SQL_TABLE, description="The table (schema.table), created when missing.")
    key_columns: list[Annotated[str, Field(pattern=SQL_NAME)]] = Field(
        default_factory=lambda: ["partition", "sequence_number"],
        min_length=1,
        max_length=8,
        description="The columns a row is upserted by (its primary key): by default the event's coordinates, "
        "which the transform keeps.",
    )
    options: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=MAX_SETTINGS,
        description="Spark's JDBC options (batchsize, driver...); no secrets here.",
    )

    CEL = (
        cel(
            "!has(self.options) || "
            "self.options.all(k, !(k.lowerAscii() in ['url', 'dbtable', 'query', 'password', 'user']))",
            NO_SECRET_OPTIONS,
            ".options",
        ),
    )

    @model_validator(mode="after")
    def _no_secret_options(self) -> JdbcSinkSpec:
        if any(key.lower() in REFUSED_OPTIONS for key in self.options):
            raise ValueError(NO_SECRET_OPTIONS)
        return self


class JdbcSink(RowSink):
    name = "jdbc"

    def __init__(self, block: JdbcSinkSpec, context: SinkContext) -> None:
        self.block = block
        resolved = NamedConnection(context.location, block, "sink").resolve(context.environ)
        self.url = resolved.connection_string or ""
        self.dead_letters = dead_letter_folder("jdbc-dead-letters", context.dead_letter_path)
        driver = block.options.get("driver") or next(
            (name for prefix, name in DRIVERS.items() if self.url.startswith(prefix)), None
        )
        if driver is None:
            raise UserError(
                "sink jdbc: no driver known for this URL; set options.driver (and add its jar to the image)"
            )
        self.driver = driver

    def check(self, spark: SparkSession) -> None:
        """The database answers this URL (its driver, host, user and password)."""
        try:
            self._connect(spark._jvm).close()
        except UserError:
            raise
        except Exception as error:
            raise UserError(f"sink jdbc: cannot connect: {self._clean(error)}") from None

    def describe(self) -> str:
        return f"table {self.block.table} (JDBC)"

    def spark_conf(self) -> dict[str, str]:
        return {}

    def staging_table(self, consumer_id: str) -> str:
        """This consumer's own staging table: readable, and ending in a digest of its id, because two ids
        may differ only in a '-' against a '.' or past the 63 characters PostgreSQL keeps of a name."""
        schema, _, table = self.block.table.rpartition(".")
        digest = hashlib.sha256(consumer_id.encode()).hexdigest()[:12]
        readable = re.sub(r"[^a-z0-9_]", "_", f"{table}_hubshift_{consumer_id}".lower())[: 62 - len(digest)]
        name = f"{readable}_{digest}"
        return f"{schema}.{name}" if schema else name

    def write_batch(self, events: DataFrame, transform: Transform, batch: WriterBatch) -> list[WrittenFile]:
        frame, files = rows_to_write(transform(events), self.name, self.dead_letters)
        if frame is None:
            return files
        return [*self._upsert(frame, batch.consumer_id, self.block.key_columns), *files]

    def write_stream_batch(self, frame: DataFrame, batch: StreamBatch) -> list[WrittenFile]:
        """A streaming job's rows, upserted by its key columns (the sink's keyColumns when the job names
        none): a batch run again rewrites the same rows."""
        keys = list(batch.key_columns) or list(self.block.key_columns)
        return self._upsert(frame, f"{batch.consumer_id}-{batch.partition}", keys)

    def _upsert(self, frame: DataFrame, writer_id: str, key_columns: Sequence[str]) -> list[WrittenFile]:
        missing = [column for column in key_columns if column not in frame.columns]
        if missing:
            raise UserError(
                f"sink jdbc: the rows lack the key columns {', '.join(missing)} (keyColumns); keep them in "
                "the transform, or name others"
            )
        staging = self.staging_table(writer_id)
        writer = frame.write.format("jdbc").option("url", self.url).option("dbtable", staging)
        for key, value in {"truncate": "true", "driver": self.driver, **self.block.options}.items():
            writer = writer.option(key, value)
        try:
            writer.mode("overwrite").save()
            rows = self._merge(frame.sparkSession._jvm, staging, list(frame.columns), key_columns)
        except UserError:
            raise
        except Exception as error:
            # not chained: Spark logs a failed batch's traceback, and the cause's text holds the URL
            raise UserError(f"sink jdbc: {self.describe()}: {self._clean(error)}") from None
        return [WrittenFile("output", self.name, self.block.table, rows)]

    def _merge(self, jvm: Any, staging: str, columns: list[str], key_columns: Sequence[str]) -> int:
        connection = self._connect(jvm)
        try:
            connection.setAutoCommit(False)
            statement = connection.createStatement()
            if not self._exists(connection, self.block.table):
                table = self.block.table
                statement.executeUpdate(f"CREATE TABLE {table} AS SELECT * FROM {staging} WHERE 1 = 0")
                keys = ", ".join(_q(c) for c in key_columns)
                statement.executeUpdate(f"ALTER TABLE {table} ADD PRIMARY KEY ({keys})")
            merge = merge_statement(self.block.table, staging, columns, key_columns)
            rows = int(statement.executeUpdate(merge))
            connection.commit()
            return rows
        except Exception:
            connection.rollback()
            raise
        finally:
            connection.close()

    def _connect(self, jvm: Any) -> Any:
        # Class.newInstance: py4j cannot pass getDeclaredConstructor's empty varargs; the driver's own
        # connect() also spares DriverManager's class-loader checks for jars on spark.driver.extraClassPath
        driver = jvm.java.lang.Class.forName(self.driver).newInstance()
        connection = driver.connect(self.url, jvm.java.util.Properties())
        if connection is None:
            raise UserError(f"sink jdbc: the driver {self.driver} does not take this URL")
        return connection

    def _exists(self, connection: Any, table: str) -> bool:
        schema, _, name = table.rpartition(".")
        metadata = connection.getMetaData()
        for candidate in (name, name.lower(), name.upper()):
            found = metadata.getTables(None, schema or None, candidate, None)
            try:
                if found.next():
                    return True
            finally:
                found.close()
        return False

    def _clean(self, error: BaseException) -> str:
        """An error as one line without the URL, or the password it holds (a driver may repeat it alone)."""
        hidden = {self.url: "<the JDBC URL>", **{p: "<the password>" for p in passwords_in(self.url)}}
        return one_line(error, hide=hidden)


# A password in a JDBC URL: a `password=` (or `pwd=`) parameter, `//user:password@host` or Oracle's
# `user/password@host`.
_PASSWORD = re.compile(r"(?i)(?:[?&;:]|^)(?:password|pwd)=([^&;]+)|//[^/@:]+:([^/@]+)@|:[^:/@]+/([^@/]+)@")


def passwords_in(url: str) -> list[str]:
    """The passwords a JDBC URL holds, longest first (so none is hidden only in part)."""
    found = {value for match in _PASSWORD.finditer(url) for value in match.groups() if value}
    return sorted(found, key=len, reverse=True)


def merge_statement(table: str, staging: str, columns: list[str], keys: Sequence[str]) -> str:
    """Upsert the staging table's rows into `table` by `keys` (standard SQL MERGE)."""
    on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in keys)
    others = [c for c in columns if c not in keys]
    update = (
        f" WHEN MATCHED THEN UPDATE SET {', '.join(f'{_q(c)} = s.{_q(c)}' for c in others)}" if others else ""
    )
    names = ", ".join(_q(c) for c in columns)
    values = ", ".join(f"s.{_q(c)}" for c in columns)
    return (
        f"MERGE INTO {table} t USING {staging} s ON {on}{update} "
        f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})"
    )


def _q(column: str) -> str:
    """A quoted column name, as Spark's JDBC writer quotes columns (tables it leaves unquoted: their names
    are plain identifiers here)."""
    return '"' + column.replace('"', '""') + '"'


def _connections(block: JdbcSinkSpec, location: Location) -> list[NamedConnection]:
    return [NamedConnection(location, block, "sink")]


def _writer(block: JdbcSinkSpec, context: SinkContext) -> JdbcSink:
    return JdbcSink(block, context)


SINK = SinkKind[JdbcSinkSpec](
    name="jdbc",
    annotation=JdbcSinkSpec | None,
    field=Field(
        default=None, description="A database table through JDBC (type jdbc), upserted by keyColumns."
    ),
    required="jdbc (the table)",
    connections=_connections,
    build=_writer,
    update="keyed",
)
