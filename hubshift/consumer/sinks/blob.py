"""The `blob` sink: files as block blobs in an Azure Storage container, under an optional name prefix.

The connection string comes from the environment variable the manifest names (`connectionStringEnv`); in
a cluster the operator fills that variable from `connectionStringSecretRef`. It is held in memory only,
never in a message, a log line or `repr`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hubshift.consumer.sinks.layout import join
from hubshift.errors import UserError

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient


@dataclass
class BlobStore:
    connection_string: str = field(repr=False)
    container: str
    prefix: str = ""
    _client: ContainerClient | None = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to Spark's Python workers: configuration only, each worker opens its own client.
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    @property
    def client(self) -> ContainerClient:
        if self._client is None:
            from azure.storage.blob import ContainerClient

            self._client = ContainerClient.from_connection_string(self.connection_string, self.container)
        return self._client

    def ensure_container(self) -> None:
        """Create the container if needed: proves the credentials and the endpoint, at start-up."""
        from azure.core.exceptions import AzureError, ClientAuthenticationError, ResourceExistsError

        where = f"sink blob container {self.container!r}"
        try:
            client = self.client
        except ValueError:
            raise UserError(f"{where}: the storage connection string is not valid") from None
        try:
            client.create_container()
        except ResourceExistsError:
            pass
        except ClientAuthenticationError:
            raise UserError(f"{where}: the storage account refused the credentials") from None
        except AzureError as exc:
            reason = " ".join(str(getattr(exc, "reason", None) or type(exc).__name__).split())
            raise UserError(f"{where}: cannot reach the storage account ({reason})") from None

    def _name(self, name: str) -> str:
        return join(self.prefix, name)

    def put(self, name: str, data: bytes) -> None:
        # One Put Blob (or Put Block List for a large one): the blob changes whole or not at all.
        self.client.upload_blob(self._name(name), data, overwrite=True)

    def get(self, name: str) -> bytes:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self.client.download_blob(self._name(name)).readall()
        except ResourceNotFoundError:
            raise FileNotFoundError(f"{self.describe()}: no blob {name}") from None

    def list(self, prefix: str = "") -> list[str]:
        root = f"{self.prefix.strip('/')}/" if self.prefix.strip("/") else ""
        names = self.client.list_blob_names(name_starts_with=root + prefix)
        return sorted(name[len(root) :] for name in names)

    def describe(self) -> str:
        return f"blob container {self.container}" + (f" prefix {self.prefix}" if self.prefix else "")
