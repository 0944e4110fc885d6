"""The real azure-eventhub SDK (sync and async clients, pure-Python transport) against the emulator."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import pytest
from azure.eventhub import EventData
from azure.eventhub._buffered_producer._partition_resolver import PartitionResolver
from azure.eventhub.aio import EventHubProducerClient as AsyncProducerClient
from azure.eventhub.exceptions import AuthenticationError, EventDataSendError
from emulator_clients import HUB, BackgroundConsumer, producer, receive, receive_async, wait_until

from hubshift.emulator.launch import RunningEmulator

pytestmark = pytest.mark.timeout(120)


def test_hub_and_partition_properties(emulator: RunningEmulator) -> None:
    with producer(emulator.connection_string) as client:
        hub = client.get_eventhub_properties()
        assert hub["eventhub_name"] == HUB
        assert hub["partition_ids"] == ["0", "1", "2", "3"]
        assert abs((datetime.datetime.now(datetime.UTC) - hub["created_at"]).total_seconds()) < 60
        empty = client.get_partition_properties("2")
        assert empty["beginning_sequence_number"] == 0
        assert empty["last_enqueued_sequence_number"] == -1
        assert empty["last_enqueued_offset"] == "-1"
        assert empty["is_empty"] is True
        before = datetime.datetime.now(datetime.UTC)
        client.send_event(EventData("a"), partition_id="2")
        client.send_event(EventData("b"), partition_id="2")
        written = client.get_partition_properties("2")
        assert written["eventhub_name"] == HUB and written["id"] == "2"
        assert written["beginning_sequence_number"] == 0
        assert written["last_enqueued_sequence_number"] == 1
        assert int(written["last_enqueued_offset"]) > 0
        assert written["is_empty"] is False
        assert written["last_enqueued_time_utc"] >= before - datetime.timedelta(seconds=1)


def test_properties_with_the_async_client(emulator: RunningEmulator) -> None:
    async def main() -> tuple[list[str], dict[str, Any]]:
        async with AsyncProducerClient.from_connection_string(
            emulator.connection_string, eventhub_name=HUB, retry_total=1
        ) as client:
            ids = await client.get_partition_ids()
            await client.send_event(EventData("x"), partition_id="3")
            return ids, await client.get_partition_properties("3")

    ids, partition = asyncio.run(main())
    assert ids == ["0", "1", "2", "3"]
    assert partition["last_enqueued_sequence_number"] == 0


def test_every_send_shape_lands_where_it_should(emulator: RunningEmulator) -> None:
    resolver = PartitionResolver(["0", "1", "2", "3"])
    with producer(emulator.connection_string) as client:
        client.send_event(EventData("to-partition-1"), partition_id="1")
        client.send_event(EventData("with-key"), partition_key="user-7")
        client.send_event(EventData("to-the-hub"))
        batch = client.create_batch(partition_id="2")
        for index in range(3):
            batch.add(EventData(f"batch-2-{index}"))
        client.send_batch(batch)
        batch = client.create_batch(partition_key="user-7")
        batch.add(EventData("batch-key-0"))
        batch.add(EventData("batch-key-1"))
        client.send_batch(batch)
        client.send_batch([EventData("list-0"), EventData("list-1")], partition_id="3")
        client.send_batch(client.create_batch())  # an empty batch is not sent at all
        hub_batch = client.create_batch()
        hub_batch.add(EventData("batch-to-hub"))
        client.send_batch(hub_batch)
    collector = receive(emulator.connection_string, 11)
    by_body = {event.body.decode(): event for event in collector.events}
    assert len(collector.events) == 11, sorted(by_body)
    key_partition = resolver.get_partition_id_by_partition_key("user-7")
    assert by_body["to-partition-1"].partition_id == "1"
    assert by_body["with-key"].partition_id == key_partition
    assert by_body["with-key"].partition_key == b"user-7"
    assert {by_body[f"batch-key-{index}"].partition_id for index in range(2)} == {key_partition}
    first = by_body["batch-2-0"].sequence_number
    assert [by_body[f"batch-2-{index}"].sequence_number for index in range(3)] == [
        first,
        first + 1,
        first + 2,
    ]
    assert {by_body[f"batch-2-{index}"].partition_id for index in range(3)} == {"2"}
    assert by_body["list-1"].partition_id == "3"
    per_partition: dict[str, list[int]] = {}
    for event in collector.events:
        per_partition.setdefault(event.partition_id, []).append(event.sequence_number)
    for numbers in per_partition.values():
        assert sorted(numbers) == list(range(len(numbers)))


def test_application_properties_and_sdk_fields_round_trip(emulator: RunningEmulator) -> None:
    event = EventData(b"\x00\x01binary")
    event.properties = {"home": "h1", "count": 3, "ratio": 0.5}
    event.content_type = "application/octet-stream"
    event.correlation_id = "corr-1"
    event.message_id = "msg-1"
    with producer(emulator.connection_string) as client:
        client.send_event(event, partition_id="0")
    collector = receive(emulator.connection_string, 1, partition_id="0")
    (received,) = collector.events
    assert received.body == b"\x00\x01binary"
    assert received.properties == {b"home": b"h1", b"count": 3, b"ratio": 0.5}


def test_sends_and_receives_with_the_async_clients(emulator: RunningEmulator) -> None:
    async def send() -> None:
        async with AsyncProducerClient.from_connection_string(
            emulator.connection_string, eventhub_name=HUB, retry_total=1
        ) as client:
            batch = await client.create_batch(partition_key="k")
            for index in range(50):
                batch.add(EventData(f"async-{index}"))
            await client.send_batch(batch)
            await client.send_event(EventData("async-single"), partition_id="0")

    asyncio.run(send())
    collector = receive_async(emulator.connection_string, 51)
    assert len(collector.events) == 51
    assert {f"async-{index}".encode() for index in range(50)} <= set(collector.bodies())


def fill_partition(emulator: RunningEmulator, count: int, partition_id: str = "0") -> None:
    with producer(emulator.connection_string) as client:
        for index in range(count):
            client.send_event(EventData(f"e{index}"), partition_id=partition_id)
            time.sleep(0.002)


def test_every_start_position(emulator: RunningEmulator) -> None:
    fill_partition(emulator, 10)
    everything = receive(emulator.connection_string, 10, partition_id="0").events
    assert [event.sequence_number for event in everything] == list(range(10))
    fourth = everything[3]

    def numbers(position: Any, inclusive: bool = False, expect: int = 10) -> list[int]:
        collector = receive(
            emulator.connection_string,
            expect,
            partition_id="0",
            starting_position=position,
            starting_position_inclusive=inclusive,
            timeout=4,
        )
        return [event.sequence_number for event in collector.events]

    assert numbers("-1") == list(range(10))
    assert numbers(fourth.offset, expect=6) == list(range(4, 10))
    assert numbers(fourth.offset, inclusive=True, expect=7) == list(range(3, 10))
    assert numbers(3, expect=6) == list(range(4, 10))
    assert numbers(3, inclusive=True, expect=7) == list(range(3, 10))
    assert numbers(fourth.enqueued_time, inclusive=True, expect=7)[0] <= 3
    assert numbers(everything[-1].enqueued_time, expect=1) == []
    assert numbers(datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)) == list(range(10))


def test_latest_receives_only_what_comes_after(emulator: RunningEmulator) -> None:
    fill_partition(emulator, 3)
    with BackgroundConsumer(
        emulator.connection_string, partition_id="0", starting_position="@latest"
    ) as collector:
        time.sleep(2)  # the receiver is attached
        with producer(emulator.connection_string) as client:
            client.send_event(EventData("new"), partition_id="0")
        assert wait_until(lambda: len(collector.events) >= 1, 15)
    assert [(event.body, event.sequence_number) for event in collector.events] == [(b"new", 3)]


def test_last_enqueued_event_properties(emulator: RunningEmulator) -> None:
    fill_partition(emulator, 5)
    collector = receive(
        emulator.connection_string, 5, partition_id="0", track_last_enqueued_event_properties=True
    )
    latest = collector.last_enqueued[-1]
    assert latest is not None
    assert latest["sequence_number"] == 4
    assert latest["offset"] == collector.events[-1].offset
    assert latest["enqueued_time"] == collector.events[-1].enqueued_time
    assert latest["retrieval_time"] is not None
    without = receive(emulator.connection_string, 1, partition_id="0")
    assert without.last_enqueued[-1] is None


def test_a_producers_delivery_annotations_reach_receivers_merged_with_the_services(
    emulator: RunningEmulator,
) -> None:
    """The service round-trips the delivery annotations a producer sets on an AmqpAnnotatedMessage; a
    receiver that asks for the last-enqueued event's properties gets both in one map."""
    from azure.eventhub.amqp import AmqpAnnotatedMessage

    def annotated(index: int) -> AmqpAnnotatedMessage:
        return AmqpAnnotatedMessage(
            data_body=f"a{index}".encode(), delivery_annotations={"x-hop": f"v{index}", "x-count": index}
        )

    with producer(emulator.connection_string) as client:
        client.send_event(annotated(0), partition_id="0")
        batch = client.create_batch(partition_id="0")
        for index in (1, 2):
            batch.add(annotated(index))
        client.send_batch(batch)
        client.send_event(EventData("plain"), partition_id="0")
    plain = receive(emulator.connection_string, 4, partition_id="0").events
    assert [event.delivery_annotations for event in plain] == [
        {b"x-hop": b"v0", b"x-count": 0},
        {b"x-hop": b"v1", b"x-count": 1},
        {b"x-hop": b"v2", b"x-count": 2},
        {},
    ]
    tracked = receive(
        emulator.connection_string, 4, partition_id="0", track_last_enqueued_event_properties=True
    )
    for index, event in enumerate(tracked.events):
        annotations = event.delivery_annotations
        assert annotations[b"last_enqueued_sequence_number"] == 3
        if index < 3:
            assert (annotations[b"x-hop"], annotations[b"x-count"]) == (f"v{index}".encode(), index)
        assert tracked.last_enqueued[index] is not None
        assert tracked.last_enqueued[index]["sequence_number"] == 3  # type: ignore[index]
    assert [event.body for event in tracked.events] == [b"a0", b"a1", b"a2", b"plain"]


def test_a_higher_owner_level_takes_the_partition(emulator: RunningEmulator) -> None:
    from azure.eventhub import CloseReason

    with BackgroundConsumer(emulator.connection_string, partition_id="0", owner_level=1) as first:
        time.sleep(2)
        with BackgroundConsumer(emulator.connection_string, partition_id="0", owner_level=2) as second:
            assert wait_until(lambda: ("0", CloseReason.OWNERSHIP_LOST) in first.closed, 20), first.closed
            assert any("link:stolen" in str(error) for error in first.errors)
            fill_partition(emulator, 1)
            assert wait_until(lambda: len(second.events) == 1, 15)
            with BackgroundConsumer(emulator.connection_string, partition_id="0", owner_level=1) as lower:
                assert wait_until(lambda: bool(lower.errors), 20)
                assert any("link:stolen" in str(error) for error in lower.errors)
            assert second.closed == []
    assert first.events == []


def test_a_wrong_key_is_an_authentication_error(emulator_factory: Any) -> None:
    server = emulator_factory(["hub:2"], key="the-key")
    wrong = server.connection_string.replace("SharedAccessKey=the-key", "SharedAccessKey=not-the-key")
    assert wrong != server.connection_string
    with producer(wrong, retry_total=0) as client, pytest.raises(AuthenticationError):
        client.get_eventhub_properties()
    with producer(wrong, retry_total=0) as client, pytest.raises(AuthenticationError):
        client.send_event(EventData("x"))
    with producer(server.connection_string) as client:
        client.send_event(EventData("right key"), partition_id="1")
    assert receive(server.connection_string, 1, partition_id="1").bodies() == [b"right key"]


def test_an_unknown_hub_is_refused(emulator: RunningEmulator) -> None:
    with (
        producer(emulator.connection_string, hub="nope", retry_total=0) as client,
        pytest.raises(AuthenticationError, match="could not be found"),
    ):
        client.get_eventhub_properties()


def test_oversize_messages_are_rejected_and_the_link_keeps_working(emulator: RunningEmulator) -> None:
    with producer(emulator.connection_string) as client:
        with pytest.raises(EventDataSendError, match="exceeds the limit"):
            client.send_event(EventData(b"x" * 1_100_000), partition_id="0", timeout=30)
        big = client.create_batch(partition_id="0")
        while True:
            try:
                big.add(EventData(b"y" * 50_000))
            except ValueError:
                break
        client.send_batch(big, timeout=30)
        client.send_event(EventData("after"), partition_id="0", timeout=30)
        # just under the limit: delivered with the service's annotations it outgrows the receiver's
        # 1 MiB frames, so it goes out in several transfer frames
        client.send_event(EventData(b"z" * 1_048_400), partition_id="0", timeout=30)
        properties = client.get_partition_properties("0")
    assert properties["last_enqueued_sequence_number"] == len(big) + 1
    collector = receive(emulator.connection_string, len(big) + 2, partition_id="0", timeout=30)
    bodies = collector.bodies()
    assert bodies[-2] == b"after"
    assert bodies[-1] == b"z" * 1_048_400
    assert all(len(body) == 50_000 for body in bodies[:-2])


def test_events_survive_a_restart_with_a_data_dir(emulator_factory: Any, tmp_path: Any) -> None:
    data_dir = tmp_path / "events"
    first = emulator_factory(["hub:2"], data_dir=data_dir)
    with producer(first.connection_string) as client:
        client.send_batch([EventData(f"kept-{index}") for index in range(20)], partition_id="1")
        created = client.get_eventhub_properties()["created_at"]
    first.stop()
    second = emulator_factory(["hub:2"], data_dir=data_dir)
    with producer(second.connection_string) as client:
        assert client.get_eventhub_properties()["created_at"] == created
        client.send_event(EventData("after-restart"), partition_id="1")
        properties = client.get_partition_properties("1")
    assert properties["last_enqueued_sequence_number"] == 20
    collector = receive(second.connection_string, 21, partition_id="1")
    assert collector.bodies() == [f"kept-{index}".encode() for index in range(20)] + [b"after-restart"]
    assert [event.sequence_number for event in collector.events] == list(range(21))


def test_retention_expires_events_and_moves_the_beginning(emulator_factory: Any) -> None:
    server = emulator_factory(["hub:1"], retention_minutes=0.03)  # 1.8 s
    with producer(server.connection_string) as client:
        client.send_batch([EventData("old") for _ in range(5)])
        assert wait_until(lambda: client.get_partition_properties("0")["is_empty"], 15, interval=0.5)
        properties = client.get_partition_properties("0")
        assert properties["beginning_sequence_number"] == 5
        assert properties["last_enqueued_sequence_number"] == 4
        client.send_event(EventData("fresh"))
    assert receive(server.connection_string, 1, timeout=5).bodies() == [b"fresh"]


def test_a_hub_with_1024_partitions(emulator_factory: Any) -> None:
    server = emulator_factory(["wide:1024"])
    with producer(server.connection_string, hub="wide") as client:
        assert client.get_partition_ids() == [str(index) for index in range(1024)]
        client.send_event(EventData("last"), partition_id="1023")
    collector = receive(server.connection_string, 1, hub="wide", partition_id="1023")
    assert collector.bodies() == [b"last"]


def test_consumer_groups_are_separate_and_unknown_ones_get_nothing(emulator: RunningEmulator) -> None:
    fill_partition(emulator, 2)
    assert len(receive(emulator.connection_string, 2, partition_id="0").events) == 2
    with BackgroundConsumer(
        emulator.connection_string, consumer_group="cg1", partition_id="0", starting_position="-1"
    ) as cg1:
        assert wait_until(lambda: len(cg1.events) == 2, 15)
    # The SDK retries a refused consumer group silently (as against the service): it just gets nothing.
    with BackgroundConsumer(
        emulator.connection_string, consumer_group="missing", partition_id="0", starting_position="-1"
    ) as missing:
        time.sleep(3)
    assert missing.events == []
