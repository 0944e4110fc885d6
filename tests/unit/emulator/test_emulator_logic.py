"""The emulator's pure parts: event parsing and stamping, the partition log, start positions, partition-key
routing, SAS verification, owner-level rules and configuration."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from azure.eventhub import EventData, EventDataBatch
from azure.eventhub._buffered_producer._partition_resolver import generate_hash_code
from azure.eventhub._pyamqp import _decode as pyamqp_decode
from azure.eventhub._pyamqp import _encode as pyamqp_encode
from azure.eventhub._pyamqp.utils import generate_sas_token
from azure.eventhub._transport._pyamqp_transport import PyamqpTransport
from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift.emulator.broker import Broker, HubSpec, ReceiverRefused
from hubshift.emulator.cbs import SasAuthorizer, parse_entity
from hubshift.emulator.config import build_hubs, load_config_file, parse_hub_spec
from hubshift.emulator.consumer import resolve_start
from hubshift.emulator.messages import BATCH_MESSAGE_FORMAT, unpack_event, unpack_publication
from hubshift.emulator.partition_log import NEVER_ENQUEUED_MS, PartitionLog
from hubshift.emulator.routing import hash_code, partition_for_key
from hubshift.errors import UserError


def sdk_encoded(event: EventData, partition_key: str | None = None) -> bytes:
    """An event as the SDK puts it on the wire (format 0)."""
    if partition_key:
        from azure.eventhub._utils import set_event_partition_key

        set_event_partition_key(event, partition_key, PyamqpTransport)
    message = PyamqpTransport.to_outgoing_amqp_message(event.raw_amqp_message)
    output = bytearray()
    pyamqp_encode.encode_payload(output, message)
    return bytes(output)


def sdk_batch(events: list[EventData], partition_key: str | None = None) -> bytes:
    batch = EventDataBatch(partition_key=partition_key, amqp_transport=PyamqpTransport)
    for event in events:
        batch.add(event)
    output = bytearray()
    pyamqp_encode.encode_payload(output, batch._message)
    return bytes(output)


def delivered(message: bytes) -> object:
    """What the SDK's receiver decodes from a stored event."""
    return pyamqp_decode.decode_payload(memoryview(message))


# --- events ----------------------------------------------------------------------------------------------


def test_a_stored_event_carries_the_service_annotations_with_the_sdk_types() -> None:
    event = EventData("hello")
    event.properties = {"kind": "door", "n": 3}
    event.message_id = "m1"
    log = PartitionLog("0", 1 << 20)
    log.append([unpack_event(sdk_encoded(event, partition_key="user1"))], now_ms=1_700_000_000_000)
    (message,), _ = log.read(0, 10, 1 << 20)
    received = delivered(message)
    annotations = received.message_annotations
    assert annotations[b"x-opt-sequence-number"] == 0
    assert annotations[b"x-opt-offset"] == b"0"
    assert annotations[b"x-opt-enqueued-time"] == 1_700_000_000_000
    assert annotations[b"x-opt-partition-key"] == b"user1"
    assert received.data == [b"hello"]
    assert received.application_properties == {b"kind": b"door", b"n": 3}
    assert received.properties.message_id == b"m1"
    assert received.header.durable is True


def test_a_producer_cannot_forge_the_service_annotations() -> None:
    event = EventData("x")
    event.raw_amqp_message.annotations = {"x-opt-sequence-number": 99, "x-opt-offset": "7", "mine": "kept"}
    log = PartitionLog("0", 1 << 20)
    log.append([unpack_event(sdk_encoded(event))], now_ms=5)
    log.append([unpack_event(sdk_encoded(event))], now_ms=5)
    (_, second), _ = log.read(0, 10, 1 << 20)
    annotations = delivered(second).message_annotations
    assert annotations[b"x-opt-sequence-number"] == 1
    assert annotations[b"x-opt-offset"] != b"7"
    assert annotations[b"mine"] == b"kept"


def test_a_batch_unpacks_into_its_events_with_the_envelope_key() -> None:
    events = [EventData(f"e{index}") for index in range(3)]
    publication = unpack_publication(BATCH_MESSAGE_FORMAT, sdk_batch(events, partition_key="pk1"))
    assert publication.partition_key == "pk1"
    assert len(publication.events) == 3
    log = PartitionLog("0", 1 << 20)
    log.append(publication.events, 1, publication.envelope_key_entry)
    messages, _ = log.read(0, 10, 1 << 20)
    assert [delivered(message).data for message in messages] == [[b"e0"], [b"e1"], [b"e2"]]
    assert all(
        delivered(message).message_annotations[b"x-opt-partition-key"] == b"pk1" for message in messages
    )


def test_multiple_data_sections_are_all_kept() -> None:
    event = EventData(body=[b"a", b"b"])
    log = PartitionLog("0", 1 << 20)
    log.append([unpack_event(sdk_encoded(event))], 1)
    (message,), _ = log.read(0, 1, 1 << 20)
    assert delivered(message).data == [b"a", b"b"]


# --- the partition log -----------------------------------------------------------------------------------


def filled_log(count: int, size: int = 10, start_ms: int = 1000) -> PartitionLog:
    log = PartitionLog("0", 1 << 30)
    for index in range(count):
        log.append([unpack_event(sdk_encoded(EventData(b"x" * size)))], now_ms=start_ms + index * 10)
    return log


def test_offsets_are_byte_positions_and_grow() -> None:
    log = filled_log(5)
    offsets = [
        int(delivered(message).message_annotations[b"x-opt-offset"]) for message in log.read(0, 5, 1 << 20)[0]
    ]
    assert offsets[0] == 0
    assert offsets == sorted(set(offsets))
    assert log.state().last_enqueued_offset == str(offsets[-1])


def test_an_empty_partition_reports_what_the_sdk_expects() -> None:
    state = PartitionLog("0", 100).state()
    assert state.beginning_sequence_number == 0
    assert state.last_enqueued_sequence_number == -1
    assert state.last_enqueued_offset == "-1"
    assert state.last_enqueued_time_ms == NEVER_ENQUEUED_MS
    assert state.is_empty


def test_retention_drops_from_the_front_and_moves_the_beginning() -> None:
    log = filled_log(10)
    assert log.expire(cutoff_ms=1050) == 5
    state = log.state()
    assert (state.beginning_sequence_number, state.last_enqueued_sequence_number, state.is_empty) == (
        5,
        9,
        False,
    )
    assert log.expire(cutoff_ms=10**9) == 5
    state = log.state()
    assert (state.beginning_sequence_number, state.last_enqueued_sequence_number, state.is_empty) == (
        10,
        9,
        True,
    )
    log.append([unpack_event(sdk_encoded(EventData("later")))], now_ms=10**9)
    assert log.state().last_enqueued_sequence_number == 10


def test_the_size_bound_keeps_memory_bounded_and_the_newest_event() -> None:
    log = PartitionLog("0", 20_000)
    for _ in range(100):
        log.append([unpack_event(sdk_encoded(EventData(b"x" * 1000)))], now_ms=1)
    assert log.retained_bytes <= 20_000
    assert log.state().last_enqueued_sequence_number == 99
    assert 0 < log.count < 100
    assert log.beginning_sequence_number == 100 - log.count


def test_enqueued_times_never_go_backwards() -> None:
    log = PartitionLog("0", 1 << 20)
    log.append([unpack_event(sdk_encoded(EventData("a")))], now_ms=2000)
    log.append([unpack_event(sdk_encoded(EventData("b")))], now_ms=1000)
    assert [delivered(m).message_annotations[b"x-opt-enqueued-time"] for m in log.read(0, 2, 1 << 20)[0]] == [
        2000,
        2000,
    ]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (None, 0),
        ("amqp.annotation.x-opt-offset > '-1'", 0),
        ("amqp.annotation.x-opt-offset >= '-1'", 0),
        ("amqp.annotation.x-opt-offset > '@latest'", 10),
        ("amqp.annotation.x-opt-sequence-number > '3'", 4),
        ("amqp.annotation.x-opt-sequence-number >= '3'", 3),
        ("amqp.annotation.x-opt-sequence-number > '500'", 10),
        ("amqp.annotation.x-opt-enqueued-time > '1030'", 4),
        ("amqp.annotation.x-opt-enqueued-time >= '1030'", 3),
        ("amqp.annotation.x-opt-enqueued-time > '0'", 0),
    ],
)
def test_start_positions(selector: str | None, expected: int) -> None:
    assert resolve_start(filled_log(10), selector) == expected


def test_offset_start_positions_are_exclusive_or_inclusive() -> None:
    log = filled_log(10)
    third = log.stored_events(3)[0].offset
    assert resolve_start(log, f"amqp.annotation.x-opt-offset > '{third}'") == 4
    assert resolve_start(log, f"amqp.annotation.x-opt-offset >= '{third}'") == 3


def test_a_bad_selector_is_refused() -> None:
    with pytest.raises(ReceiverRefused):
        resolve_start(filled_log(1), "amqp.annotation.x-opt-offset > 'abc'")


# --- routing ---------------------------------------------------------------------------------------------


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_partition_keys_hash_like_the_sdk_resolver(key: str) -> None:
    assert hash_code(key) == generate_hash_code(key)
    assert 0 <= partition_for_key(key, 32) < 32


# --- SAS ---------------------------------------------------------------------------------------------------


def test_sas_tokens_are_verified() -> None:
    now = time.time()
    authorizer = SasAuthorizer("secret", clock=lambda: now)
    audience = "sb://127.0.0.1:5672/hub"
    good = generate_sas_token(audience, "RootManageSharedAccessKey", "secret", int(now) + 60)
    assert authorizer.verify(good, audience + "/consumergroups/$default").accepted
    assert authorizer.verify(good, "sb://localhost/hub").status_code == 401
    wrong_key = generate_sas_token(audience, "RootManageSharedAccessKey", "other", int(now) + 60)
    assert authorizer.verify(wrong_key, audience).status_code == 401
    expired = generate_sas_token(audience, "RootManageSharedAccessKey", "secret", int(now) - 1)
    assert authorizer.verify(expired, audience).status_code == 401
    assert authorizer.verify(good, "sb://127.0.0.1/otherhub").status_code == 401
    assert SasAuthorizer(None, clock=time.time).verify("anything", audience).accepted


def test_entities_compare_by_host_without_port_and_whole_segments() -> None:
    hub = parse_entity("sb://Host:5672/Hub")
    assert hub.covers(parse_entity("amqps://host/hub/ConsumerGroups/$Default/Partitions/0"))
    assert not hub.covers(parse_entity("amqps://host/hub2"))
    assert not hub.covers(parse_entity("amqps://other/hub"))


# --- owner levels ------------------------------------------------------------------------------------------


class FakeReceiver:
    def __init__(self, owner_level: int | None) -> None:
        self._owner_level = owner_level
        self.stolen: str | None = None

    @property
    def owner_level(self) -> int | None:
        return self._owner_level

    def steal(self, condition: str, description: str) -> None:
        self.stolen = condition


def make_broker() -> Broker:
    return Broker([HubSpec("hub", 2)], clock=time.time, retention_seconds=3600, partition_max_bytes=1 << 20)


def test_a_higher_or_equal_owner_level_takes_the_partition_and_a_lower_is_refused() -> None:
    broker = make_broker()
    hub = broker.hubs["hub"]
    first, second, third = FakeReceiver(1), FakeReceiver(2), FakeReceiver(2)
    broker.attach_receiver(hub, "$Default", "0", first)
    broker.attach_receiver(hub, "$Default", "0", second)
    assert first.stolen == "amqp:link:stolen"
    with pytest.raises(ReceiverRefused) as refused:
        broker.attach_receiver(hub, "$Default", "0", FakeReceiver(1))
    assert refused.value.condition == "amqp:link:stolen"
    broker.attach_receiver(hub, "$default", "0", third)
    assert second.stolen == "amqp:link:stolen"
    broker.attach_receiver(hub, "$Default", "1", FakeReceiver(0))  # another partition is independent
    broker.attach_receiver(hub, "cg-other", "0", FakeReceiver(0))  # so is another consumer group


def test_receivers_without_owner_level_are_five_at_most_and_yield_to_one_with() -> None:
    broker = make_broker()
    hub = broker.hubs["hub"]
    plain = [FakeReceiver(None) for _ in range(5)]
    for receiver in plain:
        broker.attach_receiver(hub, "$Default", "0", receiver)
    with pytest.raises(ReceiverRefused) as refused:
        broker.attach_receiver(hub, "$Default", "0", FakeReceiver(None))
    assert refused.value.condition == "amqp:resource-limit-exceeded"
    broker.detach_receiver(hub, "$Default", "0", plain[0])
    broker.attach_receiver(hub, "$Default", "0", FakeReceiver(None))
    exclusive = FakeReceiver(0)
    broker.attach_receiver(hub, "$Default", "0", exclusive)
    assert all(receiver.stolen == "amqp:link:stolen" for receiver in plain[1:])
    with pytest.raises(ReceiverRefused):
        broker.attach_receiver(hub, "$Default", "0", FakeReceiver(None))


def test_retention_uses_the_clock_it_is_given() -> None:
    now = [1000.0]
    broker = Broker(
        [HubSpec("hub", 1)], clock=lambda: now[0], retention_seconds=60, partition_max_bytes=1 << 20
    )
    hub = broker.hubs["hub"]
    broker.publish(hub, None, unpack_publication(0, sdk_encoded(EventData("old"))))
    now[0] += 61
    broker.publish(hub, None, unpack_publication(0, sdk_encoded(EventData("new"))))
    assert broker.expire() == 1
    assert hub.partitions[0].beginning_sequence_number == 1


# --- configuration ---------------------------------------------------------------------------------------


def test_hub_specs() -> None:
    assert parse_hub_spec("telemetry:32") == HubSpec("telemetry", 32)
    for bad in ("telemetry", "telemetry:x", "telemetry:0", "telemetry:1025", "-bad:2", ":3"):
        with pytest.raises(UserError):
            parse_hub_spec(bad)


def test_microsoft_emulator_config_files_load(tmp_path: Path) -> None:
    config = tmp_path / "Config.json"
    config.write_text(
        json.dumps(
            {
                "UserConfig": {
                    "NamespaceConfig": [
                        {
                            "Type": "EventHub",
                            "Name": "emulatorNs1",
                            "Entities": [
                                {"Name": "eh1", "PartitionCount": "2", "ConsumerGroups": [{"Name": "cg1"}]},
                                {"Name": "eh2", "PartitionCount": 4, "ConsumerGroups": []},
                            ],
                        }
                    ],
                    "LoggingConfig": {"Type": "File"},
                }
            }
        )
    )
    assert load_config_file(config) == [HubSpec("eh1", 2, ("cg1",)), HubSpec("eh2", 4, ())]
    hubs = build_hubs(["extra:1"], ["spark"], config)
    assert [(hub.name, hub.consumer_groups) for hub in hubs] == [
        ("eh1", ("cg1", "spark")),
        ("eh2", ("spark",)),
        ("extra", ("spark",)),
    ]


@pytest.mark.parametrize(
    "content", ["not json", '{"UserConfig": {}}', '{"UserConfig": {"NamespaceConfig": [{}]}}']
)
def test_bad_config_files_are_one_clear_error(tmp_path: Path, content: str) -> None:
    config = tmp_path / "Config.json"
    config.write_text(content)
    with pytest.raises(UserError, match="--config"):
        load_config_file(config)
    with pytest.raises(UserError, match="cannot read"):
        load_config_file(tmp_path / "missing.json")


@given(st.binary(max_size=300), st.sampled_from([0, BATCH_MESSAGE_FORMAT]))
@settings(max_examples=500, deadline=None)
def test_a_garbage_delivery_is_a_decode_error_and_nothing_else(payload: bytes, message_format: int) -> None:
    from hubshift.emulator.codec import DecodeError
    from hubshift.emulator.messages import parse_request

    for parse in (lambda: unpack_publication(message_format, payload), lambda: parse_request(payload)):
        try:
            parse()
        except DecodeError:
            pass


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=20))
@settings(max_examples=100, deadline=None)
def test_batches_keep_every_event_body(bodies: list[bytes]) -> None:
    publication = unpack_publication(BATCH_MESSAGE_FORMAT, sdk_batch([EventData(body) for body in bodies]))
    log = PartitionLog("0", 1 << 30)
    log.append(publication.events, 1)
    messages, _ = log.read(0, len(bodies), 1 << 30)
    assert [b"".join(delivered(message).data) for message in messages] == bodies


def test_a_reloaded_configuration_adds_hubs_and_partitions_but_never_removes_any() -> None:
    broker = Broker(
        [HubSpec("homes", 2)], clock=time.time, retention_seconds=3600, partition_max_bytes=1 << 20
    )
    changes = broker.reconfigure([HubSpec("homes", 4, ("audit",)), HubSpec("alarms", 1)])
    homes = broker.find_hub("homes")
    assert homes is not None and homes.partition_ids == ["0", "1", "2", "3"]
    assert homes.has_consumer_group("audit") and broker.find_hub("alarms") is not None
    assert changes == ["hub homes: 2 -> 4 partitions", "hub alarms created with 1 partitions"]
    refused = broker.reconfigure([HubSpec("homes", 3)])
    assert homes.partition_ids == ["0", "1", "2", "3"] and "can only be added" in refused[0]
    assert homes.partition("3") is not None and homes.partition("4") is None
