"""What a consumer pod asks of its node: CPU and memory, as Kubernetes quantities."""

from __future__ import annotations

from pydantic import Field

from hubshift.spec.base import Model

# A Kubernetes resource quantity (what `kubectl` accepts for sizes and CPUs: 512Mi, 1Gi, 10G, 250m, 1.5).
QUANTITY = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[KMGTPE]i?|[mkMGTPE])?$"


class ResourceListSpec(Model):
    cpu: str | None = Field(default=None, pattern=QUANTITY, description="A quantity: 500m, 1, 2.")
    memory: str | None = Field(default=None, pattern=QUANTITY, description="A quantity: 512Mi, 2Gi.")


class ResourcesSpec(Model):
    """The consumer container's CPU and memory (a Pod's `resources`): Spark's driver and the receivers."""

    requests: ResourceListSpec = Field(
        default_factory=lambda: ResourceListSpec(cpu="1", memory="2Gi"),
        description="What the scheduler reserves on a node for each consumer pod.",
    )
    limits: ResourceListSpec = Field(
        default_factory=lambda: ResourceListSpec(memory="3Gi"),
        description="The most a consumer pod may use (over its memory limit it is killed).",
    )
