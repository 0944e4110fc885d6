"""The dashboards and alert rules against a real Prometheus (Debian's), started here on 127.0.0.1 with its
own storage folder, scraping the operator (`hubshift run --metrics-port`) and every consumer of the pool
(`prometheus-targets.json`, file_sd, as the run changes it) while a load runs. The scenario: two SDK
consumers under load, then a third (a changed manifest: a holddown, a rebalance, handoffs).

Both dashboards' variables are resolved as Grafana resolves them (tests/harness/dashboards.py), and every
PromQL expression of every panel must draw data over the run, except the Spark engine's own figures (this
pool runs the SDK engine; the node tier's Spark pods show those); every alert rule must evaluate without
error in that Prometheus, and every series it reads must exist (each alert fires on its own recorded
unhealthy series in alerts.test.yaml). Lag in seconds is also checked where people see it: the resource's
status and `hubshift status`, and each consumer's own for the partitions it owns. Bounded: about two and
a half minutes. Skips, saying why, without Prometheus.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.emulator.launch import RunningEmulator
from hubshift.spec import DEFAULT_EVENTHUBS_ENV
from tests.harness.dashboards import (
    SPARK_ONLY,
    PrometheusApi,
    dashboards,
    has_value,
    panel_queries,
    resolve_variables,
)
from tests.harness.ports import free_port, wait_for_port
from tests.harness.processes import end

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "hubshift"
HUBSHIFT = [sys.executable, "-m", "hubshift.cli"]
SCRAPE_SECONDS = 2


def manifest(path: Path, store: Path, replicas: int) -> Path:
    document = {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "homes"},
        "spec": {
            "eventHubs": {"hub": "homes"},
            "checkpointStore": {"sqlite": {"path": str(store)}},
            "consumer": {"checkpoint": {"everySeconds": 2}},
            "scaling": {"minReplicas": replicas, "maxReplicas": replicas, "pollingIntervalSeconds": 2},
            "rebalance": {"delaySeconds": 2, "maxHandoffSeconds": 5},
        },
    }
    path.write_text(yaml.safe_dump(document))
    return path


def prometheus_config(path: Path, operator_port: int, targets: Path) -> Path:
    config = {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "rule_files": [str(CHART / "rules" / "hubshift.rules.yaml")],
        "scrape_configs": [
            {
                "job_name": "hubshift-operator",
                "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}],
            },
            {
                "job_name": "hubshift-consumers",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": f"{SCRAPE_SECONDS}s"}],
            },
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            document = json.loads(response.read())
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expression: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expression)
        result: list[dict[str, Any]] = data["result"]
        return result

    def api(self) -> PrometheusApi:
        return PrometheusApi(lambda path, params: self.get(path, **params))


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every process the test starts; ended (by its own pid) after the test."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in reversed(started):
        end(process)


def wait_for(what: str, condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def status_of(workdir: Path) -> dict[str, Any]:
    try:
        document: dict[str, Any] = json.loads((workdir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return document


def ready_consumers(workdir: Path) -> int:
    return sum(1 for c in status_of(workdir).get("consumers", []) if c.get("ready"))


@pytest.mark.timeout(420)
def test_every_panel_and_alert_rule_returns_data_from_a_real_prometheus(
    tmp_path: Path,
    emulator_factory: Callable[..., RunningEmulator],
    prometheus_binary: str,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    emulator = emulator_factory(["homes:4"])
    env = dict(os.environ, **{DEFAULT_EVENTHUBS_ENV: emulator.connection_string})
    store = tmp_path / "store.db"
    spec = manifest(tmp_path / "homes.yaml", store, replicas=2)
    workdir = tmp_path / "work"
    operator_port, prometheus_port = free_port(), free_port()
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, command: list[str]) -> subprocess.Popen[bytes]:
        with (logs / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                command, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        processes.append(process)
        return process

    run = start(
        "run",
        [*HUBSHIFT, "run", "-f", str(spec), "--engine", "sdk", "--workdir", str(workdir),
         "--metrics-port", str(operator_port), "--duration", "200"],
    )  # fmt: skip
    start(
        "produce",
        [*HUBSHIFT, "produce", "--hub", "homes", "--homes", "200", "--rate", "150", "--duration", "150"],
    )
    config = prometheus_config(
        tmp_path / "prometheus.yml", operator_port, workdir / "prometheus-targets.json"
    )
    start(
        "prometheus",
        [prometheus_binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}", "--storage.tsdb.retention.time=1h",
         "--log.level=warn"],
    )  # fmt: skip
    assert wait_for_port(prometheus_port, 60), (logs / "prometheus.log").read_text()[-2000:]
    prometheus = Prometheus(prometheus_port)
    started = time.time()

    # two consumers under load, then a third: a holddown, a rebalance and handoffs
    wait_for("two ready consumers", lambda: ready_consumers(workdir) == 2, 90)

    def has(expression: str) -> Callable[[], bool]:
        return lambda: bool(prometheus.query(expression))

    events = 'sum(rate(hubshift_consumer_events_total{consumer="homes"}[30s])) > 0'
    wait_for("data in the consumers' events counter", has(events), 60)
    manifest(spec, store, replicas=3)
    wait_for("three ready consumers", lambda: ready_consumers(workdir) == 3, 90)
    handoffs = 'sum(hubshift_handoff_duration_seconds_count{consumer="homes"}) > 0'
    wait_for("the operator's first handoff", has(handoffs), 60)
    drained = 'sum(hubshift_consumer_handoff_duration_seconds_count{consumer="homes"}) > 0'
    wait_for("a drained handoff seen by a consumer", has(drained), 60)
    time.sleep(3 * SCRAPE_SECONDS)  # one more round of scrapes and rule evaluations
    assert run.poll() is None, (logs / "run.log").read_text()[-3000:]

    # the variables resolve as Grafana resolves them, and every panel draws data over the run
    empty = []
    for name, dashboard in dashboards().items():
        chosen = resolve_variables(dashboard, prometheus.api(), {"consumer": "homes"}, rate_interval="30s")
        for title, expression in panel_queries(dashboard, chosen):
            if SPARK_ONLY.search(expression):
                continue  # the Spark engine's own figures: the node tier's Spark pods show them
            if not has_value(prometheus.api().query_range(expression, started, time.time(), SCRAPE_SECONDS)):
                empty.append(f"{name}: {title}: {expression}")
    assert not empty, "panels that draw nothing:\n" + "\n".join(empty)

    # every alert rule evaluates in this Prometheus, and every series it reads exists
    groups = prometheus.get("/api/v1/rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    source = yaml.safe_load((CHART / "rules" / "hubshift.rules.yaml").read_text())
    assert {r["name"] for r in rules} == {r["alert"] for g in source["groups"] for r in g["rules"]}
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        for metric in set(re.findall(r"\bhubshift_[a-z_]+", rule["query"])):
            assert prometheus.query(f'{metric}{{consumer="homes"}}'), f"{rule['name']}: no {metric}"

    # lag in seconds as the consumers know it for the partitions they own, over the run: small, and there
    consumers_lag = prometheus.api().query_range(
        'max(hubshift_consumer_lag_seconds{consumer="homes"})', started, time.time(), SCRAPE_SECONDS
    )
    assert has_value(consumers_lag), "no consumer reported its partitions' lag in seconds"
    assert all(0 <= float(v) < 60 for series in consumers_lag for _, v in series["values"]), consumers_lag

    # lag in seconds: per partition from the operator, known and small under this load
    lags = prometheus.query('hubshift_partition_lag_seconds{consumer="homes"}')
    assert len(lags) >= 3, lags
    values = [float(sample["value"][1]) for sample in lags]
    assert all(math.isfinite(v) and 0 <= v < 60 for v in values), values
    status = status_of(workdir)["status"]
    assert 0 <= status["lagSeconds"] < 60 and status["laggingPartition"] in {"0", "1", "2", "3"}
    with_hub = dict(env, HUBSHIFT_EVENTHUBS=emulator.connection_string)
    shown = subprocess.run(
        [*HUBSHIFT, "status", "--store", f"sqlite:///{store}", "--namespace", f"127.0.0.1:{emulator.port}",
         "--hub", "homes", "--output", "json"],
        capture_output=True, text=True, timeout=60, env=with_hub,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["lagSeconds"] is not None and 0 <= document["lagSeconds"] < 60
    assert all(row["lagSeconds"] is not None for row in document["partitions"])
