"""What the ownership agent needs from a reading engine: start, drain and stop one partition, and hear
back what was committed.

Two engines implement it: `spark/engine.py`'s `SparkEngine` (receivers → spool → the Spark streaming query
→ pipeline and sink; `spark/streams.py`'s `StreamEngine` for a streaming job) and `sdk_engine.SdkEngine`
(receivers → a plain handler, no Spark: the rebalance benchmark's consumer mode). The agent (`agent.py`)
drives either the same way and owns every store write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from hubshift.consumer.lag import ReadProgress
from hubshift.eventhubs.receiver import StartAt
from hubshift.ownership.model import Checkpoint


@dataclass(frozen=True)
class Committed:
    """Events of `partition` up to `position` are processed and written to the sink (`events` more)."""

    partition: str
    owner_level: int
    position: Checkpoint
    events: int


@dataclass(frozen=True)
class Drained:
    """`partition` is no longer read; `position` is the last processed event (None: nothing this epoch)."""

    partition: str
    owner_level: int
    position: Checkpoint | None


@dataclass(frozen=True)
class Stolen:
    """A receiver with a higher owner level took `partition`: it has stopped, and nothing was checkpointed."""

    partition: str
    owner_level: int


@dataclass(frozen=True)
class EngineFailed:
    """The engine cannot go on (e.g. the Spark query failed and could not restart)."""

    reason: str


EngineEvent = Committed | Drained | Stolen | EngineFailed
Notify = Callable[[EngineEvent], None]


def not_started(event: EngineEvent) -> None:
    """An engine's `notify` before `start`: nothing can happen then."""
    raise RuntimeError(f"the engine reported {event} before it was started")


class Engine(Protocol):
    """Every method returns at once; outcomes arrive through the `notify` callback given to `start` (from
    any thread): the ownership agent's inbox."""

    name: str

    def start(self, notify: Notify) -> None:
        """Bring the engine up (for Spark: the session and the streaming query), reporting to `notify`."""
        ...

    def start_partition(
        self, partition: str, owner_level: int, start: StartAt, next_sequence: int | None
    ) -> None:
        """Read `partition` from `start` with a receiver at `owner_level`. `next_sequence` is the first
        sequence number to process, when known (the checkpoint's + 1)."""
        ...

    def drain_partition(self, partition: str) -> None:
        """Stop planning reads of `partition`, let the in-flight batch finish; then `Drained`."""
        ...

    def stop_partition(self, partition: str) -> None:
        """Stop reading `partition` at once (its lease is lost); nothing more is committed for it."""
        ...

    def progress(self) -> dict[str, ReadProgress]:
        """Per owned partition whose receiver has heard the partition's last enqueued event: the last
        processed sequence number and that event (lag in events and seconds, `lag.py`)."""
        ...

    def enqueued_time(self, partition: str, sequence_number: int) -> datetime | None:
        """When event `sequence_number` of `partition` was enqueued, if its receiver has already received
        it (as the first event of a batch); the agent writes the checkpoint's neighbour's time with it."""
        ...

    def close(self) -> None:
        """Stop everything (after the partitions were drained or stopped)."""
        ...
