"""Where ownership and checkpoints live: a Blob container (`BlobStoreSpec`, which a Blob sink's block
extends) or a SQLite file on one machine."""

from __future__ import annotations

from pydantic import Field, model_validator

from hubshift.spec.base import HOST, MAX_HOST_LENGTH, Model, cel
from hubshift.spec.connections import ConnectionSpec, NamedConnection, Role, named

DEFAULT_STORAGE_ENV = "HUBSHIFT_STORAGE_CONNECTION_STRING"

# A storage account's Blob endpoint: https://HOST[:PORT], optionally one path segment (an emulator's
# account, https://127.0.0.1:10000/devstoreaccount1); no user, query or fragment.
STORAGE_ACCOUNT_URL = f"^https://{HOST}(/[a-z0-9]{{1,63}})?/?$"
# The message of a credential without its address, shared by the model and its CEL rule.
CREDENTIAL_NEEDS_ACCOUNT_URL = "a credential needs accountUrl, the storage account's Blob endpoint (https://ACCOUNT.blob.core.windows.net)"


class BlobStoreSpec(ConnectionSpec):
    """A Blob container: the checkpoint store's, or a Blob sink's (`BlobSinkSpec`)."""

    SERVICE = "Azure Storage"
    DEFAULT_VARIABLE = DEFAULT_STORAGE_ENV
    ADDRESS = "account_url"
    ADDRESS_MESSAGE = CREDENTIAL_NEEDS_ACCOUNT_URL

    container: str = Field(
        min_length=3, max_length=63, description="Blob container, one per PartitionedConsumer."
    )
    account_url: str | None = Field(
        default=None,
        max_length=len("https://") + MAX_HOST_LENGTH + len("/") + 63 + len("/"),
        pattern=STORAGE_ACCOUNT_URL,
        description="The storage account's Blob endpoint (https://ACCOUNT.blob.core.windows.net), required "
        "with a credential (and with a command line's --credential); a connection string names its own.",
    )


class SqliteStoreSpec(Model):
    path: str = Field(min_length=1, description="SQLite database file (one machine only).")


class CheckpointStoreSpec(Model):
    """Where the partitions' leases, checkpoints and hubshift's assignment record are kept: one Blob container
    (or SQLite file) per PartitionedConsumer."""

    blob: BlobStoreSpec | None = Field(default=None, description="Azure Blob storage (leases, checkpoints).")
    sqlite: SqliteStoreSpec | None = Field(default=None, description="A local SQLite file instead of Blob.")

    CEL = (cel("has(self.blob) != has(self.sqlite)", "set exactly one of blob or sqlite"),)

    @model_validator(mode="after")
    def _exactly_one(self) -> CheckpointStoreSpec:
        if (self.blob is None) == (self.sqlite is None):
            raise ValueError("set exactly one of blob or sqlite")
        return self

    def connections(self, location: tuple[str | int, ...], role: Role) -> list[NamedConnection]:
        return named((*location, "blob"), self.blob, role)
