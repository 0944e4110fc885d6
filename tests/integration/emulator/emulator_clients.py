"""Small, bounded helpers over the real azure-eventhub SDK for the emulator's integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.aio import EventHubConsumerClient as AsyncConsumerClient

HUB = "hub"


@dataclass
class Received:
    partition_id: str
    sequence_number: int
    offset: str
    enqueued_time: Any
    partition_key: bytes | None
    body: bytes
    properties: dict[Any, Any]
    delivery_annotations: dict[Any, Any] = field(default_factory=dict)


@dataclass
class Collector:
    """Events received by an EventHubConsumerClient, with the callbacks' other findings."""

    events: list[Received] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    closed: list[tuple[str, Any]] = field(default_factory=list)
    last_enqueued: list[dict[str, Any] | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_event(self, context: Any, event: EventData | None) -> None:
        if event is None:
            return
        with self.lock:
            self.events.append(
                Received(
                    context.partition_id,
                    event.sequence_number,
                    event.offset,
                    event.enqueued_time,
                    event.partition_key,
                    b"".join(event.body),
                    dict(event.properties or {}),
                    dict(event.raw_amqp_message.delivery_annotations or {}),
                )
            )
            self.last_enqueued.append(context.last_enqueued_event_properties)

    def on_error(self, context: Any, error: BaseException) -> None:
        with self.lock:
            self.errors.append(error)

    def on_partition_close(self, context: Any, reason: Any) -> None:
        with self.lock:
            self.closed.append((context.partition_id, reason))

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [event.body for event in self.events]


def wait_until(condition: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


class BackgroundConsumer:
    """`EventHubConsumerClient.receive` on a thread, closed on exit."""

    def __init__(
        self, connection_string: str, hub: str = HUB, consumer_group: str = "$Default", **receive: Any
    ):
        self.client = EventHubConsumerClient.from_connection_string(
            connection_string, consumer_group=consumer_group, eventhub_name=hub, retry_total=1
        )
        self.collector = Collector()
        options: dict[str, Any] = {
            "on_event": self.collector.on_event,
            "on_error": self.collector.on_error,
            "on_partition_close": self.collector.on_partition_close,
            "max_wait_time": None,
        }
        options.update(receive)
        self._thread = threading.Thread(target=self.client.receive, kwargs=options, daemon=True)

    def __enter__(self) -> Collector:
        self._thread.start()
        return self.collector

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self._thread.join(timeout=15)


def receive(
    connection_string: str,
    count: int,
    *,
    hub: str = HUB,
    timeout: float = 20,
    **receive_options: Any,
) -> Collector:
    """Receive until `count` events arrived (or the timeout passed)."""
    receive_options.setdefault("starting_position", "-1")
    with BackgroundConsumer(connection_string, hub, **receive_options) as collector:
        wait_until(lambda: len(collector.events) >= count, timeout)
    return collector


def receive_async(
    connection_string: str, count: int, *, hub: str = HUB, timeout: float = 20, **options: Any
) -> Collector:
    """The same with the asyncio client."""
    collector = Collector()

    async def on_event(context: Any, event: EventData | None) -> None:
        collector.on_event(context, event)

    async def main() -> None:
        client = AsyncConsumerClient.from_connection_string(
            connection_string, consumer_group="$Default", eventhub_name=hub, retry_total=1
        )
        options.setdefault("starting_position", "-1")
        task = asyncio.create_task(client.receive(on_event=on_event, **options))
        deadline = time.monotonic() + timeout
        while len(collector.events) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await client.close()
        # the async EventProcessor sleeps out its load-balancing interval after close
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return collector


def producer(connection_string: str, hub: str = HUB, **options: Any) -> EventHubProducerClient:
    options.setdefault("retry_total", 1)
    return EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub, **options)
