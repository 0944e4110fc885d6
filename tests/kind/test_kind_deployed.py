"""The deployed scenarios (tests/scenarios/deployed.py) on a kind cluster: the image `docker build` made,
`helm install charts/hubshift`, the example applied, real Spark consumer pods."""

from __future__ import annotations

from tests.scenarios.deployed import DeployedScenarios


class TestDeployedOnKind(DeployedScenarios):
    """Everything the scenarios need comes from tests/kind/conftest.py's `scenario_cluster`."""
