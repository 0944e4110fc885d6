"""Shared fixtures: real servers started by the tests themselves, on 127.0.0.1, stopped after."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.harness.azurite import Azurite, start_azurite
from tests.scenarios.cluster import SESSION_STARTED

# A property test's time on a machine busy with other suites says nothing of its logic: no deadline (one
# example of the balancer took 388 ms at a load of 20 and failed the tier).
settings.register_profile("hubshift", deadline=None)
settings.load_profile("hubshift")

# Each part keeps its fixtures in tests/fixtures/<part>.py; all of them are loaded here.
pytest_plugins = sorted(
    f"tests.fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if path.stem != "__init__"
)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = start_azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def blob_container(azurite: Azurite) -> Iterator[str]:
    """A fresh, empty container on the session's Azurite; its name."""
    from azure.storage.blob import BlobServiceClient

    name = f"t{uuid.uuid4().hex[:20]}"
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    service.create_container(name)
    try:
        yield name
    finally:
        try:
            service.delete_container(name)
        except Exception:
            pass
        service.close()


def pytest_sessionstart(session: pytest.Session) -> None:
    """When the run began (the node and kind tiers report their wall time)."""
    session.config.stash[SESSION_STARTED] = time.monotonic()


TIER_BY_FOLDER = {"unit", "integration", "cluster", "node", "kind"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test's tier is the folder it lives in: tests/unit, tests/integration, tests/cluster, tests/node,
    tests/kind."""
    for item in items:
        parts = set(item.path.relative_to(config.rootpath).parts)
        for tier in TIER_BY_FOLDER & parts:
            item.add_marker(getattr(pytest.mark, tier))
