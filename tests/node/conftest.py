"""Fixtures of the node tier: one real one-node cluster per test session (tools/node up, inside a network
namespace; tests/harness/node.py) and a fresh namespace per test. When the tier cannot run here (not root,
nothing built, no Go) every test is skipped, saying why; tools/run-tests runs `tools/node build` first."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.harness.node import NodeCluster, node_unavailable, start_node_cluster


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
