"""A new link's handshake against the emulator, through the real SDK: driven to its end in the turn that
opens it (`ReceiverPool._handshake`), as the SDK's own `handler_ready` says (`sdk_internals.link_opened`)."""

from __future__ import annotations

import time

from azure.eventhub import EventData, EventHubProducerClient

from hubshift.emulator.launch import RunningEmulator
from hubshift.eventhubs.receiver import HANDSHAKE_SECONDS, PartitionReceiver, ReceiverPool, StartAt
from hubshift.eventhubs.sdk_internals import link_opened
from hubshift.eventhubs.target import EventHubsTarget


def test_a_new_link_opens_within_one_turn_and_delivers_on_the_next(emulator_factory: object) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:1"])  # type: ignore[operator]
    with EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name="hub") as p:
        p.send_batch([EventData(b"x") for _ in range(5)], partition_id="0")
    pool = ReceiverPool(
        EventHubsTarget(emulator.connection_string, f"127.0.0.1:{emulator.port}", "hub", "$Default")
    )
    batches: list[int] = []
    receiver = PartitionReceiver(
        pool, "0", 1, StartAt(), lambda batch: batches.append(batch.num_rows), lambda *_: None, lambda: True
    )
    try:
        pool._open(receiver)
        assert not link_opened(receiver.consumer)  # the SDK's own flag, before any round trip
        started = time.monotonic()
        pool._handshake(receiver)
        assert link_opened(receiver.consumer)  # connection, CBS token and attach, all in this one turn
        assert time.monotonic() - started < HANDSHAKE_SECONDS
        deadline = time.monotonic() + 5
        while not batches and time.monotonic() < deadline:
            receiver.consumer.receive(True, 1000, None)
        assert sum(batches) == 5
    finally:
        pool._release(receiver)
