"""How far behind a consumer is on the partitions it owns, as it knows it itself, without the operator
(docs/observability.md, "Lag while the operator is down"): pure, `now` passed in.

Each receiver hears the partition's last enqueued event (sequence number and time) with every delivery,
and remembers when the first event of each batch it delivered was enqueued. With the last processed
sequence number that is enough for lag in events (the backlog) and, by the same rules the operator uses,
lag in seconds: 0 when nothing is left, the enqueued time of the event after the last processed one when
the receiver delivered it as a batch's first, the last enqueued time when that event is the last; else
unknown (never a guess).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

# When event N of the partition was enqueued, if the receiver knows it.
EnqueuedTime = Callable[[int], datetime | None]


@dataclass(frozen=True)
class ReadProgress:
    """One owned partition: the last sequence number processed (-1 before the first) and the partition's
    last enqueued event as its receiver last heard it."""

    processed: int
    last_enqueued: int
    last_enqueued_time: datetime | None = None

    @property
    def backlog(self) -> int:
        """Events enqueued and not processed yet."""
        return max(0, self.last_enqueued - self.processed)


def lag_seconds(progress: ReadProgress, enqueued_time: EnqueuedTime, now: float) -> float | None:
    """Now minus the enqueued time of the partition's oldest unprocessed event (0 when there is none), or
    None while that time is not known."""
    if progress.backlog == 0:
        return 0.0
    oldest = progress.processed + 1
    moment = enqueued_time(oldest)
    if moment is None and oldest == progress.last_enqueued:
        moment = progress.last_enqueued_time
    if moment is None:
        return None
    return max(0.0, now - moment.timestamp())
