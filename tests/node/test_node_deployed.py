"""The deployed scenarios (tests/scenarios/deployed.py) on the node tier's real node: the image built here,
`helm install charts/hubshift`, the example applied, real Spark consumer pods."""

from __future__ import annotations

from tests.scenarios.deployed import DeployedScenarios


class TestDeployedOnTheNode(DeployedScenarios):
    """Everything the scenarios need comes from tests/node/conftest.py's `scenario_cluster`."""
