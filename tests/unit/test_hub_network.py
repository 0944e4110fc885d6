"""How a hub is reached, without a server: `transport` and `proxy` on every hub block (a proxy means AMQP over
WebSockets, its USER:PASSWORD comes from a Secret as a connection of its hub's role), the command line's
`--transport`/`--proxy`, the SDK clients made from them, and messages that never show a proxy's password."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from hubshift.apps.group import GroupArgs
from hubshift.connections import chosen_network
from hubshift.errors import UserError
from hubshift.eventhubs.target import (
    EventHubsTarget,
    Network,
    Proxy,
    describe_error,
    hub_target,
    parse_proxy,
    resolve_target,
    sdk_client,
)
from hubshift.manifest import connections_of, parse_manifest, with_credential
from hubshift.operator.kubernetes.render import secret_env
from hubshift.spec import DEFAULT_PROXY_ENV, EventHubsSpec, TokenCredentialSpec

CONNECTION_STRING = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"
PROXY = {"url": "http://proxy.corp:3128", "credentialsSecretRef": {"name": "proxy", "key": "credentials"}}


def manifest(event_hubs: dict[str, Any], pipeline: dict[str, Any] | None = None) -> dict[str, Any]:
    consumer: dict[str, Any] = {"sink": {"type": "folder", "folder": {"path": "/out"}}}
    if pipeline is not None:
        consumer["pipeline"] = pipeline
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "homes"},
        "spec": {
            "eventHubs": {"hub": "homes", **event_hubs},
            "checkpointStore": {"sqlite": {"path": "/x.db"}},
            "consumer": consumer,
        },
    }


# --- the model ----------------------------------------------------------------------------------------


def test_transport_defaults_to_amqp_and_a_proxy_means_websockets() -> None:
    assert EventHubsSpec(hub="h").websockets is False
    assert EventHubsSpec.model_validate({"hub": "h", "transport": "amqpWebSockets"}).websockets
    assert EventHubsSpec.model_validate({"hub": "h", "proxy": PROXY}).websockets
    with pytest.raises(ValidationError, match="a proxy carries AMQP over WebSockets"):
        EventHubsSpec.model_validate({"hub": "h", "transport": "amqp", "proxy": PROXY})
    rules = [rule["message"] for rule in EventHubsSpec.cel_rules()]
    assert any("a proxy carries AMQP over WebSockets" in message for message in rules)


@pytest.mark.parametrize(
    "url",
    ["https://proxy:3128", "http://user:secret@proxy:3128", "http://proxy", "proxy:3128", "http://p:1/path"],
)
def test_a_proxy_url_is_http_host_and_port_without_credentials(url: str) -> None:
    with pytest.raises(ValidationError):
        EventHubsSpec.model_validate({"hub": "h", "proxy": {"url": url}})


def test_a_proxys_credentials_are_a_secret_the_pods_and_the_operator_get() -> None:
    consumer = parse_manifest(
        manifest(
            {"connectionStringSecretRef": {"name": "eh", "key": "cs"}, "proxy": PROXY},
            {
                "type": "replicate",
                "replicate": {
                    "hub": "copy",
                    "proxy": {"url": "http://other:8080", "credentialsEnv": "OTHER_PROXY"},
                },
            },
        )
    )
    named = {n.path: n for n in connections_of(consumer.spec)}
    assert list(named)[-2:] == ["spec.eventHubs.proxy", "spec.consumer.pipeline.replicate.proxy"]
    assert named["spec.eventHubs.proxy"].role == "source"  # the operator's probe reads the source through it
    assert named["spec.consumer.pipeline.replicate.proxy"].role == "pipeline"
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in secret_env(consumer)}
    assert env[DEFAULT_PROXY_ENV] == {"name": "proxy", "key": "credentials"}
    assert "OTHER_PROXY" not in env  # no Secret named: the variable is the pod's own business
    # --credential replaces connection strings, never a proxy's credentials
    chosen = TokenCredentialSpec(type="managedIdentity")
    behind = parse_manifest(manifest({"namespace": "ns.servicebus.windows.net", "proxy": PROXY}))
    keyless = with_credential(behind, chosen)
    assert keyless.spec.event_hubs.credential == chosen
    assert keyless.spec.event_hubs.proxy == behind.spec.event_hubs.proxy
    assert [e["name"] for e in secret_env(keyless)] == [DEFAULT_PROXY_ENV]


def test_a_proxy_without_credentials_is_no_connection() -> None:
    consumer = parse_manifest(manifest({"proxy": {"url": "http://proxy.corp:3128"}}))
    assert [n.path for n in connections_of(consumer.spec)] == ["spec.eventHubs"]


# --- from the spec and the environment to a target --------------------------------------------------


def test_the_target_carries_the_network_with_the_proxys_credentials() -> None:
    spec = EventHubsSpec.model_validate({"hub": "homes", "proxy": PROXY})
    environ = {"HUBSHIFT_EVENTHUBS_CONNECTION_STRING": CONNECTION_STRING, DEFAULT_PROXY_ENV: "svc:pa:ss@"}
    target = resolve_target(spec, environ)
    assert target.network == Network("amqpWebSockets", Proxy("proxy.corp", 3128, "svc", "pa:ss@"))
    assert "pa:ss@" not in repr(target)
    with pytest.raises(UserError) as missing:
        resolve_target(spec, {"HUBSHIFT_EVENTHUBS_CONNECTION_STRING": CONNECTION_STRING})
    assert str(missing.value) == (
        f"environment variable {DEFAULT_PROXY_ENV} is not set: it must hold the USER:PASSWORD of the proxy "
        "spec.eventHubs.proxy names (in a cluster, set spec.eventHubs.proxy.credentialsSecretRef)"
    )
    plain = resolve_target(
        EventHubsSpec.model_validate({"hub": "homes", "transport": "amqpWebSockets"}),
        {"HUBSHIFT_EVENTHUBS_CONNECTION_STRING": CONNECTION_STRING},
    )
    assert plain.network == Network("amqpWebSockets")


def test_a_namespace_beside_a_connection_string_must_be_its_endpoint() -> None:
    """Security issue 35: a block naming its connection string's Secret and `namespace: HOST:PORT` with
    `transport: amqpWebSockets` had the SDK send a SAS token signed with that key to HOST. The namespace a
    block names must be the connection string's Endpoint (in any case); the message names the field and
    never the key."""
    environ = {"HUBSHIFT_EVENTHUBS_CONNECTION_STRING": CONNECTION_STRING}
    for namespace in ("evil.example:443", "other.servicebus.windows.net"):
        spec = EventHubsSpec.model_validate(
            {"hub": "homes", "namespace": namespace, "transport": "amqpWebSockets"}
        )
        with pytest.raises(UserError) as refused:
            resolve_target(spec, environ)
        assert str(refused.value) == (
            f"spec.eventHubs.namespace: {namespace} is not the namespace of the connection string in "
            "HUBSHIFT_EVENTHUBS_CONNECTION_STRING (its Endpoint); leave namespace out, or name the same one"
        )
    same = EventHubsSpec.model_validate({"hub": "homes", "namespace": "ns.servicebus.windows.net"})
    assert resolve_target(same, environ).fqns == "ns.servicebus.windows.net"
    upper = {"HUBSHIFT_EVENTHUBS_CONNECTION_STRING": CONNECTION_STRING.replace("sb://ns.", "sb://NS.")}
    assert resolve_target(same, upper).fqns == "ns.servicebus.windows.net"
    assert resolve_target(EventHubsSpec(hub="homes"), environ).fqns == "ns.servicebus.windows.net"


def test_a_command_lines_hub_is_checked_as_a_manifests() -> None:
    """`hubshift status` and `produce` reach their hub the way a manifest does (`hub_target`): the
    connection string's Endpoint is the namespace, the hub its EntityPath names, a credential needs the
    namespace; each refusal names the option, never the key."""
    options = {
        "fqns": "ns.servicebus.windows.net",
        "hub": "homes",
        "consumer_group": "$Default",
        "store": "sqlite:///x.db",
        "container": None,
        "eventhubs": CONNECTION_STRING,
        "credential": None,
        "client_id": None,
        "transport": None,
        "proxy": None,
    }
    target = GroupArgs.from_options(options).target()
    assert target == EventHubsTarget(CONNECTION_STRING, "ns.servicebus.windows.net", "homes", "$Default")
    assert GroupArgs.from_options({**options, "eventhubs": None}).target() is None
    with pytest.raises(UserError) as elsewhere:
        GroupArgs.from_options({**options, "fqns": "other.servicebus.windows.net"}).target()
    assert str(elsewhere.value) == (
        "--namespace: other.servicebus.windows.net is not the namespace of the connection string in "
        "--eventhubs (HUBSHIFT_EVENTHUBS) (its Endpoint); name the one the connection string's Endpoint names"
    )
    with pytest.raises(UserError) as other_hub:
        hub_target("homes", connection_string=f"{CONNECTION_STRING};EntityPath=doors", source="--cs")
    assert str(other_hub.value) == "--cs: the connection string is for hub 'doors', not 'homes'"
    with pytest.raises(UserError) as no_key:
        hub_target("homes", connection_string="SharedAccessKey=v", source="--cs")
    assert str(no_key.value).startswith("--cs: not an Event Hubs connection string") and "=v" not in str(
        no_key.value
    )
    with pytest.raises(UserError, match="--namespace: a token credential needs the namespace"):
        hub_target("homes", identity=TokenCredentialSpec(type="default"), namespace_from="--namespace")


def test_the_command_lines_proxy() -> None:
    assert chosen_network(None, None) == Network("amqp")
    assert chosen_network("amqpWebSockets", None) == Network("amqpWebSockets")
    assert chosen_network(None, "http://u%40corp:p%3Aw@10.0.0.1:8080") == Network(
        "amqpWebSockets", Proxy("10.0.0.1", 8080, "u@corp", "p:w")
    )
    with pytest.raises(UserError, match="--proxy carries AMQP over WebSockets"):
        chosen_network("amqp", "http://10.0.0.1:8080")
    for bad in ("socks5://u:hunter2@h:1", "http://u:hunter2@h", "h:1", "http://u:hunter2@h:1/x"):
        with pytest.raises(UserError) as refused:
            parse_proxy(bad)
        assert "hunter2" not in str(refused.value)
        assert str(refused.value) == "--proxy: expected an HTTP proxy as http://[USER:PASSWORD@]HOST:PORT"


# --- the SDK clients ----------------------------------------------------------------------------------


class Recorder:
    made: ClassVar[list[dict[str, Any]]] = []

    @classmethod
    def from_connection_string(cls, *args: Any, **kwargs: Any) -> Recorder:
        cls.made.append(kwargs)
        return cls.__new__(cls)


class AsyncRecorder(Recorder):
    pass


AsyncRecorder.__module__ = "azure.eventhub.aio._recorder"  # what sdk_client reads to tell them apart


def test_sdk_clients_get_websockets_the_port_and_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    Recorder.made.clear()
    proxy = Proxy("proxy.corp", 3128, "svc", "secret")
    for namespace, network, client in (
        ("ns.servicebus.windows.net", Network("amqpWebSockets"), Recorder),
        ("127.0.0.1:5999", Network("amqpWebSockets", proxy), Recorder),
        ("127.0.0.1:5999", Network("amqpWebSockets", proxy), AsyncRecorder),
        ("127.0.0.1:5999", Network("amqp"), Recorder),
    ):
        sdk_client(client, EventHubsTarget(CONNECTION_STRING, namespace, "h", "$Default", network=network))
    service, synchronous, asynchronous, plain = Recorder.made
    assert service["transport_type"].name == "AmqpOverWebsocket"
    assert "custom_endpoint_address" not in service and "http_proxy" not in service
    assert synchronous["custom_endpoint_address"] == "sb://127.0.0.1:5999"  # the SDK would drop the port
    assert synchronous["http_proxy"] == {
        "proxy_hostname": "proxy.corp",
        "proxy_port": 3128,
        "username": "svc",
        "password": "secret",
    }
    assert asynchronous["http_proxy"]["proxy_hostname"] == "http://proxy.corp"  # aiohttp takes a URL
    assert plain == {"eventhub_name": "h"}  # plain AMQP: the SDK as it is


def test_errors_name_the_proxy_never_its_password() -> None:
    target = EventHubsTarget(
        CONNECTION_STRING,
        "ns.servicebus.windows.net",
        "h",
        "$Default",
        network=Network("amqpWebSockets", Proxy("proxy.corp", 3128, "svc", "hunter2")),
    )
    assert describe_error(RuntimeError("failed CONNECT via proxy status: 407"), target).endswith(
        "the proxy proxy.corp:3128 refused its credentials (check the proxy's USER:PASSWORD)"
    )
    assert describe_error(ConnectionRefusedError("Connection refused"), target).endswith(
        "cannot connect over WebSockets through proxy proxy.corp:3128 (is the namespace reachable from here?)"
    )
    quoted = describe_error(RuntimeError("bad gateway from http://svc:hunter2@proxy.corp:3128/"), target)
    assert "hunter2" not in quoted and "http://proxy.corp:3128/" in quoted
