"""The blocks of the sinks Spark writes at a path (`delta`, `parquet`, `json`): what a manifest may say, the
one line it gets when it is wrong, and the Hadoop settings with which hadoop-azure reaches an Azure path
(an account key, workload identity, managed identity), none of which puts a secret in a message."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.errors import UserError
from hubshift.manifest import parse_manifest
from hubshift.sinks import SinkSpec, build_sink
from hubshift.sinks.base import DEFAULT_SINK_STORAGE_ENV
from hubshift.sinks.delta import SESSION_CONF, DeltaSink
from hubshift.sinks.files import FilesSink
from hubshift.sinks.spark_writer import (
    ABFS_PATH,
    ABFS_SETTINGS,
    AZURE_PATH,
    LAKE_ONLY,
    RESERVED,
    SparkPathSpec,
    hadoop_settings,
    is_azure,
)
from hubshift.spec import Resolved, TokenCredentialSpec

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "homes.yaml"
KEY = "c2VjcmV0LWFjY291bnQta2V5LWZvci10ZXN0cw=="
LAKE = "abfss://tables@lake.dfs.core.windows.net/orders"
HOST = "lake.dfs.core.windows.net"
PUBLIC = f"DefaultEndpointsProtocol=https;AccountName=lake;AccountKey={KEY};EndpointSuffix=core.windows.net"
AZURITE = (
    f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)
MANAGED = "org.apache.hadoop.fs.azurebfs.oauth2.MsiTokenProvider"
WORKLOAD_ENV = {
    "AZURE_TENANT_ID": "tenant-1",
    "AZURE_CLIENT_ID": "client-from-env",
    "AZURE_FEDERATED_TOKEN_FILE": "/var/run/secrets/azure/tokens/azure-identity-token",
}


def manifest_with_sink(sink: dict[str, Any], pipeline: str = "events") -> dict[str, Any]:
    document: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    document["spec"]["consumer"]["pipeline"] = (
        {"type": "events"} if pipeline == "events" else {"type": "function", "function": "jobs:enrich"}
    )
    document["spec"]["consumer"]["sink"] = sink
    return document


def refusal(sink: dict[str, Any]) -> str:
    with pytest.raises(UserError) as refused:
        parse_manifest(manifest_with_sink(sink))
    return str(refused.value)


def sink(block: dict[str, Any], kind: str = "delta", environ: dict[str, str] | None = None) -> Any:
    spec = SinkSpec.model_validate({"type": kind, kind: block})
    return build_sink(spec, environ or {}, scope="ns.servicebus.windows.net/orders/$default")


# --- the block ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["delta", "parquet", "json"])
def test_every_path_sink_takes_a_folder_or_an_azure_path(kind: str) -> None:
    for path in ("/data/orders", "relative/orders", LAKE, "abfs://t@devstoreaccount1.dfs.core.windows.net"):
        consumer = parse_manifest(manifest_with_sink({"type": kind, kind: {"path": path}}))
        assert consumer.spec.consumer.sink.block.path == path


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            {"path": "abfss://no-account-here"},
            f"spec.consumer.sink.delta: {AZURE_PATH}",
        ),
        (
            {"path": "abfss://tables@lake/orders"},  # no domain: the account is the host's first label
            "spec.consumer.sink.delta: path: an Azure path is",
        ),
        ({"path": "/data/orders", "connectionStringEnv": "LAKE"}, f"spec.consumer.sink.delta: {LAKE_ONLY}"),
        ({"path": "/data/orders", "credential": {"type": "workloadIdentity"}}, LAKE_ONLY),
        (
            {"path": "/data/orders", "connectionStringSecretRef": {"name": "lake", "key": "conn"}},
            LAKE_ONLY,
        ),
        ({"path": LAKE, "options": {"mode": "overwrite"}}, f"spec.consumer.sink.delta: {RESERVED}"),
        ({"path": LAKE, "options": {"txnAppId": "mine", "mergeSchema": "true"}}, RESERVED),
        ({"path": LAKE, "options": {"TXNVERSION": "3"}}, RESERVED),
        ({"path": LAKE, "options": {"checkpointLocation": "/x"}}, RESERVED),
        ({"path": LAKE, "options": {"Path": "/elsewhere"}}, RESERVED),
        ({"path": "abfss://tables@other@lake.dfs.core.windows.net/orders"}, AZURE_PATH),  # one account
        ({"path": "/data/" + "x" * 1024}, "spec.consumer.sink.delta.path: String should have at most 1024"),
        ({"path": ""}, "spec.consumer.sink.delta.path: String should have at least 1 character"),
        ({"credential": {"type": "workloadIdentity"}}, "spec.consumer.sink.delta.path: required field"),
        ({"path": LAKE, "partitonBy": ["day"]}, "spec.consumer.sink.delta.partitonBy: unknown field"),
        ({"path": LAKE, "partitionBy": ["c"] * 17}, "spec.consumer.sink.delta.partitionBy: List should have"),
        ({"path": LAKE, "options": {"maxRecordsPerFile": 10}}, "spec.consumer.sink.delta.options"),
    ],
)
def test_a_bad_path_block_is_one_line_naming_the_field(block: dict[str, Any], expected: str) -> None:
    message = refusal({"type": "delta", "delta": block})
    assert expected in message
    assert "\n" not in message


def test_a_missing_block_names_what_it_is() -> None:
    assert "delta (the table's path) is required when type is delta" in refusal({"type": "delta"})
    assert "parquet (the folder's path) is required when type is parquet" in refusal({"type": "parquet"})
    assert "json (the folder's path) is required when type is json" in refusal({"type": "json"})


def test_the_abfs_path_pattern() -> None:
    match = ABFS_PATH.match("abfss://tables@lake.dfs.core.windows.net/orders/2026")
    assert match is not None
    assert (match["container"], match["account"], match["host"], match["path"]) == (
        "tables",
        "lake",
        HOST,
        "/orders/2026",
    )
    assert ABFS_PATH.match("abfs://t@devstoreaccount1.dfs.core.windows.net") is not None
    for bad in (
        "abfss://lake.dfs.core.windows.net/x",
        "abfss://t@lake",
        "wasbs://t@lake.blob.core.windows.net",
    ):
        assert ABFS_PATH.match(bad) is None, bad
    assert is_azure("abfs://x") and is_azure("abfss://x") and not is_azure("/abfss/x")
    assert ABFS_PATH.match("abfss://t@other@lake.dfs.core.windows.net/x") is None


def test_the_crd_checks_an_azure_path_with_the_models_own_pattern() -> None:
    (rule,) = [r for r in SparkPathSpec.cel_rules() if r["message"] == AZURE_PATH]
    assert f"self.path.matches(r'{ABFS_PATH.pattern}')" in rule["rule"]
    (rule,) = [r for r in SparkPathSpec.cel_rules() if r["message"] == RESERVED]
    for key in ("path", "mode", "txnappid", "txnversion", "checkpointlocation"):
        assert f"'{key}'" in rule["rule"]


# --- hadoop-azure's settings -------------------------------------------------------------------------


def test_a_folder_needs_no_hadoop_settings() -> None:
    assert hadoop_settings("/data/orders", Resolved(PUBLIC, None, "LAKE"), {}) == {}
    assert sink({"path": "/data/orders"}).settings == {}


def test_an_account_key_per_account() -> None:
    settings = hadoop_settings(LAKE, Resolved(PUBLIC, None, "LAKE"), {})
    assert settings == {
        f"fs.azure.account.auth.type.{HOST}": "SharedKey",
        f"fs.azure.account.key.{HOST}": KEY,
        "fs.azure.metrics.collection.enabled": "false",
    }


def test_hadoop_azure_sends_no_metrics_of_its_own() -> None:
    """Its shutdown hook would send them, retrying for minutes when the account is away."""
    identity = TokenCredentialSpec(type="workloadIdentity", client_id="client-1")
    for resolved, environ in (
        (Resolved(PUBLIC, None, "LAKE"), {}),
        (Resolved(None, identity, None), WORKLOAD_ENV),
    ):
        assert hadoop_settings(LAKE, resolved, environ)["fs.azure.metrics.collection.enabled"] == "false"


def test_a_storage_endpoint_of_its_own_goes_through_its_blob_api() -> None:
    path = "abfs://tables@devstoreaccount1.dfs.core.windows.net/orders"
    host = "devstoreaccount1.dfs.core.windows.net"
    settings = hadoop_settings(path, Resolved(AZURITE, None, "LAKE"), {})
    assert settings[f"fs.azure.account.key.{host}"] == KEY
    assert settings["fs.azure.abfs.endpoint"] == "127.0.0.1:10000"
    assert settings["fs.azure.always.use.https"] == "false"
    assert settings[f"fs.azure.account.hns.enabled.{host}"] == "false"
    assert settings["fs.azure.fns.account.service.type"] == "BLOB"
    https = AZURITE.replace("BlobEndpoint=http://", "BlobEndpoint=https://")
    assert hadoop_settings(path, Resolved(https, None, "LAKE"), {})["fs.azure.always.use.https"] == "true"
    assert hadoop_settings(path.replace("abfs://", "abfss://"), Resolved(https, None, "LAKE"), {})


def test_abfss_against_a_plain_http_endpoint_is_refused_in_one_line() -> None:
    path = "abfss://tables@devstoreaccount1.dfs.core.windows.net/orders"
    with pytest.raises(UserError) as refused:
        hadoop_settings(path, Resolved(AZURITE, None, "LAKE"), {})
    assert str(refused.value) == (
        f"{path}: the storage endpoint in LAKE is plain http, which abfss:// (TLS) cannot reach: write "
        "abfs:// for a plain-http endpoint (Azurite)"
    )


def test_a_connection_string_without_the_account_key_is_refused() -> None:
    sas = "BlobEndpoint=https://lake.blob.core.windows.net;SharedAccessSignature=sv=2024&sig=S1GNATURE"
    with pytest.raises(UserError) as refused:
        hadoop_settings(LAKE, Resolved(sas, None, "LAKE"), {})
    message = str(refused.value)
    assert message == "LAKE: hadoop-azure needs the account's key (AccountKey=...) in the connection string"
    assert "S1GNATURE" not in message


def test_workload_identity_reads_the_pods_federated_token() -> None:
    identity = TokenCredentialSpec(type="workloadIdentity", client_id="client-1")
    settings = hadoop_settings(LAKE, Resolved(None, identity, None), WORKLOAD_ENV)
    assert settings == {
        **ABFS_SETTINGS,
        f"fs.azure.account.auth.type.{HOST}": "OAuth",
        f"fs.azure.account.oauth.provider.type.{HOST}": (
            "org.apache.hadoop.fs.azurebfs.oauth2.WorkloadIdentityTokenProvider"
        ),
        f"fs.azure.account.oauth2.client.id.{HOST}": "client-1",  # the block's, before the pod's
        f"fs.azure.account.oauth2.msi.tenant.{HOST}": "tenant-1",
        f"fs.azure.account.oauth2.token.file.{HOST}": WORKLOAD_ENV["AZURE_FEDERATED_TOKEN_FILE"],
    }
    sovereign = {**WORKLOAD_ENV, "AZURE_AUTHORITY_HOST": "https://login.microsoftonline.us/"}
    default = TokenCredentialSpec(type="default")
    settings = hadoop_settings(LAKE, Resolved(None, default, None), sovereign)
    assert settings[f"fs.azure.account.oauth2.client.id.{HOST}"] == "client-from-env"
    assert settings[f"fs.azure.account.oauth2.msi.authority.{HOST}"] == "https://login.microsoftonline.us/"
    assert settings[f"fs.azure.account.oauth.provider.type.{HOST}"].endswith("WorkloadIdentityTokenProvider")


@pytest.mark.parametrize(
    ("identity", "environ", "missing"),
    [
        (TokenCredentialSpec(type="workloadIdentity"), {}, "AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE, "),
        (
            TokenCredentialSpec(type="workloadIdentity", client_id="client-1"),
            {"AZURE_FEDERATED_TOKEN_FILE": "/t"},
            "AZURE_TENANT_ID (",
        ),
        (
            TokenCredentialSpec(type="default"),
            {"AZURE_FEDERATED_TOKEN_FILE": "/t", "AZURE_TENANT_ID": "t"},
            "a client id (credential.clientId or AZURE_CLIENT_ID) (",
        ),
    ],
)
def test_workload_identity_without_its_environment_is_refused_at_start_up(
    identity: TokenCredentialSpec, environ: dict[str, str], missing: str
) -> None:
    # hadoop-azure took an empty tenant and token file and failed only when writing, with its own words
    with pytest.raises(UserError) as refused:
        hadoop_settings(LAKE, Resolved(None, identity, None), environ)
    message = str(refused.value)
    assert message.startswith(f"{LAKE}: workload identity needs {missing}")
    assert "azure.workload.identity/use=true" in message and "\n" not in message


def test_managed_identity_where_the_pod_has_no_federated_token() -> None:
    managed = TokenCredentialSpec(type="managedIdentity", client_id="user-assigned")
    settings = hadoop_settings(LAKE, Resolved(None, managed, None), {"IDENTITY_ENDPOINT": "http://imds/x"})
    assert settings == {
        **ABFS_SETTINGS,
        f"fs.azure.account.auth.type.{HOST}": "OAuth",
        f"fs.azure.account.oauth.provider.type.{HOST}": MANAGED,
        f"fs.azure.account.oauth2.client.id.{HOST}": "user-assigned",
        f"fs.azure.account.oauth2.msi.endpoint.{HOST}": "http://imds/x",
    }
    default = TokenCredentialSpec(type="default")
    settings = hadoop_settings(LAKE, Resolved(None, default, None), {})
    assert settings[f"fs.azure.account.oauth.provider.type.{HOST}"].endswith("MsiTokenProvider")
    assert f"fs.azure.account.oauth2.client.id.{HOST}" not in settings


# --- the sinks built from their blocks ---------------------------------------------------------------


def test_the_delta_sink_names_its_writes_by_scope_and_partition() -> None:
    delta: DeltaSink = sink({"path": "/data/orders"})
    assert delta.app_id("3") == "hubshift/ns.servicebus.windows.net/orders/$default/3"
    assert delta.app_id("3") != delta.app_id("13")
    assert delta.describe() == "Delta table /data/orders"
    assert delta.spark_conf() == SESSION_CONF
    assert delta.dead_letters == "/data/orders/_dead_letters"
    assert SESSION_CONF["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_an_azure_table_gets_its_settings_as_spark_hadoop_conf() -> None:
    delta: DeltaSink = sink({"path": LAKE}, environ={DEFAULT_SINK_STORAGE_ENV: PUBLIC})
    conf = delta.spark_conf()
    assert conf[f"spark.hadoop.fs.azure.account.key.{HOST}"] == KEY
    assert conf[f"spark.hadoop.fs.azure.account.auth.type.{HOST}"] == "SharedKey"
    assert SESSION_CONF.items() <= conf.items()
    files: FilesSink = sink({"path": LAKE + "/", "connectionStringEnv": "LAKE"}, "parquet", {"LAKE": PUBLIC})
    assert files.path == LAKE and files.describe() == f"parquet files in {LAKE}"
    assert "spark.sql.extensions" not in files.spark_conf()
    assert files.spark_conf()[f"spark.hadoop.fs.azure.account.key.{HOST}"] == KEY


def test_dead_letters_go_beside_the_table_unless_placed() -> None:
    spec = SinkSpec.model_validate({"type": "json", "json": {"path": "/out/"}, "deadLetterPath": "/dead"})
    placed = build_sink(spec, {}, scope="s")
    assert isinstance(placed, FilesSink) and placed.dead_letters == "/dead"
    assert sink({"path": "/out/"}, "json").dead_letters == "/out/_dead_letters"


def test_an_azure_path_without_its_connection_string_names_the_variable_and_fields() -> None:
    with pytest.raises(UserError) as refused:
        sink({"path": LAKE})
    assert str(refused.value) == (
        f"environment variable {DEFAULT_SINK_STORAGE_ENV} is not set: it must hold the Azure Storage "
        "connection string of spec.consumer.sink.delta (in a cluster, set "
        "spec.consumer.sink.delta.connectionStringSecretRef; or use a token credential, "
        "spec.consumer.sink.delta.credential)"
    )


@pytest.mark.parametrize(
    ("block", "environ"),
    [
        ({"path": "abfss://no-account", "connectionStringEnv": "L"}, {"L": PUBLIC}),
        (
            {"path": "abfss://t@devstoreaccount1.dfs.core.windows.net", "connectionStringEnv": "L"},
            {"L": AZURITE},
        ),
        ({"path": LAKE, "connectionStringEnv": "L"}, {"L": PUBLIC.replace("AccountKey", "SharedAccessKey")}),
        ({"path": LAKE, "connectionStringEnv": "L", "options": {"mode": KEY}}, {"L": PUBLIC}),
    ],
)
def test_no_refusal_carries_the_account_key(block: dict[str, Any], environ: dict[str, str]) -> None:
    with pytest.raises(UserError) as refused:
        consumer = parse_manifest(manifest_with_sink({"type": "delta", "delta": block}))
        build_sink(consumer.spec.consumer.sink, environ, scope="s")
    assert KEY not in str(refused.value) and KEY[:12] not in str(refused.value)
    assert "\n" not in str(refused.value)
