"""A resource naming several hosts the operator's identity may not read is refused with every one of them,
one line each (not the first "and 1 more"), before anything is opened."""

from __future__ import annotations

from typing import Any

import pytest

from hubshift.errors import UserError
from hubshift.manifest import parse_manifest
from hubshift.operator.kubernetes.reconcile import open_cluster_loop

CREDENTIAL = {"type": "default"}


async def test_every_refused_host_is_listed_one_line_each() -> None:
    consumer = parse_manifest(
        {
            "apiVersion": "hubshift.dev/v1alpha1",
            "kind": "PartitionedConsumer",
            "metadata": {"name": "homes", "namespace": "team"},
            "spec": {
                "eventHubs": {
                    "hub": "hub",
                    "namespace": "ns.servicebus.windows.net",
                    "credential": CREDENTIAL,
                },
                "checkpointStore": {
                    "blob": {
                        "container": "store",
                        "accountUrl": "https://acct.blob.core.windows.net",
                        "credential": CREDENTIAL,
                    }
                },
            },
        }
    )
    unused: Any = None  # refused before the runtime or the metrics are touched
    with pytest.raises(UserError) as refused:
        await open_cluster_loop(consumer, unused, unused)
    lines = str(refused.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["spec.eventHubs", "spec.checkpointStore.blob"]
    assert all("is not allowed for namespace team" in line for line in lines)
