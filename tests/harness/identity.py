"""Microsoft Entra ID on this machine, for the tests of token credentials: a certificate authority and
server certificates for 127.0.0.1 (the emulator's and Azurite's TLS), an RSA signing key that the emulator
trusts, and a managed identity endpoint that azure-identity's own `ManagedIdentityCredential` reads (the
App Service protocol: `IDENTITY_ENDPOINT` and `IDENTITY_HEADER`), serving signed JWTs on 127.0.0.1.

Nothing here reaches beyond 127.0.0.1; the production code path (azure-identity, the SDKs' bearer token
policies, the Event Hubs CBS put-token of type `jwt`) is the one users run.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.harness.control_plane import CertificateAuthority

TENANT = "72f988bf-0000-4000-8000-000000000000"
ISSUER = f"https://sts.windows.net/{TENANT}/"  # the issuer Azurite's `--oauth basic` accepts
EVENTHUBS_RESOURCE = "https://eventhubs.azure.net/"
STORAGE_RESOURCE = "https://storage.azure.com"


# --- TLS ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the authority the clients trust (SSL_CERT_FILE, REQUESTS_CA_BUNDLE)
    cert: Path  # the server's certificate, for 127.0.0.1 and localhost
    key: Path

    @property
    def pair(self) -> tuple[Path, Path]:
        return self.cert, self.key

    def client_environ(self) -> dict[str, str]:
        """What makes the SDKs trust the servers: OpenSSL's default verify file (the Event Hubs SDK loads
        the default certificates) and requests' bundle (the Storage SDK, azure-identity)."""
        return {"SSL_CERT_FILE": str(self.ca), "REQUESTS_CA_BUNDLE": str(self.ca)}


def make_tls_files(folder: Path) -> TlsFiles:
    """A fresh certificate authority (the control plane's kind) and a server certificate for 127.0.0.1 and
    localhost it signed."""
    folder.mkdir(parents=True, exist_ok=True)
    authority = CertificateAuthority.create("hubshift test authority")
    cert, key = authority.issue("127.0.0.1", server_names=["localhost"], server_ips=["127.0.0.1"])
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server-key.pem")
    files.ca.write_bytes(authority.cert_pem)
    files.cert.write_bytes(cert)
    files.key.write_bytes(key)
    return files


# --- tokens ---------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SigningKey:
    """An RSA key that signs JWTs as Entra ID does (RS256, with a key id)."""

    def __init__(self) -> None:
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = uuid.uuid4().hex[:16]

    def write_public(self, path: Path) -> Path:
        path.write_bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return path

    def sign(self, claims: dict[str, Any]) -> str:
        header = _b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": self.kid}).encode())
        payload = _b64(json.dumps(claims).encode())
        signature = self.private.sign(f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{header}.{payload}.{_b64(signature)}"


def token_claims(
    resource: str,
    lifetime: float,
    *,
    client_id: str | None,
    now: float | None = None,
    roles: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The claims of a token Entra ID issues for `resource`; `roles`: the data roles the emulator reads
    (it has no role assignments of its own)."""
    issued = int(now if now is not None else time.time())
    claims: dict[str, Any] = {
        "aud": resource,
        "iss": ISSUER,
        "iat": issued,
        "nbf": issued,
        "exp": int(issued + lifetime),
        "appid": client_id or "system-assigned",
        "oid": str(uuid.uuid5(uuid.NAMESPACE_URL, client_id or "system-assigned")),
        "sub": str(uuid.uuid5(uuid.NAMESPACE_URL, client_id or "system-assigned")),
        "tid": TENANT,
        "ver": "1.0",
    }
    if roles:
        claims["roles"] = list(roles)
    return claims


@dataclass
class Issued:
    resource: str
    client_id: str | None
    token: str
    expires_on: int
    at: float


@dataclass
class TokenEndpoint:
    """A managed identity endpoint (App Service's protocol, which azure-identity's ManagedIdentityCredential
    uses when IDENTITY_ENDPOINT and IDENTITY_HEADER are set) on 127.0.0.1.

    `mode`: "valid" (signed by `key`, the one the emulator trusts), "wrong-key" (signed by another key),
    "expired" (expired an hour ago), "refuse" (HTTP 400, as for an unknown identity). `roles`: the roles
    its tokens carry (the emulator grants by them). Every token it gave out is in `issued` (the tests look
    for them in logs and status)."""

    key: SigningKey
    lifetime: float = 3600.0
    mode: str = "valid"
    roles: tuple[str, ...] = ("Azure Event Hubs Data Owner",)
    header_secret: str = field(default_factory=lambda: uuid.uuid4().hex)
    issued: list[Issued] = field(default_factory=list)
    port: int = 0
    _other_key: SigningKey = field(default_factory=SigningKey)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/msi/token"

    def environ(self) -> dict[str, str]:
        """What azure-identity reads to find this endpoint."""
        return {"IDENTITY_ENDPOINT": self.url, "IDENTITY_HEADER": self.header_secret}

    def tokens(self) -> list[str]:
        with self._lock:
            return [issued.token for issued in self.issued]

    def issued_for(self, resource: str) -> list[Issued]:
        with self._lock:
            return [issued for issued in self.issued if issued.resource == resource]

    def answer(self, query: dict[str, list[str]], secret: str | None) -> tuple[int, dict[str, Any]]:
        if secret != self.header_secret:
            return 401, {"error": "unauthorized", "error_description": "missing or wrong X-IDENTITY-HEADER"}
        resource = (query.get("resource") or [""])[0]
        client_id = (query.get("client_id") or [None])[0]
        if self.mode == "refuse":
            return 400, {
                "error": "invalid_request",
                "error_description": "Identity not found",
            }
        now = time.time()
        if self.mode == "expired":
            claims = token_claims(resource, 600, client_id=client_id, now=now - 3600, roles=self.roles)
        else:
            claims = token_claims(resource, self.lifetime, client_id=client_id, now=now, roles=self.roles)
        signer = self._other_key if self.mode == "wrong-key" else self.key
        token = signer.sign(claims)
        with self._lock:
            self.issued.append(Issued(resource, client_id, token, claims["exp"], now))
        return 200, {
            "access_token": token,
            "expires_on": str(claims["exp"]),
            "resource": resource,
            "token_type": "Bearer",
            "client_id": client_id or "system-assigned",
        }

    def start(self) -> TokenEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parsed = urlparse(self.path)
                status, body = endpoint.answer(parse_qs(parsed.query), self.headers.get("X-IDENTITY-HEADER"))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="token-endpoint", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@contextmanager
def running_token_endpoint(key: SigningKey, lifetime: float = 3600.0) -> Iterator[TokenEndpoint]:
    endpoint = TokenEndpoint(key, lifetime).start()
    try:
        yield endpoint
    finally:
        endpoint.stop()


def secrets_in(text: str, tokens: list[str]) -> list[str]:
    """The tokens (or their signatures, the part that grants access) found in `text`."""
    found = []
    for token in tokens:
        signature = token.rsplit(".", 1)[-1]
        if token in text or signature in text:
            found.append(token[:16] + "...")
    return found
