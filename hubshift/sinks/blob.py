"""The `blob` sink: files as block blobs in an Azure Storage container, under an optional name prefix.

The container (a `hubshift.azure_storage.BlobContainer`, as the checkpoint store's) is reached with a
connection string, from the environment variable the manifest names (`connectionStringEnv`; in a cluster
the operator fills that variable from `connectionStringSecretRef`), held in memory only, never in a message,
a log line or `repr`; or with the account URL and a token credential (`credential`), which each process
(Spark's Python workers too) builds for itself.

A write the storage account does not answer is tried again (1 s doubling to 30 s) for up to
`retry_seconds`: the micro-batch waits, so Spark plans no new one and the receivers stop at their bound
ahead of what was committed (back-pressure), and no checkpoint moves past output not yet written. Only
after that does the batch fail (the query starts again from what was committed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import Field
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential

from hubshift.azure_storage import BlobContainer, answered_by_account
from hubshift.errors import UserError
from hubshift.sinks.base import DEFAULT_SINK_STORAGE_ENV, ObjectStore, SinkKind, file_sink
from hubshift.sinks.layout import DEAD_LETTERS, join
from hubshift.spec import BlobStoreSpec, NamedConnection
from hubshift.spec.kinds import Location

log = logging.getLogger(__name__)

# How long a write may keep failing before the micro-batch gives up; one request's own time limits.
WRITE_RETRY_SECONDS = 300.0
CONNECTION_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 20

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient


class BlobSinkSpec(BlobStoreSpec):
    """A Blob container (and a name prefix in it) the results, dead letters and commit records go to."""

    DEFAULT_VARIABLE = DEFAULT_SINK_STORAGE_ENV

    container: str = Field(min_length=3, max_length=63, description="Blob container.")
    prefix: str = Field(default="", description="Blob name prefix.")


@dataclass
class BlobStore:
    """Blobs under `prefix` in `container` (which, and how it is reached)."""

    container: BlobContainer
    prefix: str = ""
    retry_seconds: float = WRITE_RETRY_SECONDS
    _client: ContainerClient | None = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to Spark's Python workers: configuration only, each worker opens its own client.
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    @property
    def client(self) -> ContainerClient:
        if self._client is None:
            # No retries of its own (`put` retries, with a bound); each attempt bounded in time.
            self._client = self.container.client(
                retry_total=0,
                connection_timeout=CONNECTION_TIMEOUT_SECONDS,
                read_timeout=READ_TIMEOUT_SECONDS,
            )
        return self._client

    def ensure(self) -> None:
        """Create the container if needed: proves the credentials and the endpoint, at start-up."""
        from azure.core.exceptions import AzureError, ClientAuthenticationError, ResourceExistsError

        where = f"sink blob container {self.container.name!r}"
        try:
            client = self.client
        except ValueError:
            raise UserError(f"{where}: the storage connection string is not valid") from None
        try:
            client.create_container()
        except ResourceExistsError:
            pass
        except ClientAuthenticationError as exc:
            token = self.container.token
            if token is not None:
                from_identity = token.explain(exc)
                if from_identity is not None and not answered_by_account(exc, self.container.account_url):
                    raise UserError(f"{where}: {from_identity}") from None
                raise UserError(
                    f"{where}: the storage account refused the token of credential {token.describe()} (check "
                    "that the identity has Storage Blob Data Contributor on the account or the container)"
                ) from None
            raise UserError(f"{where}: the storage account refused the credentials") from None
        except AzureError as exc:
            reason = " ".join(str(getattr(exc, "reason", None) or type(exc).__name__).split())
            raise UserError(f"{where}: cannot reach the storage account ({reason})") from None

    def _name(self, name: str) -> str:
        return join(self.prefix, name)

    def put(self, name: str, data: bytes) -> None:
        # One Put Blob (or Put Block List for a large one): the blob changes whole or not at all.
        for attempt in Retrying(
            retry=retry_if_exception(_transient),
            wait=wait_exponential(multiplier=1, min=1, max=30),
            stop=stop_after_delay(self.retry_seconds),
            before_sleep=self._waiting,
            reraise=True,
        ):
            with attempt:
                self.client.upload_blob(self._name(name), data, overwrite=True)

    def _waiting(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        reason = " ".join(str(getattr(error, "reason", None) or type(error).__name__).split())
        log.warning(
            "%s: a write failed (%s); trying again in %.0f s (the batch waits)",
            self.describe(),
            reason,
            state.next_action.sleep if state.next_action is not None else 0.0,
        )

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
        return f"blob container {self.container.name}" + (f" prefix {self.prefix}" if self.prefix else "")


def _transient(error: BaseException) -> bool:
    """A failure worth waiting out: the service unreachable, timing out, throttling or failing itself;
    not a refusal (credentials, a missing container), which no wait mends."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(error, ServiceRequestError | ServiceResponseError):
        return True
    if isinstance(error, ClientAuthenticationError | ResourceNotFoundError):
        return False
    if isinstance(error, HttpResponseError):
        return error.status_code is None or error.status_code in (408, 429) or error.status_code >= 500
    return False


def _connections(block: BlobSinkSpec, location: Location) -> list[NamedConnection]:
    return [NamedConnection(location, block, "sink")]


def _stores(
    block: BlobSinkSpec, dead_letter_path: str | None, environ: Mapping[str, str], location: Location
) -> tuple[ObjectStore, ObjectStore]:
    # lazy: the consumer builds its stores; Spark's workers unpickle this module without the hub's SDK
    from hubshift.connections import blob_container

    resolved = _connections(block, location)[0].resolve(environ)
    store = BlobStore(blob_container(block, resolved), block.prefix.strip("/"))
    dead_prefix = dead_letter_path or "/".join(p for p in (store.prefix, DEAD_LETTERS) if p)
    return store, replace(store, prefix=dead_prefix.strip("/"))


SINK = SinkKind[BlobSinkSpec](
    name="blob",
    annotation=BlobSinkSpec | None,
    field=Field(default=None),
    required="blob",
    build=file_sink("blob", _stores),
    stores=_stores,
    connections=_connections,
)
