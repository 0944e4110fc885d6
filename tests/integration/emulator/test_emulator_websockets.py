"""AMQP over WebSockets (the SDK's `TransportType.AmqpOverWebsocket`) and an HTTP proxy, with the real
azure-eventhub SDK against the emulator, which serves WebSockets on its AMQP port as a namespace does
(`/$servicebus/websocket`, subprotocol `AMQPWSB10`), over TLS too (`wss://`, as the service on 443). What
crosses the wire is read by a relay or the test proxy (`tests/harness/proxy.py`), so a client that quietly
fell back to plain AMQP would fail here."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.aio import EventHubConsumerClient as AsyncConsumerClient
from azure.eventhub.exceptions import EventHubError

from hubshift.emulator.launch import RunningEmulator
from hubshift.eventhubs.target import EventHubsTarget, Network, describe_error, parse_proxy, sdk_client
from tests.harness.identity import make_tls_files
from tests.harness.proxy import Tunnel, running_proxy

pytestmark = pytest.mark.timeout(120)

WEBSOCKETS = Network("amqpWebSockets")
UPGRADE = b"GET /$servicebus/websocket HTTP/1.1\r\n"


def target(emulator: RunningEmulator, namespace: str, network: Network) -> EventHubsTarget:
    return EventHubsTarget(emulator.connection_string, namespace, "hub", "$Default", network=network)


def send_and_receive(hub: EventHubsTarget, partition: str, count: int) -> list[str]:
    """`count` events sent to `partition` with a producer made for `hub`, then read back from the start by a
    consumer made for it."""
    with sdk_client(EventHubProducerClient, hub, retry_total=1) as producer:
        batch = producer.create_batch(partition_id=partition)
        for n in range(count):
            batch.add(EventData(f"event-{n}"))
        producer.send_batch(batch)
    received: list[str] = []
    consumer = sdk_client(EventHubConsumerClient, hub, consumer_group="$Default", retry_total=1)

    def on_event(_: Any, event: Any) -> None:
        received.append(event.body_as_str())
        if len(received) >= count:
            consumer.close()

    reader = threading.Thread(
        target=lambda: consumer.receive(on_event, partition_id=partition, starting_position="-1"), daemon=True
    )
    reader.start()
    reader.join(60)
    consumer.close()
    return received


def upgrades(tunnels: list[Tunnel]) -> list[bytes]:
    return [t.first_bytes for t in tunnels if t.first_bytes.startswith(UPGRADE)]


def test_the_sdk_sends_and_receives_over_websockets(emulator: RunningEmulator) -> None:
    with running_proxy(forward_to=("127.0.0.1", emulator.port)) as relay:
        hub = target(emulator, f"127.0.0.1:{relay.port}", WEBSOCKETS)
        assert send_and_receive(hub, "0", 5) == [f"event-{n}" for n in range(5)]
        assert relay.tunnels and len(upgrades(relay.tunnels)) == len(relay.tunnels), relay.tunnels
        assert all(b"Sec-WebSocket-Protocol: AMQPWSB10" in t.first_bytes for t in relay.tunnels)


def test_the_async_client_asks_over_websockets(emulator: RunningEmulator) -> None:
    async def properties(hub: EventHubsTarget) -> dict[str, Any]:
        async with sdk_client(AsyncConsumerClient, hub, consumer_group="$Default", retry_total=1) as client:
            result: dict[str, Any] = await client.get_partition_properties("1")
            return result

    with running_proxy(forward_to=("127.0.0.1", emulator.port)) as relay:
        hub = target(emulator, f"127.0.0.1:{relay.port}", WEBSOCKETS)
        assert asyncio.run(properties(hub))["id"] == "1"
        assert len(upgrades(relay.tunnels)) == len(relay.tunnels) > 0


def test_plain_amqp_still_works_on_the_same_port(emulator: RunningEmulator) -> None:
    with running_proxy(forward_to=("127.0.0.1", emulator.port)) as relay:
        hub = target(emulator, f"127.0.0.1:{relay.port}", Network("amqp"))
        # the connection string names the emulator's port: plain AMQP goes there, past the relay
        assert send_and_receive(hub, "2", 3) == ["event-0", "event-1", "event-2"]
        assert not relay.tunnels


def test_through_a_proxy_with_credentials_only(emulator: RunningEmulator) -> None:
    # `eventhubs.invalid` resolves only at the proxy: every connection must have crossed it
    hosts = {"eventhubs.invalid": "127.0.0.1"}
    namespace = f"eventhubs.invalid:{emulator.port}"
    with running_proxy(credentials=("corp\\user", "p@ss:word"), hosts=hosts) as proxy:
        proxied = Network(
            "amqpWebSockets", parse_proxy(f"http://127.0.0.1:{proxy.port}", "corp\\user:p@ss:word")
        )
        hub = target(emulator, namespace, proxied)
        assert send_and_receive(hub, "3", 4) == [f"event-{n}" for n in range(4)]

        async def ask() -> list[str]:
            async with sdk_client(AsyncConsumerClient, hub, consumer_group="$Default") as client:
                ids: list[str] = await client.get_partition_ids()
                return ids

        assert asyncio.run(ask()) == ["0", "1", "2", "3"]
        assert {t.target for t in proxy.tunnels} == {namespace}
        assert len(upgrades(proxy.tunnels)) == len(proxy.tunnels) >= 3
        assert proxy.refused == 0

        wrong = target(emulator, namespace, Network("amqpWebSockets", parse_proxy(proxy.url, "u:nope")))
        with (
            pytest.raises(EventHubError) as refused,
            sdk_client(EventHubProducerClient, wrong, retry_total=0) as producer,
        ):
            producer.get_partition_ids()
        line = describe_error(refused.value, wrong)
        assert line == (
            f"Event Hubs namespace {namespace}, hub 'hub': the proxy 127.0.0.1:{proxy.port} refused its "
            "credentials (check the proxy's USER:PASSWORD)"
        )
        assert "nope" not in str(refused.value) and "nope" not in line
        assert proxy.refused >= 1


def test_a_websocket_must_ask_for_amqp(emulator: RunningEmulator) -> None:
    base = f"http://127.0.0.1:{emulator.port}"
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"}
    upgrade["Sec-WebSocket-Key"] = "dGhlIHNhbXBsZSBub25jZQ=="
    for path, headers, status in (
        ("/$servicebus/websocket", upgrade, 400),  # no AMQPWSB10 subprotocol
        ("/elsewhere", upgrade, 404),
    ):
        request = urllib.request.Request(base + path, headers=headers)
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=10)
        assert answer.value.code == status, path
    # the AMQP side is untouched
    with running_proxy(forward_to=("127.0.0.1", emulator.port)) as relay:
        assert send_and_receive(target(emulator, f"127.0.0.1:{relay.port}", WEBSOCKETS), "1", 1) == [
            "event-0"
        ]


def test_websockets_over_tls_as_the_service_serves_them(
    tmp_path: Path, emulator_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = make_tls_files(tmp_path / "tls")
    emulator = emulator_factory(["hub:2"], tls=tls.pair)
    for name, value in tls.client_environ().items():
        monkeypatch.setenv(name, value)
    # without the emulator's flag the SDK speaks TLS: wss://127.0.0.1:PORT/$servicebus/websocket
    connection_string = f"Endpoint=sb://{emulator.tls_namespace};SharedAccessKeyName=k;SharedAccessKey=v"
    hub = EventHubsTarget(connection_string, emulator.tls_namespace, "hub", "$Default", network=WEBSOCKETS)
    assert send_and_receive(hub, "1", 2) == ["event-0", "event-1"]

    async def ids() -> list[str]:
        async with sdk_client(AsyncConsumerClient, hub, consumer_group="$Default") as client:
            found: list[str] = await client.get_partition_ids()
            return found

    assert asyncio.run(ids()) == ["0", "1"]
