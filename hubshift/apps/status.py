"""`hubshift status`: the ownership table of a hub's consumer group, its checkpoints and the assignment."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from hubshift.errors import UserError
from hubshift.ownership.model import OwnershipSnapshot
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import StoreError
from hubshift.ownership.stores.connect import open_store


@click.command(name="status")
@click.option(
    "--store",
    envvar="HUBSHIFT_STORE",
    required=True,
    help="sqlite:///PATH or an Azure Storage connection string (or set HUBSHIFT_STORE, to keep keys "
    "out of the process list).",
)
@click.option("--container", default=None, help="Blob container of the PartitionedConsumer (Azure only).")
@click.option("--namespace", "fqns", required=True, help="Fully qualified Event Hubs namespace.")
@click.option("--hub", required=True, help="Event Hub name.")
@click.option("--consumer-group", default="$Default", show_default=True, help="Consumer group.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(store: str, container: str | None, fqns: str, hub: str, consumer_group: str, output: str) -> None:
    """Show partition owners, checkpoints, the assignment and its phase."""
    try:
        scope = Scope(fqns, hub, consumer_group)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    lease_store = open_store(store, container)
    try:
        snapshot = take_snapshot(lease_store, scope)
    except StoreError as exc:
        raise UserError(f"cannot read the ownership records of {scope}: {exc}") from None
    finally:
        lease_store.close()
    if output == "json":
        click.echo(json.dumps(status_document(snapshot), indent=2))
    else:
        print_table(snapshot)


def status_document(snapshot: OwnershipSnapshot) -> dict[str, Any]:
    """The `--output json` object (stable keys: scripts and tests read it)."""
    assignment = snapshot.assignment
    return {
        "namespace": snapshot.scope.fqns,
        "hub": snapshot.scope.hub,
        "consumerGroup": snapshot.scope.consumer_group,
        "partitions": [
            {
                "partition": p.partition,
                "owner": p.owner,
                "lastModified": p.last_modified.isoformat(),
                "offset": p.checkpoint.offset,
                "sequenceNumber": p.checkpoint.sequence_number,
                "ownerAlive": p.owner_alive,
                "ownerLevel": p.owner_level,
                "leaseState": p.lease_state.value,
                "assignedTo": None if assignment is None else assignment.owner_of(p.partition),
                "plannedFor": None if assignment is None else assignment.planned.get(p.partition),
            }
            for p in snapshot.partitions
        ],
        "members": [{"consumer": m.consumer, "alive": m.alive} for m in snapshot.members],
        "phase": None if assignment is None else assignment.phase.value,
        "generation": None if assignment is None else assignment.generation,
        "assignment": None if assignment is None else dict(assignment.partitions),
        "planned": None if assignment is None else dict(assignment.planned),
        "change": None if assignment is None or assignment.change is None else assignment.change.value,
        "replicas": None if assignment is None else assignment.replicas,
        "holddownUntil": (
            None
            if assignment is None or assignment.holddown_until is None
            else assignment.holddown_until.isoformat()
        ),
    }


def print_table(snapshot: OwnershipSnapshot) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    assignment = snapshot.assignment
    title = (
        "no assignment record (consumers balance themselves)"
        if assignment is None
        else f"assignment generation {assignment.generation}, phase {assignment.phase.value}"
        + ("" if assignment.change is None else f", {assignment.change.value} change")
    )
    table = Table(title=f"{snapshot.scope}: {title}", title_justify="left")
    for column in ("Namespace", "Hub", "Consumer group", "Owner", "Partition", "Last modified"):
        table.add_column(column, overflow="fold")
    table.add_column("Offset", justify="right")
    table.add_column("Sequence number", justify="right")
    table.add_column("Owner level", justify="right")
    if assignment is not None:
        table.add_column("Assigned to")
    for p in snapshot.partitions:
        if p.owner is None:
            owner = "[dim](free)[/dim]"
        elif p.owner_alive:
            owner = p.owner
        else:
            owner = f"{p.owner} [red](gone)[/red]"
        row = [
            snapshot.scope.fqns,
            snapshot.scope.hub,
            snapshot.scope.consumer_group,
            owner,
            p.partition,
            p.last_modified.strftime("%Y-%m-%d %H:%M:%S UTC"),
            p.checkpoint.offset,
            str(p.checkpoint.sequence_number),
            str(p.owner_level),
        ]
        if assignment is not None:
            reader = assignment.owner_of(p.partition) or "-"
            planned = assignment.planned.get(p.partition)
            row.append(reader if planned is None else f"{reader} -> {planned} (planned, not ready)")
        table.add_row(*row)
    console.print(table)
    if not snapshot.partitions:
        console.print("no partition has been claimed or checkpointed in this consumer group yet")
    members = ", ".join(f"{m.consumer}{'' if m.alive else ' (gone)'}" for m in snapshot.members)
    console.print(f"consumers: {members or 'none registered'}")
