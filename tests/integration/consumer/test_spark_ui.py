"""The Spark UI on demand (`spark.ui.enabled`): a consumer's Spark session, set up by `session_conf` for a
Delta table on Azure storage with an account key, serves its UI on the port the spec names, and its
Environment page (and REST API) shows that key redacted, never as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.harness.ports import free_port

pytestmark = pytest.mark.timeout(180)
KEY = "c2VjcmV0LWFjY291bnQta2V5LWZvci10ZXN0cw=="
SETTING = "fs.azure.account.key.lake.dfs.core.windows.net"

# A separate process: the test session's own SparkSession (tests/fixtures/spark.py) runs without a UI.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, urllib.request
    from pyspark.sql import SparkSession
    from hubshift.consumer.spark.engine import session_conf
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
