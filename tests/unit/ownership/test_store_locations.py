"""Parsing a store string: what is accepted (a connection string as azure-storage-blob reads it), and one
line that never repeats a key for what is not."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from hubshift.azure_storage import BlobContainer, parse_connection_string
from hubshift.errors import UserError
from hubshift.ownership.stores.locations import SqliteLocation, parse_store, sqlite_url

KEY = base64.b64encode(b"a secret account key, 32 bytes!!").decode()
AZURE = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};EndpointSuffix=core.windows.net"


def test_sqlite_urls_follow_sqlalchemy() -> None:
    assert parse_store("sqlite:///state/hub.db") == SqliteLocation(Path("state/hub.db"))
    assert parse_store("sqlite:////var/lib/hub.db", "pc-1") == SqliteLocation(Path("/var/lib/hub.db"), "pc-1")
    assert parse_store(sqlite_url(Path("/tmp/x.db"))) == SqliteLocation(Path("/tmp/x.db"))
    assert parse_store(sqlite_url("rel.db")) == SqliteLocation(Path("rel.db"))


def test_azure_connection_strings() -> None:
    location = parse_store(AZURE, "orders-pc")
    assert location == BlobContainer("orders-pc", AZURE)
    assert KEY not in repr(location)
    assert isinstance(parse_store("UseDevelopmentStorage=true", "abc"), BlobContainer)
    sas = "BlobEndpoint=https://acct.blob.core.windows.net;SharedAccessSignature=sv=2024&sig=abc%3D"
    assert isinstance(parse_store(sas, "abc"), BlobContainer)
    # keys the SDK does not use are left to it, as it leaves them
    assert isinstance(parse_store(f"AccountName=acct;AccountKey={KEY};Flavour=x", "abc"), BlobContainer)


def test_what_a_connection_string_names() -> None:
    account = parse_connection_string(AZURE)
    assert (account.blob_endpoint, account.name, account.key) == (
        "https://acct.blob.core.windows.net",
        "acct",
        KEY,
    )
    assert not account.own_endpoint and KEY not in repr(account)
    azurite = parse_connection_string("UseDevelopmentStorage=true")
    assert (azurite.endpoint_host, azurite.secure, azurite.own_endpoint) == ("127.0.0.1:10000", False, True)


@pytest.mark.parametrize(
    ("store", "container", "message"),
    [
        ("", "abc", "the store is empty"),
        ("sqlite:/x.db", None, "sqlite:///relative"),
        ("sqlite:///", None, "sqlite:///relative"),
        ("https://acct.blob.core.windows.net", "abc", "read with a token credential"),
        ("http://acct.blob.core.windows.net", "abc", "only sent over TLS"),
        ("AccountName=acct;AccountKey", "abc", "not an Azure Storage connection string"),
        ("DefaultEndpointsProtocol=https;EndpointSuffix=core.windows.net", "abc", "not an Azure Storage"),
        ("AccountName=acct;AccountKey=not*base64", "abc", "not base64"),
        (f"BlobEndpoint=http://h:1/a;AccountKey={KEY}", "abc", "AccountName with AccountKey"),
        (f"AccountName=acct;AcountKey={KEY}", "abc", "names no key"),
        ("BlobEndpoint=ftp://x;AccountName=a", "abc", "must be an http(s) URL"),
        (AZURE, None, "needs a container"),
        (AZURE, "Bad_Name", "is not valid"),
        (AZURE, "a--b", "is not valid"),
    ],
)
def test_bad_stores_say_what_to_fix(store: str, container: str | None, message: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_store(store, container)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value) and KEY not in str(caught.value)


@given(st.text(alphabet=st.characters(blacklist_characters=";\n"), min_size=8, max_size=90))
def test_a_key_is_never_repeated_in_an_error(secret: str) -> None:
    shapes = ("AccountName=acct;AccountKey={};Junk", "AccountKey={}", "Acount={}", "{}", "{};AccountName=a")
    for shape in shapes:
        with pytest.raises(UserError) as caught:
            parse_store(shape.format(secret), "abc")
        with pytest.raises(UserError) as placeholder:
            parse_store(shape.format("\x00" * len(secret)), "abc")
        assume(secret not in str(placeholder.value))  # e.g. "sqlite:/" is part of the fixed advice
        assert secret not in str(caught.value)


@pytest.mark.parametrize(
    "store",
    [
        KEY,  # a bare account key (base64, '=' at the end), pasted without its name
        f"{KEY};AccountName=acct",
        "sv=2024-01-01&ss=b&srt=sco&sp=rwl&se=2030-01-01&sig=c2VjcmV0U2lnbmF0dXJl%3D",  # a SAS token alone
        f"DefaultEndpointsProtocol=https;AccountName=acct;{KEY}",
    ],
)
def test_keys_and_tokens_pasted_without_their_name_are_not_echoed(store: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_store(store, "abc")
    message = str(caught.value)
    assert KEY not in message and "sig=" not in message and "c2VjcmV0" not in message
    assert KEY[:20] not in message
