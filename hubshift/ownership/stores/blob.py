"""The Azure Blob backend of `LeaseStore`: real blob leases, ETag conditions, one container.

Each method is one storage request (a listing may page past 5,000 blobs). Failures become the store's
errors; their messages never carry the connection string, a key, a SAS token or a bearer token. The
container is reached as its `BlobContainer` says: with a connection string or with a token credential and
the account's URL.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobLeaseClient, BlobProperties, ContainerClient, LinearRetry

from hubshift.azure_storage import BlobContainer, answered_by_account
from hubshift.ownership.store import (
    BlobEntry,
    BlobNotFound,
    ContainerNotFound,
    LeaseConflict,
    LeaseLost,
    LeaseState,
    StoreError,
    StoreUnavailable,
    WriteConflict,
)
from hubshift.ownership.timing import DEFAULT_TIMING, Timing

# Azure error codes, by what they mean for a caller.
_CONFLICT = {"LeaseAlreadyPresent", "LeaseIsBreakingAndCannotBeAcquired"}
_LOST = {
    "LeaseIdMissing",
    "LeaseIdMismatchWithBlobOperation",
    "LeaseNotPresentWithBlobOperation",
    "LeaseIdMismatchWithLeaseOperation",
    "LeaseNotPresentWithLeaseOperation",
    "LeaseIsBrokenAndCannotBeRenewed",
    "LeaseIsBreakingAndCannotBeChanged",
    "LeaseIsBreakingAndCannotBeRenewed",
    "LeaseLost",
}
_CAS = {"ConditionNotMet", "BlobAlreadyExists"}
_SECRET_RE = re.compile(
    r"(\?|&|;)(sig|se|sp|sv|sr|st|spr|srt|ss|skoid|sktid|skt|ske|sks|skv|AccountKey)=[^&;\s'\"]*"
)


class BlobLeaseStore:
    """`LeaseStore` over one Azure Blob container (or Azurite)."""

    def __init__(self, container: ContainerClient, *, token_credential: str | None = None) -> None:
        self._container = container
        # With a token credential, its name (`managedIdentity`, ...) for the messages of refusals.
        self._token_credential = token_credential
        self.account_url = container.url.split("?", 1)[0].rsplit("/", 1)[0]
        self.container_name = container.container_name

    @classmethod
    def from_container(
        cls, container: BlobContainer, *, timing: Timing = DEFAULT_TIMING, **client_kwargs: Any
    ) -> BlobLeaseStore:
        """A store over `container`; `client_kwargs` go to azure-core (e.g. `per_call_policies`)."""
        client = container.client(**_client_options(timing, client_kwargs))
        return cls(client, token_credential=None if container.token is None else container.token.describe())

    # -- reading ---------------------------------------------------------------------------------------

    def list(self, prefix: str) -> list[BlobEntry]:
        with self._errors(prefix):
            return [
                _entry(blob)
                for blob in self._container.list_blobs(name_starts_with=prefix, include=["metadata"])
            ]

    def properties(self, name: str) -> BlobEntry:
        with self._errors(name):
            return _entry(self._container.get_blob_client(name).get_blob_properties())

    def read(self, name: str) -> tuple[bytes, str]:
        with self._errors(name):
            download = self._container.get_blob_client(name).download_blob()
            data = download.readall()
            return data, _quoted(str(download.properties.etag))

    # -- writing ---------------------------------------------------------------------------------------

    def create(self, name: str, metadata: Mapping[str, str]) -> bool:
        try:
            with self._errors(name):
                self._container.get_blob_client(name).upload_blob(
                    b"", metadata=dict(metadata), overwrite=False
                )
        except (WriteConflict, LeaseLost):
            return False
        return True

    def write(self, name: str, data: bytes, *, etag: str | None) -> str:
        blob = self._container.get_blob_client(name)
        with self._errors(name, not_found=WriteConflict):
            if etag is None:
                result = blob.upload_blob(data, overwrite=False)
            else:
                result = blob.upload_blob(
                    data, overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified
                )
            return _quoted(str(result["etag"]))

    def set_metadata(self, name: str, metadata: Mapping[str, str], *, lease_id: str | None) -> str:
        with self._errors(name):
            result = self._container.get_blob_client(name).set_blob_metadata(dict(metadata), lease=lease_id)
            return _quoted(str(result["etag"]))

    # -- leases ----------------------------------------------------------------------------------------

    def acquire_lease(self, name: str, lease_id: str, duration: int) -> None:
        with self._errors(name):
            self._lease(name, lease_id).acquire(lease_duration=duration)

    def renew_lease(self, name: str, lease_id: str) -> None:
        with self._errors(name):
            self._lease(name, lease_id).renew()

    def release_lease(self, name: str, lease_id: str) -> None:
        with self._errors(name):
            self._lease(name, lease_id).release()

    def break_lease(self, name: str) -> None:
        try:
            with self._errors(name):
                self._lease(name, None).break_lease(lease_break_period=0)
        except LeaseLost:
            pass  # nothing to break: the blob has no active lease

    def close(self) -> None:
        self._container.close()

    def ensure_container(self, *, create: bool) -> None:
        """One request that proves the store is reachable, the credentials work and the container exists
        (creating it when `create`)."""
        with self._errors(self.container_name):
            try:
                self._container.get_container_properties()
            except HttpResponseError as exc:
                if _code(exc) != "ContainerNotFound" or not create:
                    raise
                try:
                    self._container.create_container()
                except HttpResponseError as again:
                    if _code(again) != "ContainerAlreadyExists":
                        raise

    # -- internals -------------------------------------------------------------------------------------

    def _refused(self, exc: HttpResponseError) -> str:
        why = _code(exc) or exc.status_code
        detail = _auth_detail(exc)
        text = f"Blob storage at {self.account_url} refused the credentials ({why}{detail})"
        if self._token_credential is None:
            return text
        return (
            f"{text}: the token of credential {self._token_credential} (check that the identity has Storage "
            "Blob Data Contributor on the account or the container, and the credential's client id)"
        )

    def _lease(self, name: str, lease_id: str | None) -> BlobLeaseClient:
        return BlobLeaseClient(self._container.get_blob_client(name), lease_id=lease_id)

    @contextmanager
    def _errors(self, name: str, *, not_found: Callable[[str], StoreError] = BlobNotFound) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except ClientAuthenticationError as exc:
            if self._token_credential is not None and not answered_by_account(exc, self.account_url):
                raise StoreUnavailable(
                    f"Blob storage at {self.account_url}: no token from credential {self._token_credential}: "
                    f"{_reason(exc)}"
                ) from None
            raise StoreUnavailable(self._refused(exc)) from None
        except (ServiceRequestError, ServiceResponseError) as exc:
            raise StoreUnavailable(
                f"cannot reach Blob storage at {self.account_url}: {_reason(exc)}"
            ) from None
        except HttpResponseError as exc:
            code = _code(exc)
            if exc.status_code in (401, 403):
                raise StoreUnavailable(self._refused(exc)) from None
            if code == "ContainerNotFound":
                raise ContainerNotFound(
                    f"container {self.container_name!r} does not exist at {self.account_url}"
                ) from None
            if code == "BlobNotFound":
                raise not_found(name) from None
            if code in _CONFLICT:
                raise LeaseConflict(f"{name}: {code}") from None
            if code in _LOST:
                raise LeaseLost(f"{name}: {code}") from None
            if code in _CAS:
                raise WriteConflict(f"{name}: {code}") from None
            if exc.status_code is not None and exc.status_code >= 500:
                raise StoreUnavailable(
                    f"Blob storage at {self.account_url} failed: {exc.status_code} {code}"
                ) from None
            raise StoreError(f"{name}: {exc.status_code} {code}") from None
        except AzureError as exc:
            raise StoreUnavailable(f"Blob storage at {self.account_url} failed: {_reason(exc)}") from None


def _client_options(timing: Timing, client_kwargs: dict[str, Any]) -> dict[str, Any]:
    options = {
        "connection_timeout": timing.request_timeout_seconds,
        "read_timeout": timing.request_timeout_seconds,
        # The SDK's default backs off 15 s before its first retry: longer than half a membership lease.
        "retry_policy": LinearRetry(backoff=1, retry_total=2, random_jitter_range=1),
    }
    return {**options, **client_kwargs}


def _entry(blob: BlobProperties) -> BlobEntry:
    lease = blob.lease
    state = LeaseState(lease.state) if lease.state else LeaseState.AVAILABLE
    return BlobEntry(
        name=blob.name,
        metadata=dict(blob.metadata or {}),
        etag=_quoted(str(blob.etag)),
        last_modified=blob.last_modified,
        lease_state=state,
        lease_infinite=state is LeaseState.LEASED and lease.duration == "infinite",
        size=int(blob.size or 0),
    )


def _quoted(etag: str) -> str:
    """Listings give ETags bare, responses give them quoted: one form for comparisons."""
    return etag if etag.startswith('"') else f'"{etag}"'


def _code(exc: HttpResponseError) -> str:
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "")


def _auth_detail(exc: HttpResponseError) -> str:
    """`: The token is expired.`: Azure Storage's AuthenticationErrorDetail, when it gave one."""
    for line in str(exc.message or "").splitlines():
        if line.lower().startswith("authenticationerrordetail:"):
            return ": " + _SECRET_RE.sub(r"\1\2=REDACTED", line.partition(":")[2].strip())[:200]
    return ""


def _reason(exc: AzureError) -> str:
    """The first line of the error, with any query string or key removed."""
    text = str(exc.message if exc.message else exc).splitlines()[0] if str(exc) else type(exc).__name__
    errno = re.search(r"\[Errno [^\]]+\] [^'\")]+", text)  # "[Errno 111] Connection refused"
    return _SECRET_RE.sub(r"\1\2=REDACTED", errno.group(0) if errno else text)[:300]
