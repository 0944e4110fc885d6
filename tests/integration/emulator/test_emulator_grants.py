"""What a token put on `$cbs` allows, with Microsoft Entra ID tokens (JWTs) as the service checks them: the
scope its put-token names (the namespace or one hub), the rights its roles carry (Data Sender, Receiver,
Owner), its issuer exactly; and no SAS token at all when the emulator has only JWT keys. Over the wire with
a hand-written peer (to put what the SDK never would), and with the SDK itself over TLS."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient, TransportType
from azure.eventhub._pyamqp import _decode as pyamqp_decode
from azure.eventhub._pyamqp import _encode as pyamqp_encode
from azure.eventhub._pyamqp.message import Message, Properties
from azure.eventhub.exceptions import EventHubError
from emulator_clients import RawPeer, wait_until

from hubshift.emulator import performatives
from hubshift.emulator.codec import UInt
from hubshift.emulator.launch import RunningEmulator
from tests.harness.identity import ISSUER, SigningKey, TlsFiles, token_claims

pytestmark = pytest.mark.timeout(120)

EVENTHUBS = "https://eventhubs.azure.net/"
RECEIVER, SENDER, OWNER = (f"Azure Event Hubs Data {role}" for role in ("Receiver", "Sender", "Owner"))


def jwt(key: SigningKey, *roles: str, **changes: Any) -> str:
    claims = token_claims(EVENTHUBS, 3600, client_id="app")
    if roles:
        claims["roles"] = list(roles)
    claims.update(changes)
    return key.sign(claims)


@pytest.fixture
def jwt_emulator(emulator_factory: Any, signing_key: SigningKey, tmp_path: Path) -> RunningEmulator:
    """JWT keys and no SAS key: the way a namespace with local authentication disabled works."""
    return emulator_factory(
        ["hub:2", "other:1"],
        jwt_keys=signing_key.write_public(tmp_path / "signing.pem"),
        extra_args=["--jwt-issuer", ISSUER],
    )


class Cbs:
    """A connection that puts tokens on `$cbs` and attaches links, frame by frame."""

    def __init__(self, peer: RawPeer) -> None:
        self.peer = peer
        self.message_id = 0
        self.handle = 2
        peer.open()
        peer.attach(0, "$cbs")
        peer.attach(1, "$cbs", sender=False)

    def put(self, name: str, token: str, token_type: str = "jwt") -> tuple[int, str]:
        self.message_id += 1
        message = Message(
            value=token,
            properties=Properties(message_id=self.message_id),
            application_properties={"name": name, "operation": "put-token", "type": token_type},
        )
        payload = bytearray()
        pyamqp_encode.encode_payload(payload, message)
        self.peer.send(
            0,
            performatives.Transfer(UInt(0), UInt(self.message_id), b"t", UInt(0), False, False),
            bytes(payload),
        )
        reply = pyamqp_decode.decode_payload(self.peer.expect(0x14).fields[-1]).application_properties
        return reply[b"status-code"], reply[b"status-description"].decode()

    def attach(self, address: str, *, sender: bool) -> str | None:
        """None when the link is attached; else the error condition and description it was refused with."""
        self.handle += 1
        self.peer.attach(self.handle, address, sender=sender)
        attached = self.peer.expect(0x12)
        if attached.fields[6 if sender else 5] is not None:
            return None
        detached = self.peer.expect(0x16)
        return f"{detached.error_condition}: {detached.fields[2][1].decode()}"


def test_a_token_covers_the_scope_it_was_put_for_with_the_rights_of_its_roles(
    jwt_emulator: RunningEmulator, signing_key: SigningKey
) -> None:
    """A token put with name '' (or any host) covered every hub of the namespace for send and listen,
    whatever its roles."""
    receive_0 = "amqps://127.0.0.1/hub/ConsumerGroups/$Default/Partitions/0"
    with RawPeer(jwt_emulator.port) as peer:
        cbs = Cbs(peer)
        receiver = jwt(signing_key, RECEIVER)
        for name in ("", "hub", "sb://elsewhere.example/hub", "sb://127.0.0.1/hub/anything"):
            status, description = cbs.put(name, receiver)
            assert status == 400 and description.startswith("InvalidAudience"), name
        assert cbs.attach(receive_0, sender=False) is not None  # nothing granted yet
        assert cbs.put("sb://127.0.0.1:5671/hub", receiver) == (202, "Accepted")
        assert cbs.attach(receive_0, sender=False) is None
        refused = cbs.attach("amqps://127.0.0.1/hub", sender=True)
        assert refused == (
            "amqp:unauthorized-access: Unauthorized access. 'Send' claim(s) are required to perform this "
            "operation. Resource: 'amqps://127.0.0.1/hub'."
        )
        other = cbs.attach("amqps://127.0.0.1/other/ConsumerGroups/$Default/Partitions/0", sender=False)
        assert other is not None and other.startswith("amqp:unauthorized-access")


def test_a_namespace_token_covers_every_hub_with_its_rights(
    jwt_emulator: RunningEmulator, signing_key: SigningKey
) -> None:
    with RawPeer(jwt_emulator.port) as peer:
        cbs = Cbs(peer)
        assert cbs.put("sb://127.0.0.1/", jwt(signing_key, SENDER))[0] == 202
        assert cbs.attach("amqps://127.0.0.1/hub/Partitions/1", sender=True) is None
        assert cbs.attach("amqps://127.0.0.1/other", sender=True) is None
        listen = cbs.attach("amqps://127.0.0.1/other/ConsumerGroups/$Default/Partitions/0", sender=False)
        assert listen is not None and "'Listen' claim(s) are required" in listen
        # a token without an Event Hubs role is valid, and allows nothing
        assert cbs.put("sb://127.0.0.1/", jwt(signing_key))[0] == 202
        assert cbs.attach("amqps://127.0.0.1/hub/Partitions/1", sender=True) is not None


def test_with_only_jwt_keys_no_sas_token_is_accepted(jwt_emulator: RunningEmulator) -> None:
    """A garbage SAS token was accepted (as if the emulator had no key at all), for every hub."""
    with RawPeer(jwt_emulator.port) as peer:
        cbs = Cbs(peer)
        for token in ("SharedAccessSignature sr=x&sig=y&se=1&skn=z", "garbage"):
            status, description = cbs.put("sb://127.0.0.1/hub", token, "servicebus.windows.net:sastoken")
            assert status == 401 and "Microsoft Entra ID tokens only" in description
        assert cbs.attach("amqps://127.0.0.1/hub", sender=True) is not None


def test_the_issuer_is_compared_exactly(jwt_emulator: RunningEmulator, signing_key: SigningKey) -> None:
    with RawPeer(jwt_emulator.port) as peer:
        cbs = Cbs(peer)
        evil = jwt(signing_key, OWNER, iss=ISSUER.rstrip("/") + "evil/")
        assert cbs.put("sb://127.0.0.1/hub", evil) == (401, "InvalidIssuer: Token issuer is invalid.")
        assert cbs.put("sb://127.0.0.1/hub", jwt(signing_key, OWNER, iss=ISSUER.rstrip("/")))[0] == 202


# --- the SDK with token credentials over TLS -------------------------------------------------------------


class RoleCredential:
    """A token credential whose tokens carry the given Event Hubs roles (signed by the trusted key)."""

    def __init__(self, key: SigningKey, *roles: str) -> None:
        self.key = key
        self.roles = roles

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        token = jwt(self.key, *self.roles)
        return AccessToken(token, int(time.time()) + 3600)


@pytest.fixture
def tls_emulator(
    emulator_factory: Any,
    signing_key: SigningKey,
    tls_files: TlsFiles,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> RunningEmulator:
    for name, value in tls_files.client_environ().items():
        monkeypatch.setenv(name, value)
    return emulator_factory(
        ["hub:2"],
        tls=tls_files.pair,
        jwt_keys=signing_key.write_public(tmp_path / "signing.pem"),
        extra_args=["--jwt-issuer", ISSUER],
    )


def test_the_sdk_sends_with_a_sender_role_and_receives_with_a_receiver_role(
    tls_emulator: RunningEmulator, signing_key: SigningKey, tls_files: TlsFiles
) -> None:
    namespace = tls_emulator.tls_namespace
    assert namespace is not None
    # AMQP over TLS to the emulator's port, trusting the test authority (as hubshift's sdk_client does)
    options: dict[str, Any] = {
        "custom_endpoint_address": f"sb://{namespace}",
        "transport_type": TransportType.Amqp,
        "connection_verify": str(tls_files.ca),
        "retry_total": 0,
    }

    def producer(*roles: str) -> EventHubProducerClient:
        return EventHubProducerClient(namespace, "hub", RoleCredential(signing_key, *roles), **options)

    with producer(SENDER) as client:
        assert client.get_partition_ids() == ["0", "1"]
        client.send_event(EventData("sent by a sender"), partition_id="0")
    with producer(RECEIVER) as client, pytest.raises(EventHubError, match="'Send' claim"):
        client.send_event(EventData("not allowed"), partition_id="0")

    def received(*roles: str) -> tuple[list[bytes], list[BaseException]]:
        bodies: list[bytes] = []
        errors: list[BaseException] = []
        client = EventHubConsumerClient(
            namespace, "hub", "$Default", RoleCredential(signing_key, *roles), **options
        )

        def on_event(_context: Any, event: Any) -> None:
            bodies.append(b"".join(event.body))

        thread = threading.Thread(
            target=client.receive,
            kwargs={
                "on_event": on_event,
                "on_error": lambda _context, error: errors.append(error),
                "partition_id": "0",
                "starting_position": "-1",
            },
            daemon=True,
        )
        thread.start()
        wait_until(lambda: bool(bodies or errors), 20)
        client.close()
        thread.join(15)
        return bodies, errors

    assert received(RECEIVER) == ([b"sent by a sender"], [])
    bodies, errors = received(SENDER)
    assert bodies == [] and any("'Listen' claim" in str(error) for error in errors), errors
