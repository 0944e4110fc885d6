"""Data loss: events that expired from the hub before they were read. Pure, from what a cycle observed.

A partition's checkpoint names the last event processed; when the first event the hub still retains
(`PartitionInfo.beginning`) is further on than the event after it, retention passed the checkpoint and the
events between are gone unread. The consumer counts what it skips when it meets such a stretch
(`hubshift_consumer_events_expired_total`); the control loop sees it on every probe, before any consumer
reads on, so a pool started from zero (or stopped, or lagging by more than the retention) is stopped
before it goes past them when `spec.consumer.failOnDataLoss` is true (Spark's Kafka source's option and
meaning: its query fails on lost offsets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from hubshift.eventhubs.model import PartitionInfo
from hubshift.operator.autoscaler import ScalingDecision
from hubshift.ownership.model import OwnershipSnapshot
from hubshift.ownership.planner import consumer_sort_key

# How the messages name the switch.
FAIL_ON_DATA_LOSS = "spec.consumer.failOnDataLoss"


@dataclass(frozen=True)
class ExpiredStretch:
    """One partition's events that expired unread: sequence numbers `first` to `last`, both included."""

    partition: str
    first: int
    last: int

    @property
    def events(self) -> int:
        return self.last - self.first + 1

    def describe(self) -> str:
        return f"partition {self.partition}: {self.events} events ({self.first}-{self.last})"


def expired_unread(
    partitions: Mapping[str, PartitionInfo], snapshot: OwnershipSnapshot
) -> tuple[ExpiredStretch, ...]:
    """The partitions whose checkpoint the hub's retention passed, in partition order: the events after the
    checkpoint up to the first one retained. A partition without a checkpoint starts where its start
    position says and loses nothing; an empty one is left out (what its beginning means is not reported)."""
    checkpoints = {row.partition: row.checkpoint.sequence_number for row in snapshot.partitions}
    found = []
    for partition, info in partitions.items():
        checkpoint = checkpoints.get(partition)
        if checkpoint is None or checkpoint < 0 or info.empty or info.last_enqueued < 0:
            continue
        if checkpoint + 1 < info.beginning:
            found.append(ExpiredStretch(partition, checkpoint + 1, info.beginning - 1))
    return tuple(sorted(found, key=lambda stretch: consumer_sort_key(stretch.partition)))


def describe(expired: tuple[ExpiredStretch, ...]) -> str:
    """One line: how many events in which partitions."""
    total = sum(stretch.events for stretch in expired)
    return (
        f"{total} events expired from the hub before they were read (retention passed the checkpoint): "
        + "; ".join(stretch.describe() for stretch in expired)
    )


def stop_the_pool(
    decision: ScalingDecision, expired: tuple[ExpiredStretch, ...], fail: bool
) -> ScalingDecision:
    """The replica decision once data loss is known: 0 replicas while events expired unread and `fail`
    (failOnDataLoss) is set, else the decision unchanged. The autoscaler's state is left as it was, so the
    pool comes back at the count it asks for once the switch is off."""
    if not expired or not fail or decision.replicas == 0:
        return decision
    reason = f"stopped: {describe(expired)}; {FAIL_ON_DATA_LOSS} is true"
    return replace(decision, replicas=0, reason=reason)
