"""The emulator's namespace: hubs, their partitions and consumer groups, routing of published events,
the receivers attached to each partition (owner level / epoch rules), retention and persistence.

Everything here runs on the server's event loop; nothing blocks except the optional SQLite write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from hubshift.emulator.messages import Publication
from hubshift.emulator.partition_log import PartitionLog
from hubshift.emulator.persistence import EventStore
from hubshift.emulator.routing import partition_for_key

LOG = logging.getLogger(__name__)

DEFAULT_CONSUMER_GROUP = "$Default"
MAX_RECEIVERS_WITHOUT_OWNER_LEVEL = 5
MAX_PARTITIONS = 1024

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class HubSpec:
    name: str
    partition_count: int
    consumer_groups: tuple[str, ...] = ()


class Receiver(Protocol):
    """A consumer link as the broker sees it."""

    @property
    def owner_level(self) -> int | None: ...

    def steal(self, condition: str, description: str) -> None:
        """Detach the link from the partition with this error (it lost the partition)."""


class ReceiverRefused(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


class EmulatedHub:
    """One Event Hub the emulator serves: its partition logs, its consumer groups, and the partition each
    event goes to."""

    def __init__(
        self, spec: HubSpec, created_at_ms: int, partition_max_bytes: int, *, geo_offsets: bool = False
    ) -> None:
        self.name = spec.name
        self.created_at_ms = created_at_ms
        self.partition_max_bytes = partition_max_bytes
        self.geo_offsets = geo_offsets
        self.partitions = [
            PartitionLog(str(index), partition_max_bytes, geo=geo_offsets)
            for index in range(spec.partition_count)
        ]
        self.consumer_groups: dict[str, str] = {DEFAULT_CONSUMER_GROUP.lower(): DEFAULT_CONSUMER_GROUP}
        for group in spec.consumer_groups:
            self.consumer_groups.setdefault(group.lower(), group)
        self._round_robin = -1

    @property
    def partition_ids(self) -> list[str]:
        return [log.partition_id for log in self.partitions]

    def partition(self, partition_id: str) -> PartitionLog | None:
        if not partition_id.isdigit():
            return None
        index = int(partition_id)
        if index >= len(self.partitions) or str(index) != partition_id:
            return None
        return self.partitions[index]

    def grow(self, count: int) -> list[PartitionLog]:
        """Partitions up to `count` in all (never fewer: Event Hubs premium and dedicated tiers only add
        partitions); the new ones. Keys hash over the new count from now on, as on the service."""
        added = [
            PartitionLog(str(index), self.partition_max_bytes, geo=self.geo_offsets)
            for index in range(len(self.partitions), count)
        ]
        self.partitions.extend(added)
        return added

    def has_consumer_group(self, name: str) -> bool:
        return name.lower() in self.consumer_groups

    def route(self, partition_key: str | None) -> PartitionLog:
        if partition_key is not None:
            return self.partitions[partition_for_key(partition_key, len(self.partitions))]
        self._round_robin = (self._round_robin + 1) % len(self.partitions)
        return self.partitions[self._round_robin]


class Broker:
    def __init__(
        self,
        hubs: Iterable[HubSpec],
        *,
        clock: Clock,
        retention_seconds: float,
        partition_max_bytes: int,
        store: EventStore | None = None,
        geo_offsets: bool = False,
    ) -> None:
        self.clock = clock
        self.geo_offsets = geo_offsets
        self.retention_ms = int(retention_seconds * 1000)
        self.store = store
        self.hubs: dict[str, EmulatedHub] = {}
        self._receivers: dict[tuple[str, str, str], list[Receiver]] = {}
        now_ms = self.now_ms()
        for spec in hubs:
            created_at = store.hub_created_at(spec.name, now_ms) if store else now_ms
            hub = EmulatedHub(spec, created_at, partition_max_bytes, geo_offsets=geo_offsets)
            self.hubs[spec.name.lower()] = hub
            self._restore(hub, hub.partitions)
        self.partition_max_bytes = partition_max_bytes
        self.expire()

    def _restore(self, hub: EmulatedHub, logs: Iterable[PartitionLog]) -> None:
        if self.store is None:
            return
        for log in logs:
            saved = self.store.load(hub.name, log.partition_id)
            log.restore(saved.events, saved.next_sequence, saved.next_offset, saved.last_enqueued_ms)
            self.store.discard_before(hub.name, log.partition_id, log.beginning_sequence_number)

    def reconfigure(self, hubs: Iterable[HubSpec]) -> list[str]:
        """Apply a changed configuration while serving: new hubs appear, hubs with more partitions grow
        (fewer is refused, as on the service); what changed, for the log."""
        changes = []
        for spec in hubs:
            hub = self.find_hub(spec.name)
            if hub is None:
                created_at = (
                    self.store.hub_created_at(spec.name, self.now_ms()) if self.store else self.now_ms()
                )
                hub = EmulatedHub(spec, created_at, self.partition_max_bytes, geo_offsets=self.geo_offsets)
                self.hubs[spec.name.lower()] = hub
                self._restore(hub, hub.partitions)
                changes.append(f"hub {spec.name} created with {spec.partition_count} partitions")
                continue
            for group in spec.consumer_groups:
                hub.consumer_groups.setdefault(group.lower(), group)
            before = len(hub.partitions)
            if spec.partition_count < before:
                changes.append(
                    f"hub {hub.name}: {spec.partition_count} partitions refused (it has {before}; "
                    "partitions can only be added)"
                )
            elif spec.partition_count > before:
                self._restore(hub, hub.grow(spec.partition_count))
                changes.append(f"hub {hub.name}: {before} -> {spec.partition_count} partitions")
        return changes

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def find_hub(self, name: str) -> EmulatedHub | None:
        return self.hubs.get(name.lower())

    # --- publishing ---------------------------------------------------------------------------------

    def publish(
        self, hub: EmulatedHub, partition: PartitionLog | None, publication: Publication
    ) -> PartitionLog:
        """Enqueue a delivery's events in one partition (a batch is never split)."""
        log = partition or hub.route(publication.partition_key)
        if not publication.events:
            return log
        beginning = log.beginning_sequence_number
        first = log.append(publication.events, self.now_ms(), publication.envelope_key_entry)
        if self.store:
            self.store.append(
                hub.name,
                log.partition_id,
                log.stored_events(first),
                log.next_sequence_number,
                log.next_offset,
                log.last_enqueued_ms,
            )
            if log.beginning_sequence_number != beginning:
                self.store.discard_before(hub.name, log.partition_id, log.beginning_sequence_number)
        return log

    # --- receivers ----------------------------------------------------------------------------------

    def attach_receiver(
        self, hub: EmulatedHub, consumer_group: str, partition_id: str, receiver: Receiver
    ) -> None:
        """Admit a receiver under the service's owner-level rules, or raise ReceiverRefused.

        A receiver with an owner level at least as high as every other one takes the partition for its
        consumer group: the others are detached with `amqp:link:stolen`. A lower one is refused, and so is
        a receiver without owner level while one with owner level is attached. Without owner level, at
        most five receivers share a partition in a consumer group.
        """
        key = (hub.name.lower(), consumer_group.lower(), partition_id)
        attached = self._receivers.setdefault(key, [])
        level = receiver.owner_level
        exclusive = [other for other in attached if other.owner_level is not None]
        if level is None:
            if exclusive:
                raise ReceiverRefused(
                    "amqp:link:stolen",
                    "At least one receiver for the endpoint is created with epoch of "
                    f"'{exclusive[0].owner_level}', and so non-epoch receiver is not allowed. Either "
                    "reconnect with a higher epoch, or make sure all epoch receivers are closed or "
                    "disconnected.",
                )
            if len(attached) >= MAX_RECEIVERS_WITHOUT_OWNER_LEVEL:
                raise ReceiverRefused(
                    "amqp:resource-limit-exceeded",
                    "Exceeded the maximum number of allowed receivers per partition in a consumer group "
                    f"which is {MAX_RECEIVERS_WITHOUT_OWNER_LEVEL}. Partition: {partition_id}, consumer "
                    f"group: {consumer_group}.",
                )
            attached.append(receiver)
            return
        highest = max((other.owner_level or 0 for other in exclusive), default=None)
        if highest is not None and level < highest:
            raise ReceiverRefused(
                "amqp:link:stolen",
                f"Receiver 'nil' with a higher epoch of '{highest}' already exists. Receiver 'nil' with "
                f"epoch '{level}' cannot be created. Make sure you are creating receiver with increasing "
                "epoch value to ensure connectivity, or ensure all old epoch receivers are closed or "
                "disconnected.",
            )
        displaced = list(attached)
        attached.clear()
        attached.append(receiver)
        for other in displaced:
            other_level = "NULL" if other.owner_level is None else other.owner_level
            other.steal(
                "amqp:link:stolen",
                f"New receiver 'nil' with higher epoch of '{level}' is created hence current receiver "
                f"'nil' with epoch '{other_level}' is getting disconnected. If you are recreating the "
                "receiver, make sure a higher epoch is used.",
            )

    def detach_receiver(
        self, hub: EmulatedHub, consumer_group: str, partition_id: str, receiver: Receiver
    ) -> None:
        key = (hub.name.lower(), consumer_group.lower(), partition_id)
        attached = self._receivers.get(key)
        if attached is None:
            return
        if receiver in attached:
            attached.remove(receiver)
        if not attached:
            del self._receivers[key]

    # --- retention ----------------------------------------------------------------------------------

    def expire(self) -> int:
        """Drop events older than the retention period from every partition; returns how many went."""
        cutoff = self.now_ms() - self.retention_ms
        dropped = 0
        for hub in self.hubs.values():
            for log in hub.partitions:
                count = log.expire(cutoff)
                if count:
                    dropped += count
                    if self.store:
                        self.store.discard_before(hub.name, log.partition_id, log.beginning_sequence_number)
        return dropped

    def close(self) -> None:
        if self.store:
            self.store.close()
            self.store = None
