"""Microsoft Entra ID tokens at the emulator's `$cbs`: a JWT is accepted only when signed by a trusted key,
for an Event Hubs audience, from the expected issuer, within its lifetime, each refusal with the service's
kind of error; SAS tokens keep their own rules beside it; and a producer's delivery annotations are kept
and merged with the runtime metric's."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
from azure.eventhub._pyamqp import _decode as pyamqp_decode
from azure.eventhub._pyamqp.utils import generate_sas_token
from cryptography.hazmat.primitives import serialization

from hubshift.emulator.cbs import (
    ALL_RIGHTS,
    LISTEN,
    MANAGE,
    SEND,
    Authorizer,
    Entity,
    Grants,
    SasAuthorizer,
    parse_entity,
    token_scope,
)
from hubshift.emulator.messages import (
    DELIVERY_ANNOTATIONS_PREFIX,
    merge_delivery_annotations,
    runtime_metric_entries,
    stamp_event,
    unpack_event,
)
from hubshift.emulator.tokens import JwtVerifier, load_keys
from hubshift.errors import UserError
from tests.harness.identity import ISSUER, SigningKey, token_claims

NOW = 1_800_000_000.0
EVENTHUBS = "https://eventhubs.azure.net/"


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey()


@pytest.fixture
def verifier(key: SigningKey, tmp_path: Path) -> JwtVerifier:
    return JwtVerifier(load_keys(key.write_public(tmp_path / "key.pem")), issuers=[ISSUER], clock=lambda: NOW)


def token(key: SigningKey, **changes: object) -> str:
    claims = token_claims(EVENTHUBS, 3600, client_id="cid", now=NOW - 10)
    claims.update(changes)
    return key.sign(claims)


def test_a_signed_token_for_event_hubs_is_accepted_until_it_expires(
    key: SigningKey, verifier: JwtVerifier
) -> None:
    verdict = verifier.verify(token(key))
    assert (verdict.status_code, verdict.description) == (202, "Accepted")
    assert verdict.expires_at_ms == int(NOW - 10 + 3600) * 1000
    assert verifier.verify(token(key, aud=["other", "https://eventhubs.azure.net"])).accepted


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        (
            {"exp": int(NOW) - 1},
            "ExpiredToken: The token is expired. Expiration time: '2027-01-15T07:59:59Z'.",
        ),
        ({"exp": int(NOW)}, "ExpiredToken"),
        ({"nbf": int(NOW) + 60}, "InvalidToken: The token is not valid before"),
        ({"aud": "https://storage.azure.com"}, "InvalidAudience"),
        ({"iss": "https://sts.example.com/tenant/"}, "InvalidIssuer: Token issuer is invalid."),
        ({"exp": None}, "InvalidToken: The token has no expiration time."),
    ],
)
def test_a_token_is_refused_with_the_services_kind_of_error(
    key: SigningKey, verifier: JwtVerifier, changes: dict[str, object], refusal: str
) -> None:
    verdict = verifier.verify(token(key, **changes))
    assert verdict.status_code == 401
    assert verdict.description.startswith(refusal)


def test_a_token_signed_by_another_key_or_not_at_all_is_refused(
    key: SigningKey, verifier: JwtVerifier
) -> None:
    assert (
        verifier.verify(token(SigningKey())).description
        == "InvalidSignature: The token has an invalid signature."
    )
    header, payload, _ = token(key).split(".")
    unsigned = base64.urlsafe_b64encode(json.dumps({"alg": "none"}).encode()).rstrip(b"=").decode()
    assert verifier.verify(f"{unsigned}.{payload}.").description.startswith("InvalidSignature")
    forged = token(key, aud=EVENTHUBS)
    tampered_claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    tampered_claims["exp"] += 86400
    tampered = base64.urlsafe_b64encode(json.dumps(tampered_claims).encode()).rstrip(b"=").decode()
    assert not verifier.verify(f"{header}.{tampered}.{forged.split('.')[2]}").accepted
    for garbage in ("not a token", "a.b.c", b"\xff", 42):
        assert verifier.verify(garbage).status_code == 401


def test_keys_from_certificates_and_a_json_web_key_set(key: SigningKey, tmp_path: Path) -> None:
    numbers = key.private.public_key().public_numbers()

    def b64(value: int) -> str:
        return (
            base64.urlsafe_b64encode(value.to_bytes((value.bit_length() + 7) // 8, "big"))
            .rstrip(b"=")
            .decode()
        )

    jwks = tmp_path / "keys.json"
    jwks.write_text(
        json.dumps({"keys": [{"kty": "RSA", "kid": key.kid, "n": b64(numbers.n), "e": b64(numbers.e)}]})
    )
    assert JwtVerifier(load_keys(jwks), issuers=[ISSUER], clock=lambda: NOW).verify(token(key)).accepted
    other = SigningKey()
    both = tmp_path / "both.pem"
    both.write_bytes(
        b"".join(
            k.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            for k in (other, key)
        )
    )
    assert JwtVerifier(load_keys(both), issuers=[ISSUER], clock=lambda: NOW).verify(token(key)).accepted
    (tmp_path / "empty.pem").write_text("nothing here")
    with pytest.raises(UserError, match="no RSA public key"):
        load_keys(tmp_path / "empty.pem")


def test_sas_and_bearer_tokens_side_by_side(key: SigningKey, verifier: JwtVerifier) -> None:
    audience = "sb://127.0.0.1:5671/hub"
    both = Authorizer(SasAuthorizer("secret", clock=lambda: NOW), verifier)
    assert both.verify(token(key), audience, "jwt").accepted
    assert both.verify(token(key), audience).accepted  # a $management security_token: told by its form
    assert not both.verify(token(SigningKey()), audience, "jwt").accepted
    sas = generate_sas_token(audience, "RootManageSharedAccessKey", "secret", int(NOW) + 60)
    assert both.verify(sas, audience, "servicebus.windows.net:sastoken").rights == ALL_RIGHTS
    keyed = Authorizer(SasAuthorizer("secret", clock=time.time))
    assert keyed.verify(token(key), audience, "jwt").status_code == 401  # no JWT keys: the SAS rules
    assert not Authorizer(SasAuthorizer(None, clock=time.time)).enforcing


@pytest.mark.parametrize(
    "sas",
    ["SharedAccessSignature sr=x&sig=y&se=1&skn=z", "garbage", ""],
)
def test_with_only_jwt_keys_a_sas_token_is_refused(verifier: JwtVerifier, sas: str) -> None:
    """It was accepted, any string at all, as if no key were configured: every hub was open to it."""
    jwt_only = Authorizer(SasAuthorizer(None, clock=lambda: NOW), verifier)
    assert jwt_only.enforcing
    verdict = jwt_only.verify(sas, "sb://h/hub", "servicebus.windows.net:sastoken")
    assert verdict.status_code == 401 and not verdict.rights
    assert verdict.description.startswith("InvalidToken: this namespace takes Microsoft Entra ID tokens")
    assert not jwt_only.verify(sas, "sb://h/hub").accepted  # untyped ($management): a SAS, or a bad JWT


def test_issuers_are_compared_exactly_but_for_a_trailing_slash(key: SigningKey, tmp_path: Path) -> None:
    """The issuer was a prefix: `.../TENANT-Aevil/` passed under `.../TENANT-A`."""
    keys = load_keys(key.write_public(tmp_path / "key.pem"))
    without_slash = JwtVerifier(keys, issuers=[ISSUER.rstrip("/")], clock=lambda: NOW)
    assert without_slash.verify(token(key, iss=ISSUER)).accepted
    assert without_slash.verify(token(key, iss=ISSUER.rstrip("/"))).accepted
    for other in (ISSUER.rstrip("/") + "evil/", ISSUER + "v2.0", ISSUER.upper(), "", None, 7):
        verdict = without_slash.verify(token(key, iss=other))
        assert verdict.description == "InvalidIssuer: Token issuer is invalid.", other
    with pytest.raises(ValueError, match="issuers"):
        JwtVerifier(keys, issuers=[], clock=lambda: NOW)


def test_jwt_keys_without_an_issuer_are_one_clear_error(key: SigningKey, tmp_path: Path) -> None:
    """Any issuer was accepted by default: a token from any tenant passed."""
    import asyncio

    from hubshift.emulator.config import EmulatorSettings
    from hubshift.emulator.server import EmulatorServer

    settings = EmulatorSettings(port=0, jwt_keys=key.write_public(tmp_path / "key.pem"))
    with pytest.raises(UserError, match="--jwt-key needs --jwt-issuer"):
        asyncio.run(EmulatorServer(settings).start())


@pytest.mark.parametrize(
    ("roles", "rights"),
    [
        (["Azure Event Hubs Data Owner"], {SEND, LISTEN, MANAGE}),
        (["Azure Event Hubs Data Sender"], {SEND}),
        (["Azure Event Hubs Data Receiver"], {LISTEN}),
        (["azure event hubs data receiver", "Azure Event Hubs Data Sender"], {SEND, LISTEN}),
        ("Azure Event Hubs Data Receiver", {LISTEN}),
        (["Storage Blob Data Owner", "Reader"], set()),
        (None, set()),
    ],
)
def test_a_tokens_roles_are_its_rights(
    key: SigningKey, verifier: JwtVerifier, roles: object, rights: set[str]
) -> None:
    """The roles claim was ignored: a token for any role could send and listen."""
    verdict = verifier.verify(token(key, roles=roles))
    assert verdict.accepted and verdict.rights == rights


@pytest.mark.parametrize(
    ("name", "scope"),
    [
        ("sb://ns.example/", Entity("ns.example", ())),
        ("sb://NS.example:5671", Entity("ns.example", ())),
        ("sb://ns.example/Hub", Entity("ns.example", ("hub",))),
        (
            "amqps://ns.example/hub/ConsumerGroups/$Default",
            Entity("ns.example", ("hub", "consumergroups", "$default")),
        ),
        ("sb://ns.example/hub/partitions/3", Entity("ns.example", ("hub", "partitions", "3"))),
        (
            "sb://ns.example/hub/consumergroups/cg/partitions/3",
            Entity("ns.example", ("hub", "consumergroups", "cg", "partitions", "3")),
        ),
        ("", None),
        ("hub", None),
        ("/hub", None),
        ("http://ns.example/hub", None),
        ("sb:///hub", None),
        ("sb://other.example/hub", None),
        ("sb://ns.example/hub/anything/else", None),
        ("sb://ns.example/hub/consumergroups", None),
    ],
)
def test_a_put_tokens_name_is_the_namespace_or_within_one_of_its_hubs(
    name: str, scope: Entity | None
) -> None:
    """A name of '' covered every entity of every host."""
    if scope is None:
        with pytest.raises(ValueError):
            token_scope(name, "ns.example")
    else:
        assert token_scope(name, "ns.example") == scope
    assert token_scope("sb://anyhost/hub", None) == Entity("anyhost", ("hub",))  # no hostname in open


def test_a_grant_covers_its_scope_with_its_rights_until_it_expires() -> None:
    grants = Grants(limit=3)
    hub = parse_entity("sb://ns/hub")
    receiver = parse_entity("amqps://ns/hub/ConsumerGroups/$Default/Partitions/0")
    publisher = parse_entity("amqps://ns/hub/Partitions/0")
    other = parse_entity("amqps://ns/other/ConsumerGroups/$Default/Partitions/0")
    assert not grants.put(hub, 2_000, frozenset({LISTEN}), now_ms=1_000)
    assert grants.allows(receiver, LISTEN, 1_500) and not grants.allows(publisher, SEND, 1_500)
    assert not grants.allows(other, LISTEN, 1_500)
    assert not grants.allows(receiver, LISTEN, 2_000)  # expired at its expiry
    assert grants.put(hub, 3_000, frozenset({SEND}), now_ms=1_500)  # renewed; replaced, not added
    assert grants.allows(publisher, SEND, 2_500) and not grants.allows(receiver, LISTEN, 2_500)
    assert not grants.put(parse_entity("sb://ns/"), 3_000, ALL_RIGHTS, now_ms=2_500)
    assert grants.allows(other, LISTEN, 2_900) and grants.next_expiry(2_500, 10_000) == 3_000
    grants.put(parse_entity("sb://ns/a"), 5_000, ALL_RIGHTS, now_ms=2_500)
    assert grants.full(parse_entity("sb://ns/b"), now_ms=2_600)  # three scopes held, none expired
    assert not grants.full(parse_entity("sb://ns/a"), now_ms=2_600)  # the same scope is replaced
    assert not grants.full(parse_entity("sb://ns/b"), now_ms=3_100)  # two have expired by then


# --- delivery annotations ---------------------------------------------------------------------------------


def encoded(delivery: dict[bytes, object] | None) -> bytes:
    from azure.eventhub._pyamqp import _encode as pyamqp_encode
    from azure.eventhub._pyamqp.message import Header, Message

    message = Message(header=Header(durable=True), delivery_annotations=delivery, data=[b"body"])
    output = bytearray()
    pyamqp_encode.encode_payload(output, message)
    return bytes(output)


def test_a_producers_delivery_annotations_are_stored_and_merged_with_the_runtime_metric() -> None:
    event = unpack_event(encoded({b"x-hop": "v", b"last_enqueued_offset": "spoofed"}))
    stored = stamp_event(event, 7, 70, 1_000)
    header_length = len(event.header)
    assert stored.startswith(DELIVERY_ANNOTATIONS_PREFIX, header_length)
    delivered = pyamqp_decode.decode_payload(memoryview(stored))
    assert delivered.delivery_annotations == {b"x-hop": b"v", b"last_enqueued_offset": b"spoofed"}
    metric = runtime_metric_entries(9, "90", 2_000, 3_000)
    section, rest = merge_delivery_annotations(metric, stored, header_length)
    merged = pyamqp_decode.decode_payload(memoryview(stored[:header_length] + section + stored[rest:]))
    assert merged.delivery_annotations == {
        b"last_enqueued_sequence_number": 9,
        b"last_enqueued_offset": b"90",  # the service's, not the producer's
        b"last_enqueued_time_utc": 2_000,
        b"runtime_info_retrieval_time_utc": 3_000,
        b"x-hop": b"v",
    }
    assert merged.data == delivered.data == [b"body"]
    plain = unpack_event(encoded(None))
    assert not stamp_event(plain, 0, 0, 1).startswith(DELIVERY_ANNOTATIONS_PREFIX, len(plain.header))


def fill_and_check(*counts: int) -> list[float]:
    """CPU seconds of this thread to put a grant per partition link for each of `counts` links, then check
    each: the best of five rounds, the counts taking turns within each round. CPU time, not the clock's: on a
    busy machine the clock also counts the turns other processes had."""
    links = {
        count: [parse_entity(f"amqps://ns/hub/ConsumerGroups/$Default/Partitions/{n}") for n in range(count)]
        for count in counts
    }
    best = dict.fromkeys(counts, float("inf"))
    for _ in range(5):
        for count in counts:
            grants = Grants(limit=count)
            started = time.thread_time()
            for link in links[count]:
                grants.put(link, 10_000, frozenset({LISTEN}), now_ms=1)
            assert all(grants.allows(link, LISTEN, 2) for link in links[count])
            best[count] = min(best[count], time.thread_time() - started)
    return [best[count] for count in counts]


def test_a_connection_holding_thousands_of_grants_checks_each_link_at_once() -> None:
    """As the .NET and Java SDKs do over one connection: a token per partition link (here 4,096); every put
    and every check scanned all the grants held (16 million scope comparisons, seconds of a blocked loop).
    Timed as a ratio in one run (the machine is shared): four times the links may cost about four times as
    long, not the sixteen times of a scan per grant."""
    grants = Grants(limit=4096)
    links = [parse_entity(f"amqps://ns/hub/ConsumerGroups/$Default/Partitions/{n}") for n in range(4096)]
    for link in links:
        grants.put(link, 10_000, frozenset({LISTEN}), now_ms=1)
    assert all(grants.allows(link, LISTEN, 2) for link in links)
    assert not any(grants.allows(link, SEND, 2) for link in links)
    beyond = parse_entity("amqps://ns/hub/ConsumerGroups/$Default/Partitions/4096")
    assert not grants.allows(beyond, LISTEN, 2)
    bare = parse_entity("hub/ConsumerGroups/$Default/Partitions/7")  # an address without a host
    assert grants.allows(bare, LISTEN, 2)
    small, large = fill_and_check(1024, 4096)
    assert large < 8 * small
