"""The consumer's Spark session: a local-mode driver (its RPC and block manager on 127.0.0.1, its UI off
unless asked for), what the sink needs (Delta's extensions, hadoop-azure's settings, their jars), then the
spec's own `spark.conf`; secrets among them redacted wherever Spark shows its settings."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hubshift.consumer import leftovers
from hubshift.errors import UserError
from hubshift.spec import SparkSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from hubshift.sinks.base import Sink

# A folder of jars for the consumers' Spark beside PySpark's own (tools/spark-jars); the image needs none.
JARS_ENV = "HUBSHIFT_SPARK_JARS"
# Spark's own `spark.redaction.regex` and hadoop-azure's account keys, which it misses: the UI's Environment
# page would show an Azure sink's key (spark.hadoop.fs.azure.account.key.<host>) as it is.
REDACTION = r"(?i)secret|password|token|access[.]?key|fs[.]azure[.]account[.]key"
HADOOP_PREFIX = "spark.hadoop."
LOG4J_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n%ex
"""


def build_session(
    spec: SparkSpec,
    scratch: Path,
    consumer_id: str,
    sink: Sink | None,
    engine_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The consumer's Spark session: a local-mode driver with hubshift's settings, the engine's
    (`engine_conf`: a streaming job's state store), the sink's, then the spec's own (`session_conf`); its
    JVM recorded in the scratch folder (`leftovers`)."""
    # Spark's Python workers must run this interpreter: it has pyarrow and hubshift.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = scratch / "log4j2.properties"
    log4j.write_text(LOG4J_PROPERTIES)
    from pyspark.sql import SparkSession

    spark_spec = spec
    builder = (
        SparkSession.builder.appName(f"hubshift-{consumer_id}")
        .master(spark_spec.master)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(spark_spec.shuffle_partitions))
        .config("spark.driver.memory", spark_spec.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(scratch / "spark-local"))
        .config("spark.sql.warehouse.dir", str(scratch / "spark-warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .config("spark.sql.streaming.stopTimeout", "10s")
        # Each micro-batch is planned anew: adaptive execution adds to that fixed per-batch cost and has
        # nothing to coalesce with a couple of shuffle partitions.
        .config("spark.sql.adaptive.enabled", "false")
        # The UI (when enabled) shows; it stops nothing.
        .config("spark.ui.killEnabled", "false")
        # A Python worker (and a streaming source's runner) starting on a busy machine gets a minute to
        # connect back, not 15 s: a streaming job's query per partition starts one runner each, and under a
        # load of 20 on two cores they failed to connect back, failing their queries.
        .config("spark.python.authenticate.socketTimeout", "60s")
    )
    if spark_spec.master.startswith("local"):
        # The driver's RPC and block manager have no authentication and deserialize what they are
        # sent: a local-mode driver has no executor elsewhere to talk to, so they listen on 127.0.0.1
        # only, never on the pod's address.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    at_launch, secret = split_secrets({**(engine_conf or {}), **session_conf(spark_spec, sink, os.environ)})
    for key, value in at_launch.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm: Any = spark._jvm
    hadoop: Any = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in secret.items():
        hadoop.set(key, value)
    leftovers.record(scratch, int(jvm.java.lang.ProcessHandle.current().pid()))
    return spark


def split_secrets(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The settings the JVM is launched with, and the Hadoop settings whose names say they are secret
    (hadoop-azure's account keys, OAuth client secrets), without their `spark.hadoop.` prefix: those are set
    on the running context's Hadoop configuration instead. PySpark launches the JVM with every builder
    setting on its command line, which anyone who can list the node's processes reads."""
    at_launch: dict[str, str] = {}
    secret: dict[str, str] = {}
    for key, value in conf.items():
        if key.startswith(HADOOP_PREFIX) and re.search(REDACTION, key):
            secret[key.removeprefix(HADOOP_PREFIX)] = value
        else:
            at_launch[key] = value
    return at_launch, secret


def session_conf(spark: SparkSpec, sink: Sink | None, environ: Mapping[str, str]) -> dict[str, str]:
    """What the consumer's Spark session is configured with beyond its fixed settings: the jars beside
    PySpark's own (`HUBSHIFT_SPARK_JARS`: a folder `tools/spark-jars` fills; the image has them in PySpark's
    own jars), the Spark UI (off unless asked for), what the sink needs (Delta's extensions, hadoop-azure's
    settings), then the spec's own `spark.conf`. Secrets among them are redacted wherever Spark shows its
    settings (`REDACTION`)."""
    conf: dict[str, str] = {
        "spark.ui.enabled": "true" if spark.ui.enabled else "false",
        "spark.redaction.regex": REDACTION,
    }
    if spark.ui.enabled:
        conf["spark.ui.port"] = str(spark.ui.port)
    jars = environ.get(JARS_ENV)
    if jars:
        found = sorted(str(path) for path in Path(jars).glob("*.jar"))
        if not found:
            raise UserError(f"{JARS_ENV}={jars}: no jars there (tools/spark-jars fills such a folder)")
        # On the driver's own classpath (local mode: the executors too): JDBC's DriverManager and Delta's
        # classes are found by every class loader.
        conf["spark.driver.extraClassPath"] = ":".join(found)
    if sink is not None:
        conf.update(sink.spark_conf())
        check_jars(sink.describe(), sink.spark_conf(), jars)
    conf.update(spark.conf)
    return conf


# What a sink's Spark settings need on the classpath beside PySpark's own jars: (a word in the settings, the
# jars' file name prefixes, what they are).
NEEDED_JARS = (
    ("io.delta.", ("delta-spark_", "delta-storage-"), "Delta Lake's jars"),
    ("fs.azure.", ("hadoop-azure-",), "hadoop-azure"),
)


def check_jars(sink: str, settings: Mapping[str, str], jars: str | None) -> None:
    """A sink whose Spark settings need jars PySpark lacks (the image has them beside PySpark's own; on a
    machine `HUBSHIFT_SPARK_JARS` names a folder of them) is refused at start-up with one line that says
    where to get them, rather than with a class Spark cannot find at the first batch."""
    import pyspark

    folders = [Path(pyspark.__file__).parent / "jars", *([Path(jars)] if jars else [])]
    present = [path.name for folder in folders for path in folder.glob("*.jar")]
    text = " ".join([*settings, *settings.values()])
    for word, prefixes, what in NEEDED_JARS:
        if word in text and not all(any(n.startswith(p) for n in present) for p in prefixes):
            raise UserError(
                f"{sink} needs {what} beside PySpark's jars (the hubshift image has them): run "
                f"tools/spark-jars and set {JARS_ENV} to the folder it prints"
            )
