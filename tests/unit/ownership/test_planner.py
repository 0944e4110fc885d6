"""The assignment planner: balanced ±1, minimal moves, deterministic, idempotent, standbys."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift.ownership.planner import (
    Move,
    consumer_sort_key,
    plan_assignment,
    plan_moves,
)
from tests.harness.ownership import is_balanced, minimum_moves


def ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def pods(n: int, start: int = 0) -> list[str]:
    return [f"homes-{i}" for i in range(start, start + n)]


@st.composite
def situations(
    draw: st.DrawFn, max_partitions: int = 40, max_consumers: int = 12
) -> tuple[list[str], list[str], dict[str, str | None]]:
    """Partitions, consumers, and a current assignment that may name gone consumers or be unowned."""
    partitions = ids(draw(st.integers(0, max_partitions)))
    consumers = pods(draw(st.integers(0, max_consumers)))
    if draw(st.booleans()):
        consumers = draw(st.permutations(consumers))
    owners = [*consumers, "gone-0", "gone-1", None]
    current = {p: draw(st.sampled_from(owners)) for p in partitions}
    return partitions, consumers, current


# --- the numbers the bench targets ------------------------------------------------------------------


def test_one_to_eight_moves_28() -> None:
    current = {p: "homes-0" for p in ids(32)}
    plan = plan_assignment(ids(32), pods(8), current)
    assert len(plan.moves) == 28 == minimum_moves(ids(32), pods(8), current)
    assert plan.partitions_of("homes-0") == ["0", "1", "2", "3"]
    assert plan.partitions_of("homes-1") == ["4", "5", "6", "7"]


def test_eight_to_four_moves_16() -> None:
    before = plan_assignment(ids(32), pods(8), {}).assignment
    plan = plan_assignment(ids(32), pods(4), before)
    assert len(plan.moves) == 16 == minimum_moves(ids(32), pods(4), before)
    assert all(m.previous in pods(4, start=4) for m in plan.moves)
    assert is_balanced(plan.assignment, pods(4))


def test_cold_start_gives_contiguous_blocks_in_numeric_order() -> None:
    plan = plan_assignment(ids(12), pods(3), {})
    assert plan.partitions_of("homes-2") == ["8", "9", "10", "11"]
    assert [m.partition for m in plan.moves] == ids(12)
    assert all(m.previous is None for m in plan.moves)


def test_removing_a_consumer_from_a_balanced_pool_moves_only_its_partitions() -> None:
    before = plan_assignment(ids(32), pods(8), {}).assignment
    plan = plan_assignment(ids(32), [c for c in pods(8) if c != "homes-3"], before)
    assert {m.partition for m in plan.moves} == {p for p, c in before.items() if c == "homes-3"}


def test_standbys_are_the_consumers_beyond_the_partition_count() -> None:
    plan = plan_assignment(ids(3), pods(5), {})
    assert plan.active == ("homes-0", "homes-1", "homes-2")
    assert plan.standbys == ("homes-3", "homes-4")


def test_standbys_are_chosen_to_keep_current_owners() -> None:
    current: dict[str, str | None] = {"0": "homes-4", "1": "homes-3", "2": None}
    plan = plan_assignment(ids(3), pods(5), current)
    assert plan.assignment == {"0": "homes-4", "1": "homes-3", "2": "homes-0"}
    assert plan.standbys == ("homes-1", "homes-2")
    assert plan.moves == (Move("2", None, "homes-0"),)


def test_no_consumers_leaves_every_partition_unowned_and_moves_nothing() -> None:
    plan = plan_assignment(ids(4), [], {"0": "homes-0"})
    assert plan.assignment == {p: None for p in ids(4)}
    assert plan.moves == ()


def test_partitions_that_no_longer_exist_are_ignored() -> None:
    plan = plan_assignment(ids(2), pods(2), {"0": "homes-0", "1": "homes-1", "7": "homes-0"})
    assert plan.assignment == {"0": "homes-0", "1": "homes-1"}
    assert plan.moves == ()


def test_consumer_sort_key_is_numeric_aware() -> None:
    names = ["homes-10", "homes-2", "homes-1", "a", "homes-1b"]
    assert sorted(names, key=consumer_sort_key) == ["a", "homes-1", "homes-1b", "homes-2", "homes-10"]


def test_plan_moves_is_the_diff() -> None:
    assert plan_moves({"0": "a", "1": None}, {"0": "b", "1": "b", "2": None}) == (
        Move("0", "a", "b"),
        Move("1", None, "b"),
    )


# --- properties ---------------------------------------------------------------------------------------


@settings(max_examples=150)
@given(situations())
def test_every_plan_is_balanced_and_covers_every_partition(
    situation: tuple[list[str], list[str], dict[str, str | None]],
) -> None:
    partitions, consumers, current = situation
    plan = plan_assignment(partitions, consumers, current)
    assert sorted(plan.assignment) == sorted(partitions)
    assert is_balanced(plan.assignment, consumers)
    assert len(plan.active) == min(len(consumers), len(partitions))
    assert set(plan.active) | set(plan.standbys) == set(consumers)


@settings(max_examples=150)
@given(situations())
def test_moves_are_the_minimum(situation: tuple[list[str], list[str], dict[str, str | None]]) -> None:
    partitions, consumers, current = situation
    plan = plan_assignment(partitions, consumers, current)
    assert len(plan.moves) == minimum_moves(partitions, consumers, current)
    assert plan.moves == plan_moves(current, plan.assignment)
    # An independent lower bound: every unowned partition moves, and every consumer over the biggest
    # share (or not among the members at all) gives up its surplus.
    if consumers and partitions:
        cap = -(-len(partitions) // min(len(consumers), len(partitions)))
        unowned = sum(1 for p in partitions if current.get(p) not in consumers)
        surplus = sum(max(0, sum(1 for o in current.values() if o == c) - cap) for c in consumers)
        assert len(plan.moves) >= unowned + surplus


@settings(max_examples=100)
@given(situations(max_partitions=5, max_consumers=4))
def test_moves_match_brute_force_on_small_cases(
    situation: tuple[list[str], list[str], dict[str, str | None]],
) -> None:
    partitions, consumers, current = situation
    if not consumers:
        return
    best = min(
        sum(1 for p, owner in zip(partitions, owners, strict=True) if current.get(p) != owner)
        for owners in itertools.product(consumers, repeat=len(partitions))
        if is_balanced(dict(zip(partitions, owners, strict=True)), consumers)
    )
    assert len(plan_assignment(partitions, consumers, current).moves) == best


@settings(max_examples=100)
@given(situations(), st.randoms(use_true_random=False))
def test_same_input_same_plan_whatever_the_dict_order(
    situation: tuple[list[str], list[str], dict[str, str | None]], rnd: random.Random
) -> None:
    partitions, consumers, current = situation
    shuffled_items = list(current.items())
    rnd.shuffle(shuffled_items)
    shuffled_partitions = list(partitions)
    rnd.shuffle(shuffled_partitions)
    first = plan_assignment(partitions, consumers, current)
    second = plan_assignment(shuffled_partitions, consumers, dict(shuffled_items))
    assert first == second
    assert list(first.assignment) == sorted(partitions, key=int)


@settings(max_examples=100)
@given(situations())
def test_planning_a_balanced_assignment_moves_nothing(
    situation: tuple[list[str], list[str], dict[str, str | None]],
) -> None:
    partitions, consumers, current = situation
    plan = plan_assignment(partitions, consumers, current)
    again = plan_assignment(partitions, consumers, plan.assignment)
    assert again.moves == ()
    assert again.assignment == plan.assignment


@settings(max_examples=100)
@given(situations())
def test_kept_partitions_stay_with_their_owner(
    situation: tuple[list[str], list[str], dict[str, str | None]],
) -> None:
    """Stickiness: a consumer at or under its share keeps everything it holds."""
    partitions, consumers, current = situation
    plan = plan_assignment(partitions, consumers, current)
    for consumer in plan.active:
        held = [p for p in partitions if current.get(p) == consumer]
        if len(held) <= len(plan.partitions_of(consumer)):
            assert set(held) <= set(plan.partitions_of(consumer))
