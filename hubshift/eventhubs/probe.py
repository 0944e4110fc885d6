"""What the control loop asks Event Hubs each polling interval: the partition ids and, per partition, the
last enqueued sequence number (for the backlog). One client per PartitionedConsumer, kept open.

The SDK's public `get_partition_properties` opens a new management session, two links and a CBS token
for every call (about 0.45 s each on the emulator; 1,024 partitions would take minutes). So the probe
keeps one management link open on the client's connection and sends the same READ requests on it, one
after another (about 1 ms each; concurrent requests on one link are slower). That uses the SDK's own
transport objects (azure-eventhub 5.15.x internals, pinned in pyproject); if they are not there, the
public call is used instead. A connection string never appears in an error or a log line.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from hubshift.eventhubs.target import EventHubsTarget, describe_error
from hubshift.ownership.model import partition_sort_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as the service reports it now."""

    partition: str
    beginning: int  # the first sequence number still retained
    last_enqueued: int  # -1 when nothing was ever enqueued
    empty: bool


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

            self._client = EventHubConsumerClient.from_connection_string(
                self.target.connection_string,
                consumer_group=self.target.consumer_group,
                eventhub_name=self.target.hub,
                retry_total=1,
            )
        return self._client

    async def _partition_ids(self) -> list[str]:
        client = self._connect()
        self.requests += 1
        ids = await asyncio.wait_for(client.get_partition_ids(), self.request_timeout)
        return sorted((str(p) for p in ids), key=partition_sort_key)

    async def _properties(self, partition: str) -> PartitionInfo:
        self.requests += 1
        link = await self._management_link()
        if link is None:
            client = self._connect()
            raw = await asyncio.wait_for(client.get_partition_properties(partition), self.request_timeout)
            return PartitionInfo(
                partition,
                int(raw["beginning_sequence_number"]),
                int(raw["last_enqueued_sequence_number"]),
                bool(raw["is_empty"]),
            )
        from azure.eventhub._constants import (
            MGMT_PARTITION_OPERATION,
            MGMT_STATUS_CODE,
            MGMT_STATUS_DESC,
            READ_OPERATION,
        )

        client = self._client
        transport = client._amqp_transport
        message = transport.build_message(
            application_properties={"name": self.target.hub, "partition": partition}
        )
        message.application_properties["security_token"] = await transport.get_updated_token_async(self._auth)
        status, description, response = await asyncio.wait_for(
            transport.mgmt_client_request_async(
                link,
                message,
                operation=READ_OPERATION,
                operation_type=MGMT_PARTITION_OPERATION,
                status_code_field=MGMT_STATUS_CODE,
                description_fields=MGMT_STATUS_DESC,
            ),
            self.request_timeout,
        )
        if int(status) >= 400:
            text = description.decode() if isinstance(description, bytes) else str(description)
            raise RuntimeError(f"partition {partition}: {int(status)} {text}")
        value = response.value
        return PartitionInfo(
            partition,
            int(value[b"begin_sequence_number"]),
            int(value[b"last_enqueued_sequence_number"]),
            bool(value[b"is_partition_empty"]),
        )

    async def _management_link(self) -> Any:
        """The open management client, or None when this SDK version does not offer one."""
        if self._link is not None:
            return self._link
        client = self._connect()
        try:
            transport = client._amqp_transport
            auth = await client._create_auth_async()
            link = transport.create_mgmt_client(client._address, mgmt_auth=auth, config=client._config)
            connection = await client._conn_manager_async.get_connection(
                endpoint=client._address.hostname, auth=auth
            )
        except AttributeError:
            log.debug("this azure-eventhub has no reusable management client; using the public API")
            return None
        await asyncio.wait_for(link.open_async(connection=connection), self.request_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout
        while not await link.client_ready_async():
            if loop.time() > deadline:
                raise TimeoutError("the management link did not open")
            await asyncio.sleep(0.01)
        self._link, self._auth = link, auth
        return link

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
