"""The operator's configuration: one typed object from the command line, applied to kopf in one place."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import kopf

from hubshift.operator.access import AccessPolicy
from hubshift.operator.kubernetes.render import DEFAULT_IMAGE
from hubshift.spec import GROUP


@dataclass(frozen=True)
class OperatorConfig:
    #: Namespaces to watch; empty with `clusterwide` means all of them.
    namespaces: tuple[str, ...] = ()
    clusterwide: bool = True
    #: kopf peering object name; None runs standalone (one replica, no peering objects needed).
    peering: str | None = None
    #: Among peers, the highest priority runs and the others stand by; equal priorities would all freeze.
    priority: int = 0
    #: `/metrics` port; None serves none.
    metrics_port: int | None = 9100
    #: kopf's `/healthz` port; None serves none.
    liveness_port: int | None = 8080
    #: Kubernetes Events for kopf's own handler failures (ours are posted by the runtime).
    post_events_from_level: int = logging.WARNING
    #: The consumer pods' image when a resource names none (the chart passes the operator's own).
    consumer_image: str = DEFAULT_IMAGE
    #: What resources may have the operator do, per namespace (`--access`, the chart's `operator.access` and
    #: `operator.allowedServiceAccounts`).
    access: AccessPolicy = field(default_factory=AccessPolicy)
    #: The operator's own namespace when it serves no resource there (`unserved_namespace`).
    unserved_namespace: str | None = None

    @property
    def liveness_endpoint(self) -> str | None:
        return None if self.liveness_port is None else f"http://0.0.0.0:{self.liveness_port}/healthz"


def apply_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Every kopf setting the operator changes; called once, from the startup handler."""
    # Peering: safe to run two replicas; the one with the higher priority works, the other waits.
    settings.peering.standalone = config.peering is None
    if config.peering is not None:
        settings.peering.name = config.peering
        settings.peering.mandatory = True
        settings.peering.priority = config.priority
    settings.peering.clusterwide = config.clusterwide

    settings.posting.enabled = True
    settings.posting.level = config.post_events_from_level

    # Watches: the server closes them every few minutes, so a silently dead connection never lasts.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.watching.reconnect_backoff = 2.0
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 30

    # A deleted PartitionedConsumer waits for its control-loop daemon to exit (kopf's finalizer); give a
    # running cycle this long to finish before kopf falls back to polling every `cancellation_backoff`.
    settings.background.instant_exit_timeout = 5.0

    # kopf's bookkeeping under our group's annotations, never in status (the status schema is ours).
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )


def unserved_namespace(own: str | None, namespaces: tuple[str, ...]) -> str | None:
    """The operator's own namespace (`own`, its pod's), where it serves no PartitionedConsumer unless it was
    given that namespace by name (`--namespace`, not a glob): there live its ServiceAccount (in the chart's
    default install allowed to read every Secret of the cluster), its Azure identity and its settings, and
    a resource's pods there could otherwise run as them. None when it serves every namespace it watches."""
    if not own or own in namespaces:
        return None
    return own
