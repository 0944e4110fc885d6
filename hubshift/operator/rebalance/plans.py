"""The plan the pool moves towards (Kafka's *target* assignment) and the assignment published now (its
*current* assignment): a partition planned for a consumer not ready yet stays with its assignee until
that consumer is ready, as a Kafka member waits for the partitions others have not released yet."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hubshift.operator.rebalance.members import Roster
from hubshift.ownership.packing import PackingRules, pack_assignment
from hubshift.ownership.planner import consumer_sort_key, plan_assignment
from hubshift.spec import RebalanceSpec

# The strategy's planner: (partitions, consumers, current assignees) -> every partition's assignee.
Planner = Callable[[list[str], Sequence[str], Mapping[str, str | None]], Mapping[str, str | None]]


def load_aware(rebalance_spec: RebalanceSpec) -> bool:
    return rebalance_spec.strategy == "loadAware"


def packing_rules(rebalance_spec: RebalanceSpec, max_moves: int | None = None) -> PackingRules:
    return PackingRules(rebalance_spec.load_aware.tolerance, max_moves)


def strategy_planner(
    rebalance_spec: RebalanceSpec, load: Mapping[str, float] | None, max_moves: int | None = None
) -> Planner:
    """The strategy's planner: count-balanced, or load-aware packing moving at most `max_moves`
    partitions for load alone (None: as many as it takes)."""
    if not load_aware(rebalance_spec):
        return lambda parts, members, current: plan_assignment(parts, members, current).assignment
    rules = packing_rules(rebalance_spec, max_moves)
    return lambda parts, members, current: pack_assignment(parts, members, current, load, rules).assignment


@dataclass(frozen=True)
class PoolPlan:
    """The planner's plan (`assignment`: every partition's assignee in it) over `members`, of which
    `joiners` are expected but not ready yet."""

    assignment: Mapping[str, str | None]
    members: tuple[str, ...]
    joiners: frozenset[str]

    @classmethod
    def over(
        cls,
        partitions: list[str],
        members: Iterable[str],
        joiners: Iterable[str],
        current: Mapping[str, str | None],
        planner: Planner,
    ) -> PoolPlan:
        """The planner's plan over `members` with the fewest moves from `current` (each partition's
        assignee, or at the first cycle its lease owner)."""
        ordered = tuple(sorted(set(members), key=consumer_sort_key))
        return cls(planner(partitions, ordered, current), ordered, frozenset(joiners))

    def split(
        self, previous: Mapping[str, str | None], roster: Roster
    ) -> tuple[dict[str, str | None], dict[str, str]]:
        """(each partition's assignee now, the partitions kept for joiners): a partition planned for a joiner
        stays with its current assignee as long as that one is still in the plan and not leaving (else it
        has none until the joiner is ready)."""
        assignment: dict[str, str | None] = {}
        planned: dict[str, str] = {}
        members = set(self.members)
        for partition, assignee in self.assignment.items():
            if assignee is None or assignee not in self.joiners:
                assignment[partition] = assignee
                continue
            planned[partition] = assignee
            current = previous.get(partition)
            keeps = current is not None and (
                (current in members and not roster.leaving(current)) or roster.keeps_until_replaced(current)
            )
            assignment[partition] = current if keeps else None
        return assignment, planned


def forced_partitions(
    assignment: Mapping[str, str | None], previous: Mapping[str, str | None], roster: Roster
) -> frozenset[str]:
    """Partitions whose owner is not present to hand them over: the new owner may break at once."""
    owners = roster.observation.owners
    # A stopping consumer is not present but releases its partitions itself (a graceful drain).
    handing_off = set(roster.present) | set(roster.observation.stopping)
    forced = set()
    for partition, assignee in assignment.items():
        owner = owners.get(partition) or previous.get(partition)
        if assignee is not None and owner is not None and owner != assignee and owner not in handing_off:
            forced.add(partition)
    return frozenset(forced)
