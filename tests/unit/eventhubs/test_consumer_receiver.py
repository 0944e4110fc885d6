"""SDK events become rows in the event schema (the fast path over AMQP annotations and the public one
agree), start positions, and what counts as being deposed."""

from __future__ import annotations

import datetime as dt
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from azure.eventhub import EventData
from azure.eventhub._pyamqp import message as amqp
from azure.eventhub._pyamqp.sasl import SASLTransport
from hypothesis import given
from hypothesis import strategies as st

from hubshift.eventhubs.receiver import (
    CAUGHT_UP_TURN,
    FINAL_READS_SECONDS,
    HANDSHAKE_SECONDS,
    PartitionReceiver,
    ReceiveGap,
    ReceiverPool,
    StartAt,
    in_order,
    is_stolen,
)
from hubshift.eventhubs.rows import RECEIVED_ARROW_SCHEMA, events_to_batch
from hubshift.eventhubs.sdk_internals import TurnReads, adopt_raw_messages, track_last
from hubshift.eventhubs.target import EventHubsTarget

ENQUEUED_MS = 1_795_000_000_123


def received(
    sequence: int,
    body: bytes,
    *,
    key: bytes | None = b"h000042",
    props: Any = None,
    section: amqp.Properties | None = None,
) -> EventData:
    annotations: dict[bytes, Any] = {
        b"x-opt-sequence-number": sequence,
        b"x-opt-offset": str(sequence * 300).encode(),
        b"x-opt-enqueued-time": ENQUEUED_MS + sequence,
    }
    if key is not None:
        annotations[b"x-opt-partition-key"] = key
    message = amqp.Message(
        data=[body], message_annotations=annotations, application_properties=props, properties=section
    )
    return EventData._from_message(message)


class PublicOnly:
    """An event exposing only the SDK's public properties (the fallback path)."""

    def __init__(self, event: EventData) -> None:
        self.sequence_number = event.sequence_number
        self.offset = event.offset
        self.enqueued_time = event.enqueued_time
        self.partition_key = event.partition_key
        self.body = event.body
        self.properties = event.properties
        self.system_properties = event.system_properties


def test_rows_carry_every_column_of_the_event_schema() -> None:
    section = amqp.Properties(message_id=b"m-7", correlation_id="order-1", content_type=b"application/json")
    events = [
        received(7, b'{"a":1}', props={b"source": b"sensor", b"n": 3}, section=section),
        received(8, b"", key=None),
    ]
    batch = events_to_batch("3", events, system_properties=True)
    assert batch.schema.equals(RECEIVED_ARROW_SCHEMA)
    first, second = batch.to_pylist()
    assert first["partition"] == "3"
    assert first["sequence_number"] == 7 and first["offset"] == "2100"
    assert first["enqueued_time"] == dt.datetime.fromtimestamp((ENQUEUED_MS + 7) / 1000, dt.UTC)
    assert first["partition_key"] == "h000042" and first["body"] == b'{"a":1}'
    assert dict(first["properties"]) == {"source": "sensor", "n": "3"}
    assert second["partition_key"] is None and second["body"] == b"" and second["properties"] is None
    assert dict(first["system_properties"]) == {
        "message-id": "m-7",
        "correlation-id": "order-1",
        "content-type": "application/json",
        "x-opt-sequence-number": "7",
        "x-opt-offset": "2100",
        "x-opt-enqueued-time": str(ENQUEUED_MS + 7),
        "x-opt-partition-key": "h000042",
    }
    assert dict(second["system_properties"]) == {
        "x-opt-sequence-number": "8",
        "x-opt-offset": "2400",
        "x-opt-enqueued-time": str(ENQUEUED_MS + 8),
    }


def test_the_system_properties_are_read_only_when_asked_for() -> None:
    section = amqp.Properties(message_id=b"m-1")
    events = [received(n, b"x", section=section) for n in range(3)]
    for batch in (events_to_batch("0", events), events_to_batch("0", [])):
        assert batch.schema.equals(RECEIVED_ARROW_SCHEMA)
        assert batch.column("system_properties").null_count == batch.num_rows
    asked = events_to_batch("0", events, system_properties=True).column("system_properties").to_pylist()
    assert [dict(v)["message-id"] for v in asked] == ["m-1"] * 3


def test_the_public_path_gives_the_same_rows() -> None:
    section = amqp.Properties(message_id="m", subject="s", creation_time=1_795_000_000_000)
    events = [
        received(n, b"x%d" % n, props={b"k": b"v"}, section=section if n % 2 else None) for n in range(5)
    ]
    fast = events_to_batch("0", events, system_properties=True).to_pylist()
    public = events_to_batch("0", [PublicOnly(e) for e in events], system_properties=True).to_pylist()
    for a, b in zip(fast, public, strict=True):
        assert {k: v for k, v in a.items() if k != "offset"} == {k: v for k, v in b.items() if k != "offset"}


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (StartAt(sequence_number=41), (41, False)),
        (StartAt(sequence_number=-1), ("-1", False)),
        (
            StartAt(enqueued_time=dt.datetime(2026, 11, 21, tzinfo=dt.UTC)),
            (dt.datetime(2026, 11, 21, tzinfo=dt.UTC), True),
        ),
        (StartAt(), ("-1", False)),
    ],
)
def test_start_positions(start: StartAt, expected: tuple[object, bool]) -> None:
    assert start.sdk_position() == expected


def test_stolen_is_the_link_stolen_condition() -> None:
    class ConnectionLost(Exception):
        error = "link:stolen"

    assert is_stolen(ConnectionLost("New receiver with higher epoch"))
    assert is_stolen(RuntimeError("... Error condition: amqp:link:stolen ..."))
    assert not is_stolen(RuntimeError("socket closed"))


def test_raw_amqp_messages_give_the_same_rows_as_event_data() -> None:
    events = [received(n, b"x%d" % n, props={b"k": b"v"}, key=None if n % 2 else b"h1") for n in range(5)]
    raw = [event._message for event in events]
    raw_rows = events_to_batch("2", raw, system_properties=True).to_pylist()
    assert raw_rows == events_to_batch("2", events, system_properties=True).to_pylist()


def test_a_raw_message_without_a_data_body_takes_the_public_path() -> None:
    message = amqp.Message(
        value="plain text", message_annotations={b"x-opt-sequence-number": 4, b"x-opt-offset": b"9"}
    )
    (row,) = events_to_batch("1", [message]).to_pylist()
    assert row["sequence_number"] == 4 and row["offset"] == "9" and row["body"] == b"plain text"


def test_an_adopted_sdk_consumer_hands_over_raw_messages_and_remembers_the_last_as_event_data() -> None:
    from azure.eventhub import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(
        "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=a2V5;UseDevelopmentEmulator=true",
        consumer_group="$Default",
        eventhub_name="hub",
    )
    consumer = client._create_consumer("$Default", "0", "-1", lambda events: None, prefetch=10)
    adopt_raw_messages(consumer)
    messages = [received(n, b"b")._message for n in (3, 4)]
    consumer._message_buffer.extend(messages)
    delivered = [consumer._next_message_in_buffer(), consumer._next_message_in_buffer()]
    assert delivered == messages
    last = track_last(consumer, delivered)
    assert isinstance(last, EventData) and last.sequence_number == 4
    assert consumer._last_received_event is last and last.offset == "1200"


class StandInPool(ReceiverPool):
    """A pool without links: `_open` gives each receiver a stand-in consumer that answers `handshake_turns`
    calls with nothing, saying it is not ready (`handler_ready`, as the SDK's consumer does while its link
    opens), then `credit_turns` more with nothing (ready, no events yet), then one event per call.
    `handshake_step` is how long each handshake call waits on the socket; each delivery leaves the partition
    `behind` events behind its last enqueued one (as the SDK's last-enqueued properties say)."""

    def __init__(self, handshake_turns: int = 0, credit_turns: int = 0, handshake_step: float = 0.0) -> None:
        super().__init__(EventHubsTarget(None, "ns.example.net", "hub", "$Default"))
        self.handshake_turns = handshake_turns
        self.credit_turns = credit_turns
        self.handshake_step = handshake_step
        self.behind = 0
        # Called with the receiver after a call took its event from the link, before it is delivered.
        self.taken: Any = None

    def _open(self, receiver: PartitionReceiver) -> None:
        handshake, credit, step = self.handshake_turns, self.credit_turns, self.handshake_step
        pool = self

        class Consumer:
            asked = 0
            handler_ready = handshake == 0

            def receive(self, *_: object) -> None:
                self.asked += 1
                if self.asked <= handshake:
                    time.sleep(step)
                    self.handler_ready = self.asked == handshake
                elif self.asked > handshake + credit:
                    if pool.taken is not None:
                        pool.taken(receiver)
                    receiver.on_events([received(self.asked, b"x")])
                    receiver.last_enqueued_sequence = self.asked + pool.behind

            def close(self) -> None:
                pass

        receiver.consumer = Consumer()

    def _release(self, receiver: PartitionReceiver) -> None:
        receiver.consumer = receiver.client = None


def seconds_to_first_events(pool: StandInPool, partition: str) -> float | None:
    """Open `partition` in `pool` now: how long until its first events were delivered (None: not in 10 s)."""
    first: list[float] = []
    began = time.monotonic()
    pool.open(partition, 1, StartAt(), lambda _b: first.append(time.monotonic() - began), lambda *_: None)
    deadline = time.monotonic() + 10
    while not first and time.monotonic() < deadline:
        time.sleep(0.01)
    return first[0] if first else None


@pytest.mark.parametrize("closed", ["0", "3"])
def test_a_drain_waits_for_the_batch_in_hand_not_for_the_other_partitions_turns(closed: str) -> None:
    pool = StandInPool()
    delivered: set[str] = set()
    in_hand = threading.Event()

    def deliver_for(partition: str) -> Any:
        def deliver(_batch: object) -> None:  # the handler works 0.5 s on each event
            delivered.add(partition)
            if partition == "0" and len(delivered) == 4:
                in_hand.set()
            time.sleep(0.5)

        return deliver

    receivers = {
        str(p): pool.open(str(p), 1, StartAt(), deliver_for(str(p)), lambda *_: None) for p in range(4)
    }
    try:
        assert in_hand.wait(10)  # partition 0's batch is in hand, every partition has had a turn
        asked = time.monotonic()
        receivers[closed].close(wait=10)
        # Before: a closed partition left the turns only at its own place in the pass (partition 3: after
        # partitions 1 and 2 had their turns, 1.0 s more here).
        assert time.monotonic() - asked < 0.9
        assert receivers[closed].stopped.is_set()
    finally:
        pool.close(wait=10)


def test_a_claimed_partition_s_first_events_do_not_wait_out_the_idle_pauses_of_its_handshake() -> None:
    pool = StandInPool(handshake_turns=10)
    first: dict[str, float] = {}
    began = time.monotonic()

    def deliver_for(partition: str) -> Any:
        return lambda _batch: first.setdefault(partition, time.monotonic() - began)

    receivers = [pool.open(str(p), 1, StartAt(), deliver_for(str(p)), lambda *_: None) for p in range(4)]
    try:
        deadline = time.monotonic() + 5
        while len(first) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        # Each empty turn used to pause the partition 0.1 s: ten turns of handshake, a second per claim.
        assert len(first) == 4 and max(first.values()) < 0.5, first
        assert not any(r.opening() for r in receivers)  # events came: back to the idle pace
    finally:
        pool.close(wait=10)


def test_a_link_opening_beside_slow_deliveries_gets_its_handshake_and_credit_turns_between_them() -> None:
    pool = StandInPool()
    delivering: set[str] = set()

    def slow(partition: str) -> Any:  # the SDK engine's handler runs on the receiving thread
        def deliver(_batch: object) -> None:
            delivering.add(partition)
            time.sleep(0.1)

        return deliver

    for p in range(3):
        pool.open(str(p), 1, StartAt(), slow(str(p)), lambda *_: None)
    try:
        deadline = time.monotonic() + 5
        while len(delivering) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        # The next link needs ten handshake steps (10 ms each on the socket), then two turns for credit.
        pool.handshake_turns, pool.credit_turns, pool.handshake_step = 10, 2, 0.01
        first = seconds_to_first_events(pool, "3")
        # One handshake step per pass over the three slow handlers (0.3 s): 5.2 s; one per delivery: 1.6 s;
        # now the handshake in the turn that opens the link, then a turn after each delivery: about 0.5 s.
        assert first is not None and first < 0.9, first
    finally:
        pool.close(wait=10)


def test_a_handshake_that_does_not_finish_holds_the_other_partitions_for_one_bounded_turn() -> None:
    pool = StandInPool()
    delivered: list[float] = []

    receivers = [
        pool.open(str(p), 1, StartAt(), lambda _b: delivered.append(time.monotonic()), lambda *_: None)
        for p in range(2)
    ]
    try:
        deadline = time.monotonic() + 5
        while len(delivered) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pool.handshake_turns, pool.handshake_step = 10_000, 0.01  # a link that never opens
        opened = time.monotonic()
        receivers.append(pool.open("2", 1, StartAt(), lambda _b: None, lambda *_: None))
        time.sleep(2.0)
        after = [at for at in delivered if at > opened]
        gaps = [b - a for a, b in zip([opened, *after], after, strict=False)]
        # Its handshake holds the thread once for at most HANDSHAKE_SECONDS; the others go on reading. A
        # handshake driven to its end would hold it for 100 s (nothing after), one step held in every turn
        # would leave a few deliveries in 2 s; the gap's bound leaves room for a busy machine's scheduling
        # (1.03 s seen once in CI beside chaos runs).
        assert len(after) > 20 and max(gaps) < 3 * HANDSHAKE_SECONDS, max(gaps, default=None)
    finally:
        pool.close(wait=10)


def test_a_link_opened_during_a_pass_gets_its_first_turn_after_the_delivery_in_hand() -> None:
    pool = StandInPool()
    in_hand = threading.Event()

    delivered: list[str] = []

    def slow(partition: str) -> Any:  # three busy partitions: a pass takes 0.9 s
        def deliver(_batch: object) -> None:
            delivered.append(partition)
            if partition == "0" and len(delivered) > 3:  # every link opened, a pass begun
                in_hand.set()
            time.sleep(0.3)

        return deliver

    for p in range(3):
        pool.open(str(p), 1, StartAt(), slow(str(p)), lambda *_: None)
    try:
        assert in_hand.wait(10)  # partition 0's batch is in hand: the pass has two more to go
        first = seconds_to_first_events(pool, "3")
        # A claim's link used to wait for the pass to end and then for its place at the end of the next one
        # (1.8 s here); now it opens after the delivery in hand.
        assert first is not None and first < 0.5, first
    finally:
        pool.close(wait=10)


@pytest.mark.parametrize(("final_read", "behind"), [(True, 0), (False, 0), (True, 500)])
def test_a_drain_delivers_what_the_link_holds_once_more_when_asked(final_read: bool, behind: int) -> None:
    pool = StandInPool()
    pool.behind = behind
    after_close: list[int] = []
    delivered = threading.Event()
    receiver: PartitionReceiver | None = None

    def deliver(batch: Any) -> None:
        assert receiver is not None
        if receiver.closing.is_set():
            after_close.append(batch.num_rows)
        delivered.set()
        time.sleep(0.05)

    receiver = pool.open("0", 1, StartAt(), deliver, lambda *_: None)
    try:
        assert delivered.wait(10)
        receiver.close(wait=10, final_read=final_read)
        assert receiver.stopped.is_set()
        # A graceful drain of a caught-up partition hands over the events that came since the last batch (one
        # more batch here); any other close, or a drain 500 events behind, delivers nothing more.
        assert after_close == ([1] if final_read and not behind else [])
    finally:
        pool.close(wait=10)


def test_a_consumer_shedding_many_partitions_at_once_gives_last_reads_a_bounded_time() -> None:
    pool = StandInPool()
    late: list[str] = []
    seen: set[str] = set()
    everyone = threading.Event()
    receivers: dict[str, PartitionReceiver] = {}

    def deliver_for(partition: str) -> Any:
        def deliver(_batch: object) -> None:
            if receivers[partition].closing.is_set():
                late.append(partition)
            seen.add(partition)
            if len(seen) == 12:
                everyone.set()
            time.sleep(0.1)

        return deliver

    for p in range(12):
        receivers[str(p)] = pool.open(str(p), 1, StartAt(), deliver_for(str(p)), lambda *_: None)
    try:
        assert everyone.wait(10)
        asked = time.monotonic()
        for receiver in receivers.values():
            receiver.close(wait=None, final_read=True)
        for receiver in receivers.values():
            assert receiver.stopped.wait(10)
        # Twelve last reads of 0.1 s each would hold the thread 1.2 s: they stop at FINAL_READS_SECONDS.
        assert 1 <= len(late) <= FINAL_READS_SECONDS / 0.1 + 1, late
        assert time.monotonic() - asked < FINAL_READS_SECONDS + 0.1 + 0.3
    finally:
        pool.close(wait=10)


@pytest.mark.parametrize("final_read", [True, False])
def test_a_batch_taken_from_the_link_as_the_drain_begins_leaves_no_hole_before_the_last_read(
    final_read: bool,
) -> None:
    """The close can come between the SDK taking a batch from its buffer and the delivery: that batch used
    to be dropped, and the drain's last read then delivered the next one, so the checkpoint went past events
    nobody handled (the kind tier's exact totals caught it: 2-6 events a handoff)."""
    pool = StandInPool()
    sequences: list[int] = []
    closing = threading.Event()
    receiver: PartitionReceiver | None = None

    def close_in_between(taken: PartitionReceiver) -> None:
        if len(sequences) >= 3 and not closing.is_set():
            closing.set()
            taken.close(wait=None, final_read=final_read)

    def deliver(batch: Any) -> None:
        sequences.extend(batch.column("sequence_number").to_pylist())

    pool.taken = close_in_between
    receiver = pool.open("0", 1, StartAt(), deliver, lambda *_: None)
    try:
        assert closing.wait(10)
        assert receiver.stopped.wait(10)
        # Every delivery in order, without a hole: a drain delivers the batch in hand and then its last read;
        # any other close drops the batch in hand and delivers nothing after it.
        assert sequences == list(range(sequences[0], sequences[0] + len(sequences))), sequences
        assert len(sequences) == (5 if final_read else 3), sequences
    finally:
        pool.close(wait=10)


@pytest.mark.parametrize(("behind", "turn"), [(0, CAUGHT_UP_TURN), (500, None)])
def test_a_partition_behind_is_read_patiently_and_one_caught_up_only_while_its_burst_lasts(
    behind: int, turn: TurnReads | None
) -> None:
    pool = StandInPool()
    pool.behind = behind
    receiver = PartitionReceiver(pool, "0", 1, StartAt(), lambda _: None, lambda *_: None, lambda: True)
    pool._open(receiver)
    transport = SASLTransport("127.0.0.1", credential=None, port=5672, use_tls=False)  # never connected
    receiver.consumer._handler = SimpleNamespace(_connection=SimpleNamespace(_transport=transport))
    assert pool._turn(receiver)
    # the next turn's reads: a backlog's pauses are credit round trips, a caught-up link's are quiet
    assert transport._hubshift_turn == turn


# --- what a receiver delivers is contiguous ---------------------------------------------------------------


def test_repeats_in_front_of_a_batch_are_dropped_and_a_hole_ends_the_delivery() -> None:
    import numpy as np

    def order(seq: list[int], expected: int | None, fresh: bool = False) -> tuple[int, int, int | None, bool]:
        return in_order(np.array(seq, dtype=np.int64), expected, fresh=fresh)

    assert order([5, 6, 7], 5) == (0, 3, None, False)
    assert order([5, 6, 7], None) == (0, 3, None, False)
    # the SDK's buffer after its own re-open: the old link's events, then the new link's from the same place
    assert order([3, 4, 5, 6, 3, 4, 5, 6, 7], 5) == (2, 4, None, True)
    assert order([3, 4], 5) == (0, 0, None, False)  # nothing new
    assert order([5, 6, 9, 10], 5) == (0, 2, None, True)  # a hole amid the batch
    assert order([8, 9], 5) == (0, 0, None, True)  # a hole in front, on a link that delivered already
    assert order([8, 9], 5, fresh=True) == (0, 2, 5, False)  # a new link started later: 5-7 expired
    # a new link that started earlier than asked: the hub still had 6-7, so their absence is a hole
    assert order([3, 4, 8, 9], 6, fresh=True) == (2, 2, None, True)


@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8)), min_size=1, max_size=20),
    st.integers(1, 30),
)
def test_whatever_the_links_hand_over_a_receiver_delivers_a_contiguous_stream(
    chunks: list[tuple[int, int]], start: int
) -> None:
    """Any sequence of batches (repeats, overlaps, holes, as re-opened links and the SDK's buffer give them)
    comes out as one contiguous stream from the start position, every hole ending a delivery; a hole is
    passed over only on a link opened again whose first event comes after it (the hub no longer had those
    events), and then reported as expired before the delivery after it."""
    link_first: list[int] = []  # the first sequence number of each link's first batch: what the hub had

    def expired(first: int, last: int) -> None:
        assert last < link_first[-1], (
            f"{first}-{last} reported expired, yet the link began at {link_first[-1]}"
        )
        delivered.extend(range(first, last + 1))

    receiver = PartitionReceiver(
        StandInPool(),
        "0",
        1,
        StartAt(sequence_number=start - 1),
        lambda b: None,
        lambda *_: None,
        lambda: True,
        on_expired=expired,
    )
    delivered: list[int] = []
    receiver.deliver = lambda batch: delivered.extend(batch.column("sequence_number").to_pylist())
    receiver.consumer = SimpleNamespace()
    opened = True
    for first, count in chunks:
        if opened:  # a link's first batch
            link_first.append(first)
            opened = False
        try:
            receiver.on_events([received(n, b"x")._message for n in range(first, first + count)])
        except ReceiveGap:
            receiver.link_fresh = opened = (
                True  # the pool opens the link again after the last delivered event
            )
    if delivered:  # the events and the expired stretches, in the order they were reported
        assert delivered[0] == start
        assert delivered == list(range(start, start + len(delivered)))
        assert receiver.last_sequence == delivered[-1]


def test_a_quiet_link_is_one_with_nothing_buffered_and_nothing_to_read() -> None:
    import socket
    from collections import deque
    from io import BytesIO

    from azure.eventhub._pyamqp._transport import SSLTransport

    from hubshift.eventhubs.sdk_internals import link_quiet

    ours, theirs = socket.socketpair()
    try:
        transport: Any = SSLTransport.__new__(SSLTransport)
        transport.sock = ours
        transport._read_buffer = BytesIO()
        handler = SimpleNamespace(_connection=SimpleNamespace(_transport=transport))
        consumer = SimpleNamespace(_message_buffer=deque(), _handler=handler)
        assert link_quiet(consumer)
        consumer._message_buffer.append("event")  # a message handed over but not delivered yet
        assert not link_quiet(consumer)
        consumer._message_buffer.clear()
        transport._read_buffer = BytesIO(b"frame")  # the next frame's bytes already read
        assert not link_quiet(consumer)
        transport._read_buffer.read()  # all of it consumed
        assert link_quiet(consumer)
        theirs.sendall(b"\x00")  # bytes on the socket
        assert not link_quiet(consumer)
        assert not link_quiet(SimpleNamespace(_message_buffer=deque()))  # no connection yet: cannot tell
    finally:
        ours.close()
        theirs.close()


def test_a_partition_consumer_starts_no_keep_alive_thread_of_its_own() -> None:
    from azure.eventhub import EventHubConsumerClient

    from hubshift.eventhubs.sdk_internals import create_partition_consumer

    client = EventHubConsumerClient.from_connection_string(
        "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=a2V5;UseDevelopmentEmulator=true",
        consumer_group="$Default",
        eventhub_name="hub",
    )
    consumer = create_partition_consumer(
        client, "$Default", "0", "-1", lambda events: None, inclusive=False, owner_level=1, prefetch=10
    )
    assert consumer._keep_alive is None  # the SDK's default (30) starts a thread per link at open


def test_the_follow_waits_of_one_pass_add_up_to_a_bounded_time() -> None:
    from hubshift.eventhubs.receiver import PASS_FOLLOW_SECONDS

    pool = StandInPool()
    receivers: Any = [object()] * 4
    pool._receivers = receivers
    assert pool._caught_up_turn() == CAUGHT_UP_TURN  # few partitions: the whole follow
    pool._receivers = receivers * 256  # 1,024
    turn = pool._caught_up_turn()
    assert turn.budget == CAUGHT_UP_TURN.budget
    assert turn.follow * 1024 == pytest.approx(PASS_FOLLOW_SECONDS)
