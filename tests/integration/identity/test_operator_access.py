"""The operator reads with its own Microsoft Entra ID identity only what an administrator allowed for the
resource's namespace (`operator.access`), and only in the Azure domains or those the policy adds: a resource
naming a host of its choice gets a refusal, and that host never sees the operator's token. The token endpoint
is azure-identity's managed identity protocol on 127.0.0.1; the store is Azurite over HTTPS; the hub the
emulator over TLS."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hubshift.errors import UserError
from hubshift.eventhubs import target as eventhubs_target
from hubshift.eventhubs.target import EventHubsTarget, Network, sdk_client
from hubshift.manifest import PartitionedConsumer, parse_manifest
from hubshift.operator.access import AZURE_DOMAINS, AccessPolicy, NamespaceAccess
from hubshift.operator.kubernetes.reconcile import open_cluster_loop
from hubshift.operator.kubernetes.render import Owner
from hubshift.operator.metrics import OperatorMetrics
from hubshift.spec import TokenCredentialSpec
from tests.fixtures.identity import Entra

OPERATOR = TokenCredentialSpec(type="managedIdentity")


class Collector:
    """An HTTPS server that records every Authorization header it is sent (a host a resource names)."""

    def __init__(self, entra: Entra) -> None:
        seen = self.authorizations = []

        class Handler(BaseHTTPRequestHandler):
            def do_any(self) -> None:
                seen.append(self.headers.get("Authorization"))
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_PUT = do_HEAD = do_POST = do_any

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(entra.tls.cert), str(entra.tls.key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/account"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector(entra: Entra) -> Iterator[Collector]:
    server = Collector(entra)
    try:
        yield server
    finally:
        server.stop()


def resource(entra: Entra, account_url: str, namespace: str = "team") -> PartitionedConsumer:
    credential = {"type": "default"}  # the resource's choice; the operator uses its own identity anyway
    return parse_manifest(
        {
            "apiVersion": "hubshift.dev/v1alpha1",
            "kind": "PartitionedConsumer",
            "metadata": {"name": "homes", "namespace": namespace, "uid": "u"},
            "spec": {
                "eventHubs": {"hub": "hub", "namespace": entra.namespace, "credential": credential},
                "checkpointStore": {
                    "blob": {"container": "access-store", "accountUrl": account_url, "credential": credential}
                },
            },
        }
    )


class Runtime:
    """What the loop needs of the Kubernetes runtime here: no Secrets (token credentials only), no pods."""

    owner = Owner("homes", "team", "u")

    async def connection_environment(self, consumer: PartitionedConsumer) -> dict[str, str]:
        return {}

    async def consumers(self) -> list[Any]:
        return []


def allowing(entra: Entra, *accounts: str) -> AccessPolicy:
    hosts = {entra.namespace, f"127.0.0.1:{entra.azurite.port}"}
    return AccessPolicy(
        {"team": NamespaceAccess(frozenset({entra.namespace}), frozenset(accounts))}, frozenset(hosts)
    )


@pytest.mark.timeout(120)
async def test_a_host_the_resource_names_never_receives_the_operators_token(
    entra: Entra, collector: Collector
) -> None:
    # The review's reproduction: a local HTTPS server named as the account URL received the operator's
    # bearer token for https://storage.azure.com/. Refused before anything is opened, by default...
    consumer = resource(entra, collector.url)
    with pytest.raises(UserError) as refused:
        await open_cluster_loop(consumer, Runtime(), OperatorMetrics(), identity=OPERATOR)  # type: ignore[arg-type]
    lines = str(refused.value).splitlines()  # every refusal, one line each
    assert [line.split(":")[0] for line in lines] == ["spec.eventHubs", "spec.checkpointStore.blob"]
    # ...and with the hub and the real account allowed, the collector's host is still not.
    policy = allowing(entra, entra.azurite.account_url)
    with pytest.raises(UserError) as refused:
        await open_cluster_loop(consumer, Runtime(), OperatorMetrics(), identity=OPERATOR, access=policy)  # type: ignore[arg-type]
    assert str(refused.value).startswith("spec.checkpointStore.blob: 127.0.0.1:")
    assert collector.authorizations == []
    assert entra.endpoint.issued == []  # no token was even asked for


@pytest.mark.timeout(120)
async def test_what_an_administrator_allowed_the_operator_reads_with_its_identity(entra: Entra) -> None:
    consumer = resource(entra, entra.azurite.account_url)
    policy = allowing(entra, entra.azurite.account_url)
    loop = await open_cluster_loop(consumer, Runtime(), OperatorMetrics(), identity=OPERATOR, access=policy)  # type: ignore[arg-type]
    await loop.close()
    assert entra.endpoint.issued  # the operator's own identity was used
    # The same resource in another Kubernetes namespace is refused: the listing is per namespace.
    elsewhere = resource(entra, entra.azurite.account_url, namespace="other")
    with pytest.raises(UserError, match="not allowed for namespace other"):
        await open_cluster_loop(elsewhere, Runtime(), OperatorMetrics(), identity=OPERATOR, access=policy)  # type: ignore[arg-type]


# --- what the SDKs dial, for an address the policy admits -------------------------------------------------

EVERYTHING = AccessPolicy({"*": NamespaceAccess(frozenset({"*"}), frozenset({"*"}))})
NAMESPACES = [
    "evil.example#.servicebus.windows.net",
    "evil.example/.servicebus.windows.net",
    "evil.example?.servicebus.windows.net",
    "evil.example\\.servicebus.windows.net",
    "u@evil.example.servicebus.windows.net",
    "evil.example:5671#.servicebus.windows.net",
    "myns.servicebus.windows.net",
    "myns.servicebus.windows.net:5671",
]
ACCOUNT_URLS = [
    "https://evil.example\\.blob.core.windows.net",
    "https://evil.example#.blob.core.windows.net",
    "https://evil.example?.blob.core.windows.net",
    "https://evil.example/.blob.core.windows.net",
    "https://acct.blob.core.windows.net@evil.example",
    "https://user@acct.blob.core.windows.net",
    "https://acct.blob.core.windows.net",
    "https://acct.blob.core.windows.net/",
]


class Resolver:
    """`socket.getaddrinfo` in its place: records every host a client asks for and answers that it has no
    address, so nothing connects anywhere (the SDKs resolve a name before they connect, in any thread)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, host: Any, *args: Any, **kwargs: Any) -> Any:
        self.asked.append(host.decode() if isinstance(host, bytes) else str(host))
        raise socket.gaierror(socket.EAI_NONAME, "no address (the test's resolver)")


class NoToken:
    """A token credential for both SDKs that is never asked (nothing connects)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("never-sent", 2**31)

    async def close(self) -> None:
        return None


class AsyncNoToken(NoToken):
    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:  # type: ignore[override]
        return NoToken.get_token(self)


def in_azure(service: str, host: str) -> bool:
    return any(host.lower().endswith(domain) for domain in AZURE_DOMAINS[service])  # type: ignore[index]


async def dialed_by_eventhubs(address: str, resolver: Resolver) -> set[str]:
    """The hosts the operator's probe (the asynchronous consumer client, as `sdk_client` makes it) asks
    for, over AMQP and over WebSockets, for a namespace of `address`."""
    from azure.eventhub.aio import EventHubConsumerClient

    asked: set[str] = set()
    for transport in ("amqp", "amqpWebSockets"):
        resolver.asked.clear()
        target = EventHubsTarget(None, address, "hub", "$Default", OPERATOR, Network(transport))  # type: ignore[arg-type]
        client = sdk_client(EventHubConsumerClient, target, consumer_group="$Default", retry_total=0)
        try:
            await asyncio.wait_for(client.get_partition_ids(), 20)
        except Exception:  # the client fails as it may; what it asked for is the point
            pass
        finally:
            await client.close()
        asked.update(resolver.asked)
    return asked


def dialed_by_storage(address: str, resolver: Resolver) -> set[str]:
    """The hosts the Blob SDK (the container client the store opens with a token credential) asks for."""
    from azure.storage.blob import ContainerClient

    resolver.asked.clear()
    try:
        client = ContainerClient(address, "store", credential=NoToken(), retry_total=0)
        client.get_container_properties()
    except Exception:  # as above
        pass
    return set(resolver.asked)


@pytest.mark.timeout(300)
async def test_where_every_host_is_allowed_the_sdks_dial_only_azure_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Security issue 35: under `"*"`, `evil.example#.servicebus.windows.net` (also with `/` or `?`) passed
    the policy's suffix test and azure-eventhub dialed evil.example; `https://evil.example\\.blob.core.
    windows.net` passed and azure-storage dialed evil.example, and the operator's probe sent its Entra token
    there. For each address, what the real SDK clients ask a resolver for: an address the policy admits is
    dialed only in the Azure domains."""
    resolver = Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    monkeypatch.setattr(eventhubs_target, "AsyncCredential", lambda identity: AsyncNoToken())
    outside: list[str] = []
    for address in NAMESPACES:
        asked = await dialed_by_eventhubs(address, resolver)
        assert asked, f"the Event Hubs client asked for no host for {address!r}"
        admitted = EVERYTHING.refusal("team", "eventHubs", address, "spec.eventHubs") is None
        if any(not in_azure("eventHubs", host) for host in asked):
            outside.append(address)
            assert not admitted, f"{address!r} is admitted, and the SDK dials {sorted(asked)}"
    for address in ACCOUNT_URLS:
        asked = await asyncio.to_thread(dialed_by_storage, address, resolver)
        admitted = EVERYTHING.refusal("team", "storage", address, "spec.checkpointStore.blob") is None
        if any(not in_azure("storage", host) for host in asked):
            outside.append(address)
            assert not admitted, f"{address!r} is admitted, and the SDK dials {sorted(asked)}"
    # The tricks are real: the SDKs dial a host outside Azure for these (so the checks above can fail).
    assert {
        "evil.example#.servicebus.windows.net",
        "evil.example/.servicebus.windows.net",
        "evil.example?.servicebus.windows.net",
        "https://evil.example\\.blob.core.windows.net",
    } <= set(outside)
    # And a plain host or account URL is still admitted.
    for address in ("myns.servicebus.windows.net", "myns.servicebus.windows.net:5671"):
        assert EVERYTHING.refusal("team", "eventHubs", address, "p") is None
    for address in ("https://acct.blob.core.windows.net", "https://acct.blob.core.windows.net/"):
        assert EVERYTHING.refusal("team", "storage", address, "p") is None
