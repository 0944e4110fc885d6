"""The kopf registrations of the operator, and nothing else: each handler delegates to `reconcile`.

    registry = kopf.OperatorRegistry()
    register(registry, OperatorConfig(...))
    await kopf.operator(registry=registry, ...)

Each PartitionedConsumer's control-loop daemon runs the control loop that `open_loop` opens for it
(`reconcile.open_cluster_loop` unless a test passes its own).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import kopf

from hubshift.operator.kubernetes import reconcile
from hubshift.operator.kubernetes.api import KubeAdapter
from hubshift.operator.kubernetes.reconcile import CONTEXT_KEY, ClusterLoopOpener, OperatorContext
from hubshift.operator.kubernetes.render import CONSUMER_COMPONENT, MANAGER
from hubshift.operator.kubernetes.settings import OperatorConfig, apply_settings
from hubshift.operator.metrics import METRICS
from hubshift.spec import GROUP, PLURAL, VERSION

CR = (GROUP, VERSION, PLURAL)
CONSUMER_PODS = {"app.kubernetes.io/managed-by": MANAGER, "app.kubernetes.io/component": CONSUMER_COMPONENT}


def in_cluster_server(environ: Mapping[str, str]) -> str | None:
    """The API server as a pod reaches it: the `kubernetes` Service's address from the environment the
    kubelet sets (client-go's in-cluster config does the same), or None outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def service_account_login(
    info: kopf.ConnectionInfo | None, environ: Mapping[str, str]
) -> kopf.ConnectionInfo | None:
    """kopf's service-account credentials, aimed at the Service address rather than kopf's
    `https://kubernetes.default.svc`: that name needs cluster DNS, which not every cluster runs for every
    pod, while the address is always in the pod's environment (and in the API server's certificate)."""
    server = in_cluster_server(environ)
    if info is None or server is None:
        return info
    return dataclasses.replace(info, server=server)


def register_login(registry: kopf.OperatorRegistry) -> None:
    """Credentials as `KubeAdapter.from_environment` finds them: the pod's service account (at the
    `kubernetes` Service's address, as lightkube uses it), else `$KUBECONFIG` or `~/.kube/config` (kopf's
    own readers; no client library needed). Tests log in to their server with their own handler instead."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        in_pod = service_account_login(kopf.login_with_service_account(**kwargs), os.environ)
        return in_pod or kopf.login_with_kubeconfig(**kwargs)


def register(
    registry: kopf.OperatorRegistry,
    config: OperatorConfig,
    open_loop: ClusterLoopOpener = reconcile.open_cluster_loop,
) -> None:
    """Register every handler of the operator in `registry`."""

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        apply_settings(settings, config)
        # A test may put its own context (API server, metrics, control loop) in the memo first.
        if CONTEXT_KEY not in memo:
            memo[CONTEXT_KEY] = OperatorContext(
                kube=KubeAdapter.from_environment(),
                metrics=METRICS,
                open_loop=open_loop,
                consumer_image=config.consumer_image,
                access=config.access,
                unserved_namespace=config.unserved_namespace,
            )

    @kopf.on.resume(*CR, registry=registry, id="children")
    @kopf.on.create(*CR, registry=registry, id="children")
    @kopf.on.update(*CR, registry=registry, id="children")
    async def children(body: kopf.Body, memo: kopf.Memo, logger: reconcile.Logger, **_: Any) -> None:
        await reconcile.reconcile_children(body, memo, logger)

    @kopf.on.delete(*CR, registry=registry, optional=True, id="forget")
    async def forget(body: kopf.Body, memo: kopf.Memo, logger: reconcile.Logger, **_: Any) -> None:
        reconcile.forget(body, memo, logger)

    @kopf.index("pods", labels=CONSUMER_PODS, registry=registry, id="consumer_pods")  # the kwarg name
    def consumer_pods(body: kopf.Body, **_: Any) -> Mapping[Any, Any]:
        return reconcile.index_consumer_pod(body)

    @kopf.on.event("pods", labels=CONSUMER_PODS, registry=registry, id="consumer-pod")
    async def consumer_pod(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
        reconcile.observe_pod(reconcile.operator_context(memo), body, type)

    # One long-lived coroutine per PartitionedConsumer rather than a timer: a pod event wakes it at once,
    # its period is the CR's own polling interval, and it logs nothing per tick. A running cycle gets
    # `cancellation_backoff` seconds to finish before the daemon is cancelled.
    @kopf.daemon(
        *CR, registry=registry, id="control-loop", cancellation_backoff=10.0, cancellation_timeout=20.0
    )
    async def control(
        body: kopf.Body,
        memo: kopf.Memo,
        stopped: kopf.DaemonStopped,
        logger: reconcile.Logger,
        consumer_pods: kopf.Index[Any, Any] | None = None,  # the index above, by its name
        **_: Any,
    ) -> None:
        pods = consumer_pods if consumer_pods is not None else {}  # a live view: never `or`
        await reconcile.run_control_loop(body, memo, stopped, pods, logger)
