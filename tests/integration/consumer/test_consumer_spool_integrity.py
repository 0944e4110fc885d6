"""Nothing between the link and the sink's commit can hand a range with events missing (issue: 40 events
lost in a Delta table whose log said every partition was complete).

The loss: a partition stopped while a batch read its spool (a watchdog stop when the membership renewal
came late, a lease lost) had its spool folder removed at once; the batch's read skipped the segments the
removal had already taken, the Delta sink committed the rows it got with the partition's high-water mark at
the batch's last event, and the partition, claimed again, was read from its older checkpoint with those
events left out as written. These tests reproduce each step on the emulator, real receivers, a real spool
and (the last) a real consumer with Spark and Delta Lake, read back with delta-rs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubProducerClient

from hubshift.consumer.spark import spool
from hubshift.consumer.spark.engine import SparkEngine
from hubshift.consumer.spark.offsets import PartitionPosition, SourceOffset
from hubshift.consumer.spark.spooling import Reading
from hubshift.emulator.launch import RunningEmulator
from hubshift.eventhubs.receiver import ReceiverPool, StartAt
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.manifest import ConsumerSpec
from hubshift.sinks.commits import BatchSummary
from tests.fixtures.consumer import (
    FAIL_ONCE_DIR,
    LOSE_A_SEGMENT_DIR,
    ConsumerPool,
    consumer_environ,
    consumer_manifest,
    parquet_folder_rows,
    wait_for,
)

pytestmark = pytest.mark.timeout(600)


def send(connection_string: str, partition: str, waves: int, per_wave: int, pause: float = 0.0) -> None:
    producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name="hub")
    with producer:
        for wave in range(waves):
            batch = producer.create_batch(partition_id=partition)
            for n in range(per_wave):
                batch.add(EventData(b'{"n": %d}' % (wave * per_wave + n)))
            producer.send_batch(batch)
            time.sleep(pause)


def spooled_next(engine: SparkEngine, partition: str, level: int) -> int:
    held = spool.extent(engine.spool_root, partition, level)
    return 0 if held is None else held.next


def test_a_partition_stopped_under_a_batch_keeps_its_spool_until_no_batch_reads_it(
    emulator_factory: Callable[..., RunningEmulator], tmp_path: Path
) -> None:
    emulator = emulator_factory(["hub:1"])
    send(emulator.connection_string, "0", 10, 30, pause=0.05)
    target = EventHubsTarget(emulator.connection_string, f"127.0.0.1:{emulator.port}", "hub", "$Default")
    engine = SparkEngine(Reading(target, "c0", ConsumerSpec(), tmp_path))  # its receivers and spool; no query
    try:
        engine.start_partition("0", 1, StartAt(sequence_number=-1), 0)
        deadline = time.monotonic() + 60
        while spooled_next(engine, "0", 1) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spooled_next(engine, "0", 1) == 300
        # A batch is planned over the whole epoch, then the partition is stopped before its read (the
        # watchdog of a late membership renewal, or a lost lease): the read must still find every event.
        in_flight = SourceOffset(engine._ownership_version, {"0": PartitionPosition(1, 0, 300)})
        engine.stop_partition("0")
        batches = spool.read_range(engine.spool_root, "0", 1, 0, 300)
        assert [n for b in batches for n in b.column("sequence_number").to_pylist()] == list(range(300))
        # The batch in flight ends: the epoch stays (it was planned before the stop) ...
        engine._batch_done(in_flight, BatchSummary("c0", 0, {}))
        assert spool.extent(engine.spool_root, "0", 1) is not None
        # ... until a batch planned after the stop has ended: no batch can read it any more.
        engine._batch_done(SourceOffset(engine._ownership_version, {}), BatchSummary("c0", 1, {}))
        assert spool.extent(engine.spool_root, "0", 1) is None
    finally:
        engine.close()


def test_a_link_the_sdk_opens_again_with_events_in_its_buffer_delivers_each_event_once_in_order(
    emulator_factory: Callable[..., RunningEmulator],
) -> None:
    """The SDK's partition consumer re-opens a failed link by itself, from the last event it handed over,
    and keeps the events the old link had buffered: they come again, amid the new link's."""
    from azure.eventhub._pyamqp.error import AMQPConnectionError, ErrorCondition

    emulator = emulator_factory(["hub:1"])
    send(emulator.connection_string, "0", 1, 10)
    target = EventHubsTarget(emulator.connection_string, f"127.0.0.1:{emulator.port}", "hub", "$Default")
    pool = ReceiverPool(target)
    delivered: list[int] = []
    failed: list[bool] = []

    def deliver(batch: Any) -> None:
        delivered.extend(batch.column("sequence_number").to_pylist())
        consumer = receiver.consumer
        if not failed and len(delivered) >= 50 and 0 < len(consumer._message_buffer) < 7:
            # the next round of AMQP work (asked for when fewer than a delivery's worth are buffered) fails
            # once, with events still buffered: a connection reset
            handler = consumer._handler
            work = handler.do_work

            def fail_once(**kwargs: Any) -> Any:
                handler.do_work = work
                raise AMQPConnectionError(ErrorCondition.SocketError, description="injected reset")

            handler.do_work = fail_once
            failed.append(True)

    receiver = pool.open("0", 1, StartAt(sequence_number=-1), deliver, lambda *_: None, batch_limit=lambda: 7)
    try:
        wait_for(lambda: len(delivered) >= 10, 30, "the link open and its first events")
        send(emulator.connection_string, "0", 3, 130)  # then a burst: the SDK buffers more than it hands on
        deadline = time.monotonic() + 60
        while len(delivered) < 400 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1)  # repeats, were they delivered, would come now
    finally:
        pool.close()
    assert failed, "the fault was not injected"
    assert delivered == list(range(400))


def test_a_batch_that_finds_its_spool_holed_is_not_committed_and_every_event_lands_once_in_delta(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool, spark_jars: str
) -> None:
    from tests.integration.pipelines.test_sink_delta import table_rows

    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    table = tmp_path / "table"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        consumer={
            "spark": {"master": "local[1]", "triggerIntervalSeconds": 4, "maxEventsPerTrigger": 10_000},
            "pipeline": {"type": "function", "function": "tests.fixtures.consumer:lose_a_segment_once"},
            "sink": {"type": "delta", "delta": {"path": str(table)}},
        },
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    consumer_pool.environ["HUBSHIFT_SPARK_JARS"] = spark_jars
    consumer_pool.environ[LOSE_A_SEGMENT_DIR] = str(consumer_pool.workdir)
    consumer = consumer_pool.start(manifest, "c0")
    consumer.wait_ready()
    wait_for(lambda: consumer.metric("hubshift_consumer_owned_partitions") == 2, 120, "both partitions")
    for partition in ("0", "1"):
        send(emulator.connection_string, partition, 12, 25, pause=0.15)  # many segments a batch
    total = 2 * 12 * 25
    wait_for(lambda: table_rows(table)[0] >= total, 300, "every event in the table", on_timeout=consumer.log)
    time.sleep(5)  # a replay still running would add rows now
    assert (consumer_pool.workdir / "lost").exists(), "the fault was not injected"
    assert table_rows(table) == (total, total), consumer.log()
    assert "receiving it again" in consumer.log()
    consumer.terminate()
    assert consumer.wait(timeout=60) == 0


def test_the_batches_after_a_failed_one_are_written_under_names_of_their_own(
    tmp_path: Path, emulator_factory: object, consumer_pool: ConsumerPool
) -> None:
    """A failed batch's query starts again from a new checkpoint, whose batch ids begin at 0 again; a sink
    names what a batch writes by its number (`<consumer>-<run>-<batch>`), and the files sink took the files
    of the next "batch 0" as moved already (the first batch 0's were there), committing its partitions'
    progress with none of its rows. Every event is in the folder once."""
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    output = tmp_path / "parquet"
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        consumer={
            "spark": {"master": "local[1]", "triggerIntervalSeconds": 1},
            "pipeline": {"type": "function", "function": "tests.fixtures.consumer:fail_once_when_armed"},
            "sink": {"type": "parquet", "parquet": {"path": str(output)}},
        },
    )
    consumer_pool.environ.update(consumer_environ(emulator.connection_string))
    consumer_pool.environ[FAIL_ONCE_DIR] = str(tmp_path)
    consumer = consumer_pool.start(manifest, "c0")
    consumer.wait_ready()
    wait_for(lambda: consumer.metric("hubshift_consumer_owned_partitions") == 2, 120, "both partitions")

    def rows() -> tuple[int, int]:
        found = parquet_folder_rows(output, ["partition", "sequence_number"])
        pairs = [(row["partition"], row["sequence_number"]) for row in found]
        return len(pairs), len(set(pairs))

    # A batch at a time (each wave waits for the one before): the numbers of the first query's batches are
    # met again by the second query's.
    expected = 0
    for wave in range(3):
        if wave == 1:
            (tmp_path / "armed").touch()  # the next batch fails, its query starts again
        send(emulator.connection_string, str(wave % 2), 1, 50)
        expected += 50
        wait_for(
            lambda n=expected: rows()[0] >= n,
            180,
            f"{expected} events in the folder",
            on_timeout=consumer.log,
        )
    for wave in range(3):
        send(emulator.connection_string, str(wave % 2), 1, 50)
        expected += 50
        wait_for(
            lambda n=expected: rows()[0] >= n,
            180,
            f"{expected} events in the folder",
            on_timeout=consumer.log,
        )
    assert (tmp_path / "fired").exists(), "the failure was not injected"
    time.sleep(3)
    assert rows() == (expected, expected), consumer.log()
    consumer.terminate()
    assert consumer.wait(timeout=60) == 0
