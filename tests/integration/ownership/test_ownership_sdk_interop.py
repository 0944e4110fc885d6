"""hubshift's checkpoints are the Azure SDK's: its `BlobCheckpointStore` (sync and aio) lists what hubshift
wrote, including partitions claimed but never checkpointed, and hubshift resumes where the SDK stopped."""

from __future__ import annotations

import pytest
from azure.core.exceptions import HttpResponseError
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore as AioBlobCheckpointStore

from hubshift.ownership.checkpoints import list_checkpoints, write_checkpoint
from hubshift.ownership.leases import claim_partition
from hubshift.ownership.model import Checkpoint
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from tests.fixtures.ownership import StoreUnderTest

# As the SDK gets them from the client: mixed case; both sides lower-case the blob names.
FQNS, HUB, CG = "Interop.ServiceBus.Windows.Net", "Orders", "$Default"
SCOPE = Scope(FQNS, HUB, CG)


def sdk_view(rows: list[dict[str, object]]) -> dict[str, tuple[object, object]]:
    return {str(r["partition_id"]): (r["offset"], r["sequence_number"]) for r in rows}


def hubshift_writes(blob_store: StoreUnderTest) -> dict[str, tuple[object, object]]:
    store = blob_store.store
    for p, offset, sequence in (("0", "4096", 40), ("1", "8192", 80)):
        write_checkpoint(store, claim_partition(store, SCOPE, p, "c-0"), Checkpoint(offset, sequence))
    for p in ("2", "3"):  # claimed, never checkpointed
        claim_partition(store, SCOPE, p, "c-1")
    return {"0": ("4096", 40), "1": ("8192", 80), "2": ("-1", -1), "3": ("-1", -1)}


def test_the_sdk_lists_what_hubshift_wrote(blob_store: StoreUnderTest) -> None:
    expected = hubshift_writes(blob_store)
    sdk = BlobCheckpointStore.from_connection_string(blob_store.url, blob_store.container)
    with sdk:
        assert sdk_view(list(sdk.list_checkpoints(FQNS, HUB, CG))) == expected
        # The SDK writes checkpoints without a lease, so it cannot move a partition hubshift owns either.
        with pytest.raises(HttpResponseError):
            sdk.update_checkpoint(
                {
                    "fully_qualified_namespace": FQNS,
                    "eventhub_name": HUB,
                    "consumer_group": CG,
                    "partition_id": "0",
                    "offset": "1",
                    "sequence_number": 1,
                }
            )
        assert sdk_view(list(sdk.list_checkpoints(FQNS, HUB, CG)))["0"] == ("4096", 40)


async def test_the_aio_sdk_lists_what_hubshift_wrote(blob_store: StoreUnderTest) -> None:
    expected = hubshift_writes(blob_store)
    sdk = AioBlobCheckpointStore.from_connection_string(blob_store.url, blob_store.container)
    async with sdk:
        assert sdk_view(list(await sdk.list_checkpoints(FQNS, HUB, CG))) == expected


async def test_hubshift_resumes_where_the_sdk_stopped(blob_store: StoreUnderTest) -> None:
    def checkpoint(partition: str, offset: str, sequence: int) -> dict[str, object]:
        return {
            "fully_qualified_namespace": FQNS,
            "eventhub_name": HUB,
            "consumer_group": CG,
            "partition_id": partition,
            "offset": offset,
            "sequence_number": sequence,
        }

    with BlobCheckpointStore.from_connection_string(blob_store.url, blob_store.container) as sdk:
        sdk.update_checkpoint(checkpoint("0", "1200", 12))
    async with AioBlobCheckpointStore.from_connection_string(blob_store.url, blob_store.container) as aio:
        await aio.update_checkpoint(checkpoint("5", "5500", 55))

    store = blob_store.store
    assert list_checkpoints(store, SCOPE) == {"0": Checkpoint("1200", 12), "5": Checkpoint("5500", 55)}
    lease = claim_partition(store, SCOPE, "5", "c-0")
    assert (lease.owner_level, lease.checkpoint) == (1, Checkpoint("5500", 55))
    row = take_snapshot(store, SCOPE).partition("0")
    assert row is not None and row.free and row.checkpoint == Checkpoint("1200", 12) and row.owner_level == 0
