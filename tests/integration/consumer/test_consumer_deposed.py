"""A deposed Spark consumer (its lease broken under it) stops reading at once and cannot move the
checkpoint: by the service disconnecting its receiver for a higher owner level, and, with no new receiver,
by the fenced checkpoint write."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hubshift.apps.produce import LoadSpec, send_load
from hubshift.emulator.launch import RunningEmulator
from hubshift.eventhubs.receiver import ReceiverPool, StartAt
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.ownership.leases import claim_partition
from hubshift.ownership.membership import join_pool
from hubshift.ownership.model import EARLIEST
from hubshift.ownership.timing import Timing
from tests.fixtures.consumer import (
    ConsumerPool,
    committed_ranges,
    consumer_environ,
    consumer_manifest,
    wait_for,
)
from tests.harness.ownership import owned_by, read_checkpoint

pytestmark = pytest.mark.timeout(600)


def test_a_deposed_consumer_stops_at_once_and_cannot_move_the_checkpoint(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    sink = tmp_path / "sink"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=sink,
        consumer={"checkpoint": {"everySeconds": 1, "everyEvents": 50}},
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    ownership = consumer_pool.ownership(manifest)
    store, scope = ownership.store, ownership.scope

    stop = threading.Event()

    spec = LoadSpec(homes=40, rate=100, seed=3)
    producer = threading.Thread(
        target=send_load, args=(emulator.connection_string, "hub", spec), kwargs={"stop": stop}
    )
    producer.start()
    thieves: ReceiverPool | None = None
    try:
        # A long listing interval: the consumer notices only through its receivers and its checkpoints.
        consumer = consumer_pool.start(manifest, "c0", args=("--list-interval", "300"))
        consumer.wait_ready()
        wait_for(lambda: len(owned_by(ownership.snapshot(), "c0")) == 2, 60, "c0 to own both")
        wait_for(
            lambda: all((read_checkpoint(store, scope, p) or EARLIEST).sequence_number > 0 for p in "01"),
            180,
            "checkpoints on both partitions",
            on_timeout=consumer.log,
        )
        # Somebody else (alive, so not an orphan) takes partition 0 by force and opens its receiver.
        join_pool(
            store,
            scope,
            "x",
            clock=time.monotonic,
            timing=Timing(membership_lease_seconds=60, renew_interval_seconds=30),
        )
        taken = claim_partition(store, scope, "0", "x", force=True)
        received: list[int] = []
        thieves = ReceiverPool(
            EventHubsTarget(emulator.connection_string, f"127.0.0.1:{emulator.port}", "hub", "$Default")
        )
        thieves.open(
            "0",
            taken.owner_level,
            StartAt(sequence_number=taken.checkpoint.sequence_number),
            lambda batch: received.append(batch.num_rows),
            lambda p, level: None,
        )
        stolen_at = datetime.now(UTC)
        wait_for(
            lambda: consumer.metric("hubshift_consumer_lease_lost_total") >= 1,
            10,
            "c0 to stop partition 0 (its first lease lost)",
            on_timeout=consumer.log,
        )

        # Partition 1: the lease broken, no new receiver. The next checkpoint write is refused.
        taken_1 = claim_partition(store, scope, "1", "x", force=True)
        wait_for(
            lambda: consumer.metric("hubshift_consumer_lease_lost_total") >= 2,
            30,
            "c0 to stop partition 1 (its second lease lost)",
            on_timeout=consumer.log,
        )
        assert consumer.metric("hubshift_consumer_checkpoints_total", 'result="fenced"') >= 1
        time.sleep(5)  # several checkpoint intervals: nothing may move either checkpoint
        assert read_checkpoint(store, scope, "0") == taken.checkpoint
        assert read_checkpoint(store, scope, "1") == taken_1.checkpoint
        assert consumer.metric("hubshift_consumer_owned_partitions") == 0
        assert received, "the new owner's receiver reads"
        # Nothing c0 committed for partition 0 was enqueued after the steal.
        mine = [r for r in committed_ranges(sink).get("0", []) if r.consumer == "c0"]
        assert mine
        last = max(r.last_enqueued for r in mine if r.last_enqueued is not None)
        assert last <= stolen_at + timedelta(seconds=1), (last, stolen_at)
    finally:
        if thieves is not None:
            thieves.close()
        stop.set()
        producer.join(timeout=30)
    consumer.terminate()
    assert consumer.wait(timeout=60) == 0
