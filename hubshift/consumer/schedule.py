"""When the ownership agent does what: its timers as plain data, each decision a method with `now` (the
agent's monotonic clock, seconds) passed in.

- the listing of the scope (re-reading the assignment): every `list_interval`, at once when nudged but at
  most once per `NUDGE_FLOOR_SECONDS`, while a partition assigned here waits for its release every
  `first_claim_retry` for the first `FIRST_RETRIES_SECONDS` of the wait and every `claim_retry` after it,
  soon after this consumer released one, `RETRY_SECONDS` after a failed listing;
- the hub's partition ids: every `partition_refresh`, and whenever none are known;
- the membership renewal: when the membership says it is due, and `RETRY_SECONDS` after a failure;
- SIGTERM: a grace period to drain in, and whether the stop is done, going on, or out of time; first, for
  at most `follow_seconds`, the consumer keeps reading and follows the operator's assignment, which moves
  its partitions to consumers ready for them (an eviction's planned handoff);
- when the loop wakes next (`wake_at`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

# Nudges (`POST /assignment`) make the consumer list the scope at most this often.
NUDGE_FLOOR_SECONDS = 0.5
# A failed listing, partition-id read or membership renewal is tried again this much later.
RETRY_SECONDS = 1.0
# After a release the consumer lists again this soon: whoever waits for the partition claims it at its next
# attempt, and a partition planned here may have been freed at the same time.
AFTER_RELEASE_SECONDS = 0.5
# A wait for a release is retried at `first_claim_retry` this long, then at `claim_retry`: a graceful drain
# on the SDK engine ends within a few tenths of a second (the handoff's own time is the retry's overshoot),
# a Spark batch's takes seconds (where a short cadence would only add listings).
FIRST_RETRIES_SECONDS = 0.5
# The loop turns at least this often (engine reports are also taken when they come).
IDLE_SECONDS = 1.0


class StopOutcome(enum.Enum):
    """Where a SIGTERM stands after a turn of the loop."""

    RUNNING = "running"  # no stop asked, or still handing off within the grace period
    DONE = "done"  # everything handed off
    OUT_OF_TIME = "out of time"  # the grace period ran out: stop whatever is left


@dataclass
class AgentSchedule:
    """The agent's timers (monotonic seconds)."""

    list_interval: float
    claim_retry: float
    partition_refresh: float
    first_claim_retry: float | None = None  # None: `claim_retry` from the start
    next_list: float = 0.0
    last_nudged_listing: float = -math.inf  # the last listing a nudge made (nothing else was due)
    next_claim_retry: float = 0.0
    waiting_since: float | None = None  # when the listings began to find a claim waiting (None: none waits)
    next_partition_refresh: float = 0.0
    renew_retry_at: float = 0.0
    stop_deadline: float | None = None
    follow_until: float | None = None  # SIGTERM: follow the operator's assignment until then

    # --- listing --------------------------------------------------------------------------------------------

    def nudge_taken(self, now: float, nudged: bool) -> bool:
        """A nudge lists at once, but nudges make at most one listing per NUDGE_FLOOR_SECONDS: whoever can
        reach the HTTP port may only make the consumer read the store that much more often. (The floor
        counts from the last listing a nudge made, not from the last listing: a consumer listing at the
        claim retry, waiting or following a stop, takes the operator's nudge at once too.)"""
        return nudged and now >= self.last_nudged_listing + NUDGE_FLOOR_SECONDS

    def scheduled(self, now: float, *, waiting: bool) -> bool:
        """A listing is due without a nudge: the interval passed, or a release waited for may have come."""
        return now >= self.next_list or (waiting and now >= self.next_claim_retry)

    def listing_due(self, now: float, *, nudged: bool, waiting: bool) -> bool:
        """List the scope now: nudged, or `scheduled`."""
        return self.nudge_taken(now, nudged) or self.scheduled(now, waiting=waiting)

    def listing_started(self, now: float, *, nudged: bool = False, waiting: bool = False) -> None:
        """A listing begins (`nudged`, `waiting`: as `listing_due` was asked)."""
        if nudged and not self.scheduled(now, waiting=waiting):
            self.last_nudged_listing = now

    def listing_failed(self, now: float) -> None:
        self.next_list = now + RETRY_SECONDS

    def listed(self, now: float, *, waiting: bool) -> None:
        """A listing was acted on; `waiting`: a partition assigned here is still held by its old owner, so
        list again at the claim retry (a released partition shows as free in the listing)."""
        self.next_list = now + self.list_interval
        if not waiting:
            self.waiting_since = None
            return
        if self.waiting_since is None:
            self.waiting_since = now
        self.next_claim_retry = now + self.retry_interval(now)
        self.next_list = min(self.next_list, self.next_claim_retry)

    def retry_interval(self, now: float) -> float:
        """The claim retry at `now`: the first one's for the first `FIRST_RETRIES_SECONDS` of a wait."""
        first = self.first_claim_retry
        early = self.waiting_since is not None and now - self.waiting_since < FIRST_RETRIES_SECONDS
        return first if first is not None and early else self.claim_retry

    def released(self, now: float) -> None:
        self.next_list = min(self.next_list, now + AFTER_RELEASE_SECONDS)

    # --- the hub's partition ids ----------------------------------------------------------------------------

    def partitions_due(self, now: float, *, known: bool) -> bool:
        return not known or now >= self.next_partition_refresh

    def partitions_read(self, now: float) -> None:
        self.next_partition_refresh = now + self.partition_refresh

    # --- membership -----------------------------------------------------------------------------------------

    def renewal_due(self, now: float, renew_due: float) -> bool:
        return now >= renew_due and now >= self.renew_retry_at

    def renewal_failed(self, now: float) -> None:
        self.renew_retry_at = now + RETRY_SECONDS

    # --- SIGTERM --------------------------------------------------------------------------------------------

    def stop(self, now: float, grace_seconds: float, follow_seconds: float = 0.0) -> bool:
        """A stop was asked: hand off within `grace_seconds`, following the operator's assignment for the
        first `follow_seconds` of it. True the first time (the stop starts now)."""
        if self.stop_deadline is not None:
            return False
        self.stop_deadline = now + grace_seconds
        self.follow_until = now + min(follow_seconds, grace_seconds)
        return True

    def following(self, now: float) -> bool:
        """Whether a stop still waits for the operator to move the partitions (list at the claim retry)."""
        return self.follow_until is not None and now < self.follow_until

    def stop_outcome(self, now: float, *, owned: int) -> StopOutcome:
        if self.stop_deadline is None:
            return StopOutcome.RUNNING
        if owned == 0:
            return StopOutcome.DONE
        return StopOutcome.OUT_OF_TIME if now >= self.stop_deadline else StopOutcome.RUNNING

    # --- waking ---------------------------------------------------------------------------------------------

    def wake_at(self, now: float, *, renew_due: float | None, waiting: bool, nudged: bool = False) -> float:
        """When the loop's next turn is due at the latest (an engine report or a nudge wakes it sooner; a
        nudge held back by the floor, when the floor ends)."""
        deadlines = [now + IDLE_SECONDS, self.next_list]
        if nudged:
            deadlines.append(self.last_nudged_listing + NUDGE_FLOOR_SECONDS)
        if renew_due is not None:
            deadlines.append(max(renew_due, self.renew_retry_at))
        if waiting:
            deadlines.append(self.next_claim_retry)
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
        if self.follow_until is not None and now < self.follow_until:
            deadlines.append(self.follow_until)
        return min(deadlines)
