"""The deployed scenarios (tests/scenarios/deployed.py) on the node tier's real node: the image built here,
`helm install charts/hubshift`, the example applied, real Spark consumer pods."""

from __future__ import annotations

import os

import pytest

from tests.scenarios.deployed import DeployedScenarios

# tools/run-tests runs the same scenarios on the kind tier when kind works here: once is enough.
pytestmark = pytest.mark.skipif(
    os.environ.get("HUBSHIFT_DEPLOYED_ON_KIND") == "1",
    reason="the deployed scenarios run on the kind tier in this run (tools/run-tests)",
)


class TestDeployedOnTheNode(DeployedScenarios):
    """Everything the scenarios need comes from tests/node/conftest.py's `scenario_cluster`."""
