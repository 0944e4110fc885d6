"""Claims-based security (`$cbs` put-token): Shared Access Signature checks, Microsoft Entra ID bearer
tokens (type `jwt`) handed to a JWT checker (`tokens.JwtVerifier`) when one is configured, and the grants
a connection holds: each for the scope the put-token named, with the rights its token carries.

Without a key or JWT keys the emulator accepts every SAS token, like Microsoft's emulator. With a key, a
token must be `SharedAccessSignature sr=..&sig=..&se=..&skn=..` signed with that key (HMAC-SHA256 over the
URL-encoded resource, a newline and the expiry), not expired, under the configured key name, and its
resource must cover the entity asked for (host compared without case or port, path by whole segments); it
grants every right (the key is the namespace's root key). With JWT keys and no key, SAS tokens are refused;
without a JWT checker a bearer token is treated as the SAS rules say.

A put-token names its scope: the namespace (`sb://ns/`) or an event hub (`sb://ns/hub`, which the SDK
uses), or a consumer group or partition within it; the grant covers that scope only (the namespace covers
every hub, as on the service).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote_plus, unquote_plus, urlsplit

JWT_TOKEN_TYPE = "jwt"
# The rights (the service's claims) a grant may carry; a SAS key gives all three.
SEND = "Send"
LISTEN = "Listen"
MANAGE = "Manage"
ALL_RIGHTS = frozenset((SEND, LISTEN, MANAGE))
_SCOPE_SCHEMES = frozenset(("sb", "amqp", "amqps"))
SAS_PREFIX = "SharedAccessSignature "
DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
# What the connection string carries when the emulator runs without a key (Microsoft's placeholder).
PLACEHOLDER_KEY = "SAS_KEY_VALUE"


@dataclass(frozen=True, slots=True)
class Entity:
    """An address split into its host (lower case, no port) and its path segments (lower case)."""

    host: str
    path: tuple[str, ...]

    def covers(self, other: Entity) -> bool:
        if self.host and other.host and self.host != other.host:
            return False
        return other.path[: len(self.path)] == self.path


def parse_entity(address: str) -> Entity:
    """`amqps://host:port/hub/ConsumerGroups/cg/Partitions/0`, `sb://host/hub` or a bare `hub/...`."""
    if "://" in address:
        parts = urlsplit(address)
        host = (parts.hostname or "").lower()
        path = parts.path
    else:
        host, path = "", address
    return Entity(host, tuple(segment.lower() for segment in path.split("/") if segment))


def token_scope(name: str, namespace: str | None) -> Entity:
    """The scope a put-token's `name` gives its grant: the namespace, an event hub, or a consumer group or
    partition of one (`sb://` or `amqp[s]://`, on `namespace`'s host when known). ValueError: not one."""
    parts = urlsplit(name)
    entity = parse_entity(name)
    if parts.scheme.lower() not in _SCOPE_SCHEMES or not entity.host:
        raise ValueError(f"'{name}' is not the address of a namespace or an event hub")
    if namespace is not None and entity.host != namespace.lower():
        raise ValueError(f"'{name}' is not on this namespace ({namespace})")
    shape = entity.path[1:]
    within_hub = (
        not shape
        or (len(shape) == 2 and shape[0] in ("consumergroups", "partitions"))
        or (len(shape) == 4 and shape[0] == "consumergroups" and shape[2] == "partitions")
    )
    if not within_hub:
        raise ValueError(f"'{name}' is not the address of a namespace or an event hub")
    return entity


class Grants:
    """The tokens one connection has put on `$cbs` and had accepted: per scope (the entity the token was
    put for), until when and with which rights. A token put again for a scope replaces the one before.

    An entity is covered by the scopes among its own path's prefixes on its host, so a check looks up those
    few instead of comparing every grant held (the .NET and Java SDKs put one token per partition link)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[Entity, tuple[int, frozenset[str]]] = {}
        self._hosts: dict[str, int] = {}  # the hosts of the scopes held, and how many scopes each
        self.accepted_any = False

    def _covering(self, entity: Entity) -> Iterator[tuple[int, frozenset[str]]]:
        """The grants whose scope covers `entity` (on any host when the entity names none)."""
        for host in (entity.host,) if entity.host else tuple(self._hosts):
            for length in range(len(entity.path) + 1):
                grant = self._held.get(Entity(host, entity.path[:length]))
                if grant is not None:
                    yield grant

    def covers(self, entity: Entity, now_ms: int) -> bool:
        """Whether an unexpired grant covers `entity`, whatever its rights."""
        return any(now_ms < expiry for expiry, _ in self._covering(entity))

    def allows(self, entity: Entity, right: str, now_ms: int) -> bool:
        """Whether an unexpired grant covers `entity` with `right`."""
        return any(now_ms < expiry and right in rights for expiry, rights in self._covering(entity))

    def full(self, scope: Entity, now_ms: int) -> bool:
        """Whether a grant for a new `scope` would be one too many (expired ones are dropped first)."""
        if scope in self._held or len(self._held) < self.limit:
            return False
        for held in [held for held, (expiry, _) in self._held.items() if expiry <= now_ms]:
            self._drop(held)
        return len(self._held) >= self.limit

    def put(self, scope: Entity, expires_at_ms: int, rights: frozenset[str], now_ms: int) -> bool:
        """Hold a grant; whether it renews one that had not expired."""
        renewed = self.covers(scope, now_ms)
        if scope not in self._held:
            self._hosts[scope.host] = self._hosts.get(scope.host, 0) + 1
        self._held[scope] = (expires_at_ms, rights)
        self.accepted_any = True
        return renewed

    def _drop(self, scope: Entity) -> None:
        del self._held[scope]
        self._hosts[scope.host] -= 1
        if not self._hosts[scope.host]:
            del self._hosts[scope.host]

    def next_expiry(self, now_ms: int, horizon_ms: int) -> int | None:
        """The earliest expiry still ahead but within `horizon_ms` (far-off ones are not watched)."""
        return min((e for e, _ in self._held.values() if now_ms < e < now_ms + horizon_ms), default=None)


@dataclass(frozen=True, slots=True)
class TokenVerdict:
    status_code: int
    description: str
    expires_at_ms: int = 0
    # what an accepted token allows (SEND, LISTEN, MANAGE)
    rights: frozenset[str] = frozenset()

    @property
    def accepted(self) -> bool:
        return 200 <= self.status_code < 300


class SasAuthorizer:
    def __init__(self, key: str | None, clock: Callable[[], float], key_name: str = DEFAULT_KEY_NAME) -> None:
        self.key = key
        self.key_name = key_name
        self.clock = clock

    @property
    def enforcing(self) -> bool:
        return self.key is not None

    def verify(self, token: object, audience: str) -> TokenVerdict:
        """Whether `token` grants access to `audience` (an entity address)."""
        far_future_ms = 2**62
        if self.key is None:
            return TokenVerdict(202, "Accepted", far_future_ms, ALL_RIGHTS)
        if isinstance(token, bytes):
            token = token.decode("utf-8", "replace")
        if not isinstance(token, str) or not token.startswith("SharedAccessSignature "):
            return TokenVerdict(401, "InvalidToken: the token is not a Shared Access Signature.")
        parts: dict[str, str] = {}
        for pair in token[len("SharedAccessSignature ") :].split("&"):
            name, _, value = pair.partition("=")
            parts[name.strip().lower()] = value
        resource_raw, signature_raw = parts.get("sr"), parts.get("sig")
        expiry_raw, key_name = parts.get("se", ""), unquote_plus(parts.get("skn", ""))
        if not resource_raw or not signature_raw or not expiry_raw.isdigit():
            return TokenVerdict(401, "InvalidToken: the token lacks sr, sig or se.")
        if key_name.lower() != self.key_name.lower():
            return TokenVerdict(401, f"InvalidSignature: unknown key name '{key_name}'.")
        resource = unquote_plus(resource_raw)
        expected = {
            self._sign(signed_resource, expiry_raw)
            for signed_resource in (resource_raw, quote_plus(resource))
        }
        signature = unquote_plus(signature_raw)
        if not any(hmac.compare_digest(signature, candidate) for candidate in expected):
            return TokenVerdict(401, "InvalidSignature: The token has an invalid signature.")
        expires_at_ms = int(expiry_raw) * 1000
        if expires_at_ms <= self.clock() * 1000:
            return TokenVerdict(401, "ExpiredToken: The token is expired.")
        if not parse_entity(resource).covers(parse_entity(audience)):
            return TokenVerdict(
                401, f"InvalidAudience: The token's audience '{resource}' does not cover '{audience}'."
            )
        return TokenVerdict(202, "Accepted", expires_at_ms, ALL_RIGHTS)

    def _sign(self, resource: str, expiry: str) -> str:
        assert self.key is not None
        digest = hmac.new(self.key.encode(), f"{resource}\n{expiry}".encode(), hashlib.sha256).digest()
        return base64.b64encode(digest).decode()


class JwtChecker(Protocol):
    def verify(self, token: object) -> TokenVerdict: ...


class Authorizer:
    """Every token the emulator is shown: SAS tokens by `sas`, bearer tokens by `jwt` when set."""

    def __init__(self, sas: SasAuthorizer, jwt: JwtChecker | None = None) -> None:
        self.sas = sas
        self.jwt = jwt

    @property
    def enforcing(self) -> bool:
        """Whether entity links need an accepted put-token first."""
        return self.sas.enforcing or self.jwt is not None

    def verify(self, token: object, audience: str, token_type: object = None) -> TokenVerdict:
        """Whether `token` grants access to `audience`; `token_type` as put on `$cbs` (None: told apart by
        its form, as in a `$management` request's security_token)."""
        if self.jwt is not None and _is_bearer(token, token_type):
            return self.jwt.verify(token)
        if self.jwt is not None and not self.sas.enforcing:
            return TokenVerdict(
                401,
                "InvalidToken: this namespace takes Microsoft Entra ID tokens only (the emulator has JWT "
                "keys and no SAS key).",
            )
        return self.sas.verify(token, audience)


def _is_bearer(token: object, token_type: object) -> bool:
    if token_type is not None:
        return token_type == JWT_TOKEN_TYPE
    if isinstance(token, bytes):
        token = token.decode("utf-8", "replace")
    return isinstance(token, str) and not token.startswith(SAS_PREFIX)
