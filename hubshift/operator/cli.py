"""`hubshift operator`: the Kubernetes operator for PartitionedConsumers (kopf), with its metrics served
beside it. `hubshift run`, the local runtime, is `operator/local/cli.py`."""

from __future__ import annotations

import functools
import importlib
import os
import random
from pathlib import Path
from typing import Any

import click
import yaml

from hubshift.errors import UserError
from hubshift.identity import CREDENTIAL_TYPES, parse_identity
from hubshift.log import quiet_libraries
from hubshift.operator.access import AccessPolicy, policy_from
from hubshift.operator.kubernetes import handlers, reconcile
from hubshift.operator.kubernetes.render import DEFAULT_IMAGE
from hubshift.operator.kubernetes.settings import OperatorConfig, unserved_namespace
from hubshift.operator.metrics import METRICS
from hubshift.operator.reservations import ScopeReservations


@click.command(name="operator")
@click.option(
    "--namespace",
    "-n",
    "namespaces",
    multiple=True,
    metavar="NS",
    help="Watch this namespace (repeatable; globs like 'team-*' work).",
)
@click.option("--all-namespaces", "-A", is_flag=True, help="Watch every namespace (the default).")
@click.option("--peering", metavar="NAME", help="Run with kopf peering NAME, so several replicas are safe.")
@click.option("--standalone", is_flag=True, help="No peering: the only replica (the default).")
@click.option(
    "--priority",
    type=int,
    help="Peering priority; the highest runs, the others stand by. Default: random, so no two peers tie.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=9100,
    show_default=True,
    help="Serve /metrics on this port (0: none).",
)
@click.option(
    "--liveness-port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Serve kopf's /healthz on this port (0: none).",
)
@click.option("--log-format", type=click.Choice(["plain", "full", "json"]), default="full", show_default=True)
@click.option("--verbose", "-v", is_flag=True, help="Log what every handler does.")
@click.option(
    "--credential",
    type=click.Choice(CREDENTIAL_TYPES),
    default="default",
    show_default=True,
    help="The operator's own identity: it reads the backlog and the checkpoint store of every "
    "PartitionedConsumer that uses a token credential with it, never with the identity the resource names. "
    "workloadIdentity (the chart's azure.workloadIdentity), managedIdentity, or default (azure-identity's "
    "DefaultAzureCredential).",
)
@click.option("--client-id", default=None, help="With --credential: a user-assigned identity's client id.")
@click.option(
    "--access",
    "access_file",
    type=click.Path(dir_okay=False),
    envvar="HUBSHIFT_OPERATOR_ACCESS",
    default=None,
    help="A YAML file (the chart's operator.access and operator.allowedServiceAccounts): per Kubernetes "
    "namespace, the Event Hubs namespaces and storage accounts the operator reads with its own identity, "
    "and extra host domains (namespaces, extraDomains); the existing ServiceAccounts the consumer pods may "
    "run as (allowedServiceAccounts). Without it, the operator reads nothing with its identity (resources "
    "with a token credential are refused) and the pods run only as the ServiceAccounts it creates.",
)
@click.option(
    "--consumer-image",
    envvar="HUBSHIFT_CONSUMER_IMAGE",
    default=DEFAULT_IMAGE,
    show_default=True,
    metavar="IMAGE",
    help="The consumer pods' image for every PartitionedConsumer that names none in spec.consumer.image "
    "(the chart passes the operator's own image, so upgrading the release upgrades the pools).",
)
@click.option(
    "--control-loop",
    "control_loop",
    metavar="MODULE:FUNCTION",
    hidden=True,
    help="Open each control loop with this function instead (tests: a loop that only reports).",
)
def operator(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    peering: str | None,
    standalone: bool,
    priority: int | None,
    metrics_port: int,
    liveness_port: int,
    log_format: str,
    verbose: bool,
    credential: str,
    client_id: str | None,
    access_file: str | None,
    consumer_image: str,
    control_loop: str | None,
) -> None:
    """Run the Kubernetes operator for PartitionedConsumers."""
    import kopf

    if namespaces and all_namespaces:
        raise UserError("give either --namespace or --all-namespaces, not both")
    if peering and standalone:
        raise UserError("give either --peering or --standalone, not both")
    if not consumer_image or any(character.isspace() for character in consumer_image):
        raise UserError(f"--consumer-image {consumer_image!r}: an image reference has no spaces")
    access = load_access(access_file)
    config = OperatorConfig(
        namespaces=namespaces,
        clusterwide=not namespaces,
        peering=peering,
        priority=priority if priority is not None else random.randint(1, 2**31 - 1),
        metrics_port=metrics_port or None,
        liveness_port=liveness_port or None,
        consumer_image=consumer_image,
        access=access,
        # The pod's namespace, from the downward API (the chart sets it).
        unserved_namespace=unserved_namespace(os.environ.get("POD_NAMESPACE"), namespaces),
    )
    identity = parse_identity(credential, client_id)
    if control_loop is None:
        # One registry of hubs and consumer groups per operator process: a second resource on one is refused.
        open_loop = functools.partial(
            reconcile.open_cluster_loop, identity=identity, access=access, reservations=ScopeReservations()
        )
    else:
        open_loop = _import_function(control_loop)
    registry = kopf.OperatorRegistry()
    handlers.register_login(registry)
    handlers.register(registry, config, open_loop)
    configure_operator_logging(log_format, verbose)
    if config.metrics_port is not None:
        try:
            METRICS.serve(config.metrics_port)
        except OSError as error:
            port = config.metrics_port
            raise UserError(f"cannot serve /metrics on port {port}: {error.strerror}") from None
    kopf.run(
        registry=registry,
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        standalone=config.peering is None,
        peering_name=config.peering,
        priority=config.priority,
        liveness_endpoint=config.liveness_endpoint,
    )


def load_access(path: str | None) -> AccessPolicy:
    """The access policy file (`--access`); an empty policy without one; `UserError` for a bad file."""
    if path is None:
        return AccessPolicy()
    try:
        document = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as error:
        raise UserError(f"--access {path}: {error.strerror}") from None
    except yaml.YAMLError:
        raise UserError(f"--access {path}: not valid YAML") from None
    if not isinstance(document, dict):
        raise UserError(
            f"--access {path}: expected a map with namespaces, extraDomains and allowedServiceAccounts"
        )
    try:
        return policy_from(document)
    except ValueError as error:
        raise UserError(f"--access {path}: {error}") from None


def configure_operator_logging(log_format: str, verbose: bool) -> None:
    """kopf's log format and level (INFO, DEBUG when verbose) for the operator's own lines, without the
    libraries' per-request lines: at INFO the Azure SDK logs every storage request of every cycle with its
    headers, httpx2 every API call and aiohttp every probe (`--verbose` keeps the API calls)."""
    import kopf

    kopf.configure(verbose=verbose, log_format=kopf.LogFormat[log_format.upper()])
    quiet_libraries(requests=not verbose)


def _import_function(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError):
        raise UserError(f"--control-loop {target}: no such module:function") from None
    if not callable(function):
        raise UserError(f"--control-loop {target}: not a function")
    return function
