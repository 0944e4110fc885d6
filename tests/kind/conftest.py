"""The kind tier: the deployed scenarios (tests/scenarios/deployed.py) on a kind cluster, with the image
`docker build` made and `kind load` put on its node (.github/workflows/kind.yml sets it up). Every test
here is skipped, saying why, unless Docker is running, `kind`, `kubectl` and `helm` are on PATH and the
cluster named $HUBSHIFT_KIND_CLUSTER (default "hubshift") exists; these CI machines have no Docker engine,
so the tier runs on GitHub Actions (and the same scenarios run here on the node tier's real node)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.scenarios.cluster import Image, ScenarioCluster, ScenarioError
from tests.scenarios.deployed import summarize_figures

CLUSTER = os.environ.get("HUBSHIFT_KIND_CLUSTER", "hubshift")
# What the workflow built and loaded: `docker build -t hubshift:<version> .`, the chart's default image.
IMAGE = os.environ.get("HUBSHIFT_KIND_IMAGE", "hubshift:0.1.0")
# The API server's audit log, as the workflow's kind configuration (tests/kind/cluster.yaml) writes it.
AUDIT_LOG = "/var/log/kubernetes/kube-apiserver-audit.log"


def _why_not_available() -> str | None:
    for tool in ("docker", "kind", "kubectl", "helm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
        if info.returncode != 0:
            return "the Docker engine is not running"
        clusters = subprocess.run(
            ["kind", "get", "clusters"], capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired:
        return "docker/kind did not answer within 30 s"
    if CLUSTER not in clusters.stdout.split():
        return f"no kind cluster named {CLUSTER!r} (see .github/workflows/kind.yml for the set-up)"
    return None


def _docker(*args: str, timeout: float = 60) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise ScenarioError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


class KindScenarioCluster(ScenarioCluster):
    """A kind cluster for the deployed scenarios: the servers on this machine at the kind network's
    gateway (the address its nodes, hence the pods, reach this machine by), containers killed with the
    node container's own `ctr`, the audit log read from the control-plane container."""

    def __init__(self, kubeconfig: Path) -> None:
        repository, tag = IMAGE.rsplit(":", 1)
        gateways = _docker("network", "inspect", "kind", "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}")
        ipv4 = [address for address in gateways.split() if "." in address]
        if not ipv4:
            raise ScenarioError(f"the kind network has no IPv4 gateway ({gateways.strip()!r})")
        super().__init__(
            name="kind",
            kubeconfig=kubeconfig,
            kubectl="kubectl",
            helm="helm",
            image=Image(repository, tag, "IfNotPresent"),
            server_host=ipv4[0],
        )

    def signal_container(self, node: str, container_id: str, signal: str) -> None:
        _docker(
            "exec", node, "ctr", "-n", "k8s.io", "tasks", "kill", "--all", "--signal", signal, container_id
        )

    def audit_log(self) -> str:
        return _docker("exec", f"{CLUSTER}-control-plane", "cat", AUDIT_LOG, timeout=120)

    def node_exec(self, *command: str) -> str:
        return _docker("exec", f"{CLUSTER}-control-plane", *command, timeout=120)

    def tag_image(self, tag: str) -> Image:
        target = f"{self.image.repository}:{tag}"
        _docker("tag", self.image.reference, target)
        loaded = subprocess.run(
            ["kind", "load", "docker-image", target, "--name", CLUSTER],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if loaded.returncode != 0:
            raise ScenarioError(f"kind load docker-image {target}: {loaded.stderr.strip()}")
        return Image(self.image.repository, tag, self.image.pull_policy)


@pytest.fixture(scope="session")
def scenario_cluster(tmp_path_factory: pytest.TempPathFactory) -> KindScenarioCluster:
    """The kind cluster (every test is skipped when there is none)."""
    reason = _why_not_available()
    if reason is not None:
        pytest.skip(f"kind tier: {reason}")
    path = tmp_path_factory.mktemp("kind") / "kubeconfig"
    config = subprocess.run(
        ["kind", "get", "kubeconfig", "--name", CLUSTER],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    path.write_text(config.stdout)
    return KindScenarioCluster(path)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    summarize_figures(config, "kind", terminalreporter.write)
