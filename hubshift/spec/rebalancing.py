"""How partitions move between consumers (`RebalanceSpec`: the strategy, the holddown, the handoff, the
membership lease), how consumer pods are replaced (`RolloutSpec`), and the time a stopping consumer has."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from hubshift.ownership.store import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from hubshift.ownership.timing import DEFAULT_TIMING, Timing
from hubshift.spec.base import Model

# SIGTERM: a consumer hands off within maxHandoffSeconds plus this; its pod gets EXIT_MARGIN_SECONDS more.
STOP_MARGIN_SECONDS = 10.0
EXIT_MARGIN_SECONDS = 20.0
# SIGTERM with an operator's assignment: keep reading this long at most while the operator moves the
# partitions (a planned handoff to consumers ready for them), then hand off whatever is left. It is spent
# inside the stop margin: the grace period does not count it again.
STOP_FOLLOW_SECONDS = 5.0


class RolloutSpec(Model):
    """How consumer pods are replaced when a change needs new ones (the image, the manifest they read)."""

    strategy: Literal["Operator", "RollingUpdate"] = Field(
        default="Operator",
        description="Operator: the control loop replaces the pods one at a time (StatefulSet OnDelete), each "
        "pod's partitions handed to the others before it is deleted and its replacement given its planned "
        "share when ready. RollingUpdate: the StatefulSet replaces them itself; each pod stopped hands its "
        "partitions off on SIGTERM and gets its share back when its replacement is ready.",
    )
    max_surge: int = Field(
        default=1,
        ge=0,
        le=1,
        description="Operator strategy: one extra pod during a rollout when scaling.maxReplicas allows it, "
        "so as many pods read as before while each one is replaced; 0: none (one pod fewer reads meanwhile).",
    )


RebalanceStrategy = Literal["balanced", "loadAware"]


class LoadAwareSpec(Model):
    """How `strategy: loadAware` weighs partitions and when their load moves them (docs/decisions.md,
    "Load-aware packing")."""

    window_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="A partition's load is the median of its rates between the probes of this window (a "
        "burst covering fewer than half of those intervals does not change it), or the nearer of the last "
        "two probes' rates when both moved the same way.",
    )
    tolerance: float = Field(
        default=0.2,
        gt=0,
        le=4,
        description="A consumer's partitions move for load when it carries more than (1 + tolerance) x the "
        "mean; they move until it carries at most (1 + tolerance / 2) x the mean.",
    )
    max_moves: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="Partitions moved for load alone per publication (a change of the consumers or "
        "partitions moves what it must).",
    )


class RebalanceSpec(Model):
    strategy: RebalanceStrategy = Field(
        default="balanced",
        description="balanced: every consumer reads as many partitions as the others (+-1); loadAware: "
        "partitions are packed by their measured incoming rate, moving as few as keep every consumer near "
        "the mean load.",
    )
    load_aware: LoadAwareSpec = Field(default_factory=LoadAwareSpec)
    delay_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="Holddown: after a change of the consumers nobody planned (a pod lost or back), wait "
        "this long for the set to settle before any handoff. A scale the operator decides does not wait; "
        "a partition it plans for a new consumer that nobody reads waits at most this long for it.",
    )
    max_handoff_seconds: float = Field(
        default=15.0,
        gt=0,
        le=600,
        description="After this long, a partition not released by its old owner is taken by force.",
    )
    lease_duration_seconds: int = Field(
        default=DEFAULT_TIMING.membership_lease_seconds,
        ge=MIN_LEASE_SECONDS,
        le=MAX_LEASE_SECONDS,
        description="Membership lease (Azure's bounds: 15-60 s).",
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)

    @property
    def stop_budget_seconds(self) -> float:
        """On SIGTERM a consumer hands every partition off within this: a handoff, plus a margin for the
        batch in flight to commit."""
        return self.max_handoff_seconds + STOP_MARGIN_SECONDS

    @property
    def termination_grace_seconds(self) -> int:
        """A consumer pod's grace period: the stop budget, then time for Spark to stop and the process to
        exit after its last release, before the kubelet's SIGKILL."""
        return math.ceil(self.stop_budget_seconds + EXIT_MARGIN_SECONDS)

    def timing(self, list_interval_seconds: float | None = None) -> Timing:
        """The consumer's ownership timings for this lease: renewed at half of it, stopped a safety margin
        before it could expire; the rest are the protocol's defaults."""
        lease = self.lease_duration_seconds
        return Timing(
            membership_lease_seconds=lease,
            renew_interval_seconds=lease / 2,
            safety_margin_seconds=min(DEFAULT_TIMING.safety_margin_seconds, lease / 2 - 1),
            list_interval_seconds=list_interval_seconds or DEFAULT_TIMING.list_interval_seconds,
        )
