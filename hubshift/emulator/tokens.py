"""Microsoft Entra ID bearer tokens (JWTs) as Event Hubs checks those put on `$cbs` with type `jwt`: signed
(RS256) by a key the emulator trusts, for an Event Hubs audience, from one of the configured issuers
(compared exactly, but for a trailing slash), within their lifetime. The keys come from a file: PEM public
keys or certificates, or a JSON Web Key Set (what Entra ID publishes). A token is never logged or echoed.

What a token allows comes from its `roles` claim, the Event Hubs data roles (the emulator has no role
assignments of its own to look up): Data Receiver listens, Data Sender sends, Data Owner does both. A
valid token without one of them is accepted on `$cbs` but allows nothing, as an identity without a role
assignment: the attach is refused with the service's "'Send' claim(s) are required" error.

The emulator is strict where the service allows a few minutes of clock skew: a token is expired at its
`exp`, so a client that refreshes late is caught.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hubshift.emulator.cbs import ALL_RIGHTS, LISTEN, SEND, TokenVerdict
from hubshift.errors import UserError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

# The audiences of Event Hubs tokens: the resource azure-identity asks for (`https://eventhubs.azure.net/`,
# from the SDK's scope `https://eventhubs.azure.net//.default`), with and without the slash, and Service
# Bus's, which Event Hubs accepts too.
EVENTHUBS_AUDIENCES = (
    "https://eventhubs.azure.net",
    "https://eventhubs.azure.net/",
    "https://servicebus.azure.net",
    "https://servicebus.azure.net/",
)


# The Azure built-in roles of the Event Hubs data plane, by name (case-insensitive), and their rights.
ROLE_RIGHTS: dict[str, frozenset[str]] = {
    "azure event hubs data owner": ALL_RIGHTS,
    "azure event hubs data sender": frozenset((SEND,)),
    "azure event hubs data receiver": frozenset((LISTEN,)),
}


def rights_of(roles: object) -> frozenset[str]:
    """The rights a `roles` claim (a list of role names, or one) carries."""
    names = roles if isinstance(roles, list) else [roles]
    rights: frozenset[str] = frozenset()
    for name in names:
        if isinstance(name, str):
            rights |= ROLE_RIGHTS.get(name.strip().lower(), frozenset())
    return rights


def normal_issuer(issuer: str) -> str:
    """An issuer as compared: exactly, but for a trailing slash."""
    return issuer.rstrip("/")


@dataclass(frozen=True)
class TrustedKey:
    key: RSAPublicKey
    kid: str | None = None


def load_keys(path: Path) -> list[TrustedKey]:
    """The RSA public keys in `path`: PEM (public keys or certificates, several allowed) or a JWKS."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey, RSAPublicNumbers
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    where = f"--jwt-key {path}"
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{where}: cannot read the file: {exc.strerror or exc}") from None
    keys: list[TrustedKey] = []
    if text.lstrip().startswith("{"):
        try:
            for entry in json.loads(text).get("keys", []):
                if entry.get("kty") == "RSA":
                    numbers = RSAPublicNumbers(_b64_int(entry["e"]), _b64_int(entry["n"]))
                    keys.append(TrustedKey(numbers.public_key(), entry.get("kid")))
        except (ValueError, KeyError, AttributeError) as exc:
            raise UserError(f"{where}: not a JSON Web Key Set of RSA keys ({exc})") from None
    else:
        for block in _pem_blocks(text):
            try:
                if "CERTIFICATE" in block.splitlines()[0]:
                    public: Any = x509.load_pem_x509_certificate(block.encode()).public_key()
                else:
                    public = load_pem_public_key(block.encode())
            except ValueError as exc:
                raise UserError(f"{where}: a PEM block could not be read ({exc})") from None
            if isinstance(public, RSAPublicKey):
                keys.append(TrustedKey(public))
    if not keys:
        raise UserError(f"{where}: no RSA public key or certificate in it")
    return keys


def _pem_blocks(text: str) -> list[str]:
    blocks, current = [], []
    for line in text.splitlines():
        if line.startswith("-----BEGIN "):
            current = [line]
        elif current:
            current.append(line)
            if line.startswith("-----END "):
                blocks.append("\n".join(current) + "\n")
                current = []
    return blocks


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _b64_int(text: str) -> int:
    return int.from_bytes(_b64(text), "big")


class JwtVerifier:
    """Checks a bearer token as Event Hubs does before it accepts a put-token of type `jwt`."""

    def __init__(
        self,
        keys: Sequence[TrustedKey],
        *,
        issuers: Sequence[str],
        audiences: Sequence[str] = EVENTHUBS_AUDIENCES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not issuers:
            raise ValueError("a JWT verifier needs the issuers it accepts")
        self.keys = list(keys)
        self.audiences = frozenset(audiences)
        self.issuers = frozenset(normal_issuer(issuer) for issuer in issuers)
        self.clock = clock

    def verify(self, token: object) -> TokenVerdict:
        if isinstance(token, bytes):
            token = token.decode("utf-8", "replace")
        if not isinstance(token, str):
            return TokenVerdict(401, "InvalidToken: The token is not a string.")
        parts = token.split(".")
        try:
            if len(parts) != 3:
                raise ValueError("not three parts")
            header = json.loads(_b64(parts[0]))
            claims = json.loads(_b64(parts[1]))
            signature = _b64(parts[2])
            if not isinstance(header, dict) or not isinstance(claims, dict):
                raise ValueError("not JSON objects")
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return TokenVerdict(401, "InvalidToken: The token is not a valid JSON Web Token.")
        if header.get("alg") != "RS256":
            return TokenVerdict(
                401, f"InvalidSignature: The signing algorithm '{header.get('alg')}' is not supported."
            )
        if not self._signed(f"{parts[0]}.{parts[1]}".encode(), signature, header.get("kid")):
            return TokenVerdict(401, "InvalidSignature: The token has an invalid signature.")
        issuer = claims.get("iss")
        if not isinstance(issuer, str) or normal_issuer(issuer) not in self.issuers:
            return TokenVerdict(401, "InvalidIssuer: Token issuer is invalid.")
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if not any(isinstance(a, str) and a in self.audiences for a in audiences):
            return TokenVerdict(401, f"InvalidAudience: The token audience '{audience}' is invalid.")
        expires, not_before = claims.get("exp"), claims.get("nbf")
        if not isinstance(expires, int | float):
            return TokenVerdict(401, "InvalidToken: The token has no expiration time.")
        now = self.clock()
        if isinstance(not_before, int | float) and now < not_before:
            return TokenVerdict(401, f"InvalidToken: The token is not valid before '{_iso(not_before)}'.")
        if now >= expires:
            return TokenVerdict(
                401, f"ExpiredToken: The token is expired. Expiration time: '{_iso(expires)}'."
            )
        return TokenVerdict(202, "Accepted", int(expires * 1000), rights_of(claims.get("roles")))

    def _signed(self, data: bytes, signature: bytes, kid: object) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        candidates = [k for k in self.keys if kid is None or k.kid is None or k.kid == kid]
        for trusted in candidates:
            try:
                trusted.key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
            except InvalidSignature:
                continue
            return True
        return False


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
