"""hubshift's ownership timings: the one place they are set.

`bench/store_ops.py` measures what they cost (storage requests a day for 8 consumers x 32 partitions) and
the crash failover they allow, beside the Azure SDK processor's defaults (30 s cycle, 180 s expiry).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from hubshift.ownership.store import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS


@dataclass(frozen=True)
class Timing:
    """How often a consumer talks to the store, and how long its claims last."""

    # The membership lease: a consumer is alive while it holds it (Azure allows 15-60 s).
    membership_lease_seconds: int = 30
    # Renew at half the lease, so one failed renewal still leaves a retry before expiry.
    renew_interval_seconds: float = 15.0
    # Stop reading this long before the lease could expire when renewals fail (clock drift, stopping time).
    safety_margin_seconds: float = 5.0
    # How often a consumer lists the scope (one request): assignment changes, orphans, fallback balancing.
    list_interval_seconds: float = 20.0
    # How often an owned partition's position is written (only when it moved).
    checkpoint_interval_seconds: float = 10.0
    # One storage request may take this long before it is retried (connect and read each).
    request_timeout_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not MIN_LEASE_SECONDS <= self.membership_lease_seconds <= MAX_LEASE_SECONDS:
            raise ValueError(
                f"membership lease must be {MIN_LEASE_SECONDS}-{MAX_LEASE_SECONDS} s, "
                f"got {self.membership_lease_seconds}"
            )
        if not 0 < self.renew_interval_seconds <= self.membership_lease_seconds / 2:
            raise ValueError("renew interval must be positive and at most half the membership lease")
        if not 0 <= self.safety_margin_seconds < self.membership_lease_seconds - self.renew_interval_seconds:
            raise ValueError("safety margin must leave time between the last renewal and the deadline")
        if self.list_interval_seconds <= 0 or self.checkpoint_interval_seconds <= 0:
            raise ValueError("list and checkpoint intervals must be positive")


DEFAULT_TIMING = Timing()


def epoch_seconds(value: object) -> float | None:
    """Epoch seconds of an ISO 8601 / RFC 3339 time as Kubernetes and Spark write it (`...Z` or an offset);
    None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
