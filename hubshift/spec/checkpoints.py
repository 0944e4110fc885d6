"""What each consumer does about checkpoints: where a partition without one starts (`StartPositionSpec`), how
often they are written (`CheckpointPolicySpec`), and the checkpoints of a hub switched away from after a
failover (`FailoverSpec`)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from hubshift.ownership.timing import DEFAULT_TIMING
from hubshift.spec.base import Model, cel
from hubshift.spec.store import CheckpointStoreSpec

ENQUEUED_TIME_REQUIRED = "enqueuedTime is required when type is enqueuedTime"


class StartPositionSpec(Model):
    """Where a partition with no checkpoint starts."""

    type: Literal["earliest", "latest", "enqueuedTime"] = Field(
        default="earliest",
        description="earliest: the first event the hub retains; latest: only events enqueued after the "
        "start; enqueuedTime: the first event enqueued at or after enqueuedTime.",
    )
    enqueued_time: datetime | None = Field(default=None, description="For type enqueuedTime (RFC 3339).")

    CEL = (
        cel(
            "!has(self.type) || self.type != 'enqueuedTime' || has(self.enqueuedTime)",
            ENQUEUED_TIME_REQUIRED,
            ".enqueuedTime",
        ),
    )

    @model_validator(mode="after")
    def _time_for_enqueued(self) -> StartPositionSpec:
        if self.type == "enqueuedTime" and self.enqueued_time is None:
            raise ValueError(ENQUEUED_TIME_REQUIRED)
        return self


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
