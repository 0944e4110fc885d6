"""The operator's thin Kubernetes adapter (lightkube): the few API calls it makes.

Everything here is I/O against the API server; what to send is decided elsewhere (`render`, the control
loop). Children and the CR status are written with server-side apply under one field manager, so applying
the same thing twice changes nothing and a field we stop setting is removed.

Secrets: `read_secret` returns a `pydantic.SecretStr` whose repr and str are masked; no function here logs
a Secret's value, puts it in an error message, an Event or a status.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import socket
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from httpx2 import HTTPStatusError  # lightkube's HTTP client; its ApiError subclasses this
from lightkube import AsyncClient, KubeConfig
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Event, Pod, Secret, ServiceAccount
from lightkube.types import PatchType
from pydantic import SecretStr

from hubshift.errors import UserError
from hubshift.operator.kubernetes.render import CONSUMER_LABEL, JSON, MANAGER, Owner, selector_labels
from hubshift.operator.runtime import ConsumerInstance
from hubshift.podtemplate import METRICS_PORT_NAME
from hubshift.spec import (
    API_VERSION,
    DNS_SUBDOMAIN,
    GROUP,
    KIND,
    MAX_OBJECT_NAME,
    PLURAL,
    VERSION,
    SecretKeyRefSpec,
)

logger = logging.getLogger(__name__)

PartitionedConsumerResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)

EVENT_MESSAGE_LIMIT = 1024  # the API server refuses longer Event messages
REVISION_LABEL = "controller-revision-hash"  # the StatefulSet revision a pod was made from
_OBJECT_NAME = re.compile(DNS_SUBDOMAIN)
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SecretUnavailable(UserError):
    """A Secret or key the spec names cannot be read; the message names it, never its content."""


class ChildRefused(UserError):
    """The API server refused a child as the spec rendered it (HTTP 422: e.g. an affinity or a volume of the
    pod template it finds invalid); the message is the server's, naming the child's field."""


def is_object_name(name: str) -> bool:
    """Whether `name` is a Kubernetes object name (a DNS subdomain), safe to put into an API path."""
    return len(name) <= MAX_OBJECT_NAME and _OBJECT_NAME.fullmatch(name) is not None


def _shown(text: str) -> str:
    """A name a resource gave, for a message: quoted, at most 80 characters."""
    return repr(text if len(text) <= 80 else text[:80] + "...")


def consumer_pod_labels(consumer_name: str) -> dict[str, str]:
    """The labels that select one PartitionedConsumer's consumer pods."""
    return {**selector_labels(consumer_name), CONSUMER_LABEL: consumer_name}


def consumer_pod_selector(consumer_name: str) -> str:
    """`consumer_pod_labels` as a label selector string (`status.selector`, which the scale subresource
    hands an HPA to find the pool's pods)."""
    return ",".join(f"{key}={value}" for key, value in sorted(consumer_pod_labels(consumer_name).items()))


# --- pods as the control loop sees them ------------------------------------------------------------


def consumer_instance(pod: Mapping[str, Any]) -> ConsumerInstance:
    """A consumer pod as the runtime interface describes it (pure: reads the pod dict only)."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    name: str = metadata.get("name", "")
    labels = metadata.get("labels") or {}
    index = labels.get("apps.kubernetes.io/pod-index")
    suffix = name.rsplit("-", 1)[-1]
    ordinal = int(index) if index is not None and index.isdigit() else int(suffix) if suffix.isdigit() else -1
    ready = any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )
    port = None
    for container in (pod.get("spec") or {}).get("containers") or []:
        for container_port in container.get("ports") or []:
            if container_port.get("name") == METRICS_PORT_NAME:
                port = container_port.get("containerPort")
    ip = status.get("podIP")
    address = f"{ip}:{port}" if ip and port else None
    terminating = bool(metadata.get("deletionTimestamp")) or status.get("phase") in ("Succeeded", "Failed")
    return ConsumerInstance(
        name=name,
        ordinal=ordinal,
        ready=ready and not terminating,
        address=address,
        terminating=terminating,
        revision=labels.get(REVISION_LABEL),
    )


def status_code(error: HTTPStatusError) -> int:
    """The HTTP status of a failed API call (lightkube raises `ApiError`, a subclass, for JSON bodies)."""
    return error.response.status_code


def server_message(error: HTTPStatusError) -> str:
    """The API server's own message of a refusal (its Status), on one line."""
    status = getattr(error, "status", None)
    message = getattr(status, "message", None) or error.response.text
    return " ".join(str(message).split())[:EVENT_MESSAGE_LIMIT]


def _as_dict(obj: Any) -> JSON:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    return cast(JSON, obj.to_dict())


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the adapter -----------------------------------------------------------------------------------


class KubeAdapter:
    """The few API calls the operator makes, over one lightkube client."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()

    @classmethod
    def from_environment(cls) -> KubeAdapter:
        """In a pod: its service account; elsewhere `$KUBECONFIG` or `~/.kube/config` (as kopf does)."""
        return cls(AsyncClient(field_manager=MANAGER))

    @classmethod
    def from_server(cls, url: str) -> KubeAdapter:
        """An API server without authentication (tests: kmock)."""
        config = KubeConfig.from_dict(
            {
                "clusters": [{"name": "server", "cluster": {"server": url}}],
                "users": [{"name": "anonymous", "user": {}}],
                "contexts": [{"name": "server", "context": {"cluster": "server", "user": "anonymous"}}],
                "current-context": "server",
            }
        )
        return cls(AsyncClient(config=config, field_manager=MANAGER))

    async def close(self) -> None:
        await self.client.close()

    async def read_resource(self, namespace: str, name: str) -> JSON:
        """A PartitionedConsumer as the API server has it (`HTTPStatusError` as the server answered)."""
        return _as_dict(await self.client.get(PartitionedConsumerResource, name, namespace=namespace))

    # children

    async def apply(self, document: Mapping[str, Any]) -> JSON:
        """Create or update one object by server-side apply (we own what we set; nobody else's fields)."""
        resource: Any = resource_registry.load(document["apiVersion"], document["kind"])
        metadata = document["metadata"]
        try:
            result = await self.client.patch(
                resource,
                metadata["name"],
                dict(document),
                namespace=metadata.get("namespace"),
                patch_type=PatchType.APPLY,
                field_manager=MANAGER,
                force=True,
            )
        except HTTPStatusError as error:
            # A real API server creates on apply; some emulators answer 404 instead. Creating is equivalent.
            if status_code(error) != 404:
                raise
            result = await self.client.create(resource.from_dict(dict(document)), field_manager=MANAGER)
        return _as_dict(result)

    async def apply_all(self, documents: Iterable[Mapping[str, Any]]) -> None:
        """Apply each in order; `ChildRefused` when the API server finds one invalid."""
        for document in documents:
            try:
                await self.apply(document)
            except HTTPStatusError as error:
                if status_code(error) != 422:
                    raise
                what = f"{document['kind']} {document['metadata']['name']}"
                raise ChildRefused(f"the API server refused the {what}: {server_message(error)}") from None

    async def statefulset_replicas(self, namespace: str, name: str) -> int | None:
        """`spec.replicas` of the StatefulSet, or None when it does not exist."""
        found = await self.statefulset_state(namespace, name)
        return None if found is None else found[0]

    async def statefulset_state(self, namespace: str, name: str) -> tuple[int, str | None] | None:
        """(`spec.replicas`, the update revision) of the StatefulSet, None when it does not exist. The
        revision is None until the controller has seen the current spec (`observedGeneration`)."""
        try:
            statefulset = await self.client.get(StatefulSet, name, namespace=namespace)
        except HTTPStatusError as error:
            if status_code(error) == 404:
                return None
            raise
        spec, status, metadata = statefulset.spec, statefulset.status, statefulset.metadata
        replicas = int(spec.replicas) if spec is not None and spec.replicas is not None else 1
        generation = metadata.generation if metadata is not None else None
        seen = status is not None and generation is not None and status.observedGeneration == generation
        return replicas, status.updateRevision if seen and status is not None else None

    async def evict_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod through the Eviction API, so its PodDisruptionBudget counts it (as `kubectl drain`
        does): False when the budget refuses it now (429), True when it was evicted or is gone already."""
        eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        try:
            await self.client.create(eviction, name=name, namespace=namespace)
        except HTTPStatusError as error:
            code = status_code(error)
            if code == 404:
                return True
            if code == 429:
                return False
            raise
        return True

    async def scale_statefulset(self, namespace: str, name: str, replicas: int) -> None:
        await self.client.patch(
            StatefulSet.Scale,
            name,
            {"spec": {"replicas": replicas}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    async def service_account_owner(self, namespace: str, name: str) -> str | None:
        """Who keeps the ServiceAccount: the PartitionedConsumer whose operator created it (its name),
        "" when someone else did, None when there is none."""
        try:
            account = await self.client.get(ServiceAccount, name, namespace=namespace)
        except HTTPStatusError as error:
            if status_code(error) == 404:
                return None
            raise
        labels = (account.metadata.labels if account.metadata is not None else None) or {}
        if labels.get("app.kubernetes.io/managed-by") != MANAGER:
            return ""
        return str(labels.get(CONSUMER_LABEL, ""))

    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[JSON]:
        """The pods carrying all of `labels` (checked here too: some emulators ignore the selector)."""
        pods = self.client.list(Pod, namespace=namespace, labels=dict(labels))
        listed = [_as_dict(pod) async for pod in pods]
        return [
            pod for pod in listed if labels.items() <= (pod.get("metadata", {}).get("labels") or {}).items()
        ]

    # the operator's own credentials

    async def read_secret(self, namespace: str, ref: SecretKeyRefSpec) -> SecretStr:
        """A key of a Secret in `namespace`. lightkube joins the name into the request's path as it is, so a
        name that is not a Kubernetes object name (`../../team-b/secrets/eh` would read another namespace's
        Secret) is refused before any request, whatever the model or the CRD let through."""
        if not is_object_name(ref.name) or not _NAMESPACE.fullmatch(namespace) or len(namespace) > 63:
            raise SecretUnavailable(
                f"Secret {_shown(ref.name)} in namespace {_shown(namespace)}: not a Kubernetes object name "
                "(a DNS subdomain); nothing was read"
            )
        where = f"Secret {namespace}/{ref.name}"
        try:
            secret = await self.client.get(Secret, ref.name, namespace=namespace)
        except HTTPStatusError as error:
            code = status_code(error)
            reason = "not found" if code == 404 else "forbidden" if code == 403 else f"HTTP {code}"
            raise SecretUnavailable(f"{where}: {reason}") from None
        data = secret.data or {}
        if ref.key not in data:
            raise SecretUnavailable(f"{where} has no key {ref.key!r}")
        try:
            return SecretStr(base64.b64decode(data[ref.key]).decode())
        except (binascii.Error, UnicodeDecodeError):
            raise SecretUnavailable(f"{where}: key {ref.key!r} is not valid base64 text") from None

    # reporting

    async def post_event(
        self, owner: Owner, reason: str, message: str, *, warning: bool = False, action: str = ""
    ) -> None:
        """A core/v1 Event on the PartitionedConsumer (`kubectl describe pcon NAME` shows it)."""
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            # Named like client-go does (`<object>.<unix nanoseconds in hex>`), so no generateName is needed.
            "metadata": {"name": f"{owner.name}.{time.time_ns():x}", "namespace": owner.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": owner.name,
                "namespace": owner.namespace,
                "uid": owner.uid,
            },
            "reason": reason,
            "message": message[:EVENT_MESSAGE_LIMIT],
            "type": "Warning" if warning else "Normal",
            "action": action or reason,
            "source": {"component": MANAGER},
            "reportingComponent": MANAGER,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.client.create(cast(Event, Event.from_dict(event)))

    async def apply_status(self, owner: Owner, status: Mapping[str, Any]) -> None:
        """Replace the status fields this operator owns with `status` (server-side apply on /status), with
        the pods' selector the scale subresource reads."""
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": owner.name, "namespace": owner.namespace},
            "status": {**status, "selector": consumer_pod_selector(owner.name)},
        }
        await self.client.patch(
            PartitionedConsumerResource.Status,
            owner.name,
            body,
            namespace=owner.namespace,
            patch_type=PatchType.APPLY,
            field_manager=MANAGER,
            force=True,
        )
