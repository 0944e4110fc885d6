"""Token credentials in the model and in the process: one way in per connection (a connection string or a
credential with its namespace or account URL), the command line's `--credential`, azure-identity building
each credential once, and the SDK clients and messages made from them, all without a server."""

from __future__ import annotations

import ast
import asyncio
import copy
import pickle
from pathlib import Path
from typing import Any

import pytest
import yaml
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError

from hubshift import identity
from hubshift.connections import chosen_identity, event_hubs_target, open_checkpoint_store
from hubshift.errors import UserError
from hubshift.eventhubs.target import EventHubsTarget, describe_error, resolve_target, sdk_client
from hubshift.manifest import connections_of, credentials_of, load_manifest, parse_manifest, with_credential
from hubshift.operator.kubernetes.render import secret_env
from hubshift.pipelines.replicate import ReplicateSpec
from hubshift.sinks import build_store
from hubshift.sinks.blob import BlobSinkSpec, BlobStore
from hubshift.spec import BlobStoreSpec, EventHubsSpec, TokenCredentialSpec

ROOT = Path(__file__).resolve().parents[2]
KEYLESS = ROOT / "examples" / "homes-keyless.yaml"
EXAMPLE = ROOT / "examples" / "homes.yaml"
MANAGED = {"type": "managedIdentity"}


def keyless() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(KEYLESS.read_text())
    return copy.deepcopy(document)


# --- the model ----------------------------------------------------------------------------------------


def test_the_keyless_example_uses_a_credential_for_every_connection() -> None:
    consumer = load_manifest(KEYLESS)
    chosen = credentials_of(consumer.spec)
    assert [c.type for c in chosen] == ["workloadIdentity"] * 3
    assert consumer.spec.event_hubs.connection_string_secret_ref is None
    assert consumer.spec.checkpoint_store.blob is not None
    assert consumer.spec.checkpoint_store.blob.account_url == "https://mystorage.blob.core.windows.net"


@pytest.mark.parametrize(
    ("model", "fields", "message"),
    [
        (EventHubsSpec, {"hub": "h", "credential": MANAGED}, "a credential needs namespace"),
        (
            EventHubsSpec,
            {"hub": "h", "namespace": "n", "credential": MANAGED, "connectionStringEnv": "X"},
            "not both",
        ),
        (
            EventHubsSpec,
            {
                "hub": "h",
                "namespace": "n",
                "credential": MANAGED,
                "connectionStringSecretRef": {"name": "s", "key": "k"},
            },
            "not both",
        ),
        (BlobStoreSpec, {"container": "abc", "credential": MANAGED}, "a credential needs accountUrl"),
        (
            BlobStoreSpec,
            {"container": "abc", "accountUrl": "http://a.blob.x", "credential": MANAGED},
            "should match pattern",
        ),
        (
            BlobSinkSpec,
            {
                "container": "abc",
                "accountUrl": "https://a.blob.x",
                "credential": MANAGED,
                "connectionStringEnv": "S",
            },
            "not both",
        ),
        (ReplicateSpec, {"hub": "t", "credential": MANAGED}, "a credential needs namespace"),
        (EventHubsSpec, {"hub": "h", "namespace": "n", "credential": {"type": "keys"}}, "credential.type"),
    ],
)
def test_one_way_in_per_connection(model: Any, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        model.model_validate(fields)
    assert message in str(refused.value)


def test_a_connection_string_is_still_the_default() -> None:
    spec = EventHubsSpec.model_validate({"hub": "h"})
    assert spec.credential is None
    assert spec.connection_string_variable == "HUBSHIFT_EVENTHUBS_CONNECTION_STRING"
    assert EventHubsSpec.model_validate(
        {"hub": "h", "connectionStringEnv": "MINE"}
    ).connection_string_variable == ("MINE")


def test_the_command_lines_credential_replaces_every_connection_string() -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["checkpointStore"]["blob"]["accountUrl"] = "https://acct.blob.core.windows.net"
    document["spec"]["consumer"]["sink"]["blob"]["accountUrl"] = "https://acct.blob.core.windows.net"
    chosen = TokenCredentialSpec(type="default", client_id="cid")
    consumer = with_credential(parse_manifest(document), chosen)
    assert credentials_of(consumer.spec) == [chosen, chosen, chosen]
    assert consumer.spec.event_hubs.connection_string_secret_ref is None
    assert consumer.spec.checkpoint_store.blob is not None
    assert consumer.spec.checkpoint_store.blob.connection_string_secret_ref is None


def test_the_command_lines_credential_needs_the_addresses() -> None:
    consumer = load_manifest(EXAMPLE)  # no accountUrl for its Blob store
    with pytest.raises(UserError) as refused:
        with_credential(consumer, TokenCredentialSpec(type="default"))
    assert "--credential default: spec.checkpointStore.blob: " in str(refused.value)
    assert "accountUrl" in str(refused.value)


def test_credential_and_client_id_options() -> None:
    assert chosen_identity(None, None) is None
    assert chosen_identity("managedIdentity", "abc") == TokenCredentialSpec(
        type="managedIdentity", client_id="abc"
    )
    with pytest.raises(UserError, match="--client-id goes with --credential"):
        chosen_identity(None, "abc")
    with pytest.raises(UserError, match="choose one of workloadIdentity, managedIdentity, default"):
        chosen_identity("keys", None)


# --- resolving: the spec's credential, or the operator's own ------------------------------------------


def test_a_credential_resolves_without_any_environment_variable() -> None:
    spec = parse_manifest(keyless()).spec
    target = event_hubs_target(spec.event_hubs, {})
    assert (target.connection_string, target.fqns, target.identity) == (
        None,
        "myns.servicebus.windows.net",
        spec.event_hubs.credential,
    )
    assert "credential workloadIdentity (client id 00000000" in target.auth


def test_the_operator_reads_with_its_own_identity_never_the_resources() -> None:
    spec = parse_manifest(keyless()).spec
    own = TokenCredentialSpec(type="managedIdentity")
    assert event_hubs_target(spec.event_hubs, {}, identity=own).identity == own


def test_a_missing_connection_string_names_both_ways_in() -> None:
    with pytest.raises(UserError) as refused:
        resolve_target(EventHubsSpec(hub="h"), {})
    message = str(refused.value)
    assert "HUBSHIFT_EVENTHUBS_CONNECTION_STRING is not set" in message
    assert "spec.eventHubs.connectionStringSecretRef" in message and "spec.eventHubs.credential" in message


def test_a_workload_identity_without_its_environment_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_FEDERATED_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    spec = BlobStoreSpec.model_validate(
        {
            "container": "abc",
            "accountUrl": "https://a.blob.core.windows.net",
            "credential": {"type": "workloadIdentity"},
        }
    )
    with pytest.raises(UserError) as refused:
        open_checkpoint_store(_store(spec), {})
    message = str(refused.value)
    assert message.startswith("credential workloadIdentity: ")
    assert "azure.workload.identity/use=true" in message and "\n" not in message


def _store(blob: BlobStoreSpec) -> Any:
    from hubshift.spec import CheckpointStoreSpec

    return CheckpointStoreSpec(blob=blob)


# --- azure-identity builds them, once per process ------------------------------------------------------


def test_each_type_is_azure_identitys_own_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential, WorkloadIdentityCredential

    monkeypatch.setenv("AZURE_TENANT_ID", "tenant")
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", "/var/run/secrets/azure/tokens/azure-identity-token")
    built = {
        kind: identity.token_credential(TokenCredentialSpec(type=kind, client_id="cid"))  # type: ignore[arg-type]
        for kind in identity.CREDENTIAL_TYPES
    }
    assert isinstance(built["workloadIdentity"], WorkloadIdentityCredential)
    assert isinstance(built["managedIdentity"], ManagedIdentityCredential)
    assert isinstance(built["default"], DefaultAzureCredential)
    again = identity.token_credential(TokenCredentialSpec(type="managedIdentity", client_id="cid"))
    assert again is built["managedIdentity"], "one credential, one token cache, per process"


def test_the_asynchronous_clients_share_the_processes_credential() -> None:
    class Fake:
        calls: list[tuple[str, ...]] = []

        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            self.calls.append(scopes)
            return AccessToken("t", 1)

    chosen = TokenCredentialSpec(type="default", client_id="async-test")
    fake = Fake()
    identity._CREDENTIALS[chosen] = fake  # type: ignore[assignment]
    try:

        async def ask() -> AccessToken:
            async with identity.AsyncCredential(chosen) as credential:
                return await credential.get_token("https://eventhubs.azure.net//.default")

        assert asyncio.run(ask()).token == "t"
        assert fake.calls == [("https://eventhubs.azure.net//.default",)]
    finally:
        del identity._CREDENTIALS[chosen]


def test_azure_identity_is_imported_by_hubshift_identity_only() -> None:
    for path in (ROOT / "hubshift").rglob("*.py"):
        if path == ROOT / "hubshift" / "identity.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(name.startswith("azure.identity") for name in names), path


# --- SDK clients and messages --------------------------------------------------------------------------


class Recorder:
    """Stands in for an azure-eventhub client class: records how it was made."""

    __module__ = "azure.eventhub._consumer_client"
    made: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.made.append(("init", (), kwargs))

    @classmethod
    def from_connection_string(cls, *args: Any, **kwargs: Any) -> Recorder:
        cls.made.append(("from_connection_string", args, kwargs))
        return cls.__new__(cls)


def test_sdk_clients_from_a_connection_string_or_a_namespace_and_credential(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/company-ca.pem")
    Recorder.made.clear()
    sdk_client(Recorder, EventHubsTarget("Endpoint=sb://x/;K=V", "x", "hub", "$Default"), retry_total=1)
    chosen = TokenCredentialSpec(type="managedIdentity")
    identity._CREDENTIALS[chosen] = object()  # type: ignore[assignment]
    try:
        sdk_client(Recorder, EventHubsTarget(None, "ns.servicebus.windows.net", "hub", "$Default", chosen))
        sdk_client(Recorder, EventHubsTarget(None, "127.0.0.1:45671", "hub", "$Default", chosen))
    finally:
        del identity._CREDENTIALS[chosen]
    (_, args, from_string), (_, _, service), (_, _, with_port) = Recorder.made
    assert args == ("Endpoint=sb://x/;K=V",) and from_string["eventhub_name"] == "hub"
    assert from_string["connection_verify"] == "/etc/company-ca.pem"
    assert service["fully_qualified_namespace"] == "ns.servicebus.windows.net"
    assert "custom_endpoint_address" not in service
    assert with_port["custom_endpoint_address"] == "sb://127.0.0.1:45671"
    assert with_port["transport_type"].name == "Amqp"  # not the SDK's WebSockets default for an endpoint


def test_a_refused_token_says_what_to_fix_without_the_token() -> None:
    chosen = TokenCredentialSpec(type="workloadIdentity", client_id="cid")
    target = EventHubsTarget(None, "ns.servicebus.windows.net", "hub", "$Default", chosen)

    class AuthenticationError(Exception):
        pass

    refused = AuthenticationError(
        "CBS Token authentication failed.\nStatus code: 401\nDescription: ExpiredToken: The token is expired."
    )
    line = describe_error(refused, target)
    assert "the token of credential workloadIdentity (client id cid) was refused: ExpiredToken" in line
    assert "Azure Event Hubs Data Receiver" in line and "\n" not in line
    unavailable = ClientAuthenticationError("ManagedIdentityCredential: no response from the IMDS endpoint")
    wrapped = RuntimeError("connection failed")
    wrapped.__cause__ = unavailable
    line = describe_error(wrapped, target)
    assert (
        "no token from credential workloadIdentity (client id cid): ClientAuthenticationError: "
        "ManagedIdentityCredential" in line
    )


def test_the_blob_sink_with_a_credential_pickles_without_a_secret() -> None:
    spec = parse_manifest(keyless()).spec.consumer.sink
    store = build_store(spec, {}, check=False)
    assert isinstance(store, BlobStore)
    assert store.container.connection_string is None and store.container.token is not None
    copied = pickle.loads(pickle.dumps(store))
    assert copied.container == store.container
    assert copied.container.account_url == "https://mystorage.blob.core.windows.net"


def _route_with_failover() -> dict[str, Any]:
    """A route pipeline with two targets, a leftover `replicate:` block, a Blob sink and a failover store."""
    secret = {"connectionStringSecretRef": {"name": "s", "key": "cs"}}
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "routes"},
        "spec": {
            "eventHubs": {"hub": "source", "namespace": "src.servicebus.windows.net", **secret},
            "checkpointStore": {
                "blob": {"container": "cps", "accountUrl": "https://a.blob.core.windows.net"}
            },
            "consumer": {
                "sink": {
                    "type": "blob",
                    "blob": {"container": "out", "accountUrl": "https://a.blob.core.windows.net"},
                },
                "failover": {
                    "namespace": "old.servicebus.windows.net",
                    "hub": "old",
                    "checkpointStore": {
                        "blob": {"container": "oldcp", "accountUrl": "https://b.blob.core.windows.net"}
                    },
                },
                "pipeline": {
                    "type": "route",
                    "replicate": {"hub": "left-over", "connectionStringEnv": "LEFT_OVER"},
                    "route": {
                        "targets": [
                            {"name": "a", "hub": "ta", "namespace": "t.servicebus.windows.net"},
                            {
                                "name": "b",
                                "hub": "tb",
                                "namespace": "u.servicebus.windows.net",
                                "connectionStringEnv": "TB",
                                **secret,
                            },
                        ],
                        "rules": [{"to": ["a", "b"]}],
                    },
                },
            },
        },
    }


def test_connections_are_enumerated_once_in_one_order() -> None:
    consumer = parse_manifest(_route_with_failover())
    paths = [named.path for named in connections_of(consumer.spec)]
    assert paths == [
        "spec.eventHubs",
        "spec.checkpointStore.blob",
        "spec.consumer.sink.blob",
        "spec.consumer.pipeline.route.targets[0]",
        "spec.consumer.pipeline.route.targets[1]",
        "spec.consumer.failover.checkpointStore.blob",
    ]
    # The left-over replicate block is no connection: neither its Secret nor its variable reaches a pod.
    env = {e["name"] for e in secret_env(consumer)}
    assert env == {"HUBSHIFT_EVENTHUBS_CONNECTION_STRING", "TB"}


def test_the_command_lines_credential_reaches_route_targets_and_the_failover_store() -> None:
    chosen = TokenCredentialSpec(type="managedIdentity", client_id="cid")
    consumer = with_credential(parse_manifest(_route_with_failover()), chosen)
    assert credentials_of(consumer.spec) == [chosen] * 6
    for named in connections_of(consumer.spec):
        assert named.connection.connection_string_secret_ref is None
        assert named.connection.connection_string_env is None


def test_a_missing_connection_string_names_the_block_and_the_fields_to_set() -> None:
    consumer = parse_manifest(_route_with_failover())
    target = connections_of(consumer.spec)[4]
    with pytest.raises(UserError) as refused:
        target.resolve({})
    assert str(refused.value) == (
        "environment variable TB is not set: it must hold the Event Hubs connection string of "
        "spec.consumer.pipeline.route.targets[1] (in a cluster, set "
        "spec.consumer.pipeline.route.targets[1].connectionStringSecretRef; or use a token credential, "
        "spec.consumer.pipeline.route.targets[1].credential)"
    )
    assert target.resolve(
        {"TB": "  Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v \n"}
    ).connection_string == ("Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v")


def test_the_hint_names_the_client_id_when_the_identity_environment_is_there() -> None:
    """A wrong client id with the managed identity endpoint (or the workload identity environment) set: the
    hint names the client id, not the variables that are already there."""
    endpoint = {"IDENTITY_ENDPOINT": "http://127.0.0.1:1/token", "IDENTITY_HEADER": "h"}
    managed = TokenCredentialSpec(type="managedIdentity", client_id="wrong-id")
    assert "check that client id wrong-id is a user-assigned identity" in identity.hint(managed, endpoint)
    assert "IDENTITY_ENDPOINT and IDENTITY_HEADER" in identity.hint(managed, {})  # nothing set: where to look
    federated = {
        "AZURE_TENANT_ID": "t",
        "AZURE_FEDERATED_TOKEN_FILE": "/var/run/token",
        "AZURE_CLIENT_ID": "c",
    }
    workload = TokenCredentialSpec(type="workloadIdentity")
    assert "client id c is the identity federated with this pod's ServiceAccount" in identity.hint(
        workload, federated
    )
    assert "AZURE_FEDERATED_TOKEN_FILE set" in identity.hint(workload, {})
