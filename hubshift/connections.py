"""From a manifest and an environment to the services it names: the one place where a spec's checkpoint
store is opened and its Event Hub resolved, for the consumer, both operator runtimes and the applications.

Each connection authenticates with a connection string from the environment variable the spec names
(`...ConnectionStringEnv`; in a cluster the operator, for itself, and the pods, through their Secrets, put
it there) or with a Microsoft Entra ID token credential (`credential`), built by `hubshift.identity`. The
operator passes its own identity (`identity`), which then stands in for every credential the spec names:
it never acts as an identity a resource chose. Errors are one line (`UserError`) that names the variable
or field to fix, never a secret.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import click

from hubshift.azure_storage import BlobContainer
from hubshift.errors import UserError
from hubshift.eventhubs.target import TRANSPORTS, EventHubsTarget, Network, parse_proxy, resolve_target
from hubshift.identity import CREDENTIAL_TYPES, IdentityCredential, parse_identity
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseStore
from hubshift.ownership.stores.locations import open_store, sqlite_url
from hubshift.ownership.timing import DEFAULT_TIMING, Timing
from hubshift.spec.connections import Resolved, TokenCredentialSpec
from hubshift.spec.hub import EventHubsSpec
from hubshift.spec.store import BlobStoreSpec, CheckpointStoreSpec

CREDENTIAL_ENV = "HUBSHIFT_CREDENTIAL"
CLIENT_ID_ENV = "HUBSHIFT_CLIENT_ID"
TRANSPORT_ENV = "HUBSHIFT_TRANSPORT"
PROXY_ENV = "HUBSHIFT_PROXY"

Command = TypeVar("Command", bound=Callable[..., object])


def event_hubs_target(
    spec: EventHubsSpec, environ: Mapping[str, str], *, identity: TokenCredentialSpec | None = None
) -> EventHubsTarget:
    """The hub the consumers read, with its connection string (checked for shape, not yet connected) or its
    token credential (`identity` in its place when given)."""
    return resolve_target(spec, environ, identity=identity)


def ownership_scope(target: EventHubsTarget) -> Scope:
    """Where the pool's leases, checkpoints and assignment live in its store."""
    return Scope(target.fqns, target.hub, target.consumer_group)


def open_checkpoint_store(
    spec: CheckpointStoreSpec,
    environ: Mapping[str, str],
    *,
    timing: Timing = DEFAULT_TIMING,
    create: bool = True,
    identity: TokenCredentialSpec | None = None,
    location: tuple[str | int, ...] = ("spec", "checkpointStore"),
) -> LeaseStore:
    """The checkpoint store the spec names, reachable and with its container (or file) in place (`create`
    makes them); a Blob store with a token credential uses `identity` in its place when given. `location`:
    where the block is, for messages."""
    if spec.sqlite is not None:
        return open_store(sqlite_url(spec.sqlite.path), create=create, timing=timing)
    named = spec.connections(location, "store")
    if not named:  # the model requires exactly one of them
        raise UserError(f"{'.'.join(map(str, location))}: set exactly one of blob or sqlite")
    assert spec.blob is not None
    container = blob_container(spec.blob, named[0].resolve(environ, identity=identity))
    return open_store(container, create=create, timing=timing)


def blob_container(block: BlobStoreSpec, resolved: Resolved) -> BlobContainer:
    """The container a Blob block names (the checkpoint store's, a Blob sink's), reached with its resolved
    connection string, or with its account URL and the resolved token credential."""
    if resolved.identity is not None:
        assert block.account_url is not None  # the model requires it with a credential
        token = IdentityCredential(resolved.identity)
        return BlobContainer(block.container, account_url=block.account_url.rstrip("/"), token=token)
    return BlobContainer(block.container, connection_string=resolved.connection_string or "")


def credential_options(help_text: str) -> Callable[[Command], Command]:
    """A command's `--credential TYPE` and `--client-id ID` (also `HUBSHIFT_CREDENTIAL`,
    `HUBSHIFT_CLIENT_ID`): a Microsoft Entra ID token credential; `help_text` says what it is used for."""

    def decorate(command: Command) -> Command:
        command = click.option(
            "--client-id",
            envvar=CLIENT_ID_ENV,
            default=None,
            help="With --credential: the client id of a user-assigned identity (or $HUBSHIFT_CLIENT_ID).",
        )(command)
        return click.option(
            "--credential",
            type=click.Choice(CREDENTIAL_TYPES),
            envvar=CREDENTIAL_ENV,
            default=None,
            help=f"{help_text} (or ${CREDENTIAL_ENV}): workloadIdentity (AKS), managedIdentity, or default "
            "(azure-identity's DefaultAzureCredential: environment, workload or managed identity, Azure "
            "CLI).",
        )(command)

    return decorate


def chosen_identity(credential: str | None, client_id: str | None) -> TokenCredentialSpec | None:
    """The identity `--credential` and `--client-id` name; None without `--credential`."""
    if credential is None:
        if client_id:
            raise UserError(
                "--client-id goes with --credential (workloadIdentity, managedIdentity or default)"
            )
        return None
    return parse_identity(credential, client_id)


def network_options(command: Command) -> Command:
    """A command's `--transport` and `--proxy` (also `HUBSHIFT_TRANSPORT`, `HUBSHIFT_PROXY`): how it reaches
    the Event Hubs it names, as a manifest's hub block says with `transport` and `proxy`."""
    command = click.option(
        "--proxy",
        envvar=PROXY_ENV,
        default=None,
        metavar="URL",
        help=f"Reach Event Hubs through this HTTP proxy, http://[USER:PASSWORD@]HOST:PORT (or ${PROXY_ENV}, "
        "which keeps a password out of the process list); AMQP then goes over WebSockets.",
    )(command)
    return click.option(
        "--transport",
        type=click.Choice(TRANSPORTS),
        envvar=TRANSPORT_ENV,
        default=None,
        help=f"amqp (port 5671) or amqpWebSockets (port 443, for networks that let only HTTPS out) (or "
        f"${TRANSPORT_ENV}). Default: amqp, or amqpWebSockets with --proxy.",
    )(command)


def chosen_network(transport: str | None, proxy: str | None) -> Network:
    """The network `--transport` and `--proxy` name (a proxy carries WebSockets, as in a manifest)."""
    if not proxy:
        return Network("amqpWebSockets" if transport == "amqpWebSockets" else "amqp")
    if transport == "amqp":
        raise UserError("--proxy carries AMQP over WebSockets: leave --transport out or set amqpWebSockets")
    return Network("amqpWebSockets", parse_proxy(proxy))
