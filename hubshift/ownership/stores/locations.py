"""Open a store from what a user types: the one place a store location is parsed and checked.

- `sqlite:///relative/path.db` or `sqlite:////absolute/path.db` (SQLAlchemy's form; `sqlite_url` builds it);
- an Azure Storage connection string (`AccountName=...;AccountKey=...;` or `BlobEndpoint=...;...`, read by
  azure-storage-blob: `hubshift.azure_storage`), with a container;
- a storage account's Blob endpoint (`https://ACCOUNT.blob.core.windows.net`) with a container and a token
  credential.

A Blob store's location is a `hubshift.azure_storage.BlobContainer`, the type the Blob sink uses too.

Bad input becomes `hubshift.errors.UserError`: one line that says what to fix and never repeats the
connection string (it holds a key).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hubshift.azure_storage import BlobContainer, TokenSource, parse_connection_string
from hubshift.errors import UserError
from hubshift.ownership.store import ContainerNotFound, LeaseStore, StoreError
from hubshift.ownership.stores.sqlite import DEFAULT_CONTAINER
from hubshift.ownership.timing import DEFAULT_TIMING, Timing

SQLITE_SCHEME = "sqlite:///"
_CONTAINER_RE = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_HINT = "expected sqlite:///PATH or an Azure Storage connection string (AccountName=...;AccountKey=...;)"


@dataclass(frozen=True)
class SqliteLocation:
    path: Path
    container: str = DEFAULT_CONTAINER


def sqlite_url(path: str | Path) -> str:
    """The store string for a SQLite file (absolute paths get the fourth slash)."""
    return SQLITE_SCHEME + str(path)


def parse_store(
    store: str, container: str | None = None, *, token: TokenSource | None = None
) -> SqliteLocation | BlobContainer:
    """Parse and check a store string without contacting anything; `UserError` if it is malformed. An
    account URL needs the token credential it is read with (`token`)."""
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
        if token is None:
            raise UserError(
                "a storage account URL is read with a token credential: pass --credential "
                "(workloadIdentity, managedIdentity or default), or give a connection string"
            )
        return BlobContainer(check_container(container), account_url=text.rstrip("/"), token=token)
    return check_blob(BlobContainer(container or "", connection_string=text))


def check_blob(location: BlobContainer) -> BlobContainer:
    """A Blob store's location, checked without contacting anything: its connection string (if it has one)
    and its container's name."""
    if location.connection_string is not None:
        parse_connection_string(location.connection_string, "the store")
    check_container(location.name)
    return location


def check_container(container: str | None) -> str:
    if not container:
        raise UserError("an Azure Storage store needs a container: pass --container NAME")
    if not _CONTAINER_RE.match(container):
        raise UserError(
            f"container name {container!r} is not valid: 3-63 lower-case letters, digits and single hyphens"
        )
    return container


def open_store(
    store: str | SqliteLocation | BlobContainer,
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
    if isinstance(store, str):
        location = parse_store(store, container)
    else:
        location = check_blob(store) if isinstance(store, BlobContainer) else store
    if isinstance(location, SqliteLocation):
        return _open_sqlite(location, create=create, clock=clock)
    return _open_blob(location, create=create, timing=timing, **client_kwargs)


def _parse_sqlite(text: str, container: str | None) -> SqliteLocation:
    if not text.startswith(SQLITE_SCHEME) or len(text) == len(SQLITE_SCHEME):
        raise UserError("a SQLite store is written sqlite:///relative/path.db or sqlite:////absolute/path.db")
    return SqliteLocation(path=Path(text[len(SQLITE_SCHEME) :]), container=container or DEFAULT_CONTAINER)


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


def _open_blob(location: BlobContainer, *, create: bool, timing: Timing, **client_kwargs: Any) -> LeaseStore:
    from hubshift.ownership.stores.blob import BlobLeaseStore  # lazy: the Storage SDK only for Blob

    try:
        store = BlobLeaseStore.from_container(location, timing=timing, **client_kwargs)
    except ValueError:
        raise UserError(f"the store is not a valid Azure Storage connection string: {_HINT}") from None
    try:
        store.ensure_container(create=create)
    except ContainerNotFound:
        store.close()
        raise UserError(
            f"container {location.name!r} does not exist at {store.account_url}: "
            "create it, or check --container"
        ) from None
    except StoreError as exc:
        store.close()
        raise UserError(str(exc)) from None
    return store


def _last_clause(exc: Exception) -> str:
    return str(exc).rsplit(": ", 1)[-1]
