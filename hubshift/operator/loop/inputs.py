"""What a cycle is given: what the PartitionedConsumer says this cycle (`CycleInputs`), and the consumers as
the runtime reports them with the revision new ones are made from (`ConsumersSeen`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hubshift.operator.runtime import ConsumerInstance
from hubshift.operator.status import Condition
from hubshift.ownership.timing import epoch_seconds


@dataclass(frozen=True)
class CycleInputs:
    """What the PartitionedConsumer itself says this cycle (its metadata and previous status)."""

    annotations: Mapping[str, str] = field(default_factory=dict)
    created_at: float | None = None
    spec_generation: int | None = None  # the resource's metadata.generation
    previous_conditions: Sequence[Mapping[str, Any]] = ()
    # What the runtime says of the spec where it runs (Kubernetes: whether the output outlives a pod).
    conditions: Sequence[Condition] = ()
    previous_rollout: Mapping[str, Any] | None = None  # the status' `rollout` block as last written

    @classmethod
    def from_body(cls, body: Mapping[str, Any], conditions: Sequence[Condition] = ()) -> CycleInputs:
        metadata = body.get("metadata") or {}
        created = metadata.get("creationTimestamp")
        status = body.get("status") or {}
        return cls(
            annotations=dict(metadata.get("annotations") or {}),
            created_at=epoch_seconds(created),
            spec_generation=metadata.get("generation"),
            previous_conditions=list(status.get("conditions") or []),
            conditions=tuple(conditions),
            previous_rollout=status.get("rollout") if isinstance(status.get("rollout"), Mapping) else None,
        )


@dataclass(frozen=True)
class ConsumersSeen:
    """The consumers as the runtime reports them this cycle, the replica count asked of it, the revision new
    ones are made from, and what the resource says (the rollout's pause, its last status)."""

    instances: Sequence[ConsumerInstance]
    current_replicas: int
    revision: str | None
    inputs: CycleInputs
