"""The Spark UI on demand (`spark.ui.enabled`): a consumer's Spark session, set up by `session_conf` for a
Delta table on Azure storage with an account key, serves its UI on the port the spec names, and its
Environment page (and REST API) shows that key redacted, never as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import ConsumerPool, consumer_environ, consumer_manifest
from tests.harness.ports import free_port

pytestmark = pytest.mark.timeout(180)
KEY = "c2VjcmV0LWFjY291bnQta2V5LWZvci10ZXN0cw=="
SETTING = "fs.azure.account.key.lake.dfs.core.windows.net"

# A separate process: the test session's own SparkSession (tests/fixtures/spark.py) runs without a UI.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, urllib.request
    from pyspark.sql import SparkSession
    from hubshift.consumer.spark.session import session_conf
    from hubshift.sinks import SinkSpec, build_sink
    from hubshift.spec import SparkSpec

    port, key = int(sys.argv[1]), sys.argv[2]
    block = {"path": "abfss://t@lake.dfs.core.windows.net/orders", "connectionStringEnv": "LAKE"}
    lake = f"DefaultEndpointsProtocol=https;AccountName=lake;AccountKey={key};EndpointSuffix=core.windows.net"
    sink = build_sink(SinkSpec.model_validate({"type": "delta", "delta": block}), {"LAKE": lake})
    spec = SparkSpec.model_validate({"master": "local[1]", "ui": {"enabled": True, "port": port}})
    builder = SparkSession.builder.appName("ui").master("local[1]")
    for name, value in {
        **session_conf(spec, sink, os.environ),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.port.maxRetries": "0",
    }.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    try:
        url = f"http://127.0.0.1:{port}/api/v1/applications/{spark.sparkContext.applicationId}/environment"
        page = urllib.request.urlopen(url, timeout=30).read().decode()
        html = urllib.request.urlopen(f"http://127.0.0.1:{port}/environment/", timeout=30).read().decode()
        print(json.dumps({"api": json.loads(page), "html": html}))
    finally:
        spark.stop()
    """
)


def test_the_ui_serves_on_its_port_and_redacts_the_account_key(spark_jars: str) -> None:
    port = free_port()
    environ = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "HUBSHIFT_SPARK_JARS": spark_jars,
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(port), KEY],
        capture_output=True,
        text=True,
        timeout=150,
        env=environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert KEY not in done.stdout and KEY not in done.stderr
    spark_properties = dict(shown["api"]["sparkProperties"])
    hadoop_properties = dict(shown["api"]["hadoopProperties"])
    assert spark_properties[f"spark.hadoop.{SETTING}"] == "*********(redacted)"
    assert hadoop_properties[SETTING] == "*********(redacted)"
    assert spark_properties["spark.ui.port"] == str(port)
    assert "Environment" in shown["html"]  # the page itself (its text is in stdout, checked above)


def test_a_consumers_spark_driver_listens_on_loopback_only_and_its_ui_stops_nothing(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    """Spark's driver RPC and block manager have no authentication and deserialize what they are sent: a
    consumer's (local mode) listen on 127.0.0.1 only, never on the machine's or the pod's address; its UI,
    when enabled, has no kill buttons."""
    import psutil

    from hubshift.consumer import leftovers

    emulator: RunningEmulator = emulator_factory(["hub:1"])  # type: ignore[operator]
    port = free_port()
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=tmp_path / "sink",
        consumer={"spark": {"master": "local[1]", "ui": {"enabled": True, "port": port}}},
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    consumer = consumer_pool.start(manifest, "c0")
    consumer.wait_ready()
    jvm = int((consumer_pool.workdir / "scratch-c0" / leftovers.RECORD).read_text().split()[0])
    listening = [
        c.laddr for c in psutil.Process(jvm).net_connections("inet") if c.status == psutil.CONN_LISTEN
    ]
    assert listening, "the driver listens on nothing?"
    assert {address.ip for address in listening} <= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}, listening
    assert port in {address.port for address in listening}  # the UI is among them
    environment = json.loads(
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/applications", timeout=30).read()
    )
    application = environment[0]["id"]
    settings = json.loads(
        urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/v1/applications/{application}/environment", timeout=30
        ).read()
    )
    assert dict(settings["sparkProperties"])["spark.ui.killEnabled"] == "false"
    consumer.terminate()
    assert consumer.wait(timeout=60) == 0
