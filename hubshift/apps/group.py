"""The options of the commands about one consumer group's records (`status`, `checkpoints`, `release`): where
its store is, which hub and group, and how to read the hub (its connection string or a token credential,
over which transport and proxy); and opening what they name, with one-line errors and no secret in them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from hubshift.connections import (
    Command,
    chosen_identity,
    chosen_network,
    credential_options,
    network_options,
)
from hubshift.errors import UserError
from hubshift.eventhubs.target import EventHubsTarget, hub_target
from hubshift.identity import IdentityCredential
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseStore
from hubshift.ownership.stores.locations import open_store, parse_store

_WHERE = (
    click.option(
        "--store",
        envvar="HUBSHIFT_STORE",
        required=True,
        help="sqlite:///PATH, an Azure Storage connection string (or set HUBSHIFT_STORE, to keep keys out of "
        "the process list), or a storage account URL (https://ACCOUNT.blob.core.windows.net) read with "
        "--credential.",
    ),
    click.option("--container", default=None, help="Blob container of the PartitionedConsumer (Azure only)."),
    click.option("--namespace", "fqns", required=True, help="Fully qualified Event Hubs namespace."),
    click.option("--hub", required=True, help="Event Hub name."),
    click.option("--consumer-group", default="$Default", show_default=True, help="Consumer group."),
)


def group_options(hub_use: str, *, required: bool = True) -> Callable[[Command], Command]:
    """The options naming a consumer group's records and its hub; `hub_use`: what the command reads the hub
    for (the help of --eventhubs and --credential); `required`: False for a command that can take them from
    elsewhere (a manifest, a resource), which then checks them itself (`GroupArgs.missing`)."""
    where = _WHERE if required else tuple(_optional(option) for option in _WHERE)
    reading = (
        click.option(
            "--eventhubs",
            envvar="HUBSHIFT_EVENTHUBS",
            default=None,
            help=f"The hub's Event Hubs connection string (or set HUBSHIFT_EVENTHUBS): {hub_use}.",
        ),
        credential_options(
            f"Read the hub at --namespace ({hub_use}) and a store given as an account URL with this token "
            "credential"
        ),
        network_options,
    )

    def decorate(command: Command) -> Command:
        for option in reversed((*where, *reading)):
            command = option(command)
        return command

    return decorate


def _optional(option: Callable[[Command], Command]) -> Callable[[Command], Command]:
    """The same option, not required (click keeps its settings on the decorator's closure: rebuilt here)."""

    def decorate(command: Command) -> Command:
        command = option(command)
        params = getattr(command, "__click_params__", None)
        if params:
            params[-1].required = False
        return command

    return decorate


def missing(options: Mapping[str, Any]) -> list[str]:
    """The options naming the records that were not given (--store, --namespace, --hub)."""
    names = {"store": "--store", "fqns": "--namespace", "hub": "--hub"}
    return [flag for key, flag in names.items() if not options.get(key)]


@dataclass(frozen=True)
class GroupArgs:
    """What the options named: the scope, where its store is, and how to reach its hub."""

    scope: Scope
    consumer_group: str  # as given (the scope lower-cases it; the service is asked with the user's spelling)
    store: str = field(repr=False)
    container: str | None
    eventhubs: str | None = field(repr=False)
    credential: str | None
    client_id: str | None
    transport: str | None
    proxy: str | None = field(repr=False)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> GroupArgs:
        """From a command's keyword arguments (`group_options`'); `UserError` for a malformed scope."""
        try:
            scope = Scope(options["fqns"], options["hub"], options["consumer_group"])
        except ValueError as exc:
            raise UserError(str(exc)) from None
        return cls(
            scope,
            options["consumer_group"],
            options["store"],
            options["container"],
            options["eventhubs"],
            options["credential"],
            options["client_id"],
            options["transport"],
            options["proxy"],
        )

    def open_store(self) -> LeaseStore:
        """The store (checked reachable, its container there); with --credential a store given as an
        account URL is read with the token credential."""
        identity = chosen_identity(self.credential, self.client_id)
        token = None if identity is None else IdentityCredential(identity)
        return open_store(parse_store(self.store, self.container, token=token))

    def target(self) -> EventHubsTarget | None:
        """The hub, with its connection string (--eventhubs) or the token credential (--credential); None
        when neither was given."""
        identity = chosen_identity(self.credential, self.client_id)
        if self.eventhubs:
            identity = None  # the connection string reads the hub (--credential, a store given as a URL)
        elif identity is None:
            return None
        return hub_target(
            self.scope.hub,
            self.consumer_group,
            connection_string=self.eventhubs,
            identity=identity,
            namespace=self.scope.fqns,
            network=chosen_network(self.transport, self.proxy),
            source="--eventhubs (HUBSHIFT_EVENTHUBS)",
            namespace_from="--namespace",
            advice="name the one the connection string's Endpoint names",
        )
