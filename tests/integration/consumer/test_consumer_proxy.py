"""A pool behind a corporate proxy: the manifest's hub block names an HTTP proxy (its USER:PASSWORD from the
environment, as a pod gets it from its Secret), and the namespace (the connection string's Endpoint too)
resolves only at the proxy, so every connection a consumer makes (the SDK engine's receivers, the Spark
engine's, the management link), `hubshift status` and `hubshift produce --proxy` must cross it, as AMQP over
WebSockets: a client the settings did not reach cannot connect at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import (
    ConsumerPool,
    committed_ranges,
    consumer_environ,
    consumer_manifest,
    coverage,
    wait_for,
)
from tests.harness.proxy import running_proxy
from tests.harness.ranges import read_range_logs

pytestmark = pytest.mark.timeout(400)

HIDDEN = "eventhubs.invalid"  # only the proxy resolves it
CREDENTIALS = ("svc-hubshift", "s3cret:with@signs")
UPGRADE = b"GET /$servicebus/websocket HTTP/1.1\r\n"
HUBSHIFT = [sys.executable, "-m", "hubshift.cli"]


def test_both_engines_read_through_the_proxy(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:4"])  # type: ignore[operator]
    namespace = f"{HIDDEN}:{emulator.port}"
    connection_string = emulator.connection_string.replace("127.0.0.1", HIDDEN)
    with running_proxy(credentials=CREDENTIALS, hosts={HIDDEN: "127.0.0.1"}) as proxy:
        manifest = consumer_manifest(
            tmp_path / "consumer.yaml",
            store={"sqlite": {"path": str(tmp_path / "store.db")}},
            sink=tmp_path / "sink",
        )
        document = yaml.safe_load(manifest.read_text())
        document["spec"]["eventHubs"].update(
            namespace=namespace,
            proxy={"url": proxy.url, "credentialsEnv": "CORP_PROXY_CREDENTIALS"},
        )
        manifest.write_text(yaml.safe_dump(document))
        consumer_pool.environ.update(
            consumer_environ(connection_string), CORP_PROXY_CREDENTIALS=":".join(CREDENTIALS)
        )
        ownership = consumer_pool.ownership(manifest)
        assert ownership.scope.fqns == namespace
        owners = {"0": "sdk-0", "1": "sdk-0", "2": "spark-0", "3": "spark-0"}
        ownership.publish(owners, 1, 2)
        ranges = tmp_path / "ranges"
        sdk = consumer_pool.start(manifest, "sdk-0", engine="sdk", args=("--ranges", str(ranges / "s.jsonl")))
        spark = consumer_pool.start(manifest, "spark-0", engine="spark")
        sdk.wait_ready()
        spark.wait_ready()
        wait_for(lambda: ownership.owners() == owners, 60, "both consumers claiming their partitions")

        produced = produce(connection_string, proxy.url_with_credentials(), 400)
        assert sum(produced.values()) == 400

        def sdk_read() -> dict[str, set[int]]:
            found: dict[str, set[int]] = {}
            for entry in read_range_logs(ranges):
                found.setdefault(entry["partition"], set()).update(range(entry["first"], entry["last"] + 1))
            return found

        def all_read() -> bool:
            by_spark = committed_ranges(tmp_path / "sink")
            read = {**sdk_read(), **{p: coverage(by_spark.get(p, []))[0] for p in ("2", "3")}}
            return all(read.get(p, set()) == set(range(n)) for p, n in produced.items())

        wait_for(all_read, 180, "every event read by its owner", on_timeout=lambda: spark.log() + sdk.log())

        status = subprocess.run(
            [
                *HUBSHIFT,
                *("status", "--store", f"sqlite:///{tmp_path / 'store.db'}", "--namespace", namespace),
                *("--hub", "hub", "--output", "json"),
            ],
            env={
                **os.environ,
                "HUBSHIFT_EVENTHUBS": connection_string,
                "HUBSHIFT_PROXY": proxy.url_with_credentials(),
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert status.returncode == 0, status.stderr
        table = json.loads(status.stdout)
        assert {row["partition"]: row["owner"] for row in table["partitions"]} == owners
        assert all(row["backlog"] is not None for row in table["partitions"]), table

        assert {t.target for t in proxy.tunnels} == {namespace}
        assert all(t.first_bytes.startswith(UPGRADE) for t in proxy.tunnels), proxy.tunnels
        assert proxy.refused == 0
        for consumer in (sdk, spark):
            assert CREDENTIALS[1] not in consumer.log()
        assert CREDENTIALS[1] not in status.stderr + status.stdout


def produce(connection_string: str, proxy: str, count: int) -> dict[str, int]:
    """`hubshift produce` through the proxy."""
    result = subprocess.run(
        [*HUBSHIFT, "produce", "--hub", "hub", "--count", str(count), "--rate", "2000", "--output", "json"],
        env={
            **os.environ,
            "HUBSHIFT_EVENTHUBS_CONNECTION_STRING": connection_string,
            "HUBSHIFT_PROXY": proxy,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    partitions: dict[str, int] = json.loads(result.stdout)["partitions"]
    return {p: int(partitions.get(p, 0)) for p in ("0", "1", "2", "3")}
