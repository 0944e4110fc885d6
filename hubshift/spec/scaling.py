"""How many consumers: scaling on the backlog (or on lag in seconds) with at least KEDA ScaledObject's and
HPA's capabilities (`ScalingSpec`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hubshift.spec.base import Model, cel


class ScalingPolicySpec(Model):
    """One HPA scaling policy: at most `value` pods (or percent) per `periodSeconds`."""

    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1)
    period_seconds: int = Field(ge=1, le=1800)


class ScalingRulesSpec(Model):
    stabilization_window_seconds: int = Field(ge=0, le=3600)
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"
    policies: list[ScalingPolicySpec] = Field(default_factory=list)


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
    scale_up: ScalingRulesSpec = Field(default_factory=_default_scale_up)
    scale_down: ScalingRulesSpec = Field(default_factory=_default_scale_down)


class ScalingGoalSpec(Model):
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
    unprocessed_events: int = Field(
        default=0, ge=0, description="Scale from zero only when the backlog exceeds this."
    )


class FallbackSpec(Model):
    failure_threshold: int = Field(default=3, ge=1, description="Failed backlog reads before falling back.")
    replicas: int = Field(default=1, ge=0, description="Replica count while the backlog cannot be read.")
    behavior: Literal["static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"] = (
        "static"
    )


MAX_BELOW_MIN = "maxReplicas must be at least minReplicas"


class ScalingSpec(Model):
    """At least KEDA ScaledObject's capabilities, for Event Hubs backlog."""

    min_replicas: int = Field(default=1, ge=0, description="0 allows scale to zero.")
    max_replicas: int = Field(default=32, ge=1, description="Never more than the partition count either.")
    idle_replicas: int | None = Field(default=None, ge=0, le=0, description="KEDA idleReplicaCount (only 0).")
    polling_interval_seconds: float = Field(default=15.0, ge=1, description="How often the backlog is read.")
    cooldown_period_seconds: int = Field(default=300, ge=0, description="Idle time before scaling to zero.")
    initial_cooldown_period_seconds: int = Field(default=0, ge=0)
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
