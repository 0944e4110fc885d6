"""How many consumers: scaling on the backlog (or on lag in seconds) with at least KEDA ScaledObject's and
HPA's capabilities (`ScalingSpec`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hubshift.spec.base import Model, cel


class ScalingPolicySpec(Model):
    """One HPA scaling policy: at most `value` pods (or percent) per `periodSeconds`."""

    type: Literal["Pods", "Percent"] = Field(
        description="Pods: value is a number of pods; Percent: of the current."
    )
    value: int = Field(ge=1, description="How many pods (or what percent of the current count) per period.")
    period_seconds: int = Field(ge=1, le=1800, description="The window the policy counts changes over.")


class ScalingRulesSpec(Model):
    """How fast the pool may change in one direction (an HPA's `behavior.scaleUp` / `scaleDown`)."""

    stabilization_window_seconds: int = Field(
        ge=0,
        le=3600,
        description="The recommendations of this many past seconds are considered: a scale-up goes to the "
        "lowest of them, a scale-down to the highest (no flapping).",
    )
    select_policy: Literal["Max", "Min", "Disabled"] = Field(
        default="Max",
        description="Max: the policy allowing the biggest change; Min: the smallest; Disabled: no change in "
        "this direction.",
    )
    policies: list[ScalingPolicySpec] = Field(
        default_factory=list, description="Rate limits (none: any change at once)."
    )


def _default_scale_up() -> ScalingRulesSpec:
    # HPA's own default: the higher of +4 pods or +100% per 60 s, no stabilisation.
    return ScalingRulesSpec(
        stabilization_window_seconds=0,
        select_policy="Max",
        policies=[
            ScalingPolicySpec(type="Pods", value=4, period_seconds=60),
            ScalingPolicySpec(type="Percent", value=100, period_seconds=60),
        ],
    )


def _default_scale_down() -> ScalingRulesSpec:
    # HPA's own default: 300 s stabilisation, any amount per 15 s.
    return ScalingRulesSpec(
        stabilization_window_seconds=300,
        select_policy="Max",
        policies=[ScalingPolicySpec(type="Percent", value=100, period_seconds=15)],
    )


class ScalingBehaviorSpec(Model):
    """An HPA's `behavior`, with its defaults."""

    scale_up: ScalingRulesSpec = Field(
        default_factory=_default_scale_up,
        description="Default as an HPA's: no stabilisation, at most +4 pods or +100% (the higher) per 60 s.",
    )
    scale_down: ScalingRulesSpec = Field(
        default_factory=_default_scale_down,
        description="Default as an HPA's: a 300 s stabilisation window, then any amount per 15 s.",
    )


class ScalingGoalSpec(Model):
    """What the pool is sized for: a backlog per replica, or a lag in seconds."""

    unprocessed_events_per_replica: int = Field(
        default=1000, ge=1, description="Backlog one replica is expected to carry (KEDA: 64)."
    )
    lag_seconds: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="Lag target in seconds: replicas from each consumer's measured capacity and each "
        "partition's incoming rate and backlog, so that the worst partition's lag stays under this. Until "
        "a capacity is measured, unprocessedEventsPerReplica decides.",
    )


class ActivationSpec(Model):
    """When a pool at zero starts (KEDA's activation threshold)."""

    unprocessed_events: int = Field(
        default=0, ge=0, description="Scale from zero only when the backlog exceeds this."
    )


class FallbackSpec(Model):
    """What the pool does while the backlog cannot be read (KEDA's fallback); unset: keep the count."""

    failure_threshold: int = Field(default=3, ge=1, description="Failed backlog reads before falling back.")
    replicas: int = Field(default=1, ge=0, description="Replica count while the backlog cannot be read.")
    behavior: Literal["static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"] = (
        Field(
            default="static",
            description="static: replicas; currentReplicas: keep the count; currentReplicasIfHigher: the "
            "higher of the two; currentReplicasIfLower: the lower (KEDA's fallback behaviors).",
        )
    )


MAX_BELOW_MIN = "maxReplicas must be at least minReplicas"


class ScalingSpec(Model):
    """At least KEDA ScaledObject's capabilities, for Event Hubs backlog."""

    min_replicas: int = Field(default=1, ge=0, description="0 allows scale to zero.")
    max_replicas: int = Field(default=32, ge=1, description="Never more than the partition count either.")
    idle_replicas: int | None = Field(default=None, ge=0, le=0, description="KEDA idleReplicaCount (only 0).")
    polling_interval_seconds: float = Field(default=15.0, ge=1, description="How often the backlog is read.")
    cooldown_period_seconds: int = Field(default=300, ge=0, description="Idle time before scaling to zero.")
    initial_cooldown_period_seconds: int = Field(
        default=0, ge=0, description="After the resource is created, no scale to zero for this long."
    )
    target: ScalingGoalSpec = Field(default_factory=ScalingGoalSpec)
    activation: ActivationSpec = Field(default_factory=ActivationSpec)
    behavior: ScalingBehaviorSpec = Field(default_factory=ScalingBehaviorSpec)
    fallback: FallbackSpec | None = None
    align_to_partitions: bool = Field(
        default=True,
        description="Round replica counts to ones that spread partitions evenly (e.g. 32 partitions: "
        "1,2,3,4,5,6,7,8,11,16,32).",
    )

    @property
    def may_scale_to_zero(self) -> bool:
        return self.min_replicas == 0 or self.idle_replicas == 0

    CEL = (
        cel(
            "!has(self.maxReplicas) || !has(self.minReplicas) || self.maxReplicas >= self.minReplicas",
            MAX_BELOW_MIN,
            ".maxReplicas",
        ),
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScalingSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError(MAX_BELOW_MIN)
        return self
