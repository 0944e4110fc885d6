"""The `PartitionedConsumer` status: what the control loop reports, typed once.

The CRD's status schema is generated from these models (`hubshift.operator.kubernetes.crd`), so a field the
control loop writes is never pruned by the API server. Build one `PartitionedConsumerStatus`, then
`runtime.publish_status(status.to_body())`. No field here may ever carry a secret.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from hubshift.spec import Model

# Pending: children created, no control-loop cycle yet. Invalid: the spec failed the operator's validation.
Phase = Literal["Pending", "Ready", "Holddown", "Rebalancing", "Invalid"]
PHASES: tuple[Phase, ...] = ("Pending", "Ready", "Holddown", "Rebalancing", "Invalid")

# Condition types, KEDA's plus ours.
READY = "Ready"
ACTIVE = "Active"
FALLBACK = "Fallback"
PAUSED = "Paused"
REBALANCING = "Rebalancing"


class Condition(Model):
    """A Kubernetes-style condition (`kubectl wait --for=condition=Ready pcon/NAME`)."""

    type: str = Field(min_length=1, description="Ready, Active, Fallback, Paused or Rebalancing.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", description="One CamelCase word.")
    message: str = Field(default="", description="What a person needs to know.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(default=None, ge=0)


class ConsumerAssignment(Model):
    """The partitions one consumer is assigned in the published assignment."""

    consumer: str = Field(min_length=1, description="Consumer identity (pod name).")
    partitions: list[str] = Field(default_factory=list, description="Event Hubs partition ids.")


class PendingHandoff(Model):
    """A partition moving between consumers, not yet taken by its new owner."""

    partition: str
    from_owner: str | None = Field(default=None, description="The consumer releasing it (none if orphaned).")
    to_owner: str = Field(min_length=1, description="The consumer taking it.")
    since: datetime | None = Field(default=None, description="When the move was published.")


class PartitionedConsumerStatus(Model):
    phase: Phase = Field(default="Pending", description="Pending, Ready, Holddown, Rebalancing or Invalid.")
    message: str | None = Field(default=None, description="Why the phase is what it is, for people.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status describes."
    )
    conditions: list[Condition] = Field(default_factory=list)
    desired_replicas: int | None = Field(default=None, ge=0, description="Replicas the control loop wants.")
    current_replicas: int | None = Field(default=None, ge=0, description="The StatefulSet's replicas.")
    ready_replicas: int | None = Field(default=None, ge=0, description="Consumer pods passing readiness.")
    partition_count: int | None = Field(default=None, ge=0, description="Partitions of the Event Hub.")
    total_backlog: int | None = Field(
        default=None, ge=0, description="Unprocessed events over all partitions."
    )
    assignment_generation: int | None = Field(
        default=None, ge=0, description="Generation of the published assignment record."
    )
    assignment: list[ConsumerAssignment] = Field(
        default_factory=list, description="The published assignment, one entry per consumer."
    )
    holddown_until: datetime | None = Field(
        default=None, description="While in Holddown: when the new assignment will be published."
    )
    pending_handoffs: list[PendingHandoff] = Field(
        default_factory=list, description="Moves published but not yet done."
    )
    last_scale_time: datetime | None = Field(default=None, description="When replicas last changed.")
    last_active_time: datetime | None = Field(
        default=None, description="When the backlog was last above the activation threshold."
    )

    def to_body(self) -> dict[str, Any]:
        """The status as the API server stores it (camelCase, RFC 3339 times, unset fields left out)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


def carry_transition_time(
    previous: object, condition: Condition, now: datetime, generation: int | None = None
) -> Condition:
    """`condition` stamped with when its status last changed: kept from `previous` (the CR's current
    `status.conditions`, as stored) when the status is the same, else `now`."""
    since = now
    for old in previous if isinstance(previous, list) else []:
        if (
            isinstance(old, dict)
            and old.get("type") == condition.type
            and old.get("status") == condition.status
        ):
            stamp = old.get("lastTransitionTime")
            if isinstance(stamp, str):
                since = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return condition.model_copy(update={"last_transition_time": since, "observed_generation": generation})
