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
    requests: ResourceListSpec = Field(default_factory=lambda: ResourceListSpec(cpu="1", memory="2Gi"))
    limits: ResourceListSpec = Field(default_factory=lambda: ResourceListSpec(memory="3Gi"))
