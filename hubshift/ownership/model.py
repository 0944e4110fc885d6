"""The ownership domain as plain frozen data: what the consumer, the operator and the decisions share."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseState


@dataclass(frozen=True)
class Checkpoint:
    """A partition's position: the last event consumed (the SDK's `offset` and `sequencenumber`).

    `-1`/`-1` means nothing consumed yet; then `start`, when set, is the enqueued time to begin at
    (hubshift's own metadata `hubshiftstart`; the SDK and KEDA see "from the beginning").
    """

    offset: str
    sequence_number: int
    start: datetime | None = None

    @property
    def consumed_nothing(self) -> bool:
        return self.sequence_number < 0


EARLIEST = Checkpoint(offset="-1", sequence_number=-1)


@dataclass(frozen=True)
class PartitionLease:
    """Proof that `consumer` owns `partition`: what a claim returns and what a checkpoint write needs.

    `owner_level` is the Event Hubs epoch to open the receiver with; `checkpoint` is where to resume.
    """

    scope: Scope
    partition: str
    consumer: str
    lease_id: str
    owner_level: int
    checkpoint: Checkpoint


@dataclass(frozen=True)
class Member:
    """A consumer that registered in the scope; alive while it holds its membership lease."""

    consumer: str
    alive: bool
    last_modified: datetime


@dataclass(frozen=True)
class PartitionOwnership:
    """One row of the ownership table: a partition that has a checkpoint blob."""

    partition: str
    owner: str | None  # who holds the partition lease now; None when it is free
    owner_alive: bool  # the owner holds its membership lease
    lease_state: LeaseState
    owner_level: int
    last_modified: datetime
    checkpoint: Checkpoint
    last_owner: str | None = None  # the last consumer that claimed it, even after a release
    # when the event after `checkpoint` was enqueued, as its owner wrote it (None: not known)
    next_enqueued: datetime | None = None

    @property
    def free(self) -> bool:
        """Claimable without breaking anything (never leased, released, broken or expired)."""
        return self.lease_state is not LeaseState.LEASED

    @property
    def orphaned(self) -> bool:
        """Leased by a consumer that is no longer alive: may be broken and claimed at once."""
        return self.lease_state is LeaseState.LEASED and not self.owner_alive


class Phase(enum.StrEnum):
    READY = "Ready"
    HOLDDOWN = "Holddown"
    REBALANCING = "Rebalancing"


class ChangeKind(enum.StrEnum):
    """Which kind of change of the consumer set a generation carries out (docs/decisions.md)."""

    PLANNED = "planned"  # decided by the operator (scale-out, scale-in, cold start): published at once
    HOLDDOWN = "holddown"  # nobody planned it (a pod gone, a pod back): published when the holddown ends
    IMMEDIATE = "immediate"  # the partition set changed, or a consumer is gone for good: published at once


class ClaimReason(enum.StrEnum):
    """Why a consumer claims a partition."""

    FREE = "free"  # nobody holds its lease (never claimed, released, broken or expired)
    MINE = "mine"  # its lease is still ours (a restart with the same identity)
    ORPHANED = "orphaned"  # its owner is no longer alive
    OWNER_GONE = "owner gone"  # the operator saw its owner go (the assignment's `forced`)
    HANDOFF_DEADLINE = "handoff deadline passed"  # its owner did not release it in time
    STEAL = "steal"  # fallback balancing: from the biggest owner

    @property
    def acquired_how(self) -> str:
        """How the lease is acquired: released, own, expired or broken (a consumer metric's label)."""
        return {ClaimReason.FREE: "released", ClaimReason.MINE: "own", ClaimReason.ORPHANED: "expired"}.get(
            self, "broken"
        )


@dataclass(frozen=True)
class Claim:
    """A partition a consumer is to claim, by `force` (breaking the lease of `owner`) or not."""

    partition: str
    force: bool
    reason: ClaimReason
    owner: str | None = None  # who holds its lease now, when it is taken from someone

    def describe(self) -> str:
        """For a log line: the reason, and from whom."""
        return self.reason.value if self.owner is None else f"{self.reason.value} from {self.owner}"


@dataclass(frozen=True)
class Driver:
    """The resource whose control loop publishes a scope's assignment: its unique id (a Kubernetes
    resource's `metadata.uid`; `local:<namespace>/<name>` for `hubshift run`) and, for messages, its name
    (`namespace/name`)."""

    uid: str
    resource: str


@dataclass(frozen=True)
class Assignment:
    """The operator's decision, published with compare-and-swap: each partition's assignee.

    `partitions` maps partition id -> its assignee, the consumer that reads it (a partition without one is
    left out). `partition_ids` are every partition the decision covers, `consumers` the consumers it was
    planned for (standbys too), `forced` the partitions whose assignee may break the old owner's lease at
    once (that owner is gone). `updated_at` is when this generation was published: an assignee may break
    the old owner's lease `max_handoff_seconds` after it. `extra` keeps fields this version does not know,
    so a round trip never drops them.

    A planned change (docs/decisions.md, "Planned changes") names consumers that are not ready yet:
    `planned` maps such a partition to its planned owner while `partitions` keeps its current assignee (or
    leaves it out when it has none); the operator moves the partition into `partitions` for its planned
    owner in the generation it publishes once that consumer is ready. A partition left out of `partitions`
    its planned owner may claim before that, while its lease is free (a cold start); a consumer that does
    not know `planned` simply waits for that generation. `planned_until`: partitions of `planned` that
    nobody reads wait for their planned owner until then. `change` is the kind of change this generation
    carries out, while it runs. `returning`: consumers that stopped gracefully (their pods deleted) and that
    the pool brings back; the operator plans their share again once their old pods are gone. `driver`: the
    resource whose control loop publishes it (one per scope).
    """

    generation: int
    partitions: Mapping[str, str]
    phase: Phase
    replicas: int
    updated_at: datetime
    holddown_until: datetime | None = None
    max_handoff_seconds: float | None = None
    partition_ids: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()
    forced: frozenset[str] = frozenset()
    planned: Mapping[str, str] = field(default_factory=dict)
    planned_until: datetime | None = None
    change: ChangeKind | None = None
    returning: tuple[str, ...] = ()
    driver: Driver | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def assignee_of(self, partition: str) -> str | None:
        return self.partitions.get(partition)

    @property
    def covered(self) -> tuple[str, ...]:
        """Every partition this generation decides about: `partition_ids`, or (a record written without
        them) the assigned ones."""
        return self.partition_ids or tuple(sorted(self.partitions, key=partition_sort_key))

    def partitions_of(self, consumer: str) -> list[str]:
        return sorted((p for p, c in self.partitions.items() if c == consumer), key=partition_sort_key)

    def planned_for(self, consumer: str) -> list[str]:
        """The partitions planned for `consumer` that are not in `partitions` for it yet."""
        return sorted((p for p, c in self.planned.items() if c == consumer), key=partition_sort_key)


@dataclass(frozen=True)
class StoredAssignment:
    """An assignment as stored, with the ETag to compare-and-swap against."""

    assignment: Assignment
    etag: str


@dataclass(frozen=True)
class OwnershipSnapshot:
    """Everything one listing of the scope says: partitions, members and the assignment record."""

    scope: Scope
    partitions: tuple[PartitionOwnership, ...]
    members: tuple[Member, ...]
    assignment: Assignment | None
    assignment_etag: str | None

    def partition(self, partition: str) -> PartitionOwnership | None:
        return next((p for p in self.partitions if p.partition == partition), None)

    @property
    def live_members(self) -> list[str]:
        return sorted(m.consumer for m in self.members if m.alive)

    @property
    def owners(self) -> dict[str, str]:
        """partition -> its lease owner now, for leased partitions only."""
        return {p.partition: p.owner for p in self.partitions if p.owner is not None}


def partition_sort_key(partition: str) -> tuple[int, int, str]:
    """Numeric partition ids in numeric order ("2" before "10"), others after, by name."""
    return (0, int(partition), "") if partition.isdigit() else (1, 0, partition)
