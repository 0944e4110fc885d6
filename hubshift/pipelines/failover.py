"""Failover onto a replica hub: the events the old hub's consumers already handled are skipped, using the
`repl-*` metadata the replicate pipeline adds (the replication task pattern's failover recipe).

A new consumer of the replica starts on a new checkpoint store at an enqueued time (`startPosition`), a
little before the failure. The old checkpoint store, when it can still be read, says up to which sequence
number each partition of the old hub was handled; a replicated event carries that sequence number as the
last value of `repl-sequence` (values are appended after `;` at each hop). With the same partition count
on both hubs, a stream (partition key, or `keepPartition`) is in the same partition in both, so an event of
partition p whose last `repl-sequence` is at or below the old checkpoint of p was handled: it is skipped,
and still counts as processed (the new checkpoint moves past it). Events produced straight into the replica
carry no `repl-sequence` and are never skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hubshift.pipelines.replicate import REPL_SEQUENCE

if TYPE_CHECKING:
    from pyspark.sql import Column


def last_replicated_sequence(properties: Any) -> int | None:
    """The immediate source's sequence number in `repl-sequence` (its last value), or None."""
    if not properties:
        return None
    pairs = properties.items() if isinstance(properties, Mapping) else properties
    for key, value in pairs:
        if key == REPL_SEQUENCE and value:
            last = str(value).rsplit(";", 1)[-1].strip()
            return int(last) if last.isdigit() else None
    return None


def already_handled(row: Mapping[str, Any], handled: Mapping[str, int]) -> bool:
    """Whether the old hub's consumers handled this event (`handled`: partition -> checkpointed sequence)."""
    through = handled.get(str(row.get("partition")))
    if through is None:
        return False
    sequence = last_replicated_sequence(row.get("properties"))
    return sequence is not None and sequence <= through


def handled_condition(handled: Mapping[str, int]) -> Column:
    """`already_handled` as a Spark condition over the event rows (never null)."""
    from pyspark.sql import functions as F

    last = F.element_at(F.split(F.col("properties").getItem(REPL_SEQUENCE), ";"), -1)
    sequence = F.trim(last).try_cast("long")
    condition = F.lit(False)
    for partition, through in sorted(handled.items()):
        condition = condition | ((F.col("partition") == partition) & (sequence <= F.lit(through)))
    return F.coalesce(condition, F.lit(False))
