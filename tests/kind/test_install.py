"""The chart installed the operator on kind: the CRD is served and the operator's Deployment is available.
The scenarios of the cluster tier are added here as the operator lands."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)


def test_crd_is_served(kind_api: Any) -> None:
    import kubernetes

    crd = kubernetes.client.ApiextensionsV1Api(kind_api).read_custom_resource_definition(
        "partitionedconsumers.hubshift.dev"
    )
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions.get("Established") == "True"


def test_operator_deployment_is_available(kind_api: Any, kind_release_namespace: str) -> None:
    import kubernetes

    deployments = (
        kubernetes.client.AppsV1Api(kind_api).list_namespaced_deployment(kind_release_namespace).items
    )
    assert deployments, f"no Deployment in {kind_release_namespace}"
    for deployment in deployments:
        assert (deployment.status.available_replicas or 0) >= 1, deployment.metadata.name
