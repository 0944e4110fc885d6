"""`KubernetesRuntime`: the control loop's consumers as the pods of a StatefulSet, and the connection
strings the operator itself needs, read from the Secrets the spec names.

Secrets: `read_secret` returns a `pydantic.SecretStr` whose repr and str are masked; nothing here logs a
Secret's value, puts it in an error message, an Event or a status.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from httpx2 import HTTPStatusError
from pydantic import SecretStr

from hubshift.manifest import PartitionedConsumer, connections_of
from hubshift.operator.kubernetes.api import KubeAdapter, consumer_instance, consumer_pod_labels, status_code
from hubshift.operator.kubernetes.render import ChildNames, Owner
from hubshift.operator.runtime import ConsumerInstance
from hubshift.spec import SecretKeyRefSpec

# The connections the control loop itself opens: it reads the backlog and the checkpoint store.
OPERATOR_ROLES = frozenset(("source", "store"))

logger = logging.getLogger(__name__)


# Pods from the operator's watch (kopf index), so a cycle sees a lost pod at once without listing.
PodSource = Callable[[], Iterable[ConsumerInstance]]


class KubernetesRuntime:
    """`ConsumerRuntime` for one PartitionedConsumer: a StatefulSet of consumer pods.

    `owner` is the resource's identity. `pods` is the operator's in-memory view of the consumer pods (a
    kopf index); without it the pods are listed from the API server.
    """

    def __init__(self, kube: KubeAdapter, owner: Owner, pods: PodSource | None = None) -> None:
        self.kube = kube
        self.owner = owner
        self.names = ChildNames.of(owner.name)
        self._pods = pods
        self._revision: str | None = None  # the update revision the last `replicas()` read

    async def consumers(self) -> list[ConsumerInstance]:
        if self._pods is not None:
            instances: Sequence[ConsumerInstance] = list(self._pods())
        else:
            pods = await self.kube.list_pods(self.owner.namespace, consumer_pod_labels(self.owner.name))
            instances = [consumer_instance(pod) for pod in pods]
        return sorted(instances, key=lambda instance: (instance.ordinal, instance.name))

    async def replicas(self) -> int:
        found = await self.kube.statefulset_state(self.owner.namespace, self.names.statefulset)
        self._revision = None if found is None else found[1]
        return 0 if found is None else found[0]

    async def revision(self) -> str | None:
        """The StatefulSet's update revision, as the cycle's `replicas()` read it."""
        return self._revision

    async def replace_consumer(self, name: str) -> bool:
        return await self.kube.evict_pod(self.owner.namespace, name)

    async def set_replicas(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"replica count must be >= 0, not {count}")
        await self.kube.scale_statefulset(self.owner.namespace, self.names.statefulset, count)

    async def record_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        try:
            await self.kube.post_event(self.owner, reason, message, warning=warning)
        except HTTPStatusError as error:  # an Event lost is no reason to stop the loop
            code = status_code(error)
            logger.warning("could not post event %s on %s: HTTP %d", reason, self.owner.name, code)

    async def publish_status(self, status: dict[str, object]) -> None:
        await self.kube.apply_status(self.owner, status)

    # beyond the protocol: the operator's own access to Event Hubs and the store

    async def read_secret(self, ref: SecretKeyRefSpec) -> SecretStr:
        """A key of a Secret in the CR's namespace (masked; call `.get_secret_value()` at the last moment)."""
        return await self.kube.read_secret(self.owner.namespace, ref)

    async def connection_environment(self, consumer: PartitionedConsumer) -> dict[str, str]:
        """The connection strings of the connections the control loop opens (the source and the checkpoint
        store, of `connections_of`), under the variable names the spec gives, as the consumer pods get
        them: only from the Secrets the spec names. Never the operator's own environment: whoever may create
        a PartitionedConsumer must not make the operator use credentials it holds for itself."""
        environment: dict[str, str] = {}
        for named in connections_of(consumer.spec):
            reference = named.connection.connection_string_secret_ref
            if named.role in OPERATOR_ROLES and reference is not None:
                secret = await self.read_secret(reference)
                environment[named.connection.connection_string_variable] = secret.get_secret_value()
        return environment
