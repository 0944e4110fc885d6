"""The kind tier: the same scenarios as the cluster tier on a kind cluster with the real image installed
by `helm install charts/hubshift` (.github/workflows/kind.yml sets it up). Every test here is skipped
unless Docker is running, `kind` is on PATH and the cluster named $HUBSHIFT_KIND_CLUSTER (default
"hubshift") exists; these CI machines have no Docker engine, so the tier runs on GitHub Actions."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CLUSTER = os.environ.get("HUBSHIFT_KIND_CLUSTER", "hubshift")
RELEASE = os.environ.get("HUBSHIFT_KIND_RELEASE", "hubshift")
RELEASE_NAMESPACE = os.environ.get("HUBSHIFT_KIND_NAMESPACE", "hubshift-system")
IMAGE = os.environ.get("HUBSHIFT_KIND_IMAGE", "hubshift:ci")


def _why_not_available() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    if shutil.which("kind") is None:
        return "kind is not installed"
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


@pytest.fixture(scope="session")
def kind_kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig for the kind cluster (the test is skipped when there is none)."""
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
    return path


@pytest.fixture(autouse=True)
def _kind_available(kind_kubeconfig: Path) -> None:
    """Every test in tests/kind needs the cluster: requesting the fixture skips them all without it."""


@pytest.fixture
def kind_release_namespace() -> str:
    """The namespace the chart was installed into ($HUBSHIFT_KIND_NAMESPACE)."""
    return RELEASE_NAMESPACE


@pytest.fixture
def kind_api(kind_kubeconfig: Path) -> Iterator[Any]:
    """An admin `kubernetes.client.ApiClient` for the kind cluster."""
    import kubernetes

    client = kubernetes.config.new_client_from_config(config_file=str(kind_kubeconfig))
    try:
        yield client
    finally:
        client.close()
