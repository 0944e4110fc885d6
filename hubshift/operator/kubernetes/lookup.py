"""A PartitionedConsumer read from a cluster by a command on a person's machine (`hubshift status
pcon/NAME`): the resource through the person's kubeconfig, and the connection strings of the connections
the command opens from the Secrets the resource names, with the person's own access. Errors are one line;
no Secret's value is ever in one."""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from pathlib import Path

import httpx2
from httpx2 import HTTPStatusError
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ConfigError

from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumer, connections_of
from hubshift.operator.kubernetes.api import KubeAdapter, is_object_name, status_code
from hubshift.operator.kubernetes.render import MANAGER, consumer_from_body
from hubshift.spec import GROUP, KIND, PLURAL, SHORT_NAME, Role

# What `kubectl get` accepts for the kind: pcon/NAME, partitionedconsumer/NAME, partitionedconsumers/NAME,
# and each with the group (partitionedconsumer.hubshift.dev/NAME).
_KINDS = {SHORT_NAME, KIND.lower(), PLURAL}
_REFERENCE = re.compile(r"^(?P<kind>[a-z.]+)/(?P<name>[^/]+)$")


def parse_reference(text: str) -> str:
    """The resource's name from `pcon/NAME` (or the kind spelled out, with or without its group)."""
    match = _REFERENCE.match(text.strip().lower())
    kind = "" if match is None else match.group("kind").removesuffix(f".{GROUP}")
    if match is None or kind not in _KINDS or not is_object_name(match.group("name")):
        raise UserError(f"{text!r}: expected pcon/NAME (a PartitionedConsumer and its name)")
    return match.group("name")


def kube_client(kubeconfig: str | None, context: str | None) -> tuple[AsyncClient, str]:
    """A client with the person's kubeconfig (`kubeconfig`, else $KUBECONFIG's first file, else
    ~/.kube/config) and its context (`context`, else the current one), and that context's namespace."""
    path = kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or "~/.kube/config"
    file = Path(path).expanduser()
    try:
        config = KubeConfig.from_file(file)
        chosen = config.get(context_name=context)
    except (ConfigError, OSError, ValueError, KeyError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise UserError(f"cannot use kubeconfig {file}: {reason}") from None
    if chosen is None:
        raise UserError(
            f"kubeconfig {file}: no context {context!r}" if context else f"kubeconfig {file}: no context"
        )
    return AsyncClient(config=chosen, field_manager=MANAGER), chosen.namespace or "default"


async def read_consumer(
    name: str,
    namespace: str | None,
    roles: Collection[Role],
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    secrets: bool = True,
) -> tuple[PartitionedConsumer, dict[str, str]]:
    """The resource as the API server has it, and (with `secrets`) the connection strings of its
    connections of `roles` from the Secrets it names, under the variables the spec gives, as its pods get
    them."""
    client, default_namespace = kube_client(kubeconfig, context)
    kube = KubeAdapter(client)
    where = f"{KIND} {namespace or default_namespace}/{name}"
    try:
        try:
            body = await kube.read_resource(namespace or default_namespace, name)
        except HTTPStatusError as error:
            code = status_code(error)
            reason = "not found" if code == 404 else "forbidden" if code == 403 else f"HTTP {code}"
            raise UserError(f"{where}: {reason}") from None
        except httpx2.HTTPError as error:
            raise UserError(f"cannot reach the Kubernetes API server: {type(error).__name__}") from None
        consumer = consumer_from_body(body)
        environment: dict[str, str] = {}
        for named in connections_of(consumer.spec) if secrets else []:
            reference = named.connection.connection_string_secret_ref
            if named.role in roles and reference is not None:
                value = await kube.read_secret(consumer.metadata.namespace, reference)
                environment[named.connection.connection_string_variable] = value.get_secret_value()
        return consumer, environment
    finally:
        await kube.close()
