"""The operator reads with its own Microsoft Entra ID identity only what an administrator allowed for the
resource's namespace (`operator.access`), and only in the Azure domains or those the policy adds: a resource
naming a host of its choice gets a refusal, and that host never sees the operator's token. The token endpoint
is azure-identity's managed identity protocol on 127.0.0.1; the store is Azurite over HTTPS; the hub the
emulator over TLS."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumer, parse_manifest
from hubshift.operator.access import AccessPolicy, NamespaceAccess
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
    assert "spec.eventHubs" in str(refused.value) and "(and 1 more)" in str(refused.value)
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
