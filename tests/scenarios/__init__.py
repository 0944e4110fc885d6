"""Scenarios written once and run on more than one cluster: `deployed.py` (the chart, the image, the example)
runs in tests/node on the node tier's real node and in tests/kind on a kind cluster, each tier giving it a
`ScenarioCluster` (`cluster.py`). Nothing here is collected by itself (no `test_*.py`)."""
