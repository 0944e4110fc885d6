"""`hubshift status`: the ownership table of a hub's consumer group, its checkpoints and the assignment;
with the hub's connection string (`--eventhubs`) or a token credential (`--credential`), each partition's
backlog and lag in seconds, decided as the control loop decides them (`operator/partition_lag.py`, from the
times the owners write beside their checkpoints: no event is read).

The records are named by the options (`--store`, `--namespace`, `--hub`), or by what names them already: a
manifest (`-f FILE`: its blocks, their connection strings from the variables they name) or a resource in a
cluster (`pcon/NAME`, read with the person's kubeconfig, the connection strings from the Secrets it names);
then the hub is always read."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from hubshift.apps.group import GroupArgs, group_options, missing
from hubshift.connections import chosen_identity, event_hubs_target, open_checkpoint_store, ownership_scope
from hubshift.errors import UserError
from hubshift.eventhubs.management import read_partitions
from hubshift.eventhubs.model import PartitionInfo
from hubshift.manifest import PartitionedConsumer, load_manifest, with_credential
from hubshift.operator.observe import backlog_per_partition
from hubshift.operator.partition_lag import PartitionLag, lag_per_partition, worst_lag
from hubshift.ownership.model import OwnershipSnapshot
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseStore, StoreError
from hubshift.spec import Role
from hubshift.spec.checkpoints import StartPositionSpec

# The connections `hubshift status` opens of a manifest or resource: the hub and the checkpoint store.
STATUS_ROLES: tuple[Role, ...] = ("source", "store")


@click.command(name="status")
@click.argument("resource", required=False, metavar="[pcon/NAME]")
@click.option(
    "-f",
    "--filename",
    "manifest",
    default=None,
    metavar="FILE",
    help="A PartitionedConsumer manifest naming the hub, consumer group and store (instead of --store, "
    "--namespace and --hub); their connection strings from the variables it names.",
)
@click.option(
    "-n",
    "--resource-namespace",
    default=None,
    help="With pcon/NAME: the resource's Kubernetes namespace (default: the kubeconfig context's).",
)
@click.option("--kubeconfig", default=None, help="With pcon/NAME: the kubeconfig (default: $KUBECONFIG).")
@click.option("--context", default=None, help="With pcon/NAME: the kubeconfig context (default: current).")
@group_options("adds each partition's backlog and lag in seconds", required=False)
@click.option(
    "--start",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where a partition without a checkpoint starts (the manifest's startPosition): its backlog.",
)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(
    resource: str | None,
    manifest: str | None,
    resource_namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    start: str,
    output: str,
    **options: Any,
) -> None:
    """Show partition owners, checkpoints, the assignment and its phase (and, with --eventhubs or
    --credential, the backlog and lag in seconds of each partition). Name the records with --store,
    --namespace and --hub, or with a manifest (-f FILE) or a resource in the cluster (pcon/NAME), whose
    hub is then always read."""
    if resource is not None or manifest is not None:
        named, read = named_records(resource, manifest, resource_namespace, kubeconfig, context, options)
        show(named, read, output)
        return
    absent = missing(options)
    if absent:
        raise UserError(
            f"name the consumer group's records: {', '.join(absent)} (or a manifest, -f FILE, or a resource "
            "in the cluster, pcon/NAME)"
        )
    args = GroupArgs.from_options(options)
    snapshot = _read_records(args.open_store, args.scope)
    lag: Lag | None = None
    target = args.target()
    if target is not None:
        lag = hub_lag(
            snapshot,
            asyncio.run(read_partitions(target)),
            StartPositionSpec(type="latest" if start == "latest" else "earliest"),
            time.time(),
        )
    show(snapshot, lag, output)


def show(snapshot: OwnershipSnapshot, lag: Lag | None, output: str) -> None:
    if output == "json":
        click.echo(json.dumps(status_document(snapshot, lag), indent=2))
    else:
        print_table(snapshot, lag)


Lag = tuple[dict[str, int], dict[str, PartitionLag]]


def named_records(
    resource: str | None,
    manifest: str | None,
    resource_namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    options: dict[str, Any],
) -> tuple[OwnershipSnapshot, Lag]:
    """The records and lag of the consumer group a manifest or a resource names, read with the connection
    strings it names (or `--credential` in their place)."""
    if resource is not None and manifest is not None:
        raise UserError("give a manifest (-f FILE) or a resource (pcon/NAME), not both")
    given = [flag for key, flag in (("fqns", "--namespace"), ("hub", "--hub")) if options.get(key)]
    if given:
        raise UserError(f"{' and '.join(given)}: the {'manifest' if manifest else 'resource'} names them")
    identity = chosen_identity(options.get("credential"), options.get("client_id"))
    environ = dict(os.environ)
    if manifest is not None:
        consumer = load_manifest(manifest)
    else:
        consumer, secrets = resource_with_secrets(
            str(resource), resource_namespace, kubeconfig, context, with_secrets=identity is None
        )
        environ.update(secrets)
    if identity is not None:
        consumer = with_credential(consumer, identity, STATUS_ROLES)
    spec = consumer.spec
    target = event_hubs_target(spec.event_hubs, environ)
    snapshot = _read_records(
        lambda: open_checkpoint_store(spec.checkpoint_store, environ, create=False), ownership_scope(target)
    )
    partitions = asyncio.run(read_partitions(target))
    return snapshot, hub_lag(snapshot, partitions, spec.consumer.start_position, time.time())


def _read_records(opener: Callable[[], LeaseStore], scope: Scope) -> OwnershipSnapshot:
    """The ownership records of `scope`, read from the store `opener` opens (and closed after); a store
    that cannot be opened or read is one line naming the scope."""
    try:
        lease_store = opener()
    except StoreError as exc:
        raise UserError(f"cannot open the checkpoint store of {scope}: {exc}") from None
    try:
        return take_snapshot(lease_store, scope)
    except StoreError as exc:
        raise UserError(f"cannot read the ownership records of {scope}: {exc}") from None
    finally:
        lease_store.close()


def resource_with_secrets(
    reference: str, namespace: str | None, kubeconfig: str | None, context: str | None, *, with_secrets: bool
) -> tuple[PartitionedConsumer, dict[str, str]]:
    """A resource in a cluster (`pcon/NAME`) and the connection strings of its hub and store."""
    # lazy: the Kubernetes client only for a resource (the other ways of `hubshift status` never need it)
    from hubshift.operator.kubernetes import lookup

    name = lookup.parse_reference(reference)
    return asyncio.run(
        lookup.read_consumer(
            name, namespace, STATUS_ROLES, kubeconfig=kubeconfig, context=context, secrets=with_secrets
        )
    )


def hub_lag(
    snapshot: OwnershipSnapshot, partitions: dict[str, PartitionInfo], start: StartPositionSpec, now: float
) -> Lag:
    """Backlog and lag in seconds per partition, as the control loop decides them (no event read)."""
    backlog = backlog_per_partition(partitions, snapshot, start)
    return backlog, lag_per_partition(partitions, snapshot, backlog, {}, now)


def status_document(snapshot: OwnershipSnapshot, lag: Lag | None = None) -> dict[str, Any]:
    """The `--output json` object (stable keys: scripts and tests read it). With the hub read (`lag`),
    each partition has `backlog` and `lagSeconds` (null: not known yet), and the top level the worst."""
    assignment = snapshot.assignment
    worst = None if lag is None else worst_lag(lag[1])
    partitions: list[dict[str, Any]] = [
        {
            "partition": p.partition,
            "owner": p.owner,
            "lastModified": p.last_modified.isoformat(),
            "offset": p.checkpoint.offset,
            "sequenceNumber": p.checkpoint.sequence_number,
            "nextEnqueued": None if p.next_enqueued is None else p.next_enqueued.isoformat(),
            "ownerAlive": p.owner_alive,
            "ownerLevel": p.owner_level,
            "leaseState": p.lease_state.value,
            "assignedTo": None if assignment is None else assignment.assignee_of(p.partition),
            "plannedFor": None if assignment is None else assignment.planned.get(p.partition),
        }
        for p in snapshot.partitions
    ]
    if lag is not None:
        backlog, lags = lag
        for row in partitions:
            known = lags.get(str(row["partition"]))
            row["backlog"] = backlog.get(str(row["partition"]))
            row["lagSeconds"] = None if known is None or known.seconds is None else round(known.seconds, 3)
    return {
        "namespace": snapshot.scope.fqns,
        "hub": snapshot.scope.hub,
        "consumerGroup": snapshot.scope.consumer_group,
        "partitions": partitions,
        "lagSeconds": None if worst is None or worst.seconds is None else round(worst.seconds, 3),
        "laggingPartition": None if worst is None else worst.partition,
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


def print_table(snapshot: OwnershipSnapshot, lag: Lag | None = None) -> None:
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
    if lag is not None:
        table.add_column("Backlog", justify="right")
        table.add_column("Lag (s)", justify="right")
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
            assignee = assignment.assignee_of(p.partition) or "-"
            planned = assignment.planned.get(p.partition)
            row.append(assignee if planned is None else f"{assignee} -> {planned} (planned, not ready)")
        if lag is not None:
            known = lag[1].get(p.partition)
            row.append(str(lag[0].get(p.partition, "-")))
            row.append("?" if known is None or known.seconds is None else f"{known.seconds:.1f}")
        table.add_row(*row)
    console.print(table)
    if not snapshot.partitions:
        console.print("no partition has been claimed or checkpointed in this consumer group yet")
    members = ", ".join(f"{m.consumer}{'' if m.alive else ' (gone)'}" for m in snapshot.members)
    console.print(f"consumers: {members or 'none registered'}")
    if lag is None:
        console.print(
            "backlog and lag in seconds: pass the hub's connection string (--eventhubs) or a token "
            "credential (--credential)"
        )
        return
    worst = worst_lag(lag[1])
    unknown = sum(1 for x in lag[1].values() if x.seconds is None)
    if worst is not None:
        console.print(
            f"lag: {worst.seconds:.1f}s (partition {worst.partition}), backlog {sum(lag[0].values())} events"
            + (f"; {unknown} partitions not known yet" if unknown else "")
        )
