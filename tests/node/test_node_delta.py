"""A Spark team's own Delta job (tests/scenarios/delta_job.py) on the node tier's real node: its code from a
ConfigMap, real Spark consumer pods writing Delta over ABFS, a pod deleted mid-run."""

from __future__ import annotations

from tests.scenarios.delta_job import DeltaJobScenario


class TestDeltaJobOnTheNode(DeltaJobScenario):
    """Everything the scenario needs comes from tests/node/conftest.py's `scenario_cluster`."""
