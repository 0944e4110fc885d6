"""Azure Storage: a Blob container and how to reach it (`BlobContainer`), the one type the checkpoint store
(`hubshift.ownership.stores`) and the Blob sink (`hubshift.sinks.blob`) both use, and what a connection
string names (`parse_connection_string`: read by azure-storage-blob itself, then checked).

A container is reached with a connection string (it holds a key: never in a message, a log line or a
`repr`) or with its account's Blob endpoint and a Microsoft Entra ID token credential (`TokenSource`, kept as
configuration: a container pickles to Spark's workers and each process builds its own credential).
Refusals are one line (`UserError`) that never repeats the connection string.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from hubshift.errors import UserError

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.storage.blob import ContainerClient

EXPECTED = "Key=Value parts: AccountName=...;AccountKey=...; or BlobEndpoint=...;SharedAccessSignature=..."
# An endpoint's host as azure-storage-blob keeps it (HOST[:PORT][/PATH]); with a scheme in it (ftp://...)
# the connection string's BlobEndpoint was not http(s).
_ENDPOINT_HOST = re.compile(r"[^/:@\s]+(:[0-9]{1,5})?(/\S*)?")


class TokenSource(Protocol):
    """A Microsoft Entra ID token credential as configuration (`hubshift.identity.IdentityCredential`):
    plain data that pickles, from which each process builds its own credential once."""

    def credential(self) -> TokenCredential:
        """This process's credential."""
        ...

    def describe(self) -> str:
        """Which credential, for messages (a client id is no secret)."""
        ...

    def explain(self, error: BaseException) -> str | None:
        """One line for an error getting a token; None for any other error."""
        ...


@dataclass(frozen=True)
class BlobContainer:
    """A Blob container and how to reach it: a connection string, or its account's Blob endpoint
    (`account_url`) with a token credential (`token`)."""

    name: str
    connection_string: str | None = field(default=None, repr=False)
    account_url: str | None = None
    token: TokenSource | None = None

    def __post_init__(self) -> None:
        by_token = self.token is not None and bool(self.account_url)
        if (self.connection_string is not None) == by_token:
            raise ValueError("a container is reached with a connection string, or an account URL and a token")

    def client(self, **options: Any) -> ContainerClient:
        """An azure-storage-blob client of the container (`options` go to azure-core); the SDK's ValueError
        for a connection string it cannot read."""
        from azure.storage.blob import ContainerClient

        if self.connection_string is not None:
            return ContainerClient.from_connection_string(self.connection_string, self.name, **options)
        assert self.account_url is not None and self.token is not None
        return ContainerClient(self.account_url, self.name, credential=self.token.credential(), **options)


def answered_by_account(error: BaseException, account_url: str | None) -> bool:
    """Whether the storage account itself refused (rather than the token endpoint of a credential)."""
    request = getattr(getattr(error, "response", None), "request", None)
    return request is not None and account_url is not None and str(request.url).startswith(account_url)


@dataclass(frozen=True)
class StorageAccount:
    """What an Azure Storage connection string names, as azure-storage-blob reads it: the Blob endpoint
    (`scheme://host[:port][/path]`), the account, and its key (None with a shared access signature)."""

    blob_endpoint: str
    name: str | None
    key: str | None = field(repr=False)

    @property
    def endpoint_host(self) -> str:
        """`host[:port]` of the Blob endpoint."""
        return urlsplit(self.blob_endpoint).netloc

    @property
    def secure(self) -> bool:
        return self.blob_endpoint.startswith("https://")

    @property
    def own_endpoint(self) -> bool:
        """Whether the Blob endpoint is one of its own (Azurite, a private endpoint), not the account's
        public `ACCOUNT.blob.SUFFIX`."""
        return self.name is None or not self.endpoint_host.startswith(f"{self.name}.blob.")


def parse_connection_string(text: str, where: str = "the connection string") -> StorageAccount:
    """The account, endpoint and key a connection string names (`AccountName`/`AccountKey`/
    `EndpointSuffix`, `BlobEndpoint`, `SharedAccessSignature`, `UseDevelopmentStorage=true`), read by
    azure-storage-blob without contacting anything; `UserError` naming `where` (never the string) when it
    reads none, has no http(s) endpoint, carries no key or signature, or a key that is not base64."""
    from azure.storage.blob import BlobServiceClient

    try:
        client = BlobServiceClient.from_connection_string(text.strip())
    except ValueError:
        raise UserError(f"{where}: not an Azure Storage connection string ({EXPECTED})") from None
    with client:
        host = client.primary_hostname
        if client.scheme not in ("http", "https") or not _ENDPOINT_HOST.fullmatch(host):
            raise UserError(f"{where}: its BlobEndpoint must be an http(s) URL")
        key: str | None = getattr(client.credential, "account_key", None)
        if key is None and not urlsplit(client.url).query:
            raise UserError(
                f"{where}: it names no key (it needs AccountName with AccountKey, or SharedAccessSignature)"
            )
        if key is not None:
            try:
                base64.b64decode(key, validate=True)
            except (binascii.Error, ValueError):
                raise UserError(f"{where}: its AccountKey is not base64 (a cut-off copy?)") from None
        return StorageAccount(f"{client.scheme}://{host}", client.account_name, key)
