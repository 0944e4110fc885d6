"""Open a store from what a user types: the one place a store location is parsed and checked.

- `sqlite:///relative/path.db` or `sqlite:////absolute/path.db` (SQLAlchemy's form; `sqlite_url` builds it);
- an Azure Storage connection string (`AccountName=...;AccountKey=...;` or `BlobEndpoint=...;...`), with a
  container;
- a storage account's Blob endpoint (`https://ACCOUNT.blob.core.windows.net`) with a container and a token
  credential.

Bad input becomes `hubshift.errors.UserError`: one line that says what to fix and never repeats the
connection string (it holds a key).
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hubshift.errors import UserError
from hubshift.ownership.store import ContainerNotFound, LeaseStore, StoreError
from hubshift.ownership.stores.sqlite import DEFAULT_CONTAINER
from hubshift.ownership.timing import DEFAULT_TIMING, Timing

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

SQLITE_SCHEME = "sqlite:///"
_KNOWN_KEYS = {
    "defaultendpointsprotocol",
    "accountname",
    "accountkey",
    "endpointsuffix",
    "blobendpoint",
    "blobsecondaryendpoint",
    "queueendpoint",
    "tableendpoint",
    "fileendpoint",
    "sharedaccesssignature",
    "usedevelopmentstorage",
    "developmentstorageproxyuri",
}
_CONTAINER_RE = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_HINT = "expected sqlite:///PATH or an Azure Storage connection string (AccountName=...;AccountKey=...;)"


@dataclass(frozen=True)
class SqliteLocation:
    path: Path
    container: str = DEFAULT_CONTAINER


@dataclass(frozen=True)
class BlobLocation:
    """A Blob container, reached with a connection string or with a token credential and its account's URL
    (`credential_name` says which credential, in messages)."""

    connection_string: str | None = field(repr=False)
    container: str
    account_url: str | None = None
    credential: TokenCredential | None = field(default=None, repr=False, compare=False)
    credential_name: str = "token credential"


def sqlite_url(path: str | Path) -> str:
    """The store string for a SQLite file (absolute paths get the fourth slash)."""
    return SQLITE_SCHEME + str(path)


_KEY_NAME_RE = re.compile(r"[A-Za-z]{1,32}")


def parse_store(
    store: str,
    container: str | None = None,
    *,
    credential: TokenCredential | None = None,
    credential_name: str = "token credential",
) -> SqliteLocation | BlobLocation:
    """Parse and check a store string without contacting anything; `UserError` if it is malformed. An
    account URL needs the token `credential` it is read with."""
    text = store.strip()
    if not text:
        raise UserError(f"the store is empty: {_HINT}")
    if text.lower().startswith("sqlite:"):
        return _parse_sqlite(text, container)
    if "://" in text and "=" not in text:
        if not re.match(r"^https://[^/\s]+(/[^/\s]+)?/?$", text):
            raise UserError(
                "a storage account URL is https://ACCOUNT.blob.core.windows.net (a token is only sent over "
                "TLS)"
            )
        if credential is None:
            raise UserError(
                "a storage account URL is read with a token credential: pass --credential "
                "(workloadIdentity, managedIdentity or default), or give a connection string"
            )
        return BlobLocation(None, check_container(container), text.rstrip("/"), credential, credential_name)
    _check_connection_string(text)
    return BlobLocation(connection_string=text, container=check_container(container))


def check_container(container: str | None) -> str:
    if not container:
        raise UserError("an Azure Storage store needs a container: pass --container NAME")
    if not _CONTAINER_RE.match(container):
        raise UserError(
            f"container name {container!r} is not valid: 3-63 lower-case letters, digits and single hyphens"
        )
    return container


def open_store(
    store: str | SqliteLocation | BlobLocation,
    container: str | None = None,
    *,
    create: bool = False,
    timing: Timing = DEFAULT_TIMING,
    clock: Callable[[], float] = time.time,
    **client_kwargs: Any,
) -> LeaseStore:
    """Open and check a store: reachable, credentials accepted, container (or SQLite file) present.

    `create` makes a missing container or SQLite file (the consumer and the operator); without it
    (`hubshift status`) a missing one is an error. `clock` is SQLite's wall clock; `client_kwargs` go to
    the Azure client (e.g. `per_call_policies`).
    """
    location = parse_store(store, container) if isinstance(store, str) else store
    if isinstance(location, SqliteLocation):
        return _open_sqlite(location, create=create, clock=clock)
    return _open_blob(location, create=create, timing=timing, **client_kwargs)


def _parse_sqlite(text: str, container: str | None) -> SqliteLocation:
    if not text.startswith(SQLITE_SCHEME) or len(text) == len(SQLITE_SCHEME):
        raise UserError("a SQLite store is written sqlite:///relative/path.db or sqlite:////absolute/path.db")
    return SqliteLocation(path=Path(text[len(SQLITE_SCHEME) :]), container=container or DEFAULT_CONTAINER)


def _check_connection_string(text: str) -> None:
    pairs: dict[str, str] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise UserError(f"the store is not a valid connection string (a part has no Key=Value): {_HINT}")
        if key.strip().lower() not in _KNOWN_KEYS:
            # Name the key only when it looks like one: a key pasted without its name must not be echoed.
            name = key.strip()
            known = _KEY_NAME_RE.fullmatch(name)
            what = f"an unknown key {name!r}" if known else "a part that is no Key=Value"
            raise UserError(f"the connection string has {what}: {_HINT}")
        pairs[key.strip().lower()] = value.strip()
    if pairs.get("usedevelopmentstorage", "").lower() == "true":
        return
    if not pairs.get("blobendpoint") and not pairs.get("accountname"):
        raise UserError("the connection string names no account (it needs AccountName or BlobEndpoint)")
    account_key = pairs.get("accountkey")
    if account_key is not None:
        if not pairs.get("accountname"):
            raise UserError("the connection string has an AccountKey but no AccountName")
        try:
            base64.b64decode(account_key, validate=True)
        except (binascii.Error, ValueError):
            raise UserError("the connection string's AccountKey is not base64 (a cut-off copy?)") from None
    endpoint = pairs.get("blobendpoint")
    if endpoint and not re.match(r"^https?://[^/\s]+", endpoint):
        raise UserError("the connection string's BlobEndpoint must be an http(s) URL")


def _open_sqlite(location: SqliteLocation, *, create: bool, clock: Callable[[], float]) -> LeaseStore:
    from hubshift.ownership.stores.sqlite import SqliteLeaseStore  # lazy: one backend per store

    path = location.path
    if path.is_dir():
        raise UserError(f"the SQLite store {path} is a directory: give the path of a database file")
    if not path.exists():
        if not create:
            raise UserError(f"there is no SQLite store at {path} (nothing has used it yet; check the path)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the SQLite store at {path}: {exc.strerror or exc}") from None
    try:
        store = SqliteLeaseStore(path, location.container, clock=clock)
        store.list("\x00probe")  # a first read proves the file is a database we can use
    except StoreError as exc:
        raise UserError(f"cannot write the SQLite store at {path}: {_last_clause(exc)}") from None
    return store


def _open_blob(location: BlobLocation, *, create: bool, timing: Timing, **client_kwargs: Any) -> LeaseStore:
    from hubshift.ownership.stores.blob import BlobLeaseStore  # lazy: the Storage SDK only for Blob

    try:
        if location.connection_string is not None:
            store = BlobLeaseStore.from_connection_string(
                location.connection_string, location.container, timing=timing, **client_kwargs
            )
        else:
            assert location.account_url is not None and location.credential is not None
            store = BlobLeaseStore.from_account_url(
                location.account_url,
                location.container,
                location.credential,
                credential_name=location.credential_name,
                timing=timing,
                **client_kwargs,
            )
    except ValueError:
        raise UserError(f"the store is not a valid Azure Storage connection string: {_HINT}") from None
    try:
        store.ensure_container(create=create)
    except ContainerNotFound:
        store.close()
        raise UserError(
            f"container {location.container!r} does not exist at {store.account_url}: "
            "create it, or check --container"
        ) from None
    except StoreError as exc:
        store.close()
        raise UserError(str(exc)) from None
    return store


def _last_clause(exc: Exception) -> str:
    return str(exc).rsplit(": ", 1)[-1]
