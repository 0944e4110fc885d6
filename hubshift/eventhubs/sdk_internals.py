"""The azure-eventhub internals hubshift relies on, all in this one module (written against 5.15.1;
pyproject.toml takes its patch releases, not the next minor one; re-run bench/throughput.py and
bench/control_loop.py after any upgrade).

- Partition consumers are created the way the SDK's own EventProcessor does (`_create_consumer`), so one
  thread can take the partitions in turn (docs/consumer.md), without the keep-alive thread the SDK starts
  for each.
- Received messages stay raw AMQP messages instead of an `EventData` each (`adopt_raw_messages`); their
  properties section is read by its fields' names (`RawMessageProperties`, for the system properties).
- A connection's socket is read in chunks of up to 64 KiB instead of two reads per frame, and a turn does
  not wait out the socket timeout on a quiet link (`buffer_socket_reads`).
- Management requests go over one long-lived link of the client's connection instead of a new link per
  request (`open_management_link`, `read_partition_properties`).

Each has a fallback when the internals are missing: `EventData` delivery, the public management calls.
"""

from __future__ import annotations

import asyncio
import errno
import select
import ssl
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import Any

from azure.eventhub import EventData
from azure.eventhub._pyamqp._transport import SSLTransport
from azure.eventhub._pyamqp.message import Message as RawMessage
from azure.eventhub._pyamqp.message import Properties as RawMessageProperties

from hubshift.eventhubs.model import numeric_offset

__all__ = [
    "EventData",
    "RawMessage",
    "RawMessageProperties",
    "TurnReads",
    "adopt_raw_messages",
    "buffer_socket_reads",
    "create_partition_consumer",
    "link_quiet",
    "open_management_link",
    "read_partition_properties",
    "track_last",
]


def create_partition_consumer(
    client: Any,
    consumer_group: str,
    partition: str,
    position: Any,
    on_events: Callable[[list[Any]], None],
    *,
    inclusive: bool,
    owner_level: int,
    prefetch: int,
) -> Any:
    """A partition consumer of `client` at `owner_level` delivering batches to `on_events`, raw AMQP
    messages where the SDK allows it."""
    consumer = client._create_consumer(
        consumer_group,
        partition,
        position,
        on_events,
        event_position_inclusive=inclusive,
        owner_level=owner_level,
        prefetch=prefetch,
        track_last_enqueued_event_properties=True,
    )
    adopt_raw_messages(consumer)
    # No keep-alive thread: the SDK gives every partition consumer one (keep_alive 30, which
    # `_create_consumer` does not pass on), waking every second and every 30 s reading the connection's socket
    # from its own thread, beside the receiving thread's reads. 1,024 partitions: 1,024 threads
    # (bench/partitions.py). The receivers' whole turns (at least one a second) send the idle-timeout frames.
    if hasattr(consumer, "_keep_alive"):
        consumer._keep_alive = None
    return consumer


def link_opened(consumer: Any) -> bool:
    """Whether an SDK partition consumer's link has finished opening (connection, CBS token, attach): its
    `handler_ready`, which the SDK sets once `client_ready()` says so. A consumer without it (another SDK
    version) counts as opened, so its handshake goes on a step per receive, as the SDK drives it."""
    return bool(getattr(consumer, "handler_ready", True))


def adopt_raw_messages(consumer: Any) -> None:
    """Make an SDK partition consumer deliver its raw AMQP messages instead of wrapping each in an
    `EventData` (its message, properties and annotation views: a large share of the receiving thread's
    CPU, bench/throughput.py). The last message of each batch is still wrapped
    (`track_last`): the SDK resumes from it after a retried link failure, and it carries the
    last-enqueued-event properties."""
    buffer = getattr(consumer, "_message_buffer", None)
    if buffer is None or not hasattr(consumer, "_next_message_in_buffer"):
        return  # another SDK version: it keeps delivering EventData, which events_to_batch also reads
    consumer._next_message_in_buffer = buffer.popleft


READ_CHUNK = 64 * 1024  # below glibc's mmap threshold: a chunk is a plain allocation, not an mmap


@dataclass(frozen=True)
class TurnReads:
    """How one turn reads a link's frames (`buffer_socket_reads`): its first frame only if it is there
    already, each further one if it comes within `follow` seconds, and none started after `budget` seconds
    (from the first) while the read buffer is empty."""

    follow: float
    budget: float


def buffer_socket_reads(consumer: Any, turn: TurnReads | None = None) -> None:
    """Make the socket of `consumer`'s connection (once it has one) read in chunks, and start a new turn of
    reads (`turn`: how it ends; None: as pyamqp's, on a socket timeout).

    pyamqp reads every frame with two `recv_into` calls, its 8-byte header and then its body, each a system
    call (two with the socket's timeout) and a trip through the interpreter, a large share of the receiving
    thread's CPU for a hub's small events (`bench/throughput.py` measures it). The chunked read hands the
    frame reader the same bytes and leaves what it read past a frame in the transport's own read buffer,
    which pyamqp's frame reader already consults first and restores after a timeout, so its timeout and
    error handling stay as they are.
    Idempotent and cheap: called after every turn, it also covers a connection the SDK re-opened. WebSocket
    transports (which already read whole messages) and other SDK versions are left alone.

    `turn`: pyamqp reads up to a prefetch's worth of frames a turn and returns only when a read times out. So
    every turn that read anything ended with a whole socket timeout of waiting on a link with nothing more to
    give, a turn on a quiet link waited one out too, and a link whose events come more often than the socket
    timeout (30 a second against 50 ms) held the turn until it had read a prefetch's worth, every other
    partition's events waiting (and its own, undelivered until then). With `turn`, a turn ends at the first
    quiet moment or at its budget; the read ends as pyamqp's own timeout ends it, nothing read and nothing
    lost (the socket timeout still bounds the rest of a frame whose first bytes came)."""
    handler = getattr(consumer, "_handler", None)
    transport: Any = getattr(getattr(handler, "_connection", None), "_transport", None)
    if not issubclass(type(transport), SSLTransport):
        return
    if not getattr(transport, "_hubshift_chunked", False):
        if not isinstance(getattr(transport, "_read_buffer", None), BytesIO):
            return
        transport._read = types.MethodType(_chunked_read, transport)
        transport._hubshift_chunked = True
    transport._hubshift_turn = turn
    transport._hubshift_turn_began = None


def link_quiet(consumer: Any) -> bool:
    """Whether an SDK partition consumer has nothing to hand over or read right now: no message buffered, no
    bytes left in its transport's read buffer or its TLS layer, its socket not readable (one `poll` with no
    wait). False when it cannot tell (no connection yet, a WebSocket transport, another SDK version): the
    caller then gives it a turn as before."""
    if getattr(consumer, "_message_buffer", None):
        return False
    handler = getattr(consumer, "_handler", None)
    transport: Any = getattr(getattr(handler, "_connection", None), "_transport", None)
    if not issubclass(type(transport), SSLTransport):
        return False
    buffer = getattr(transport, "_read_buffer", None)
    sock = getattr(transport, "sock", None)
    if not isinstance(buffer, BytesIO) or sock is None:
        return False
    position = buffer.tell()
    if buffer.seek(0, 2) != position:  # bytes of the next frame already read
        buffer.seek(position)
        return False
    try:
        return not _frame_arrives(sock, 0.0)
    except (OSError, ValueError):  # a closed socket: let the turn find out
        return False


def _frame_arrives(sock: Any, wait: float) -> bool:
    """Whether the next frame's first bytes are readable within `wait` seconds (a TLS socket may hold them
    decrypted already, where polling the socket cannot see them)."""
    pending = getattr(sock, "pending", None)
    if callable(pending) and pending() > 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(wait * 1000))


def _chunked_read(
    transport: Any,
    n: int,
    initial: bool = False,
    buffer: memoryview | None = None,
    _errnos: tuple[int, ...] = (errno.ENOENT, errno.EAGAIN, errno.EINTR),  # pyamqp's own retryable set
) -> memoryview:
    """Exactly `n` bytes, as pyamqp's `SSLTransport._read` gives them, from one `recv` of up to
    `READ_CHUNK` bytes where it can; the bytes past `n` stay in `transport._read_buffer`."""
    view = buffer if buffer is not None else memoryview(bytearray(n))
    length = transport._read_buffer.readinto(view)  # what an earlier chunk left
    turn: TurnReads | None = getattr(transport, "_hubshift_turn", None)
    try:
        if initial and length == 0 and turn is not None:  # a frame's header, nothing buffered
            began: float | None = transport._hubshift_turn_began
            now = time.monotonic()
            if began is None:  # the turn's first frame: only if it is there
                ends = not _frame_arrives(transport.sock, 0.0)
                transport._hubshift_turn_began = now
            else:
                ends = now - began > turn.budget or not _frame_arrives(transport.sock, turn.follow)
            if ends:
                raise TimeoutError()  # the turn ends here, as on pyamqp's socket timeout
        while length < n:
            try:
                data = transport.sock.recv(READ_CHUNK)
            except OSError as exc:
                if isinstance(exc, ssl.SSLError) and "timed out" in str(exc):
                    raise TimeoutError() from exc
                if exc.errno in _errnos:
                    if initial and transport.raise_on_initial_eintr:
                        raise TimeoutError() from exc
                    continue
                raise
            if not data:
                raise OSError("Server unexpectedly closed connection")
            wanted = n - length
            if len(data) <= wanted:
                view[length : length + len(data)] = data
                length += len(data)
            else:
                view[length:n] = data[:wanted]
                transport._read_buffer = BytesIO(data[wanted:])
                length = n
    except BaseException:
        # as pyamqp does: what this read took goes back to the buffer, and the frame reader puts the
        # frame's earlier parts in front of it, so the next read starts the frame again
        transport._read_buffer = BytesIO(bytes(view[:length]))
        raise
    return view


def track_last(consumer: Any, events: Sequence[Any]) -> Any:
    """The batch's last event as an `EventData`, recorded where the SDK looks when it reconnects."""
    last = events[-1]
    if isinstance(last, RawMessage):
        last = consumer._last_received_event = EventData._from_message(last)
    return last


async def open_management_link(client: Any, timeout: float) -> tuple[Any, Any] | None:
    """(link, auth): one management link kept open on `client`'s connection (an async
    `EventHubConsumerClient`), or None when this SDK version does not offer one."""
    try:
        transport = client._amqp_transport
        auth = await client._create_auth_async()
        link = transport.create_mgmt_client(client._address, mgmt_auth=auth, config=client._config)
        connection = await client._conn_manager_async.get_connection(
            endpoint=client._address.hostname, auth=auth
        )
    except AttributeError:
        return None
    await asyncio.wait_for(link.open_async(connection=connection), timeout)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await link.client_ready_async():
        if loop.time() > deadline:
            raise TimeoutError("the management link did not open")
        await asyncio.sleep(0.01)
    return link, auth


async def read_partition_properties(
    client: Any, link: Any, auth: Any, hub: str, partition: str, timeout: float
) -> tuple[int, int, bool, float | None, int | None]:
    """(beginning sequence number, last enqueued sequence number, empty, last enqueued time in Unix
    seconds, last enqueued offset when it is a byte position) of one partition, read with the READ request
    the SDK's `get_partition_properties` sends, on the link `open_management_link` opened."""
    from azure.eventhub._constants import (
        MGMT_PARTITION_OPERATION,
        MGMT_STATUS_CODE,
        MGMT_STATUS_DESC,
        READ_OPERATION,
    )

    transport = client._amqp_transport
    message = transport.build_message(application_properties={"name": hub, "partition": partition})
    message.application_properties["security_token"] = await transport.get_updated_token_async(auth)
    status, description, response = await asyncio.wait_for(
        transport.mgmt_client_request_async(
            link,
            message,
            operation=READ_OPERATION,
            operation_type=MGMT_PARTITION_OPERATION,
            status_code_field=MGMT_STATUS_CODE,
            description_fields=MGMT_STATUS_DESC,
        ),
        timeout,
    )
    if int(status) >= 400:
        text = description.decode() if isinstance(description, bytes) else str(description)
        raise RuntimeError(f"partition {partition}: {int(status)} {text}")
    value = response.value
    enqueued = value.get(b"last_enqueued_time_utc")
    return (
        int(value[b"begin_sequence_number"]),
        int(value[b"last_enqueued_sequence_number"]),
        bool(value[b"is_partition_empty"]),
        None if enqueued is None else float(enqueued) / 1000,
        numeric_offset(value.get(b"last_enqueued_offset")),
    )
