"""Sending to an Event Hub: the one send loop (events in order, in as few batches as fit) and the producers a
process keeps per target hub.

An event too large for an empty batch is not sent and is reported to the caller (the replication pipelines
make it a dead letter, the load generator refuses it); any other failure of the service raises.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from azure.eventhub import EventData, EventDataBatch, EventHubProducerClient

from hubshift.eventhubs.target import EventHubsTarget, sdk_client


def send_events(producer: Any, events: Sequence[EventData], **batch_options: str) -> list[int]:
    """Send `events` in order with `producer.create_batch(**batch_options)` (a `partition_key` or a
    `partition_id`, or neither); the indexes of the events too large to send."""
    too_large: list[int] = []
    batch = producer.create_batch(**batch_options)
    for index, event in enumerate(events):
        if _added(batch, event):
            continue
        if len(batch):
            producer.send_batch(batch)
            batch = producer.create_batch(**batch_options)
            if _added(batch, event):
                continue
        too_large.append(index)
    if len(batch):
        producer.send_batch(batch)
    return too_large


def _added(batch: EventDataBatch, event: EventData) -> bool:
    """Whether `event` fit into `batch` (and was added)."""
    try:
        batch.add(event)
    except ValueError:
        return False
    return True


# One producer per target in each process (in Spark: each Python worker), kept across micro-batches: Spark
# reuses its workers, and a new producer per batch would be a new connection and token every trigger. The
# SDK reconnects it as needed.
_PRODUCERS: dict[EventHubsTarget, EventHubProducerClient] = {}
_PRODUCERS_LOCK = threading.Lock()


def producer_for(target: EventHubsTarget) -> EventHubProducerClient:
    with _PRODUCERS_LOCK:
        producer = _PRODUCERS.get(target)
        if producer is None:
            producer = _PRODUCERS[target] = sdk_client(EventHubProducerClient, target)
        return producer
