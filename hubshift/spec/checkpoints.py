"""What each consumer does about checkpoints: where a partition without one starts (`StartPositionSpec`), how
often they are written (`CheckpointPolicySpec`), and the checkpoints of a hub switched away from after a
failover (`FailoverSpec`)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from hubshift.ownership.timing import DEFAULT_TIMING
from hubshift.spec.base import Model, cel
from hubshift.spec.store import CheckpointStoreSpec

ENQUEUED_TIME_REQUIRED = "enqueuedTime is required when type is enqueuedTime"
SEQUENCE_NUMBER_REQUIRED = "sequenceNumber is required when type is sequenceNumber"
PARTITION_IDS = "partitions: keys are partition ids (0, 1, ... up to 4 digits)"
PARTITION_ID = re.compile(r"^[0-9]{1,4}$")
# The most partitions an Event Hub has (Premium and Dedicated tiers: 1,024).
MAX_PARTITIONS = 1024


class PartitionStartSpec(Model):
    """Where one partition without a checkpoint starts, instead of the pool's start position."""

    type: Literal["earliest", "latest", "enqueuedTime", "sequenceNumber"] = Field(
        description="earliest, latest or enqueuedTime as for the pool; sequenceNumber: the event with that "
        "sequence number first (Kafka's startingOffsets for a partition). A sequence number retention has "
        "removed starts at the first event retained; one not enqueued yet, at the partition's end (the next "
        "event enqueued), with a warning."
    )
    enqueued_time: datetime | None = Field(default=None, description="For type enqueuedTime (RFC 3339).")
    sequence_number: int | None = Field(default=None, ge=0, description="For type sequenceNumber.")

    CEL = (
        cel(
            "self.type != 'enqueuedTime' || has(self.enqueuedTime)",
            ENQUEUED_TIME_REQUIRED,
            ".enqueuedTime",
        ),
        cel(
            "self.type != 'sequenceNumber' || has(self.sequenceNumber)",
            SEQUENCE_NUMBER_REQUIRED,
            ".sequenceNumber",
        ),
    )

    @model_validator(mode="after")
    def _position_for_type(self) -> PartitionStartSpec:
        if self.type == "enqueuedTime" and self.enqueued_time is None:
            raise ValueError(ENQUEUED_TIME_REQUIRED)
        if self.type == "sequenceNumber" and self.sequence_number is None:
            raise ValueError(SEQUENCE_NUMBER_REQUIRED)
        return self


class StartPositionSpec(Model):
    """Where a partition with no checkpoint starts."""

    type: Literal["earliest", "latest", "enqueuedTime"] = Field(
        default="earliest",
        description="earliest: the first event the hub retains; latest: only events enqueued after the "
        "start; enqueuedTime: the first event enqueued at or after enqueuedTime.",
    )
    enqueued_time: datetime | None = Field(default=None, description="For type enqueuedTime (RFC 3339).")
    partitions: dict[str, PartitionStartSpec] = Field(
        default_factory=dict,
        max_length=MAX_PARTITIONS,
        description='A partition\'s own start position, by partition id ({"0": {type: sequenceNumber, '
        "sequenceNumber: 1200}}); the others start at the pool's. Like the pool's, only for a partition "
        "without a checkpoint: a checkpoint always wins (move one with `hubshift checkpoints reset`).",
    )

    CEL = (
        cel(
            "!has(self.type) || self.type != 'enqueuedTime' || has(self.enqueuedTime)",
            ENQUEUED_TIME_REQUIRED,
            ".enqueuedTime",
        ),
        cel(
            "!has(self.partitions) || self.partitions.all(p, p.matches('^[0-9]{1,4}$'))",
            PARTITION_IDS,
            ".partitions",
        ),
    )

    @model_validator(mode="after")
    def _time_for_enqueued(self) -> StartPositionSpec:
        if self.type == "enqueuedTime" and self.enqueued_time is None:
            raise ValueError(ENQUEUED_TIME_REQUIRED)
        if any(not PARTITION_ID.match(partition) for partition in self.partitions):
            raise ValueError(PARTITION_IDS)
        return self

    def of(self, partition: str) -> PartitionStartSpec:
        """Where `partition` starts when it has no checkpoint: its own start position, else the pool's."""
        own = self.partitions.get(partition)
        return (
            own if own is not None else PartitionStartSpec(type=self.type, enqueued_time=self.enqueued_time)
        )


class FailoverSpec(Model):
    """After a failover to a replica hub: the checkpoints of the hub switched away from. Events that carry
    repl-sequence at or below the old checkpoint of their partition were handled there and are skipped."""

    checkpoint_store: CheckpointStoreSpec = Field(description="The old hub's checkpoint store.")
    namespace: str = Field(min_length=1, description="The old hub's namespace, as its checkpoints name it.")
    hub: str = Field(min_length=1, description="The old hub.")
    consumer_group: str = Field(default="$Default", min_length=1, description="The old consumer group.")


class CheckpointPolicySpec(Model):
    """A partition's checkpoint is written after Spark committed a batch, at most this often."""

    every_seconds: float = Field(
        default=DEFAULT_TIMING.checkpoint_interval_seconds,
        gt=0,
        description="Write at least this often while events flow.",
    )
    every_events: int = Field(default=50_000, ge=1, description="...or after this many events, if sooner.")
