"""`$management` READ requests: the hub's and each partition's runtime information, with exactly the
keys and AMQP types the SDK's `get_eventhub_properties` / `get_partition_properties` parse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hubshift.emulator.broker import Broker
from hubshift.emulator.cbs import Authorizer
from hubshift.emulator.codec import Array, Int, Long, Timestamp
from hubshift.emulator.messages import RequestMessage

EVENTHUB_TYPE = "com.microsoft:eventhub"
PARTITION_TYPE = "com.microsoft:partition"


@dataclass(frozen=True, slots=True)
class ManagementReply:
    status_code: int
    description: str
    body: Any = None


def handle_management_request(
    request: RequestMessage, broker: Broker, authorizer: Authorizer, namespace_host: str
) -> ManagementReply:
    properties = request.application_properties
    operation = properties.get("operation")
    entity_type = properties.get("type")
    name = properties.get("name")
    if operation != "READ":
        return ManagementReply(400, f"The operation '{operation}' is not supported; only READ is.")
    if not isinstance(name, str):
        return ManagementReply(400, "The request has no entity 'name'.")
    audience = f"sb://{namespace_host}/{name}"
    if authorizer.enforcing:
        verdict = authorizer.verify(properties.get("security_token"), audience)
        if not verdict.accepted:
            return ManagementReply(verdict.status_code, verdict.description)
        if not verdict.rights:
            return ManagementReply(
                401,
                "Unauthorized access. 'Listen' or 'Send' claim(s) are required to perform this operation. "
                f"Resource: '{audience}'.",
            )
    hub = broker.find_hub(name)
    if hub is None:
        return ManagementReply(404, f"The messaging entity '{audience}' could not be found.")
    if entity_type == EVENTHUB_TYPE:
        return ManagementReply(
            200,
            "OK",
            {
                "name": hub.name,
                "type": EVENTHUB_TYPE,
                "created_at": Timestamp(hub.created_at_ms),
                "partition_count": Int(len(hub.partitions)),
                "partition_ids": Array("string", tuple(hub.partition_ids)),
            },
        )
    if entity_type == PARTITION_TYPE:
        partition_id = properties.get("partition")
        log = hub.partition(partition_id) if isinstance(partition_id, str) else None
        if log is None:
            return ManagementReply(
                400,
                f"The specified partition '{partition_id}' is invalid for an EventHub partition sender or "
                f"receiver. It should be between 0 and {len(hub.partitions) - 1}.",
            )
        state = log.state()
        return ManagementReply(
            200,
            "OK",
            {
                "name": hub.name,
                "type": PARTITION_TYPE,
                "partition": log.partition_id,
                "begin_sequence_number": Long(state.beginning_sequence_number),
                "last_enqueued_sequence_number": Long(state.last_enqueued_sequence_number),
                "last_enqueued_offset": state.last_enqueued_offset,
                "last_enqueued_time_utc": Timestamp(state.last_enqueued_time_ms),
                "is_partition_empty": state.is_empty,
            },
        )
    return ManagementReply(400, f"The entity type '{entity_type}' is not supported.")
