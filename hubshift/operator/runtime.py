"""What the control loop needs from the place consumers run: Kubernetes (pods of a StatefulSet) or this
machine (processes). The loop itself (`operator/loop/`) is the same for both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ConsumerInstance:
    """One consumer as its runtime sees it."""

    name: str  # identity: the StatefulSet pod name (`<cr>-<ordinal>`) or the local process's name
    ordinal: int
    ready: bool  # running and passing its readiness probe
    address: str | None  # host:port of its HTTP server (nudges, metrics); None while unknown
    terminating: bool = False  # being deleted (pod deletionTimestamp / process asked to stop)
    revision: str | None = None  # the StatefulSet revision the pod was made from (None: not a StatefulSet's)


class ConsumerRuntime(Protocol):
    async def consumers(self) -> list[ConsumerInstance]:
        """The consumers that exist now, ordered by ordinal."""
        ...

    async def replicas(self) -> int:
        """The replica count currently asked of the runtime (StatefulSet spec.replicas)."""
        ...

    async def set_replicas(self, count: int) -> None: ...

    async def revision(self) -> str | None:
        """The revision new consumers are made from (the StatefulSet's update revision), once the runtime
        has seen its current spec; None when unknown or not versioned (this machine)."""
        ...

    async def replace_consumer(self, name: str) -> bool:
        """Stop one consumer so that the runtime makes it again at the current revision (an eviction: a
        PodDisruptionBudget may refuse it, then False)."""
        ...

    async def record_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """A Kubernetes Event on the PartitionedConsumer (locally: a log line)."""
        ...

    async def publish_status(self, status: dict[str, object]) -> None:
        """The PartitionedConsumer's status subresource (locally: a file `hubshift status` can read)."""
        ...
