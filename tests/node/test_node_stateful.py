"""A Spark team's streaming job (tests/scenarios/stateful_job.py) on the node tier's real node: its code from
a ConfigMap, real Spark consumer pods whose state follows their partitions through a scale-out, a kill -9
and a rollout, the windows read back with delta-rs."""

from __future__ import annotations

from tests.scenarios.stateful_job import StatefulJobScenario


class TestStatefulJobOnTheNode(StatefulJobScenario):
    """Everything the scenario needs comes from tests/node/conftest.py's `scenario_cluster`."""
