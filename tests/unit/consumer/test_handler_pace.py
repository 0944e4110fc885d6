"""The SDK engine's deliveries sized to about a second of its handler's work (`HandlerPace`), and the
receivers asking the SDK for no more than that a turn."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from hubshift.consumer.sdk_engine import DELIVERY_SECONDS, FIRST_DELIVERY_EVENTS, HandlerPace, SdkEngine
from hubshift.eventhubs.receiver import MAX_BATCH, PartitionReceiver, ReceiverPool, StartAt
from hubshift.eventhubs.target import EventHubsTarget


def test_a_batch_is_about_a_second_of_the_handler_s_work() -> None:
    pace = HandlerPace()
    assert pace.batch_limit() == FIRST_DELIVERY_EVENTS  # nothing measured yet
    pace.record(100, 2.0)  # 20 ms an event
    assert pace.batch_limit() == round(DELIVERY_SECONDS / 0.02)
    fast = HandlerPace()
    fast.record(1000, 0.01)
    assert fast.batch_limit() == MAX_BATCH
    slow = HandlerPace()
    slow.record(1, 3.0)
    assert slow.batch_limit() == 1
    empty = HandlerPace()
    empty.record(0, 1.0)
    assert empty.batch_limit() == FIRST_DELIVERY_EVENTS
    instant = HandlerPace()
    instant.record(4, 2.2250738585072014e-308)  # a second over it is past any integer
    assert instant.batch_limit() == MAX_BATCH


def test_a_handler_that_slows_down_gets_smaller_batches_within_a_few_deliveries() -> None:
    pace = HandlerPace()
    for _ in range(10):
        pace.record(1000, 0.1)  # 0.1 ms an event
    assert pace.batch_limit() == MAX_BATCH
    for _ in range(6):
        pace.record(pace.batch_limit(), pace.batch_limit() * 0.02)  # now 20 ms an event
    assert pace.batch_limit() <= 2 * DELIVERY_SECONDS / 0.02


@given(st.lists(st.tuples(st.integers(0, 5000), st.floats(0, 100)), max_size=30))
def test_the_limit_is_always_between_one_and_the_receivers_batch(samples: list[tuple[int, float]]) -> None:
    pace = HandlerPace()
    for events, seconds in samples:
        pace.record(events, seconds)
        assert 1 <= pace.batch_limit() <= MAX_BATCH


def test_the_receivers_ask_the_sdk_for_at_most_the_limit() -> None:
    asked: list[int] = []

    class Consumer:
        handler_ready = True

        def receive(self, _batch: bool, max_batch_size: int, _wait: Any) -> None:
            asked.append(max_batch_size)

    pool = ReceiverPool(EventHubsTarget(None, "ns.example.net", "hub", "$Default"))
    limits = iter([7, 0, 5000])
    receiver = PartitionReceiver(
        pool, "0", 1, StartAt(), lambda _: None, lambda *_: None, lambda: True, lambda: next(limits)
    )
    receiver.consumer = Consumer()
    for _ in range(3):
        pool._turn(receiver)
    assert asked == [7, 1, MAX_BATCH]


def test_the_sdk_engine_sizes_its_receivers_batches_by_its_own_handler() -> None:
    opened: dict[str, Any] = {}

    class Pool(ReceiverPool):
        def open(self, *args: Any, batch_limit: Any = None, **_: Any) -> Any:
            opened["deliver"], opened["limit"] = args[3], batch_limit
            return None

    def handler(_partition: str, _level: int, _batch: pa.RecordBatch) -> None:
        time.sleep(0.1)  # 10 rows: 10 ms an event

    target = EventHubsTarget(None, "ns.example.net", "hub", "$Default")
    engine = SdkEngine(target, handler, pool=Pool(target))
    engine.start(lambda _: None)
    engine.start_partition("0", 1, StartAt(), None)
    assert opened["limit"]() == FIRST_DELIVERY_EVENTS
    rows = pa.RecordBatch.from_pydict(
        {"offset": [str(i) for i in range(10)], "sequence_number": list(range(10))}
    )
    opened["deliver"](rows)
    assert 20 <= opened["limit"]() <= 100  # about a second of 10 ms events (a busy machine sleeps longer)
