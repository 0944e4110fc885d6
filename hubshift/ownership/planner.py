"""The assignment planner: which consumer reads which partition, with the fewest moves.

Pure: a function of the partition ids, the active consumers and the current assignment.

Rules (docs/decisions.md, "Assignment planner"):
- every active consumer gets ``P // k`` or ``P // k + 1`` partitions, where ``k = min(consumers, P)``;
  consumers beyond the partition count are hot standbys and get nothing;
- the number of moves (partitions whose assignee changes, counting unassigned -> assigned) is the minimum
  possible from the current assignment;
- the same input gives the same output: partitions in numeric order ("2" before "10"), consumers in the
  order given, no dict-order or hash randomness.

Why the plan is minimal: a consumer can keep at most ``min(assigned, cap)`` of what it is assigned now,
where its cap is ``P // k + 1`` for ``P % k`` of the active consumers and ``P // k`` for the rest. Giving
the larger caps to the consumers assigned the most, and making the ``k`` most assigned ones active, keeps
the most partitions (an exchange argument: swapping a consumer with more into a larger cap never keeps
fewer). Everything not kept moves, so ``moves = P - kept`` and no balanced assignment does better.
Ties between consumers assigned as many go to the consumer earlier in the list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hubshift.ownership.model import partition_sort_key

# Each partition's assignee (None: nobody's).
Assignees = Mapping[str, str | None]


@dataclass(frozen=True)
class Move:
    """`partition` changes assignee: from `previous` (None when it had none) to `assignee`.

    `previous` is the assignee in the current assignment, even when that consumer is gone.
    """

    partition: str
    previous: str | None
    assignee: str


@dataclass(frozen=True)
class Plan:
    """A balanced assignment of every partition and how to get there from the current one."""

    assignment: dict[str, str | None]  # every partition, in partition order; None only without consumers
    moves: tuple[Move, ...]
    active: tuple[str, ...]  # consumers assigned at least one partition, in the order given
    standbys: tuple[str, ...]  # consumers beyond the partition count, in the order given

    def partitions_of(self, consumer: str) -> list[str]:
        return [p for p, assignee in self.assignment.items() if assignee == consumer]


def consumer_sort_key(name: str) -> tuple[tuple[int, int, str], ...]:
    """Natural order for consumer names, so `homes-2` comes before `homes-10`."""
    chunks: list[tuple[int, int, str]] = []
    digits = ""
    text = ""
    for char in name:
        if char.isdigit():
            if text:
                chunks.append((1, 0, text))
                text = ""
            digits += char
        else:
            if digits:
                chunks.append((0, int(digits), digits))
                digits = ""
            text += char
    if digits:
        chunks.append((0, int(digits), digits))
    if text:
        chunks.append((1, 0, text))
    return tuple(chunks)


def sorted_partitions(partitions: Iterable[str]) -> list[str]:
    return sorted(set(partitions), key=partition_sort_key)


def fair_shares(partition_count: int, consumer_count: int) -> list[int]:
    """How many partitions each active consumer gets, biggest first: `k` counts that differ by at most 1."""
    active = min(partition_count, consumer_count)
    if active == 0:
        return []
    base, extra = divmod(partition_count, active)
    return [base + 1] * extra + [base] * (active - extra)


def plan_assignment(partitions: Iterable[str], consumers: Sequence[str], current: Assignees) -> Plan:
    """The balanced assignment with the fewest moves from `current`.

    `current` may name consumers that are gone (not in `consumers`) or partitions that no longer exist;
    both are ignored, so a gone consumer's partitions count as unassigned.
    """
    parts = sorted_partitions(partitions)
    members = list(dict.fromkeys(consumers))
    if not members or not parts:
        return Plan({p: None for p in parts}, (), (), tuple(members))

    held = _held(parts, members, current)
    order = {c: i for i, c in enumerate(members)}
    ranked = sorted(members, key=lambda c: (-len(held[c]), order[c]))
    shares = fair_shares(len(parts), len(members))
    caps = dict(zip(ranked, shares, strict=False))

    kept: dict[str, list[str]] = {c: held[c][: caps[c]] for c in caps}
    taken = {p for ps in kept.values() for p in ps}
    pool = [p for p in parts if p not in taken]

    assignment: dict[str, str | None] = {p: None for p in parts}
    for consumer in members:  # fill deficits in the order given, from the lowest free partition up
        if consumer not in caps:
            continue
        want = caps[consumer] - len(kept[consumer])
        kept[consumer].extend(pool[:want])
        del pool[:want]
        for p in kept[consumer]:
            assignment[p] = consumer

    active = tuple(c for c in members if c in caps)
    standbys = tuple(c for c in members if c not in caps)
    return Plan(assignment, plan_moves(current, assignment), active, standbys)


def plan_moves(current: Assignees, plan: Assignees) -> tuple[Move, ...]:
    """The partitions `plan` gives to a different assignee than `current`, in partition order."""
    moves = [
        Move(p, current.get(p), assignee)
        for p, assignee in plan.items()
        if assignee is not None and current.get(p) != assignee
    ]
    return tuple(sorted(moves, key=lambda m: partition_sort_key(m.partition)))


def _held(parts: list[str], members: list[str], current: Assignees) -> dict[str, list[str]]:
    held: dict[str, list[str]] = {c: [] for c in members}
    for p in parts:
        assignee = current.get(p)
        if assignee is not None and assignee in held:
            held[assignee].append(p)
    return held
