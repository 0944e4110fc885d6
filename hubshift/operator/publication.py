"""What follows from a rebalance step's publication: whether the assignment record is written, and whose
membership ends so that forced partitions move at once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hubshift.operator.rebalance import PublishAssignment
from hubshift.ownership.model import Assignment
from hubshift.ownership.planner import consumer_sort_key
from hubshift.ownership.records import encode_assignment


def record_changed(new: Assignment, old: Assignment | None) -> bool:
    """Whether the record must be written: what the consumers would read differs."""
    return old is None or encode_assignment(new) != encode_assignment(old)


def owners_to_expel(
    published: PublishAssignment, owners: Mapping[str, str | None], spared: Iterable[str]
) -> list[str]:
    """The owners of forced partitions to expel: ending their membership lets the new owners take those
    partitions at once (an orphan is claimed by force) instead of after the membership lease. `spared`
    are the consumers present or still handing off after SIGTERM (they release on their own)."""
    keep = set(spared)
    gone = {owners.get(p) for p in published.forced}
    return sorted((c for c in gone if c is not None and c not in keep and c != "?"), key=consumer_sort_key)
