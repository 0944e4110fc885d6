"""The management questions asked of a hub: its partition ids and, per partition, the first retained and
the last enqueued sequence numbers. Two front ends over the same answers (`PartitionInfo`):

- `EventHubsManagement` for a thread (the consumer's ownership agent: partition ids, where `latest` and a
  partition's own start sequence number start);
- `EventHubsProbe` for asyncio (the operator's control loop: every partition each polling interval).

The SDK's public `get_partition_properties` opens a new management session, two links and a CBS token for
every call (about 0.45 s each on the emulator; 1,024 partitions would take minutes), so the probe keeps one
management link open and sends its READ requests on it one after another (about 1 ms each;
`sdk_internals`). A connection string or a token never appears in an error or a log line.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

from hubshift.errors import UserError
from hubshift.eventhubs.model import EventAt, PartitionInfo, numeric_offset
from hubshift.eventhubs.sdk_internals import open_management_link, read_partition_properties
from hubshift.eventhubs.target import EventHubsTarget, describe_error, sdk_client
from hubshift.ownership.model import EARLIEST, Checkpoint, partition_sort_key

log = logging.getLogger(__name__)


class ProbeError(Exception):
    """Event Hubs could not be read; the message is one line a person can act on (no secret)."""


class EventHubsProbe:
    """Partition ids and properties of one hub, over one long-lived client."""

    def __init__(self, target: EventHubsTarget, *, request_timeout: float = 10.0) -> None:
        self.target = target
        self.request_timeout = request_timeout
        self.requests = 0  # management requests sent (the benchmark reports them)
        self._client: Any = None
        self._link: Any = None
        self._auth: Any = None
        self._public_only = False

    async def partitions(self) -> dict[str, PartitionInfo]:
        """Every partition of the hub with its last enqueued sequence number; `ProbeError` on failure."""
        try:
            ids = await self._partition_ids()
            infos = {}
            for partition in ids:
                infos[partition] = await self._properties(partition)
            return infos
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._reset()
            raise ProbeError(describe_error(exc, self.target)) from None

    async def partition_ids(self) -> list[str]:
        try:
            return await self._partition_ids()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._reset()
            raise ProbeError(describe_error(exc, self.target)) from None

    async def close(self) -> None:
        await self._reset()

    # --- the SDK -----------------------------------------------------------------------------------

    def _connect(self) -> Any:
        if self._client is None:
            from azure.eventhub.aio import EventHubConsumerClient

            self._client = sdk_client(
                EventHubConsumerClient, self.target, consumer_group=self.target.consumer_group, retry_total=1
            )
        return self._client

    async def _partition_ids(self) -> list[str]:
        client = self._connect()
        self.requests += 1
        ids = await asyncio.wait_for(client.get_partition_ids(), self.request_timeout)
        return sorted((str(p) for p in ids), key=partition_sort_key)

    async def _properties(self, partition: str) -> PartitionInfo:
        self.requests += 1
        client = self._connect()
        if self._link is None and not self._public_only:
            opened = await open_management_link(client, self.request_timeout)
            if opened is None:
                log.debug("this azure-eventhub has no reusable management client; using the public API")
                self._public_only = True
            else:
                self._link, self._auth = opened
        if self._link is None:
            raw = await asyncio.wait_for(client.get_partition_properties(partition), self.request_timeout)
            moment = raw.get("last_enqueued_time_utc")
            return PartitionInfo(
                partition,
                int(raw["beginning_sequence_number"]),
                int(raw["last_enqueued_sequence_number"]),
                bool(raw["is_empty"]),
                moment.timestamp() if moment is not None else None,
                numeric_offset(raw.get("last_enqueued_offset")),
            )
        beginning, last, empty, enqueued, offset = await read_partition_properties(
            client, self._link, self._auth, self.target.hub, partition, self.request_timeout
        )
        return PartitionInfo(partition, beginning, last, empty, None if empty else enqueued, offset)

    async def enqueued_time(self, partition: str, sequence_number: int) -> float | None:
        """When event `sequence_number` of `partition` was enqueued (Unix seconds); None when it cannot be
        read within the timeout (`event_at`)."""
        found = await self.event_at(partition, sequence_number)
        return None if found is None else found.enqueued_time

    async def event_at(self, partition: str, position: int | datetime) -> EventAt | None:
        """The first event of `partition` at sequence number `position`, or enqueued at or after the time
        `position`, read with a receiver of its own (no owner level: Event Hubs refuses it while a
        consumer's receiver reads the partition, and a consumer that comes later takes over at once); None
        when there is none, or it cannot be read within the timeout."""
        from azure.eventhub.aio import EventHubConsumerClient

        self.requests += 1
        client: Any = sdk_client(
            EventHubConsumerClient, self.target, consumer_group=self.target.consumer_group, retry_total=0
        )
        found: asyncio.Future[EventAt | None] = asyncio.get_running_loop().create_future()

        async def on_event(_context: Any, event: Any) -> None:
            if not found.done() and event is not None:
                moment = event.enqueued_time
                found.set_result(
                    EventAt(
                        int(event.sequence_number),
                        str(event.offset),
                        None if moment is None else moment.timestamp(),
                    )
                )

        async def on_error(_context: Any, error: Exception) -> None:
            if not found.done():
                found.set_result(None)
                log.debug("partition %s: reading one event failed: %s", partition, type(error).__name__)

        receiving = asyncio.ensure_future(
            client.receive(
                on_event,
                partition_id=partition,
                starting_position=position,
                starting_position_inclusive=True,
                prefetch=1,
                on_error=on_error,
            )
        )
        try:
            return await asyncio.wait_for(found, self.request_timeout)
        except TimeoutError:
            return None
        finally:
            try:
                await asyncio.wait_for(client.close(), self.request_timeout)
            except Exception as exc:  # closing a refused link may fail; it is gone either way
                log.debug("closing the reader of partition %s: %s", partition, type(exc).__name__)
            receiving.cancel()

    async def _reset(self) -> None:
        link, client = self._link, self._client
        self._link = self._auth = self._client = None
        for closing in (link, client):
            if closing is None:
                continue
            try:
                await asyncio.wait_for(
                    closing.close_async() if closing is link else closing.close(), self.request_timeout
                )
            except Exception as exc:  # closing a broken connection may fail too; nothing to do about it
                log.debug("closing the Event Hubs client: %s", type(exc).__name__)


class EventHubsManagement:
    """Partition ids and last enqueued events, for the agent (one client, reused)."""

    def __init__(self, target: EventHubsTarget, *, retry_total: int = 3) -> None:
        self.target = target
        self._retry_total = retry_total
        self._client: Any = None

    def _connect(self) -> Any:
        if self._client is None:
            from azure.eventhub import EventHubConsumerClient

            self._client = sdk_client(
                EventHubConsumerClient,
                self.target,
                consumer_group=self.target.consumer_group,
                retry_total=self._retry_total,
            )
        return self._client

    def probe(self) -> list[str]:
        """Check the hub at start-up: reachable, credentials accepted, hub exists. `UserError` if not."""
        try:
            return self.partition_ids()
        except UserError:
            raise
        except Exception as exc:
            raise UserError(describe_error(exc, self.target)) from None

    def partition_ids(self) -> list[str]:
        ids = [str(p) for p in self._connect().get_partition_ids()]
        return sorted(ids, key=partition_sort_key)

    def last_enqueued(self, partition: str) -> Checkpoint | None:
        """The partition's last event as a checkpoint (where `latest` starts); None when it is empty."""
        properties = self._connect().get_partition_properties(partition)
        if properties.get("is_empty"):
            return None
        return Checkpoint(
            offset=str(properties["last_enqueued_offset"]),
            sequence_number=int(properties["last_enqueued_sequence_number"]),
        )

    def start_at(self, partition: str, sequence_number: int) -> Checkpoint:
        """The checkpoint that has a reader begin at event `sequence_number` (a partition's own start
        position): the event before it, its offset read from the hub as `hubshift checkpoints reset` reads
        it; nothing consumed when there is none before it or retention removed it; the partition's last event
        when `sequence_number` is not enqueued yet (the reader begins at the next event; a warning says so).
        `UserError` when the event before cannot be read now (the claim is tried again)."""
        properties = self._connect().get_partition_properties(partition)
        last = int(properties["last_enqueued_sequence_number"])
        if sequence_number > last + 1:
            log.warning(
                "partition %s: its start position, sequence number %d, is not enqueued yet (the last is %d): "
                "it starts at its end",
                partition,
                sequence_number,
                last,
            )
            return EARLIEST if last < 0 else Checkpoint(str(properties["last_enqueued_offset"]), last)
        if properties.get("is_empty") or sequence_number <= int(properties["beginning_sequence_number"]):
            return EARLIEST
        found = asyncio.run(_event_at(self.target, partition, sequence_number - 1))
        if found is None or found.sequence_number != sequence_number - 1:
            raise UserError(
                f"partition {partition}: event {sequence_number - 1} could not be read (its offset is where "
                f"the partition's start position, sequence number {sequence_number}, begins)"
            )
        return Checkpoint(found.offset, found.sequence_number)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None


async def _event_at(target: EventHubsTarget, partition: str, sequence_number: int) -> EventAt | None:
    probe = EventHubsProbe(target)
    try:
        return await probe.event_at(partition, sequence_number)
    finally:
        await probe.close()


async def read_partitions(target: EventHubsTarget) -> dict[str, PartitionInfo]:
    """The hub's partitions, read once with a probe of their own (the commands' one read); a refusal is
    one line for the person who ran the command."""
    probe = EventHubsProbe(target)
    try:
        return await probe.partitions()
    except ProbeError as exc:
        raise UserError(str(exc)) from None
    finally:
        await probe.close()
