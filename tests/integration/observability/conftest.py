"""The observability tests' binaries, from Debian (tools/observability installs them): a test that needs
one that is missing skips, saying why."""

from __future__ import annotations

import shutil

import pytest


def installed(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (tools/observability installs it from Debian)")
    return found


@pytest.fixture(scope="module")
def promtool() -> str:
    return installed("promtool")


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    return installed("prometheus")


@pytest.fixture(scope="module")
def chromium() -> str:
    return installed("chromium")
