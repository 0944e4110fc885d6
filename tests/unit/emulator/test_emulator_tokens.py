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

from hubshift.emulator.cbs import Authorizer, SasAuthorizer
from hubshift.emulator.messages import (
    DELIVERY_ANNOTATIONS_PREFIX,
    merge_delivery_annotations,
    parse_event,
    runtime_metric_entries,
    stamp_event,
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
    return JwtVerifier(load_keys(key.write_public(tmp_path / "key.pem")), issuer=ISSUER, clock=lambda: NOW)


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
    assert JwtVerifier(load_keys(jwks), clock=lambda: NOW).verify(token(key)).accepted
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
    assert JwtVerifier(load_keys(both), clock=lambda: NOW).verify(token(key)).accepted
    (tmp_path / "empty.pem").write_text("nothing here")
    with pytest.raises(UserError, match="no RSA public key"):
        load_keys(tmp_path / "empty.pem")


def test_sas_and_bearer_tokens_side_by_side(key: SigningKey, verifier: JwtVerifier) -> None:
    audience = "sb://127.0.0.1:5671/hub"
    keyless = Authorizer(SasAuthorizer(None, clock=lambda: NOW), verifier)
    assert keyless.enforcing
    assert keyless.verify(token(key), audience, "jwt").accepted
    assert keyless.verify(token(key), audience).accepted  # a $management security_token: told by its form
    assert not keyless.verify(token(SigningKey()), audience, "jwt").accepted
    sas = generate_sas_token(audience, "RootManageSharedAccessKey", "any", int(NOW) + 60)
    assert keyless.verify(
        sas, audience, "servicebus.windows.net:sastoken"
    ).accepted  # plain AMQP keeps working
    keyed = Authorizer(SasAuthorizer("secret", clock=time.time))
    assert keyed.verify(token(key), audience, "jwt").status_code == 401  # no JWT keys: the SAS rules
    assert not Authorizer(SasAuthorizer(None, clock=time.time)).enforcing


# --- delivery annotations ---------------------------------------------------------------------------------


def encoded(delivery: dict[bytes, object] | None) -> bytes:
    from azure.eventhub._pyamqp import _encode as pyamqp_encode
    from azure.eventhub._pyamqp.message import Header, Message

    message = Message(header=Header(durable=True), delivery_annotations=delivery, data=[b"body"])
    output = bytearray()
    pyamqp_encode.encode_payload(output, message)
    return bytes(output)


def test_a_producers_delivery_annotations_are_stored_and_merged_with_the_runtime_metric() -> None:
    event = parse_event(encoded({b"x-hop": "v", b"last_enqueued_offset": "spoofed"}))
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
    plain = parse_event(encoded(None))
    assert not stamp_event(plain, 0, 0, 1).startswith(DELIVERY_ANNOTATIONS_PREFIX, len(plain.header))
