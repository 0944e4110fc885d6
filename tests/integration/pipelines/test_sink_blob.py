"""The Blob sink on Azurite: a batch's partials, dead letters and commit record as blobs, read back by the
aggregate view; bad credentials fail at start-up in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.blob import ContainerClient

from hubshift.consumer.spark.batch import process_batch
from hubshift.errors import UserError
from hubshift.pipelines.aggregate import AggregatePipeline
from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.pipelines.sensor_events import SensorEvent
from hubshift.sinks import BlobStore, SinkSpec, build_sink, build_store
from tests.fixtures.spark import event_row
from tests.harness.azurite import Azurite

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def spec(container: str, **extra: Any) -> SinkSpec:
    return SinkSpec.model_validate(
        {
            "type": "blob",
            "blob": {"container": container, "prefix": "homes", "connectionStringEnv": "SINK"},
            **extra,
        }
    )


def test_batches_land_as_blobs_and_read_back_exactly(
    azurite: Azurite, blob_container: str, event_frame: Callable[..., Any]
) -> None:
    environ = {"SINK": azurite.connection_string}
    body = SensorEvent("h7", "h7-s0", "motion", "detected", T0 + timedelta(seconds=3)).to_json()
    first = [event_row("0", n, body, partition_key="h7") for n in range(5)] + [event_row("0", 5, b"{oops")]
    second = [event_row("0", n, body, partition_key="h7") for n in range(6, 9)]
    # two consumers, one after the other (a graceful handoff of partition 0)
    a, b = build_sink(spec(blob_container), environ), build_sink(spec(blob_container), environ)
    done = process_batch(event_frame(first), 0, "homes-0", AggregatePipeline(60), a)
    process_batch(event_frame(second), 0, "homes-1", AggregatePipeline(60), b)
    assert done.dead_letters == 1

    client = ContainerClient.from_connection_string(azurite.connection_string, blob_container)
    names = sorted(client.list_blob_names())
    assert sum(n.startswith("homes/_batches/") for n in names) == 2
    assert sum(n.startswith("homes/aggregates/window=20261121T100000Z/") for n in names) == 2
    (dead,) = [n for n in names if n.startswith("homes/dead-letter/date=")]
    letter = json.loads(client.download_blob(dead).readall())
    assert letter["sequenceNumber"] == 5 and letter["body"] == "{oops"

    view = AggregateView(build_store(spec(blob_container), environ))
    assert view.refresh() == 2
    assert view.count(T0, "h7", "motion") == 8
    view.write_views()
    assert "homes/views/index.json" in set(client.list_blob_names())
    client.close()


def test_dead_letter_path_is_a_prefix_in_the_container(azurite: Azurite, blob_container: str) -> None:
    sink = build_sink(spec(blob_container, deadLetterPath="poison/"), {"SINK": azurite.connection_string})
    assert isinstance(sink.dead_letter_store, BlobStore)  # type: ignore[attr-defined]
    assert sink.dead_letter_store.prefix == "poison"  # type: ignore[attr-defined]


def test_the_container_is_created_at_start_up(azurite: Azurite) -> None:
    container = f"new{datetime.now(UTC):%H%M%S%f}"
    build_sink(spec(container), {"SINK": azurite.connection_string})
    client = ContainerClient.from_connection_string(azurite.connection_string, container)
    assert client.exists()
    client.delete_container()


def test_bad_credentials_fail_at_start_up_in_one_line(azurite: Azurite, blob_container: str) -> None:
    wrong = azurite.connection_string.replace("AccountKey=", "AccountKey=AAAA")
    with pytest.raises(UserError) as error:
        build_sink(spec(blob_container), {"SINK": wrong})
    assert "refused the credentials" in str(error.value) or "cannot reach" in str(error.value)
    assert "AccountKey" not in str(error.value)


def test_an_unreachable_account_fails_in_one_line() -> None:
    from tests.harness.azurite import connection_string
    from tests.harness.ports import free_port

    with pytest.raises(UserError, match="cannot reach the storage account"):
        build_sink(spec("homes"), {"SINK": connection_string(free_port())})
