"""Fixtures of the node tier: one real one-node cluster per test session (tools/node up, inside a network
namespace; tests/harness/node.py), a fresh namespace per test, and that cluster as the deployed scenarios
see it (tests/scenarios). When the tier cannot run here (not root, nothing built, no Go) every test is
skipped, saying why; tools/run-tests runs `tools/node build` first."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.node import NodeCluster, image_ref, node_unavailable, start_node_cluster
from tests.scenarios import monitoring
from tests.scenarios.cluster import Image, ScenarioCluster, ScenarioError
from tests.scenarios.deployed import summarize_figures


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[NodeCluster]:
    reason = node_unavailable()
    if reason:
        pytest.skip(f"no node cluster: {reason}")
    cluster = start_node_cluster(f"pytest-{os.getpid()}")
    print(f"node cluster {cluster.name} up in {cluster.startup_seconds:.1f} s ({cluster.kubeconfig})")
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def node_namespace(node_cluster: NodeCluster) -> Iterator[str]:
    """A fresh namespace (`t-<random>`), deleted after the test without waiting."""
    name = node_cluster.create_namespace(f"t-{uuid.uuid4().hex[:10]}")
    try:
        yield name
    finally:
        node_cluster.delete_namespace(name)


class NodeScenarioCluster(ScenarioCluster):
    """The node tier's cluster for the deployed scenarios: the image tools/image built (imported into
    containerd, so `IfNotPresent`, the chart's default, never pulls), the servers inside the node's network
    namespace on its address (pods reach it locally, the test through the veth), containers killed with
    containerd's own `ctr`, the audit log tools/node has the API server write."""

    def __init__(self, node: NodeCluster) -> None:
        tag = image_ref("hubshift").rsplit(":", 1)[1]  # docker.io/library/hubshift:<version>
        super().__init__(
            name="node",
            kubeconfig=node.kubeconfig,
            kubectl=node.kubectl_path,
            helm=node.kubectl_path.parent / "helm",  # the control plane's bin folder holds both
            image=Image("hubshift", tag, "IfNotPresent"),
            server_host=node.node_ip,
            server_wrapper=("ip", "netns", "exec", node.state["netns"]),
            monitoring=monitoring.built_stack(image_ref("monitoring")),
        )
        self.node = node

    def signal_container(self, node: str, container_id: str, signal: str) -> None:
        assert node == self.node.node_name, node
        socket = self.node.run_dir / "containerd" / "containerd.sock"
        command = [
            "ctr",
            "--address",
            str(socket),
            "-n",
            "k8s.io",
            "tasks",
            "kill",
            "--all",
            "--signal",
            signal,
        ]
        result = self.node.in_node(*command, container_id)
        if result.returncode != 0:
            raise ScenarioError(f"ctr tasks kill --signal {signal} {container_id}: {result.stderr.strip()}")

    def audit_log(self) -> str:
        return Path(self.node.state["audit_log"]).read_text(errors="replace")

    def node_exec(self, *command: str) -> str:
        result = self.node.in_node(*command)
        if result.returncode != 0:
            raise ScenarioError(f"{' '.join(command)[:200]}: {result.stderr.strip()}")
        return result.stdout

    def tag_image(self, tag: str) -> Image:
        socket = self.node.run_dir / "containerd" / "containerd.sock"
        source = image_ref("hubshift")  # docker.io/library/hubshift:<version>, as tools/node imported it
        target = f"{source.rsplit(':', 1)[0]}:{tag}"
        command = [
            "ctr",
            "--address",
            str(socket),
            "-n",
            "k8s.io",
            "images",
            "tag",
            "--force",
            source,
            target,
        ]
        result = self.node.in_node(*command)
        if result.returncode != 0:
            raise ScenarioError(f"ctr images tag {source} {target}: {result.stderr.strip()}")
        return Image(self.image.repository, tag, self.image.pull_policy)


@pytest.fixture(scope="session")
def scenario_cluster(node_cluster: NodeCluster) -> NodeScenarioCluster:
    return NodeScenarioCluster(node_cluster)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    summarize_figures(config, "node", terminalreporter.write)
