"""`hubshift checkpoints show|reset` as a person runs them, against Azurite and the emulator: refused while a
live consumer owns a partition, a dry run unless `--execute`, each kind of position resolved from the hub
(the checkpoint names the event before the next one read, with its offset), a gone owner's lease broken, a
partition without a checkpoint blob given one; the next claim resumes there one owner level up. A move is
fenced: a consumer claiming the partition meanwhile makes it fail, never read a stale position."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient

from hubshift.emulator.launch import RunningEmulator
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition, release_partition
from hubshift.ownership.membership import expel, join_pool, leave
from hubshift.ownership.model import Checkpoint
from hubshift.ownership.override import TakenMeanwhile, move_checkpoint
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import BlobEntry, LeaseStore
from tests.fixtures.ownership import StoreUnderTest
from tests.harness.azurite import ACCOUNT_KEY

pytestmark = pytest.mark.timeout(240)

EVENTS = 20  # per partition: sequence numbers 0-19
HUBSHIFT = [sys.executable, "-m", "hubshift.cli"]


@dataclass(frozen=True)
class Sent:
    offset: str
    enqueued: datetime


def fill(emulator: RunningEmulator) -> dict[str, list[Sent]]:
    """EVENTS events in each of the 4 partitions, two batches apart in time; each event's offset and time."""
    with EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name="hub") as p:
        for round_ in range(2):
            for partition in ("0", "1", "2", "3"):
                batch = p.create_batch(partition_id=partition)
                for n in range(EVENTS // 2):
                    batch.add(EventData(f"{round_}-{n}"))
                p.send_batch(batch)
            time.sleep(1.2)
    found: dict[str, list[Sent]] = {p: [] for p in ("0", "1", "2", "3")}
    consumer = EventHubConsumerClient.from_connection_string(
        emulator.connection_string, "$Default", eventhub_name="hub"
    )

    def on_event(context: Any, event: Any) -> None:
        found[context.partition_id].append(Sent(str(event.offset), event.enqueued_time))
        if all(len(events) == EVENTS for events in found.values()):
            consumer.close()

    with consumer:
        consumer.receive(on_event, starting_position="-1")
    return found


def hubshift(
    *args: str, emulator: RunningEmulator, store: StoreUnderTest
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HUBSHIFT_STORE": store.url,
        "HUBSHIFT_EVENTHUBS": emulator.connection_string,
        "COLUMNS": "220",
    }
    scope = ("--container", store.container, "--namespace", f"127.0.0.1:{emulator.port}", "--hub", "hub")
    result = subprocess.run([*HUBSHIFT, *args, *scope], env=env, capture_output=True, text=True, timeout=120)
    assert ACCOUNT_KEY not in result.stdout + result.stderr
    assert "SharedAccessKey=" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result


def positions(store: LeaseStore, scope: Scope) -> dict[str, tuple[str, int]]:
    return {
        row.partition: (row.checkpoint.offset, row.checkpoint.sequence_number)
        for row in take_snapshot(store, scope).partitions
    }


def test_reset_is_refused_while_owned_then_moves_every_kind_of_position(
    emulator: RunningEmulator, blob_store: StoreUnderTest
) -> None:
    sent = fill(emulator)
    store, scope = blob_store.store, Scope(f"127.0.0.1:{emulator.port}", "hub", "$Default")
    alive = join_pool(store, scope, "c-0", clock=time.monotonic)
    leases = [claim_partition(store, scope, p, "c-0") for p in ("0", "1")]
    for lease in leases:
        write_checkpoint(store, lease, Checkpoint(sent[lease.partition][9].offset, 9))
    join_pool(store, scope, "c-1", clock=time.monotonic)
    write_checkpoint(store, claim_partition(store, scope, "2", "c-1"), Checkpoint(sent["2"][14].offset, 14))
    expel(store, scope, "c-1")  # gone: its partition 2 is an orphan, its lease still held
    before = positions(store, scope)

    shown = json.loads(
        hubshift("checkpoints", "show", "--output", "json", emulator=emulator, store=blob_store).stdout
    )
    table = {row["partition"]: row for row in shown["partitions"]}
    assert [table[p]["owner"] for p in "0123"] == ["c-0", "c-0", "c-1", None]
    assert [table[p]["ownerAlive"] for p in "012"] == [True, True, False]
    assert [table[p]["backlog"] for p in "0123"] == [10, 10, 5, 20]
    assert table["3"]["sequenceNumber"] is None and table["0"]["retained"] == [0, 19]

    refused = hubshift(
        "checkpoints", "reset", "--to-sequence", "5", "--execute", emulator=emulator, store=blob_store
    )
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "hubshift: error: cannot move checkpoints while live consumers own partitions 0 (c-0), 1 (c-0): "
        "pause the pool first (kubectl annotate partitionedconsumer NAME "
        "autoscaling.hubshift.dev/paused-replicas=0, or that annotation in the manifest of hubshift run), "
        "then run this again once `hubshift checkpoints show` lists them free"
    )
    assert positions(store, scope) == before

    for lease in leases:  # c-0 hands its partitions off and leaves, as on SIGTERM
        release_partition(store, lease)
    leave(store, alive)
    dry = hubshift("checkpoints", "reset", "--to-sequence", "5", emulator=emulator, store=blob_store)
    assert dry.returncode == 0, dry.stderr
    assert "dry run: nothing was written" in dry.stdout
    assert positions(store, scope) == before

    done = hubshift(
        "checkpoints", "reset", "--to-sequence", "5", "--execute", emulator=emulator, store=blob_store
    )
    assert done.returncode == 0, done.stderr
    assert "moved 4 checkpoint(s) to sequence number 5" in done.stdout
    assert positions(store, scope) == {p: (sent[p][4].offset, 4) for p in "0123"}
    snapshot = take_snapshot(store, scope)
    assert all(row.free for row in snapshot.partitions), "the gone owner's lease was broken, ours released"
    assert [row.owner_level for row in snapshot.partitions] == [1, 1, 1, 0]
    resumed = claim_partition(store, scope, "2", "c-2")
    assert (resumed.checkpoint, resumed.owner_level) == (Checkpoint(sent["2"][4].offset, 4), 2)
    release_partition(store, resumed)

    # the first event of the second round, by its enqueued time
    at = sent["1"][10].enqueued.isoformat()
    assert (
        hubshift(
            "checkpoints",
            "reset",
            "--to-time",
            at,
            "--partitions",
            "1",
            "--execute",
            emulator=emulator,
            store=blob_store,
        ).returncode
        == 0
    )
    assert positions(store, scope)["1"] == (sent["1"][9].offset, 9)
    assert (
        hubshift(
            "checkpoints", "reset", "--to-end", "--execute", emulator=emulator, store=blob_store
        ).returncode
        == 0
    )
    assert positions(store, scope) == {p: (sent[p][19].offset, 19) for p in "0123"}
    assert (
        hubshift(
            "checkpoints", "reset", "--to-start", "--execute", emulator=emulator, store=blob_store
        ).returncode
        == 0
    )
    assert positions(store, scope) == {p: ("-1", -1) for p in "0123"}

    past = hubshift("checkpoints", "reset", "--to-sequence", "21", emulator=emulator, store=blob_store)
    assert past.returncode == 2
    assert past.stderr.strip() == (
        "hubshift: error: partition 0: sequence number 21 is past its end (the next event will be 20)"
    )
    neither = hubshift("checkpoints", "reset", "--partitions", "0", emulator=emulator, store=blob_store)
    assert "exactly one of --to-start, --to-end, --to-time or --to-sequence" in neither.stderr


class ClaimWhileMoving:
    """The store, with a consumer's forced claim of the partition slipped in between the move's acquire and
    its write (a consumer that did not wait for the pause)."""

    def __init__(self, store: LeaseStore, scope: Scope) -> None:
        self.store, self.scope, self.done = store, scope, False

    def properties(self, name: str) -> BlobEntry:
        entry = self.store.properties(name)
        if not self.done and name.endswith("/checkpoint/0"):
            self.done = True
            claim_partition(self.store, self.scope, "0", "intruder", force=True)
        return entry

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_claim_during_a_move_wins_and_nothing_stale_is_read(lease_store: StoreUnderTest) -> None:
    store, scope = lease_store.store, Scope("ns", "hub", "$Default")
    release_partition(store, claim_partition(store, scope, "0", "c-0"), final=Checkpoint("900", 9))
    row = take_snapshot(store, scope).partition("0")
    with pytest.raises(TakenMeanwhile):
        move_checkpoint(ClaimWhileMoving(store, scope), scope, row, "0", Checkpoint("100", 1))  # type: ignore[arg-type]
    after = take_snapshot(store, scope).partition("0")
    assert after is not None and after.owner == "intruder" and after.checkpoint == Checkpoint("900", 9)
