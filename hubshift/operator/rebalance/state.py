"""The rebalance machine's state, which is exactly the assignment record, and what it observes each cycle.

`RebalanceState` round-trips through `hubshift.ownership.model.Assignment` (`to_record`/`from_record`);
deadlines are absolute wall-clock times, so they survive an operator restart unchanged. When the record
read from the store has another generation than the state kept (a restart, a lost write, another writer),
the record wins (`starting_point`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hubshift.ownership.model import Assignment, ChangeKind, Phase
from hubshift.ownership.planner import consumer_sort_key, sorted_partitions
from hubshift.spec import RebalanceSpec


def holddown_seconds(rebalance_spec: RebalanceSpec) -> float:
    """How long an unplanned change of the consumers waits before a partition moves (`delaySeconds`)."""
    return rebalance_spec.delay_seconds


def joiner_wait_seconds(rebalance_spec: RebalanceSpec) -> float:
    """How long a partition planned for a consumer not ready yet, and read by nobody, waits for that
    consumer once another could read it (`delaySeconds` too: the same setting, another wait)."""
    return rebalance_spec.delay_seconds


@dataclass(frozen=True)
class RebalanceState:
    """The published assignment and where the machine stands; round-trips through a plain dict."""

    generation: int = 0
    phase: Phase = Phase.READY
    assignment: Mapping[str, str | None] = field(default_factory=dict)  # every partition: its assignee now
    consumers: tuple[str, ...] = ()  # the consumers the plan is for (standbys and planned ones too)
    forced: frozenset[str] = frozenset()  # partitions the new owner may break at once
    published_at: float | None = None
    holddown_until: float | None = None
    replicas: int = 0  # the replica count last asked of the StatefulSet
    planned: Mapping[str, str] = field(default_factory=dict)  # partition -> its planned owner, not ready yet
    planned_until: float | None = None  # unread partitions of `planned` wait for their owner until then
    change: ChangeKind | None = None  # the kind of the last publication, until it is done
    # Consumers that left the plan stopping gracefully and whose ordinal the pool keeps: planned again as
    # soon as their old pod is gone (a replacement takes its share when ready, without a holddown).
    returning: tuple[str, ...] = ()

    @property
    def plan(self) -> dict[str, str | None]:
        """The plan the pool moves towards: each partition's planned owner, else its assignee."""
        return {p: self.planned.get(p, assignee) for p, assignee in self.assignment.items()}

    @property
    def running(self) -> ChangeKind | None:
        """The kind of change under way: `holddown` while its timer runs, else the last publication's."""
        return ChangeKind.HOLDDOWN if self.holddown_until is not None else self.change

    def handoff_deadline(self, rebalance_spec: RebalanceSpec) -> float | None:
        return None if self.published_at is None else self.published_at + rebalance_spec.max_handoff_seconds

    def partitions_of(self, consumer: str) -> list[str]:
        return [p for p, assignee in self.assignment.items() if assignee == consumer]

    def to_record(self, rebalance_spec: RebalanceSpec) -> Assignment:
        """The assignment record the consumers read (`hubshift.ownership.model.Assignment`)."""
        return Assignment(
            generation=self.generation,
            partitions={p: c for p, c in self.assignment.items() if c is not None},
            phase=self.phase,
            replicas=self.replicas,
            updated_at=_datetime(self.published_at or 0.0),
            holddown_until=None if self.holddown_until is None else _datetime(self.holddown_until),
            max_handoff_seconds=rebalance_spec.max_handoff_seconds,
            partition_ids=tuple(sorted_partitions(self.assignment)),
            consumers=self.consumers,
            forced=self.forced,
            planned=dict(self.planned),
            planned_until=None if self.planned_until is None else _datetime(self.planned_until),
            change=self.change,
            returning=self.returning,
        )

    @classmethod
    def from_record(cls, record: Assignment) -> RebalanceState:
        ids = record.covered
        consumers = record.consumers or sorted(set(record.partitions.values()), key=consumer_sort_key)
        return cls(
            generation=record.generation,
            phase=record.phase,
            assignment={p: record.partitions.get(p) for p in sorted_partitions(ids)},
            consumers=tuple(str(c) for c in consumers),
            forced=record.forced,
            published_at=record.updated_at.timestamp() if record.generation else None,
            holddown_until=None if record.holddown_until is None else record.holddown_until.timestamp(),
            replicas=record.replicas,
            planned=dict(record.planned),
            planned_until=None if record.planned_until is None else record.planned_until.timestamp(),
            change=record.change,
            returning=tuple(record.returning),
        )


@dataclass(frozen=True)
class Observation:
    """What the operator saw this cycle."""

    partitions: tuple[str, ...]
    consumers: tuple[str, ...]  # present and ready, e.g. ("homes-0", "homes-1")
    owners: Mapping[str, str | None]  # the lease owner of each partition now (None: free)
    desired_replicas: int  # from the autoscaler
    current_replicas: int  # the StatefulSet's spec.replicas
    record: RebalanceState | None = None  # the assignment record as read from the store
    departed: frozenset[str] = frozenset()  # consumers known to be gone for good (any naming)
    # Replica i is `<pool>-<i>` (the StatefulSet's pods); None: unknown, so no change can be planned.
    pool: str | None = None
    # Consumers whose pods are being deleted (SIGTERM: they hand their partitions off on their own).
    stopping: frozenset[str] = frozenset()
    # Present consumers a rollout replaces next: each keeps a partition until its planned owner is ready.
    retiring: frozenset[str] = frozenset()
    # Each partition's load in events per second (`operator.load.load_weights`); None: not measured yet.
    load: Mapping[str, float] | None = None
    capacity: float | None = None  # events one consumer processes per second of work; None: not measured


def starting_point(state: RebalanceState | None, record: RebalanceState | None) -> RebalanceState:
    """The state a cycle starts from: the record read from the store when its generation differs from the
    state kept (a restart, a lost write, another writer), else the state kept."""
    if record is not None and (state is None or record.generation != state.generation):
        return record
    return state if state is not None else RebalanceState()


def ordinal(consumer: str) -> int | None:
    """The StatefulSet ordinal at the end of a consumer's name (`homes-3` -> 3); None without one."""
    _, dash, tail = consumer.rpartition("-")
    return int(tail) if dash and tail.isdigit() else None


def consumer_name(pool: str, number: int) -> str:
    """Replica `number` of the pool: the StatefulSet's pod name (`homes`, 3 -> `homes-3`)."""
    return f"{pool}-{number}"


def pending_handoffs(state: RebalanceState, owners: Mapping[str, str | None]) -> list[str]:
    """Partitions whose observed owner is not (yet) their assignee. A partition without an assignee that
    its planned owner already owns is not pending: a joiner claims such a partition itself as soon
    as it has joined (`hubshift.consumer.ownership_step`)."""
    return pending_partitions(state.assignment, state.planned, owners)


def pending_partitions(
    assignment: Mapping[str, str | None], planned: Mapping[str, str], owners: Mapping[str, str | None]
) -> list[str]:
    """`pending_handoffs` of an assignment and its planned owners not published yet."""
    return [
        p
        for p, assignee in assignment.items()
        if owners.get(p) != assignee and not (assignee is None and owners.get(p) == planned.get(p))
    ]


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=UTC)
