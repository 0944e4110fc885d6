"""The consumer's Event Hubs receivers: one AMQP link per owned partition at that ownership's owner level,
all driven by one thread, delivering Arrow batches in the event row schema.

One thread takes the partitions in turn, as the SDK's own EventProcessor does (`EventHubConsumer.receive`,
one round of AMQP work per partition and turn); one thread per partition costs about twice the CPU per
event for the GIL's sake (measured: docs/consumer.md). Each partition has its own client and connection,
so closing one never disturbs the others. A turn takes only the frames a link has ready (it does not wait
on a quiet socket), and a partition that had nothing is asked again only a little later.

- A link detached for a higher owner level (`amqp:link:stolen`) raises `ConnectionLostError` from the
  SDK at once: the partition is reported *stolen* and never retried.
- Any other failure after the SDK's own retries: the client is closed and a new one opened right after
  the last delivered event (the SDK's processor would restart from its original position instead).

Sequence numbers are contiguous within a partition, so what a receiver delivers is checked to be: each
batch starts right after the last one delivered and has no hole. The SDK re-opens a failed link by itself
from the last event it handed over, and keeps the events its old link had buffered, so repeats come
in front of or amid the new link's events: repeats are dropped. A hole is never delivered: the link is
opened again right after the last event delivered. A new link that starts later than asked is the hub's
retention at work (those events expired): reported with `on_expired`, then delivered from there.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from azure.eventhub import EventHubConsumerClient
from azure.eventhub._utils import get_last_enqueued_event_properties

from hubshift.errors import one_line
from hubshift.eventhubs.rows import events_to_batch
from hubshift.eventhubs.sdk_internals import (
    TurnReads,
    buffer_socket_reads,
    create_partition_consumer,
    link_opened,
    link_quiet,
    track_last,
)
from hubshift.eventhubs.target import EventHubsTarget, describe_error, sdk_client

log = logging.getLogger(__name__)

# How a receiver reads: events per delivered batch (a spool segment) and AMQP credit.
MAX_BATCH = 1000
PREFETCH = 1000
# A receiver whose read failed is opened again this much later.
REOPEN_SECONDS = 1.0
# How long a read may wait on a partition's socket (the SDK's default is 0.2 s): a handshake's steps, the
# rest of a frame whose first bytes came, and every read of a partition behind (its backlog comes as fast
# as credit goes back: a pause on its socket is a round trip, and a turn that gave up on it would pause the
# partition for QUIET_SECONDS). A partition caught up is read a burst a turn (`CAUGHT_UP_TURN`,
# `buffer_socket_reads`): its first frame only if it is there already, each further one if it comes within
# 5 ms, and for at most 50 ms; the thread's idle wait paces the loop, not one quiet socket (nor one link
# whose events come more often than the socket timeout) while the other partitions' events wait.
SOCKET_TIMEOUT_SECONDS = 0.05
CAUGHT_UP_TURN = TurnReads(follow=0.005, budget=0.05)
# The follow waits are spent one partition after another: a pass's add up to this much at most (each
# partition's follow is this share of it, at most CAUGHT_UP_TURN's). At 1,024 partitions with an event
# now and then, a 5 ms wait after nearly every turn's one event made a pass of 5 s (bench/partitions.py).
PASS_FOLLOW_SECONDS = 0.05
# A partition that had nothing is asked again after this long; one whose link is opening, at once (with
# this pause between rounds), until its first events or for OPENING_WINDOW_SECONDS after it was opened.
QUIET_SECONDS = 0.1
# A caught-up, opened link whose socket has nothing to read skips its turn (a `poll` instead of the SDK's
# receive: bench/partitions.py, 1,024 quiet partitions) but takes a whole one at least this often, so the
# SDK's own timers (its token's renewal, the connection's idle-timeout frames) still run.
FULL_TURN_SECONDS = 1.0
OPENING_SECONDS = 0.005
OPENING_WINDOW_SECONDS = 1.0
# A new link's handshake (connection, CBS token, link attach) is driven in one turn for at most this long:
# each step waits on the socket for the service's answer (the socket timeout), so this is a few round trips,
# not a busy loop; a handshake that takes longer goes on in later turns.
HANDSHAKE_SECONDS = 0.5
# The drains' last reads (`PartitionReceiver.close(final_read=True)`) stop for this long at most a round:
# each can take a while (a link not read since its handshake waits a socket timeout), and a consumer
# shedding 28 partitions at once must not hold the others' turns for 28 of them (the rest leave without
# one; their events wait for the next owner, as before).
FINAL_READS_SECONDS = 0.25
# A drain's last read is for a partition that is caught up (at most this many events behind at its last
# delivery) and delivers at most this many: the SDK engine's handler runs on the receiving thread, and a
# consumer behind on the partition (one shedding load) should hand it over, not read a prefetch's worth more.
FINAL_READ_EVENTS = 100
# Per partition: the first sequence number and enqueued time of this many recent batches are kept.
BATCH_STARTS_KEPT = 256


@dataclass(frozen=True)
class StartAt:
    """Where a receiver starts: after `sequence_number`, else at `enqueued_time`, else the beginning
    (`latest` is resolved to a sequence number by the agent before the receiver starts)."""

    sequence_number: int | None = None
    enqueued_time: dt.datetime | None = None

    def sdk_position(self) -> tuple[str | int | dt.datetime, bool]:
        """The SDK's `starting_position` and `starting_position_inclusive`."""
        if self.sequence_number is not None and self.sequence_number >= 0:
            return self.sequence_number, False
        if self.enqueued_time is not None:
            return self.enqueued_time, True
        return "-1", False


class ReceiveGap(RuntimeError):
    """A link delivered events with a hole that no expiry explains: it is opened again after the last event
    delivered."""


def in_order(sequence: Any, expected: int | None, *, fresh: bool) -> tuple[int, int, int | None, bool]:
    """Which rows of a received batch to deliver, from its sequence numbers (a numpy array): `(begin, end,
    expired_from, hole)`. Rows `[begin, end)` follow `expected` without a hole (repeats of events before
    `expected` are dropped when they lead the batch); `expired_from`: on a `fresh` link (nothing received
    since it opened) whose first event is later than `expected`, the first sequence number the hub no longer
    had (events `[expired_from, sequence[0])` expired), else None; `hole`: events after `end`
    were dropped because a sequence number was missing (or repeated amid the batch)."""
    count = len(sequence)
    if count == 0:
        return 0, 0, None, False
    begin = 0
    if expected is not None and sequence[0] < expected:
        # repeats of what was delivered, in front of the batch (the SDK's buffer after its own re-open)
        ahead = np.nonzero(sequence >= expected)[0]
        if len(ahead) == 0:
            return 0, 0, None, False
        begin = int(ahead[0])
    expired_from = None
    first = int(sequence[begin])
    if expected is not None and first > expected:
        if not fresh or begin > 0:
            # a hole: the link had events before `expected` (or delivered since it opened), so the hub
            # still held the missing ones; only a fresh link's very first event can say they expired
            return begin, begin, None, True
        expired_from = expected
    steps = np.diff(sequence[begin:])
    breaks = np.nonzero(steps != 1)[0]
    if len(breaks) == 0:
        return begin, count, expired_from, False
    return begin, begin + int(breaks[0]) + 1, expired_from, True


def is_stolen(error: BaseException) -> bool:
    """A receiver disconnected because another one opened with a higher (or equal) owner level."""
    condition = getattr(error, "error", None)
    return condition == "link:stolen" or "link:stolen" in str(error)


class PartitionReceiver:
    """One partition read under one owner level (a `ReceiverPool` drives it).

    `deliver(batch)` runs on the pool's thread and must not block: `has_room()` False pauses the partition
    instead (back-pressure: its AMQP credit runs out and the service holds the events). `on_stolen` runs
    once if a higher owner level took the partition; then the receiver has stopped for good.
    `on_expired(first, last)` runs (on the pool's thread, before the delivery that follows them) when
    events the receiver asked for had expired from the hub: it goes on after them.
    """

    def __init__(
        self,
        pool: ReceiverPool,
        partition: str,
        owner_level: int,
        start: StartAt,
        deliver: Callable[[pa.RecordBatch], None],
        on_stolen: Callable[[str, int], None],
        has_room: Callable[[], bool],
        batch_limit: Callable[[], int] = lambda: MAX_BATCH,
        on_expired: Callable[[int, int], None] = lambda first, last: None,
    ) -> None:
        self.pool = pool
        self.partition = partition
        self.owner_level = owner_level
        self.start = start
        self.deliver = deliver
        self.on_stolen = on_stolen
        self.has_room = has_room
        self.batch_limit = batch_limit  # events per delivery, at most MAX_BATCH
        self.on_expired = on_expired
        self.stolen = False
        self.last_enqueued_sequence: int | None = None
        self.last_enqueued_time: dt.datetime | None = None  # of that event, when Event Hubs says
        self.received = 0
        self.last_sequence: int | None = None
        # Nothing delivered since the pool opened the current link: a later start than asked is an expiry.
        self.link_fresh = True
        self.closing = threading.Event()
        # A drain: deliver what the link holds once more before it leaves the turns (and never drop a batch
        # taken from the link after the close: the last read would deliver past it, a hole in the stream).
        self.final_read = False
        self.stopped = threading.Event()  # out of the pool's turns: no delivery follows
        self.closed = threading.Event()  # and its link is closed
        self.client: Any = None
        self.consumer: Any = None
        self.not_before = 0.0
        self.opened_at: float | None = None
        self.full_turn_at = 0.0  # when its link last had a whole turn (the SDK's receive)
        # first sequence number of a delivered batch -> that event's enqueued time (the consumer's lag in
        # seconds: the checkpoint's neighbour is usually the first event of a batch already received)
        self._batch_starts: OrderedDict[int, dt.datetime] = OrderedDict()
        self._starts_lock = threading.Lock()

    @property
    def running(self) -> bool:
        return not self.closed.is_set()

    def close(self, wait: float | None = 10.0, *, final_read: bool = False) -> None:
        """Stop delivering at once (`wait`: until the pool's thread has delivered its last batch, so the
        last position is final); the link is closed right after, off that thread. `final_read` (a graceful
        drain): the thread first gives the link one more turn and delivers what it holds, the events that
        came since its last batch, which would otherwise wait for the next owner's first batch."""
        self.final_read = final_read
        self.closing.set()
        self.pool.closed_one()
        if wait:
            self.stopped.wait(wait)

    def due(self, now: float) -> bool:
        """Whether the receiving thread gives it a turn now: not closing, its pause over, room for more."""
        return not self.closing.is_set() and now >= self.not_before and self.has_room()

    def opening(self) -> bool:
        """Nothing received yet and its link not opened yet, or opened lately (a handshake in progress, or
        nothing to read yet)."""
        return self.received == 0 and (
            self.opened_at is None or time.monotonic() - self.opened_at < OPENING_WINDOW_SECONDS
        )

    def events_behind(self) -> int | None:
        """At its last delivery, how many events it was behind the partition's last enqueued one (None:
        nothing delivered yet, or the service did not say)."""
        last, newest = self.last_sequence, self.last_enqueued_sequence
        return None if last is None or newest is None else newest - last

    def caught_up(self) -> bool:
        """At its last delivery, at most `FINAL_READ_EVENTS` behind the partition's last enqueued event."""
        behind = self.events_behind()
        return behind is not None and behind <= FINAL_READ_EVENTS

    def behind(self) -> bool:
        """At its last delivery, more than `FINAL_READ_EVENTS` behind: the service has a backlog to send."""
        behind = self.events_behind()
        return behind is not None and behind > FINAL_READ_EVENTS

    def batch_size(self) -> int:
        """Events per delivery: what `batch_limit` says, within 1 and `MAX_BATCH`."""
        return max(1, min(MAX_BATCH, self.batch_limit()))

    def final_turn(self) -> None:
        """A drained link's last round of AMQP work (on the receiving thread), its events delivered: at most
        one socket wait (nothing to read) or one batch of at most `FINAL_READ_EVENTS`. A failure ends the
        drain where the last delivery left it."""
        try:
            self.consumer.receive(True, min(FINAL_READ_EVENTS, self.batch_size()), None)
        except Exception as exc:  # the link is closed next either way; the position stands
            log.debug("partition %s: the drain's last read failed: %r", self.partition, exc)

    def position(self) -> tuple[str | int | dt.datetime, bool]:
        if self.last_sequence is not None:
            return self.last_sequence, False
        return self.start.sdk_position()

    def expected(self) -> int | None:
        """The sequence number the next delivery starts with (None: whatever the hub has first)."""
        if self.last_sequence is not None:
            return self.last_sequence + 1
        asked = self.start.sequence_number
        return asked + 1 if asked is not None and asked >= 0 else None

    def on_events(self, events: list[Any]) -> None:
        # A close stops deliveries at once, even of a batch already taken from the link (nothing after it is
        # delivered, so the next owner reads it again) -- except a drain's, whose last read follows: its
        # batches are all delivered, in order.
        if not events or (self.closing.is_set() and not self.final_read):
            return
        batch = events_to_batch(self.partition, events, system_properties=self.pool.system_properties)
        expected = self.expected()
        begin, end, expired_from, hole = in_order(
            batch.column("sequence_number").to_numpy(), expected, fresh=self.link_fresh
        )
        self.link_fresh = False  # its first events came: what the hub had first is known
        if end > begin:
            if begin or end < batch.num_rows:
                batch = batch.slice(begin, end - begin)
            first = int(batch.column("sequence_number")[0].as_py())
            if expired_from is not None:
                self.on_expired(expired_from, first - 1)
            self._remember_start(batch)
            self.deliver(batch)
            self.last_sequence = first + batch.num_rows - 1
            self.received += batch.num_rows
        if hole:
            after = self.last_sequence if self.last_sequence is not None else expected
            raise ReceiveGap(
                f"partition {self.partition}: events came with a hole after sequence number {after}; "
                "reading again from there"
            )
        if end == begin:
            return
        last_event = track_last(self.consumer, events)
        try:
            properties = get_last_enqueued_event_properties(last_event) or {}
        except Exception:  # only metrics depend on it
            properties = {}
        last = properties.get("sequence_number")
        if last is not None:
            self.last_enqueued_sequence = int(last)
            moment = properties.get("enqueued_time")
            self.last_enqueued_time = moment if isinstance(moment, dt.datetime) else None

    def _remember_start(self, batch: pa.RecordBatch) -> None:
        first = int(batch.column("sequence_number")[0].as_py())
        enqueued = batch.column("enqueued_time")[0].as_py()
        if enqueued is None:
            return
        with self._starts_lock:
            self._batch_starts[first] = enqueued
            while len(self._batch_starts) > BATCH_STARTS_KEPT:
                self._batch_starts.popitem(last=False)

    def enqueued_time(self, sequence_number: int) -> dt.datetime | None:
        """When the event `sequence_number` was enqueued, if it began a batch this receiver delivered."""
        with self._starts_lock:
            return self._batch_starts.get(sequence_number)


class ReceiverPool:
    """The consumer's receivers, on one thread (started with the first partition)."""

    def __init__(self, target: EventHubsTarget, *, system_properties: bool = False) -> None:
        # The process's first Arrow array imports pandas (pyarrow looks for pandas objects): about 0.25 s
        # here, paid now rather than by the first batch of the first partition claimed (a handoff's).
        events_to_batch("", [])
        self._target = target
        # Whether the batches carry the events' system properties (else that column is empty).
        self.system_properties = system_properties
        self._consumer_group = target.consumer_group
        self._failure: str | None = None  # the last failure reported, until a receive succeeds
        self._lock = threading.Lock()
        self._receivers: list[PartitionReceiver] = []
        self._wake = threading.Event()
        self._closed = threading.Event()  # some receiver was closed since the thread last looked
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def open(
        self,
        partition: str,
        owner_level: int,
        start: StartAt,
        deliver: Callable[[pa.RecordBatch], None],
        on_stolen: Callable[[str, int], None],
        has_room: Callable[[], bool] = lambda: True,
        batch_limit: Callable[[], int] = lambda: MAX_BATCH,
        on_expired: Callable[[int, int], None] = lambda first, last: None,
    ) -> PartitionReceiver:
        receiver = PartitionReceiver(
            self, partition, owner_level, start, deliver, on_stolen, has_room, batch_limit, on_expired
        )
        with self._lock:
            self._receivers.append(receiver)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="receivers", daemon=True)
                self._thread.start()
        self.wake()
        return receiver

    def wake(self) -> None:
        self._wake.set()

    def closed_one(self) -> None:
        """A receiver was closed: the thread takes it out of the turns after the batch in hand."""
        self._closed.set()
        self.wake()

    def close(self, wait: float = 10.0) -> None:
        with self._lock:
            receivers = list(self._receivers)
        for receiver in receivers:
            receiver.closing.set()
        self._stopping.set()
        self.closed_one()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait)

    # --- the receiving thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                receivers = list(self._receivers)
            self._retire_closed()
            if self._stopping.is_set():
                return
            worked = False
            now = time.monotonic()
            for receiver in receivers:
                if receiver.due(now) and self._turn(receiver):
                    worked = True
                    # A delivery can be slow (the SDK engine's handler runs on this thread), and a new link
                    # needs a few turns of credit after its handshake: links still opening get a turn after
                    # every delivery, not one per pass over every partition's handler. That includes links
                    # opened since the pass began (a claim's), which would otherwise wait for the pass's end
                    # for their handshake.
                    with self._lock:
                        current = list(self._receivers)
                    for other in current:
                        if other is not receiver and other.opening() and other.due(time.monotonic()):
                            self._turn(other)
                # A drain waits for the batch in hand only, not for the other partitions' turns (with costly
                # batches a pass over them all can take longer than a handoff may): whichever receivers were
                # closed meanwhile leave the turns now, wherever they are in the pass.
                self._retire_closed()
            if not worked:
                # A new link needs a few turns of credit after its handshake before its first events: while
                # one opens, the next turn comes within milliseconds, not after the idle pause (which made
                # every claim wait about a second for its first events). Otherwise the pause lets the links'
                # buffers fill: fewer, larger deliveries cost less per event.
                # (Only links due now: one waiting out a failure's retry pause is not worth turning for.)
                opening = any(r.opening() and r.due(time.monotonic()) for r in receivers)
                self._wake.wait(OPENING_SECONDS if opening else QUIET_SECONDS / 2)
                self._wake.clear()

    def _turn(self, receiver: PartitionReceiver) -> bool:
        """One round of AMQP work for one partition; True when it delivered events."""
        before = receiver.received
        if self._quiet(receiver):
            receiver.not_before = time.monotonic() + QUIET_SECONDS
            return False
        receiver.full_turn_at = time.monotonic()
        try:
            if receiver.consumer is None:
                self._open(receiver)
                receiver.opened_at = time.monotonic()
                self._handshake(receiver)
            receiver.consumer.receive(True, receiver.batch_size(), None)
            buffer_socket_reads(receiver.consumer, None if receiver.behind() else self._caught_up_turn())
        except Exception as exc:
            if is_stolen(exc):
                receiver.stolen = True
                log.warning(
                    "partition %s: a receiver with a higher owner level took over (ours: %d); stopped",
                    receiver.partition,
                    receiver.owner_level,
                )
                self._shut(receiver)
                receiver.on_stolen(receiver.partition, receiver.owner_level)
                return False
            self._report_failure(receiver, exc)
            self._release(receiver)
            receiver.not_before = time.monotonic() + REOPEN_SECONDS
            return False
        self._failure = None
        if receiver.received == before:
            receiver.not_before = time.monotonic() + (0.0 if receiver.opening() else QUIET_SECONDS)
            return False
        return True

    def _caught_up_turn(self) -> TurnReads:
        """How a caught-up partition's turn reads: `CAUGHT_UP_TURN`, its follow at most its share of
        `PASS_FOLLOW_SECONDS`."""
        with self._lock:
            receivers = max(1, len(self._receivers))
        follow = min(CAUGHT_UP_TURN.follow, PASS_FOLLOW_SECONDS / receivers)
        return CAUGHT_UP_TURN if follow == CAUGHT_UP_TURN.follow else replace(CAUGHT_UP_TURN, follow=follow)

    def _quiet(self, receiver: PartitionReceiver) -> bool:
        """A caught-up, opened link with nothing to read, whose last whole turn was less than
        `FULL_TURN_SECONDS` ago: its turn can be skipped. The SDK's receive of a quiet link costs tens of
        microseconds, ten times a second per partition: with 1,024 partitions most of the idle CPU."""
        consumer = receiver.consumer
        if consumer is None or receiver.opening() or receiver.behind() or not link_opened(consumer):
            return False
        if time.monotonic() - receiver.full_turn_at >= FULL_TURN_SECONDS:
            return False
        return link_quiet(consumer)

    def _handshake(self, receiver: PartitionReceiver) -> None:
        """Drive a new link's handshake to its end (at most `HANDSHAKE_SECONDS`) in this turn: one step per
        turn gave a claim's handshake one step per delivery of every other partition (seconds with the SDK
        engine's slow handlers, on the handoff's critical path)."""
        deadline = time.monotonic() + HANDSHAKE_SECONDS
        consumer = receiver.consumer
        while not link_opened(consumer) and time.monotonic() < deadline:
            consumer.receive(True, MAX_BATCH, None)

    def _report_failure(self, receiver: PartitionReceiver, error: BaseException) -> None:
        """One warning per kind of failure while it lasts (a refused credential fails every partition on
        every retry), with what to fix; repeats go to the debug log."""
        text = str(error)
        refused = type(error).__name__ == "AuthenticationError" or "401" in text.split("Description", 1)[0]
        reason = describe_error(error, self._target) if refused else one_line(error)
        if reason == self._failure:
            log.debug("partition %s: receiving failed again, reconnecting: %s", receiver.partition, reason)
            return
        self._failure = reason
        log.warning("partition %s: receiving failed, reconnecting: %s", receiver.partition, reason)

    def _open(self, receiver: PartitionReceiver) -> None:
        client: Any = sdk_client(
            EventHubConsumerClient,
            self._target,
            consumer_group=self._consumer_group,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
        )
        position, inclusive = receiver.position()
        receiver.link_fresh = True
        receiver.client = client
        receiver.consumer = create_partition_consumer(
            client,
            self._consumer_group,
            receiver.partition,
            position,
            receiver.on_events,
            inclusive=inclusive,
            owner_level=receiver.owner_level,
            prefetch=PREFETCH,
        )

    def _release(self, receiver: PartitionReceiver) -> None:
        consumer, client = receiver.consumer, receiver.client
        receiver.consumer = receiver.client = None
        for closable in (consumer, client):
            if closable is not None:
                try:
                    closable.close()
                except Exception as exc:  # closing a broken link may fail; it is gone either way
                    log.debug("partition %s: closing failed: %r", receiver.partition, exc)

    def _shut(self, receiver: PartitionReceiver) -> None:
        self._release(receiver)
        with self._lock:
            if receiver in self._receivers:
                self._receivers.remove(receiver)
        receiver.stopped.set()
        receiver.closed.set()

    def _retire_closed(self) -> None:
        """Retire every receiver closed since the last look (one flag read per turn when none was)."""
        if not self._closed.is_set():
            return
        self._closed.clear()  # before the look: a close after it sets the flag again
        with self._lock:
            closed = [r for r in self._receivers if r.closing.is_set()]
        reads_until = time.monotonic() + FINAL_READS_SECONDS
        for receiver in closed:
            self._retire(receiver, final_read=time.monotonic() < reads_until)

    def _retire(self, receiver: PartitionReceiver, *, final_read: bool) -> None:
        """Take a closing receiver out of the turns (after its last read, if it asked for one, is caught
        up, and `final_read` allows): this thread is the only one that delivers, so nothing follows and
        whoever waits for it may go on (a drain's final checkpoint). Its link is closed on a thread of its
        own: a consumer handing 28 partitions off at once waits for one close, not for 28 in a row (about
        0.2 s each)."""
        asked = final_read and receiver.final_read and not receiver.stolen
        if asked and receiver.consumer is not None and receiver.caught_up():
            receiver.final_turn()
        with self._lock:
            if receiver in self._receivers:
                self._receivers.remove(receiver)
        receiver.stopped.set()

        def close_link() -> None:
            self._release(receiver)
            receiver.closed.set()

        threading.Thread(target=close_link, name=f"close-{receiver.partition}", daemon=True).start()
