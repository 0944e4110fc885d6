"""What one step of the rebalance machine hands back: the next state and the actions the control loop takes,
in order (a publication is written to the record before anything else)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from hubshift.operator.rebalance.state import RebalanceState
from hubshift.ownership.model import ChangeKind
from hubshift.ownership.planner import Move


class PublishReason(enum.StrEnum):
    """Why a generation is published; the value is its metric label."""

    PARTITIONS_CHANGED = "partitions-changed"  # the hub's partition set changed (or the first cycle)
    HOLDDOWN_OVER = "holddown-over"  # the consumer set changed unplanned and the holddown ran out
    ORPHANS = "orphans"  # partitions of consumers gone for good move at once
    DRAIN = (
        "drain"  # planned scale-in: partitions of the consumers leaving move before the StatefulSet shrinks
    )
    PLANNED = "planned"  # planned scale-out or cold start: the plan for the new consumer set, at once
    JOINED = "joined"  # consumers of the plan are ready: the partitions planned for them are handed over
    JOINERS_LATE = "joiners-late"  # planned consumers not ready by `planned_until`: their share is re-planned
    STOPPING = "stopping"  # consumers stopping (pods being deleted): their partitions move to the others
    ROLLOUT = "rollout"  # a consumer a rollout replaces next: its partitions move to the consumers planned
    RETURNING = "returning"  # consumers that stopped come back: their share is planned for them
    LOAD = "load"  # loadAware: a consumer carries more than its tolerance over the mean load


class EventReason(enum.StrEnum):
    """The `reason` of the Kubernetes Events the machine records (one CamelCase word each)."""

    REBALANCING = "Rebalancing"
    REBALANCED = "Rebalanced"
    HOLDDOWN = "Holddown"
    HOLDDOWN_CANCELLED = "HolddownCancelled"
    HANDOFF_FORCED = "HandoffForced"
    SCALING_OUT = "ScalingOut"
    SCALING_IN = "ScalingIn"
    PLANNED = "Planned"
    JOINERS_LATE = "JoinersLate"


@dataclass(frozen=True)
class PublishAssignment:
    """Write this generation to the assignment record (compare-and-swap) before anything else."""

    generation: int
    assignment: Mapping[str, str | None]
    forced: frozenset[str]
    moves: tuple[Move, ...]
    reason: PublishReason
    detail: str  # for people: which consumers, which change
    planned: Mapping[str, str] = field(default_factory=dict)  # partitions kept for consumers not ready yet
    kind: ChangeKind = ChangeKind.IMMEDIATE


@dataclass(frozen=True)
class SetReplicas:
    replicas: int
    reason: str


@dataclass(frozen=True)
class BreakLeases:
    """The handoff time of `generation` is over: the new owners of `partitions` may break their leases."""

    generation: int
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class RecordEvent:
    """A Kubernetes Event on the PartitionedConsumer."""

    reason: EventReason
    message: str
    warning: bool = False


Action = PublishAssignment | SetReplicas | BreakLeases | RecordEvent


@dataclass(frozen=True)
class Step:
    state: RebalanceState
    actions: tuple[Action, ...]

    @property
    def published(self) -> PublishAssignment | None:
        return next((a for a in self.actions if isinstance(a, PublishAssignment)), None)
