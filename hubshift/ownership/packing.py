"""Load-aware packing: which consumer reads which partition, weighing each partition by its load.

Pure: a function of the partition ids, the consumers, the current assignment, each partition's load (events
per second; None: not measured) and the rules. docs/decisions.md ("Load-aware packing") has the semantics.

- Weights: a partition weighs its load plus `OVERHEAD` x the mean partition load (a receiver and its
  checkpoints cost something, so idle partitions spread rather than pile up on one consumer). A partition
  without a figure weighs the mean; without any figure above zero every partition weighs 1, and the
  packing spreads counts.
- LoadLimits: the mean is the total weight over ``k = min(consumers, partitions)``. A consumer is *over* when
  it carries more than the trigger, ``(1 + tolerance) x mean``, and more than ``(1 + tolerance / 2)`` x its
  heaviest partition. It sheds partitions until it carries at most its target, ``(1 + tolerance / 2) x mean``
  (the settle level), or its heaviest partition when that alone weighs more. The gap between trigger and
  settle is the hysteresis: a consumer just filled to the settle level does not shed again at the next small
  change of load.
- Required moves (never capped): a partition whose assignee is not one of the consumers goes, heaviest
  first, to the least loaded consumer.
- Voluntary moves (at most `max_moves`): each over consumer, busiest first, sheds the fewest partitions
  that bring it to its target and all fit elsewhere under the settle level (each, heaviest first, to the
  least loaded consumer; if that leaves one without room, best fit: to the fullest with room), lightest
  set first; else the same with one more partition,
  and so on. When nothing fits (partitions too coarse for the settle level), each of the fewest that
  leaves both consumers lighter than the shedding one was moves to the least loaded consumer. A partition
  heavier than the settle level moves only that way. Repeated until nobody over can shed.
- Minimum: an over consumer must lose at least the fewest of its partitions that bring it to its target;
  when those fit, the plan moves exactly them (property-tested against a brute force for one busy
  consumer). An assignment with nobody over is kept as it is. Every move leaves both consumers lighter
  than the shedding one was, so with steady loads repeated packing comes to rest.
- Deterministic: partitions in numeric order, consumers in the order given; ties go to the lower
  partition, the consumer with fewer partitions, then the earlier consumer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hubshift.ownership.model import partition_sort_key
from hubshift.ownership.planner import Assignees, Plan, plan_moves, sorted_partitions

# Each partition weighs this share of the mean partition load on top of its own: idle ones are not free.
OVERHEAD = 0.05
# A consumer shedding k of its n partitions tries every set of k while there are at most this many.
EXHAUSTIVE = 2000
# Comparisons of sums of floats allow this relative slack, so the order of a sum never decides a move.
SLACK = 1e-9


@dataclass(frozen=True)
class PackingRules:
    """When load moves partitions: `tolerance` over the mean before a consumer sheds (it sheds down to half
    of it over the mean), at most `max_moves` voluntary moves per plan (None: no cap)."""

    tolerance: float = 0.2
    max_moves: int | None = None


@dataclass(frozen=True)
class LoadLimits:
    """The mean weight per consumer, and the trigger and settle levels over it."""

    mean: float
    trigger: float
    settle: float

    @classmethod
    def of(cls, weights: Mapping[str, float], consumers: int, rules: PackingRules) -> LoadLimits:
        active = max(1, min(consumers, len(weights)))
        mean = sum(weights.values()) / active
        return cls(mean, mean * (1 + rules.tolerance), mean * (1 + rules.tolerance / 2))


def partition_weights(partitions: Iterable[str], load: Mapping[str, float] | None) -> dict[str, float]:
    """Each partition's weight for the packing: its load plus the overhead; see the module docstring."""
    parts = list(partitions)
    known = {
        p: max(0.0, float(load[p]))
        for p in parts
        if load is not None and p in load and math.isfinite(load[p])
    }
    total = sum(known.values())
    if total <= 0:
        return {p: 1.0 for p in parts}
    mean = total / len(known)
    return {p: known.get(p, mean) + OVERHEAD * mean for p in parts}


def consumer_loads(assignment: Assignees, weights: Mapping[str, float]) -> dict[str, float]:
    """Each assignee's total weight (consumers assigned nothing are left out)."""
    loads: dict[str, float] = {}
    for partition, consumer in assignment.items():
        if consumer is not None:
            loads[consumer] = loads.get(consumer, 0.0) + weights.get(partition, 0.0)
    return loads


def pack_assignment(
    partitions: Iterable[str],
    consumers: Sequence[str],
    current: Assignees,
    load: Mapping[str, float] | None,
    rules: PackingRules,
) -> Plan:
    """The assignment that keeps every consumer near the mean load with the fewest moves from `current`.

    `current` may name consumers that are gone or partitions that no longer exist; a gone consumer's
    partitions count as unassigned (required moves)."""
    parts = sorted_partitions(partitions)
    members = list(dict.fromkeys(consumers))
    if not members or not parts:
        return Plan({p: None for p in parts}, (), (), tuple(members))
    weights = partition_weights(parts, load)
    packing = _Packing(members, weights)
    unassigned = []
    for p in parts:
        assignee = current.get(p)
        if assignee is not None and assignee in packing.held:
            packing.put(p, assignee)
        else:
            unassigned.append(p)
    for p in sorted(unassigned, key=lambda q: (-weights[q], partition_sort_key(q))):
        packing.put(p, packing.lightest({}))
    packing.shed_over(LoadLimits.of(weights, len(members), rules), rules.max_moves)
    assignment: dict[str, str | None] = {p: packing.owner[p] for p in parts}
    active = tuple(c for c in members if packing.held[c])
    standbys = tuple(c for c in members if not packing.held[c])
    return Plan(assignment, plan_moves(current, assignment), active, standbys)


def shed_target(weights: Sequence[float], settle: float) -> float:
    """What an over consumer carrying `weights` sheds down to: the settle level, or its heaviest partition
    when that alone weighs more."""
    return max(settle, max(weights, default=0.0))


def fewest_to_shed(weights: Sequence[float], target: float) -> int:
    """The fewest of `weights` whose removal brings their sum to `target` (the heaviest ones)."""
    excess = sum(weights) - target
    removed = 0.0
    for count, weight in enumerate(sorted(weights, reverse=True)):
        if removed >= excess * (1 - SLACK):
            return count
        removed += weight
    return len(weights)


class _Packing:
    """The assignment being built, with each consumer's partitions and load."""

    def __init__(self, members: list[str], weights: Mapping[str, float]) -> None:
        self.members = members
        self.order = {c: i for i, c in enumerate(members)}
        self.weights = weights
        self.owner: dict[str, str] = {}
        self.held: dict[str, list[str]] = {c: [] for c in members}
        self.load: dict[str, float] = {c: 0.0 for c in members}

    def put(self, partition: str, consumer: str) -> None:
        self.owner[partition] = consumer
        self.held[consumer].append(partition)
        self.load[consumer] += self.weights[partition]

    def move(self, partition: str, consumer: str) -> None:
        previous = self.owner[partition]
        self.held[previous].remove(partition)
        self.load[previous] -= self.weights[partition]
        self.put(partition, consumer)

    def over(self, consumer: str, limits: LoadLimits) -> bool:
        """Over the trigger, and (a consumer whose heaviest partition weighs more than the settle level
        carries that one in any case) over its heaviest partition by more than the settle factor."""
        heaviest = max((self.weights[p] for p in self.held[consumer]), default=0.0)
        limit = max(limits.trigger, heaviest * limits.settle / limits.mean) if limits.mean > 0 else 0.0
        return self.load[consumer] > limit * (1 + SLACK)

    def shed_over(self, limits: LoadLimits, max_moves: int | None) -> None:
        """The voluntary moves: each over consumer, busiest first, sheds the fewest partitions that fit
        elsewhere (see `_shed`), again until nobody over can shed, while the cap allows."""
        if len(self.members) < 2:
            return
        budget = math.inf if max_moves is None else max_moves
        moved = True
        while moved:  # a consumer that took partitions too coarse for the settle level may be over now
            moved = False
            over = [c for c in self.members if self.over(c, limits)]
            for consumer in sorted(over, key=lambda c: (-self.load[c], self.order[c])):
                for partition, receiver in self._shed(consumer, limits.settle):
                    if budget <= 0:
                        return
                    self.move(partition, receiver)
                    budget -= 1
                    moved = True

    def _shed(self, consumer: str, settle: float) -> list[tuple[str, str]]:
        """The moves that bring `consumer` to its target: the first set (the fewest partitions that suffice,
        lightest first; then one more, and so on) whose partitions all fit elsewhere (`_placed`); when none
        does, each partition of the fewest that leaves both consumers lighter than `consumer` is now."""
        held = sorted(self.held[consumer], key=lambda p: (-self.weights[p], partition_sort_key(p)))
        weights = [self.weights[p] for p in held]
        target = shed_target(weights, settle)
        excess = (sum(weights) - target) * (1 - SLACK)
        fewest = fewest_to_shed(weights, target)
        for size in range(fewest, len(held) + 1):
            for candidate in _candidates(held, size, excess, self.weights):
                moves = self._placed(consumer, candidate, settle)
                if moves is not None:
                    return moves
        moves = []
        load = self.load[consumer]
        extra: dict[str, float] = {}
        for partition in _lightened(held, fewest, excess, self.weights):
            weight = self.weights[partition]
            receiver = self.lightest(extra, but=consumer)
            if self.load[receiver] + extra.get(receiver, 0.0) + weight < load * (1 - SLACK):
                moves.append((partition, receiver))
                extra[receiver] = extra.get(receiver, 0.0) + weight
                load -= weight
        return moves

    def _placed(self, consumer: str, partitions: list[str], settle: float) -> list[tuple[str, str]] | None:
        """Each of `partitions` (heaviest first) to another consumer where it fits under the settle level:
        the least loaded (a moved partition arrives with a backlog: the most room drains it soonest), else,
        when that does not place them all, the fullest (best fit: the room left stays in one piece); one
        heavier than the settle level to the least loaded, if it ends lighter than `consumer` is now. None
        if one does not fit either way."""
        return self._placed_by(consumer, partitions, settle, spread=True) or self._placed_by(
            consumer, partitions, settle, spread=False
        )

    def _placed_by(
        self, consumer: str, partitions: list[str], settle: float, *, spread: bool
    ) -> list[tuple[str, str]] | None:
        extra: dict[str, float] = {}
        moves = []
        for partition in partitions:
            weight = self.weights[partition]
            loads = {c: self.load[c] + extra.get(c, 0.0) for c in self.members if c != consumer}
            fitting = [c for c in loads if loads[c] + weight <= settle * (1 + SLACK)]
            if fitting and spread:
                receiver = min(fitting, key=lambda c: (loads[c], len(self.held[c]), self.order[c]))
            elif fitting:
                receiver = max(fitting, key=lambda c: (loads[c], -len(self.held[c]), -self.order[c]))
            else:
                receiver = self.lightest(extra, but=consumer)
                if weight <= settle or loads[receiver] + weight >= self.load[consumer] * (1 - SLACK):
                    return None
            extra[receiver] = extra.get(receiver, 0.0) + weight
            moves.append((partition, receiver))
        return moves

    def lightest(self, extra: Mapping[str, float], but: str | None = None) -> str:
        """The least loaded consumer, `extra` added (ties: fewer partitions, then the earlier one)."""
        others = (c for c in self.members if c != but)
        return min(others, key=lambda c: (self.load[c] + extra.get(c, 0.0), len(self.held[c]), self.order[c]))


def _candidates(held: list[str], size: int, excess: float, weights: Mapping[str, float]) -> list[list[str]]:
    """The sets of `size` of `held` that weigh at least `excess`, lightest first: every one while there are
    at most `EXHAUSTIVE` combinations, else the lightened one (`_lightened`)."""
    if math.comb(len(held), size) > EXHAUSTIVE:
        return [_lightened(held, size, excess, weights)]
    sets = [list(c) for c in itertools.combinations(held, size) if sum(weights[p] for p in c) >= excess]
    return sorted(sets, key=lambda c: (sum(weights[p] for p in c), [partition_sort_key(p) for p in c]))


def _lightened(held: list[str], size: int, excess: float, weights: Mapping[str, float]) -> list[str]:
    """`size` of `held` (heaviest first) that weigh at least `excess` together, lightened: starting from the
    heaviest `size`, each swapped for the lightest one left that keeps the sum at least `excess`; heaviest
    first."""
    chosen, rest = held[:size], held[size:]
    total = sum(weights[p] for p in chosen)
    for index, partition in enumerate(chosen):
        lighter = sorted(
            (q for q in rest if weights[q] < weights[partition]),
            key=lambda q: (weights[q], partition_sort_key(q)),
        )
        for candidate in lighter:
            if total - weights[partition] + weights[candidate] >= excess:
                total += weights[candidate] - weights[partition]
                rest[rest.index(candidate)] = partition
                chosen[index] = candidate
                break
    return sorted(chosen, key=lambda p: (-weights[p], partition_sort_key(p)))
