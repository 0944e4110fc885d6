"""`hubshift status` on both backends, and every bad input as one line on stderr with a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hubshift.ownership.assignment import publish_assignment
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition, release_partition
from hubshift.ownership.membership import join_pool
from hubshift.ownership.model import Assignment, Checkpoint, Phase
from hubshift.ownership.scope import Scope
from hubshift.ownership.stores.locations import sqlite_url
from tests.fixtures.ownership import StoreUnderTest
from tests.harness.azurite import ACCOUNT_KEY, connection_string
from tests.harness.ports import free_port

SCOPE = Scope("shop.servicebus.windows.net", "orders", "$Default")
SCOPE_ARGS = ["--namespace", "shop.servicebus.windows.net", "--hub", "orders", "--consumer-group", "$Default"]


def hubshift(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hubshift.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def store_args(subject: StoreUnderTest) -> tuple[list[str], dict[str, str]]:
    """The store goes in the environment for Azure (it holds a key), on the command line for SQLite."""
    if subject.kind == "blob":
        return ["--container", subject.container], {"HUBSHIFT_STORE": subject.url}
    return ["--store", subject.url], {}


def populate(subject: StoreUnderTest) -> None:
    import time

    store = subject.store
    join_pool(store, SCOPE, "orders-0", clock=time.monotonic)
    write_checkpoint(store, claim_partition(store, SCOPE, "0", "orders-0"), Checkpoint("4096", 40))
    claim_partition(store, SCOPE, "1", "orders-0")
    claim_partition(store, SCOPE, "2", "orders-1")  # never joined: shown as gone
    release_partition(store, claim_partition(store, SCOPE, "10", "orders-1"), final=Checkpoint("77", 7))
    now = datetime(2026, 11, 21, 9, 30, tzinfo=UTC)
    assignment = Assignment(3, {"0": "orders-0", "1": "orders-0", "2": "orders-0", "10": "orders-1"},
                            Phase.REBALANCING, 2, now)  # fmt: skip
    publish_assignment(store, SCOPE, assignment, etag=None)


def test_status_prints_the_ownership_table_as_json(lease_store: StoreUnderTest) -> None:
    populate(lease_store)
    args, env = store_args(lease_store)
    result = hubshift("status", *args, *SCOPE_ARGS, "--output", "json", env=env)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    rows = {r["partition"]: r for r in document["partitions"]}
    assert list(rows) == ["0", "1", "2", "10"]
    assert {k: rows["0"][k] for k in ("owner", "offset", "sequenceNumber")} == {
        "owner": "orders-0",
        "offset": "4096",
        "sequenceNumber": 40,
    }
    assert datetime.fromisoformat(rows["0"]["lastModified"]).tzinfo is not None
    assert (rows["1"]["offset"], rows["1"]["sequenceNumber"]) == ("-1", -1)
    assert (rows["2"]["owner"], rows["2"]["ownerAlive"]) == ("orders-1", False)
    assert (rows["10"]["owner"], rows["10"]["offset"], rows["10"]["leaseState"]) == (None, "77", "available")
    assert (document["phase"], document["generation"]) == ("Rebalancing", 3)
    assert document["assignment"] == {"0": "orders-0", "1": "orders-0", "2": "orders-0", "10": "orders-1"}
    assert document["members"] == [{"consumer": "orders-0", "alive": True}]


def test_status_prints_a_human_table(lease_store: StoreUnderTest) -> None:
    populate(lease_store)
    args, env = store_args(lease_store)
    result = hubshift("status", *args, *SCOPE_ARGS, env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "generation 3, phase Rebalancing" in out
    for text in ("shop.servicebus.windows.net", "orders-0", "4096", "(gone)", "(free)", "Last modified"):
        assert text in out
    line = next(row for row in out.splitlines() if "4096" in row)
    assert "orders-0" in line and " 40 " in line


def test_status_of_an_empty_consumer_group(sqlite_store: StoreUnderTest) -> None:
    result = hubshift("status", "--store", sqlite_store.url, *SCOPE_ARGS, "--output", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["partitions"] == [] and document["phase"] is None and document["assignment"] is None


def bad(*args: str, env: dict[str, str] | None = None) -> str:
    """Run a failing `hubshift status`; its one stderr line."""
    result = hubshift("status", *args, *SCOPE_ARGS, env=env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert ACCOUNT_KEY not in result.stderr and ACCOUNT_KEY[:20] not in result.stderr
    return lines[0]


def test_a_malformed_connection_string() -> None:
    malformed = "not an Azure Storage connection string"
    assert malformed in bad("--store", "AccountName=x;nonsense", "--container", "abc")
    typo = f"Acount=x;AccountKey={ACCOUNT_KEY}"
    assert malformed in bad("--store", typo, "--container", "abc")
    assert "AccountKey is not base64" in bad("--store", "AccountName=x;AccountKey=***;", "--container", "abc")
    assert "needs a container" in bad(env={"HUBSHIFT_STORE": connection_string(10000)})
    assert "sqlite:////absolute" in bad("--store", "sqlite:/x.db")


def test_an_unreachable_store() -> None:
    line = bad("--container", "abc", env={"HUBSHIFT_STORE": connection_string(free_port())})
    assert line.startswith("hubshift: error: cannot reach Blob storage at http://127.0.0.1:")


def test_a_missing_container(blob_store: StoreUnderTest) -> None:
    line = bad("--container", "no-such-container", env={"HUBSHIFT_STORE": blob_store.url})
    assert "container 'no-such-container' does not exist" in line


def test_wrong_credentials(blob_store: StoreUnderTest) -> None:
    wrong = blob_store.url.replace(ACCOUNT_KEY, "d3Jvbmcga2V5IGZvciB0aGUgdGVzdA==")
    line = bad("--container", blob_store.container, env={"HUBSHIFT_STORE": wrong})
    assert "refused the credentials" in line


@pytest.mark.parametrize("case", ["directory", "not-a-database", "missing"])
def test_a_sqlite_path_that_cannot_be_used(tmp_path: Path, case: str) -> None:
    path = {
        "directory": tmp_path,
        "not-a-database": tmp_path / "notes.txt",
        "missing": tmp_path / "x" / "s.db",
    }
    (tmp_path / "notes.txt").write_text("not a database, but long enough to have a header: " * 4)
    line = bad("--store", sqlite_url(path[case]))
    expected = {
        "directory": "is a directory",
        "not-a-database": "cannot write the SQLite store",
        "missing": "there is no SQLite store",
    }
    assert expected[case] in line and str(path[case]) in line


def test_a_bad_scope(sqlite_store: StoreUnderTest) -> None:
    result = hubshift("status", "--store", sqlite_store.url, "--namespace", "ns", "--hub", "a/b")
    assert result.returncode != 0 and "contain no '/'" in result.stderr and "Traceback" not in result.stderr
