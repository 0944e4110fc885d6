"""The harness the tests and benchmarks share (never imported by hubshift itself): Azurite, the Kubernetes
control plane, the node tier's cluster, the report-only control loop and replay counting."""
