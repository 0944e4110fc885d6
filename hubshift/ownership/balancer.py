"""The fallback balancer: how consumers share partitions when no operator assigns them.

Legacy lease-manager style (docs/ownership.md, "Without the operator"), run by each consumer once per listing
cycle over what that listing showed. Pure: the caller does the claims against the store.

One cycle of consumer `me`:
1. Members are the live consumers plus `me`; the fair share is ``ceil(P / members)``.
2. A partition is *free* when nobody owns it or its owner is not live (orphaned). If I hold fewer than
   the fair share and something is free, claim free partitions up to the fair share.
3. Otherwise, if nothing is free, I hold fewer than the fair share, and the biggest owner holds at least
   two more than me, steal exactly one of its partitions. Never more than one steal per cycle.

Choices where the legacy rule is silent:
- A consumer at or above the fair share never steals: whenever the spread is worse than ±1 someone is
  below the fair share and steals instead, so this only avoids moves that do not help.
- Nothing is ever released voluntarily; over-share owners are corrected by steals.
- Deterministic choice without contention: each member prefers the partitions starting at
  ``index(me) * P // members`` (its own block, wrapping round), so consumers starting together claim
  disjoint blocks instead of racing for partition "0". The biggest owner is the one with the most
  partitions, ties to the first in natural name order.

Convergence: a claim shrinks the free set; a steal from an owner with at least two more than the
stealer lowers the sum of squared holdings by at least 2. So from any start the pool reaches a state
where nothing is free and every count is within one of the others, and stays there.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from hubshift.ownership.model import Claim, ClaimReason
from hubshift.ownership.planner import consumer_sort_key, sorted_partitions


def fair_share(partition_count: int, member_count: int) -> int:
    """The most partitions one member should hold: ``ceil(P / members)``."""
    return math.ceil(partition_count / member_count) if member_count > 0 else partition_count


def balance(
    me: str,
    partitions: Sequence[str],
    owners: Mapping[str, str | None],
    live: Collection[str],
) -> tuple[Claim, ...]:
    """What `me` should claim this cycle, given who owns what (`owners`) and who is alive (`live`)."""
    parts = sorted_partitions(partitions)
    members = sorted(set(live) | {me}, key=consumer_sort_key)
    alive = set(members)
    share = fair_share(len(parts), len(members))
    preference = _preference(parts, members.index(me), len(members))

    holdings: dict[str, list[str]] = {m: [] for m in members}
    free: list[str] = []
    for p in preference:
        owner = owners.get(p)
        if owner is not None and owner in alive:
            holdings[owner].append(p)
        else:
            free.append(p)

    mine = len(holdings[me])
    if mine >= share:
        return ()
    if free:
        return tuple(_free_claim(p, owners.get(p)) for p in free[: share - mine])
    victim = _biggest(members, holdings)
    if len(holdings[victim]) >= mine + 2:
        return (Claim(holdings[victim][0], True, ClaimReason.STEAL, victim),)
    return ()


def _free_claim(partition: str, owner: str | None) -> Claim:
    """A free partition: nobody's, or its owner is not alive (an orphan, its lease broken by force)."""
    if owner is None:
        return Claim(partition, False, ClaimReason.FREE)
    return Claim(partition, True, ClaimReason.ORPHANED, owner)


def _preference(parts: list[str], index: int, member_count: int) -> list[str]:
    start = index * len(parts) // member_count if member_count else 0
    return parts[start:] + parts[:start]


def _biggest(members: list[str], holdings: Mapping[str, list[str]]) -> str:
    """The member holding the most partitions; ties go to the first in natural name order."""
    victim = members[0]
    for member in members:
        if len(holdings[member]) > len(holdings[victim]):
            victim = member
    return victim
