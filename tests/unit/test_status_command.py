"""`hubshift status` with the records named by a manifest (`-f FILE`) or a resource (`pcon/NAME`) instead
of retyped store strings; what it refuses, in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from hubshift.apps import status as status_app
from hubshift.errors import UserError
from hubshift.eventhubs.model import PartitionInfo
from hubshift.operator.kubernetes.lookup import kube_client, parse_reference
from hubshift.ownership.leases import claim_partition
from hubshift.ownership.membership import join_pool
from hubshift.ownership.scope import Scope
from hubshift.ownership.stores.sqlite import SqliteLeaseStore

SECRET = "SharedAccessKey=c2VjcmV0LWRvLW5vdC1zaG93"
CONNECTION_STRING = f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;{SECRET}"


def write_manifest(tmp_path: Path) -> Path:
    document = {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "homes"},
        "spec": {
            "eventHubs": {"hub": "telemetry", "consumerGroup": "spark"},
            "checkpointStore": {"sqlite": {"path": str(tmp_path / "store.db")}},
        },
    }
    path = tmp_path / "homes.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run(*args: str, **environ: str) -> Any:
    env = {"HUBSHIFT_STORE": "", **environ}
    return CliRunner().invoke(status_app.status, list(args), env=env, standalone_mode=False)


def test_a_manifest_names_the_store_the_hub_and_the_start_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = write_manifest(tmp_path)
    store = SqliteLeaseStore(tmp_path / "store.db")
    scope = Scope("ns.servicebus.windows.net", "telemetry", "spark")
    join_pool(store, scope, "homes-0", clock=lambda: 0.0)
    claim_partition(store, scope, "0", "homes-0")
    store.close()

    async def partitions(target: Any) -> dict[str, PartitionInfo]:
        assert (target.fqns, target.hub, target.consumer_group) == (scope.fqns, "telemetry", "spark")
        return {p: PartitionInfo(p, 0, 9, False) for p in ("0", "1")}

    monkeypatch.setattr(status_app, "read_partitions", partitions)
    result = run(
        "-f", str(manifest), "--output", "json", HUBSHIFT_EVENTHUBS_CONNECTION_STRING=CONNECTION_STRING
    )
    assert result.exception is None, result.output
    assert SECRET not in result.output
    document = yaml.safe_load(result.output)
    assert (document["namespace"], document["hub"], document["consumerGroup"]) == (
        "ns.servicebus.windows.net",
        "telemetry",
        "spark",
    )
    assert [(row["partition"], row["owner"], row["backlog"]) for row in document["partitions"]] == [
        ("0", "homes-0", 10)
    ]


def test_without_records_named_it_says_what_to_give(tmp_path: Path) -> None:
    result = run()
    assert isinstance(result.exception, UserError)
    assert "--store, --namespace, --hub" in str(result.exception)
    assert "-f FILE" in str(result.exception) and "pcon/NAME" in str(result.exception)


def test_a_manifest_and_a_resource_or_retyped_names_are_refused(tmp_path: Path) -> None:
    manifest = str(write_manifest(tmp_path))
    both = run("pcon/homes", "-f", manifest)
    assert str(both.exception) == "give a manifest (-f FILE) or a resource (pcon/NAME), not both"
    retyped = run("-f", manifest, "--hub", "other")
    assert str(retyped.exception) == "--hub: the manifest names them"


def test_a_missing_connection_string_names_the_variable(tmp_path: Path) -> None:
    result = run("-f", str(write_manifest(tmp_path)), HUBSHIFT_EVENTHUBS_CONNECTION_STRING="")
    assert isinstance(result.exception, UserError)
    assert "HUBSHIFT_EVENTHUBS_CONNECTION_STRING" in str(result.exception)
    assert "\n" not in str(result.exception)


def test_a_malformed_connection_string_is_refused_without_its_key(tmp_path: Path) -> None:
    result = run(
        "-f", str(write_manifest(tmp_path)), HUBSHIFT_EVENTHUBS_CONNECTION_STRING=f"Endpoint=;{SECRET}"
    )
    assert isinstance(result.exception, UserError)
    assert "c2VjcmV0LWRvLW5vdC1zaG93" not in str(result.exception)


@pytest.mark.parametrize(
    "reference",
    [
        "pcon/homes",
        "PartitionedConsumer/homes",
        "partitionedconsumers/homes",
        "partitionedconsumer.hubshift.dev/homes",
    ],
)
def test_a_resource_is_named_as_kubectl_names_it(reference: str) -> None:
    assert parse_reference(reference) == "homes"


@pytest.mark.parametrize("reference", ["homes", "deployment/homes", "pcon/", "pcon/Homes_1", "pcon/a/b"])
def test_anything_else_is_refused_in_one_line(reference: str) -> None:
    with pytest.raises(UserError, match="expected pcon/NAME"):
        parse_reference(reference)


def test_a_kubeconfig_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError) as refused:
        kube_client(str(tmp_path / "nope"), None)
    assert str(refused.value).startswith(f"cannot use kubeconfig {tmp_path / 'nope'}")
    assert "\n" not in str(refused.value)
