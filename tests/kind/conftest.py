"""The kind tier: the deployed scenarios (tests/scenarios/deployed.py) on a kind cluster named
$HUBSHIFT_KIND_CLUSTER (default "hubshift").

Two ways to a cluster, the same tests:
- **podman** (the default; this project's machines, the GitHub Actions workflow): `tools/run-tests` brings
  the cluster up with `tools/kind up` (kind on podman, a node image built here), loads the images tools/image
  built (`hubshift`, `monitoring`) and brings it down after. The emulator and Azurite run inside the node
  container's network namespace on its address (as on the node tier: pods reach them locally, the test
  through kind's internal bridge); nothing listens on this machine's own addresses.
- **docker** (`HUBSHIFT_KIND_PROVIDER=docker`): a kind cluster you made on Docker, with the image `docker
  build` made loaded (`HUBSHIFT_KIND_IMAGE`); the servers listen at the kind network's gateway.

Every test is skipped, saying why, when neither is there."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.harness.node import REPO_ROOT, image_ref
from tests.scenarios import monitoring
from tests.scenarios.cluster import Image, ScenarioCluster, ScenarioError
from tests.scenarios.deployed import summarize_figures

CLUSTER = os.environ.get("HUBSHIFT_KIND_CLUSTER", "hubshift")
PODMAN = os.environ.get("HUBSHIFT_KIND_PROVIDER", "podman") != "docker"  # as tools/run-tests reads it
TOOLS_KIND = REPO_ROOT / "tools" / "kind"
# docker: what the workflow built and loaded (`docker build -t hubshift:<version> .`, the chart's default).
IMAGE = os.environ.get("HUBSHIFT_KIND_IMAGE", "hubshift:0.1.0")
# The API server's audit log, as tests/kind/cluster.yaml has it written.
AUDIT_LOG = "/var/log/kubernetes/kube-apiserver-audit.log"
NODE = f"{CLUSTER}-control-plane"


def _run(command: list[str], what: str, timeout: float = 120) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ScenarioError(f"{what}: no answer within {timeout:g} s") from None
    if result.returncode != 0:
        raise ScenarioError(f"{what}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def _engine(*args: str, timeout: float = 120) -> str:
    """podman (as tools/kind runs it for kind's nodes) or docker."""
    command = [str(TOOLS_KIND), "podman", *args] if PODMAN else ["docker", *args]
    return _run(command, f"{'podman' if PODMAN else 'docker'} {' '.join(args)[:120]}", timeout)


def _why_not_available() -> str | None:
    if PODMAN:
        listed = subprocess.run(
            [str(TOOLS_KIND), "list"], capture_output=True, text=True, timeout=60, check=False
        )
        if CLUSTER not in listed.stdout.split():
            return f"no kind cluster {CLUSTER!r} on podman (tools/run-tests brings it up with tools/kind)"
        return None
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


def _control_plane_bin() -> Path:
    """kubectl and helm as tools/control-plane built them (the versions every tier pins)."""
    folder = _run([str(REPO_ROOT / "tools" / "control-plane"), "--dir"], "tools/control-plane --dir").strip()
    return Path(folder)


class KindScenarioCluster(ScenarioCluster):
    """A kind cluster for the deployed scenarios: containers signalled and images tagged with the node
    container's own `ctr`, the audit log read from the control-plane container."""

    def __init__(self, kubeconfig: Path) -> None:
        if PODMAN:
            # The node's network namespace: servers there listen on its address on kind's internal network.
            address = _engine(
                "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", NODE
            ).split()
            pid = _engine("inspect", "-f", "{{.State.Pid}}", NODE).strip()
            if not address or not pid.isdigit():
                raise ScenarioError(f"the kind node {NODE} has no address or process ({address}, {pid!r})")
            tools = _control_plane_bin()
            reference = image_ref("hubshift")  # docker.io/library/hubshift:<version>, as loaded
            super().__init__(
                name="kind",
                kubeconfig=kubeconfig,
                kubectl=tools / "kubectl",
                helm=tools / "helm",
                image=Image("hubshift", reference.rsplit(":", 1)[1], "IfNotPresent"),
                server_host=address[0],
                server_wrapper=("nsenter", f"--net=/proc/{pid}/ns/net"),
                monitoring=monitoring.built_stack(image_ref("monitoring")),
            )
            return
        repository, tag = IMAGE.rsplit(":", 1)
        gateways = _engine("network", "inspect", "kind", "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}")
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
        kill = ("ctr", "-n", "k8s.io", "tasks", "kill", "--all", "--signal", signal, container_id)
        _engine("exec", node, *kill)

    def audit_log(self) -> str:
        return _engine("exec", NODE, "cat", AUDIT_LOG, timeout=120)

    def node_exec(self, *command: str) -> str:
        return _engine("exec", NODE, *command, timeout=120)

    def tag_image(self, tag: str) -> Image:
        """The image under another tag on the node (a `helm upgrade` to a new image)."""
        if PODMAN:  # tools/image's archive, loaded under its full reference
            source = image_ref("hubshift")
            target = f"{source.rsplit(':', 1)[0]}:{tag}"
            _engine("exec", NODE, "ctr", "-n", "k8s.io", "images", "tag", "--force", source, target)
        else:
            target = f"{self.image.repository}:{tag}"
            _engine("tag", self.image.reference, target)
            _run(["kind", "load", "docker-image", target, "--name", CLUSTER], f"kind load {target}", 600)
        return Image(self.image.repository, tag, self.image.pull_policy)


@pytest.fixture(scope="session")
def scenario_cluster(tmp_path_factory: pytest.TempPathFactory) -> KindScenarioCluster:
    """The kind cluster (every test is skipped when there is none)."""
    reason = _why_not_available()
    if reason is not None:
        pytest.skip(f"kind tier: {reason}")
    if PODMAN:
        return KindScenarioCluster(Path(_run([str(TOOLS_KIND), "kubeconfig", CLUSTER], "kubeconfig").strip()))
    path = tmp_path_factory.mktemp("kind") / "kubeconfig"
    path.write_text(_run(["kind", "get", "kubeconfig", "--name", CLUSTER], "kind get kubeconfig", 30))
    return KindScenarioCluster(path)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    summarize_figures(config, "kind", terminalreporter.write)
