"""Who is who in a cycle: each consumer's standing, from what the operator saw (`Roster`) and towards the
plan published (`Members`). These are the machine's member states; docs/decisions.md ("Rebalance state
machine", Words) defines each word."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hubshift.operator.rebalance.state import Observation, RebalanceState, consumer_name, ordinal
from hubshift.ownership.planner import consumer_sort_key, sorted_partitions


@dataclass(frozen=True)
class Roster:
    """The consumers as observed this cycle: present, leaving, gone, stopping, kept by the pool."""

    observation: Observation
    partitions: list[str]
    present: list[str]

    @classmethod
    def of(cls, observation: Observation) -> Roster:
        return cls(
            observation,
            sorted_partitions(observation.partitions),
            sorted(set(observation.consumers), key=consumer_sort_key),
        )

    @property
    def limit(self) -> int:
        """Ordinals at or beyond it are leaving (present) or gone (absent): the desired replica count. An
        ordinal the StatefulSet does not have yet but the machine scales out to is coming, not leaving."""
        return self.observation.desired_replicas

    def leaving(self, consumer: str) -> bool:
        number = ordinal(consumer)
        observation = self.observation
        return (
            consumer in observation.departed
            or consumer in observation.stopping
            or consumer in observation.retiring
            or (number is not None and number >= self.limit)
        )

    def gone(self, consumer: str) -> bool:
        """Leaving and absent for good (not merely stopping: that one hands off on its own)."""
        return self.leaving(consumer) and consumer not in self.present and not self.stopping(consumer)

    def stopping(self, consumer: str) -> bool:
        return consumer in self.observation.stopping

    def keeps_until_replaced(self, consumer: str) -> bool:
        """A consumer a rollout replaces next keeps each partition until its planned owner is ready."""
        return consumer in self.observation.retiring and consumer in self.present

    def kept(self, consumer: str) -> bool:
        """Whether the pool brings this consumer back when its pod is gone: a StatefulSet replica (named
        after the pool) below the desired count."""
        observation = self.observation
        number = ordinal(consumer)
        return (
            observation.pool is not None
            and number is not None
            and consumer == consumer_name(observation.pool, number)
            and number < self.limit
            and consumer not in observation.departed
        )

    @property
    def candidates(self) -> list[str]:
        """Who may own partitions now: present, and neither leaving nor departed."""
        return [c for c in self.present if not self.leaving(c)]

    @property
    def arriving(self) -> list[str]:
        """The consumers a scale-out brings (ordinals from the StatefulSet's count up to the desired one),
        not ready yet; none when the pool's naming is unknown."""
        observation = self.observation
        if observation.pool is None:
            return []
        names = (consumer_name(observation.pool, i) for i in range(observation.current_replicas, self.limit))
        return [name for name in names if name not in self.present]


@dataclass(frozen=True)
class Members:
    """Each consumer's standing towards the published plan this cycle."""

    candidates: list[str]  # present and not leaving: may read partitions now
    arriving: list[str]  # brought by a scale-out decided this cycle, not in the plan yet
    coming_back: list[str]  # returning consumers not in the plan yet, and not leaving
    joiners: list[str]  # expected, not ready: planned owners not late, and the incoming not present
    dropped: frozenset[str]  # planned owners no longer expected (late, or leaving) and not present
    late: list[str]  # dropped for being late, not leaving: their unread share waited long enough
    leaving: list[str]  # assignees that are leaving: their partitions move this cycle

    @classmethod
    def of(cls, state: RebalanceState, roster: Roster, now: float) -> Members:
        arriving = [c for c in roster.arriving if c not in state.consumers]
        coming_back = [c for c in state.returning if c not in state.consumers and not roster.leaving(c)]
        incoming = _unique([*arriving, *coming_back])
        expected = _expected_joiners(state, roster, now)
        dropped = set(state.planned.values()) - set(expected) - set(roster.present)
        leaving = {c for c in state.assignment.values() if c is not None and roster.leaving(c)}
        return cls(
            candidates=roster.candidates,
            arriving=arriving,
            coming_back=coming_back,
            joiners=_unique([*expected, *(c for c in incoming if c not in roster.present)]),
            dropped=frozenset(dropped),
            late=sorted((c for c in dropped if not roster.leaving(c)), key=consumer_sort_key),
            leaving=sorted(leaving, key=consumer_sort_key),
        )

    @property
    def incoming(self) -> list[str]:
        """The consumers a planned change brings into the plan this cycle: arriving or coming back."""
        return _unique([*self.arriving, *self.coming_back])

    @property
    def present_and_joining(self) -> list[str]:
        """Whom a plan over the consumers present is for: the candidates and the joiners."""
        return [*self.candidates, *self.joiners]


def unread(state: RebalanceState, roster: Roster) -> list[str]:
    """Partitions planned for a consumer not ready yet whose assignee is not present (nobody reads them)."""
    present = set(roster.present)
    return [p for p in state.planned if state.assignment.get(p) not in present]


def _expected_joiners(state: RebalanceState, roster: Roster, now: float) -> list[str]:
    """The planned consumers still expected: not ready yet, not leaving, and not late (a partition planned
    for them unread past `planned_until`)."""
    late = state.planned_until is not None and now >= state.planned_until
    unread_now = set(unread(state, roster)) if late else set()
    return [
        c
        for c in sorted(set(state.planned.values()), key=consumer_sort_key)
        if c not in roster.present
        and not roster.leaving(c)
        and not any(state.planned.get(p) == c for p in unread_now)
    ]


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))
