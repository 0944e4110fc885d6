"""Failover onto a replica hub: the events the old hub's consumers already handled are skipped, using the
`repl-*` metadata the replicate and route pipelines add (the replication task pattern's failover recipe).

A new consumer of the replica starts on a new checkpoint store at an enqueued time (`startPosition`), a
little before the failure. The old checkpoint store, when it can still be read, says up to which sequence
number each partition of the old hub was handled. A replicated event carries the partition and sequence
number it had in the hub it was forwarded from as the last values of `repl-partition` and `repl-sequence`
(values are appended after `;` at each hop): it was handled when that sequence number is at or below the
old checkpoint of *that* partition, wherever the event landed in the replica (keyless events are spread
over the replica's partitions, and partition counts may differ). Such an event is skipped and still counts
as processed (the new checkpoint moves past it). An event without both values (produced straight into the
replica, or forwarded by a replicator that did not record its source partition) is never skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hubshift.pipelines.replicate import REPL_PARTITION, REPL_SEQUENCE

if TYPE_CHECKING:
    from pyspark.sql import Column


def _last(value: Any) -> str:
    return str(value).rsplit(";", 1)[-1].strip() if value else ""


def replicated_from(properties: Any) -> tuple[str, int] | None:
    """The partition and sequence number the event had in the hub it was forwarded from (the last values of
    `repl-partition` and `repl-sequence`), or None when it does not carry both."""
    if not properties:
        return None
    pairs = properties.items() if isinstance(properties, Mapping) else properties
    found = {key: value for key, value in pairs if key in (REPL_PARTITION, REPL_SEQUENCE)}
    partition, sequence = _last(found.get(REPL_PARTITION)), _last(found.get(REPL_SEQUENCE))
    if not partition or not sequence.isdigit():
        return None
    return partition, int(sequence)


def already_handled(row: Mapping[str, Any], handled: Mapping[str, int]) -> bool:
    """Whether the old hub's consumers handled this event (`handled`: the old hub's partition -> its
    checkpointed sequence number)."""
    source = replicated_from(row.get("properties"))
    if source is None:
        return False
    partition, sequence = source
    through = handled.get(partition)
    return through is not None and sequence <= through


def handled_condition(handled: Mapping[str, int]) -> Column:
    """`already_handled` as a Spark condition over the event rows (never null)."""
    from pyspark.sql import functions as F

    def last(key: str) -> Column:
        return F.trim(F.element_at(F.split(F.col("properties").getItem(key), ";"), -1))

    partition, sequence = last(REPL_PARTITION), last(REPL_SEQUENCE).try_cast("long")
    condition = F.lit(False)
    for old_partition, through in sorted(handled.items()):
        condition = condition | ((partition == F.lit(old_partition)) & (sequence <= F.lit(through)))
    return F.coalesce(condition, F.lit(False))
