"""`hubshift checkpoints show|reset` and `hubshift release`: a consumer group's checkpoints by hand, as
`kafka-consumer-groups --reset-offsets` does for Kafka, and the hand-over of the group to another reader.

- `show`: each partition's checkpoint, its owner and lease; with the hub, what is retained and the backlog.
- `reset`: the checkpoints of all partitions or some moved to the start, the end, an enqueued time or a
  sequence number. A dry run unless `--execute`. Refused while live consumers own any of them: pause the
  pool first (`autoscaling.hubshift.dev/paused-replicas: "0"`: each consumer hands its partitions off and
  none comes back while the annotation stays).
- `release`: hubshift's leases on the checkpoint blobs ended (those of gone owners broken), the checkpoints
  left in the Azure SDK's layout, so its EventProcessor with `BlobCheckpointStore`, or Azure Functions,
  continues from them. Refused on the same condition.

Every write is fenced as the consumers' are (`hubshift.ownership.override`). A checkpoint names the last
event consumed: moving to "the next event read is N" writes event N-1's offset and sequence number (the SDK
resumes after the offset, hubshift after the sequence number), or "nothing consumed" (`-1`) when N is the
first retained event. Offsets are opaque strings (a geo-replicated namespace's are no numbers).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import click
from rich.console import Console
from rich.table import Table

from hubshift.apps.group import GroupArgs, group_options
from hubshift.errors import UserError
from hubshift.eventhubs.management import EventHubsProbe, read_partitions
from hubshift.eventhubs.model import PartitionInfo
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.ownership.model import EARLIEST, Checkpoint, OwnershipSnapshot, partition_sort_key
from hubshift.ownership.override import Moved, TakenMeanwhile, live_owners, move_checkpoint, release_ownership
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import StoreError
from hubshift.spec.resource import PAUSED_REPLICAS_ANNOTATION

ResetKind = Literal["start", "end", "time", "sequence"]


@dataclass(frozen=True)
class ResetTo:
    """Where a reset moves each partition: its start, its end, the first event enqueued at or after `time`,
    or the event `sequence` (the next one read)."""

    kind: ResetKind
    time: datetime | None = None
    sequence: int | None = None

    def describe(self) -> str:
        if self.kind == "time":
            assert self.time is not None
            return f"the first event enqueued at or after {self.time.isoformat()}"
        if self.kind == "sequence":
            return f"sequence number {self.sequence}"
        return f"the {self.kind}"


@dataclass(frozen=True)
class Planned:
    """One partition's new position: the next event read (`next_sequence`) and the checkpoint saying so."""

    partition: str
    next_sequence: int
    checkpoint: Checkpoint
    note: str = ""


# --- the decisions (pure) -----------------------------------------------------------------------------


def next_sequence(to: ResetTo, info: PartitionInfo, first_at_time: int | None) -> tuple[int, str]:
    """The sequence number read next after the reset, with a note for the table; `first_at_time`: the
    first event enqueued at or after `to.time` (None: there is none yet). `UserError` for a sequence number
    past the partition's end."""
    end = info.last_enqueued + 1
    if to.kind == "start":
        return info.beginning, ""
    if to.kind == "end" or (to.kind == "time" and first_at_time is None):
        return end, "" if to.kind == "end" else "no event since then: the end"
    wanted = first_at_time if to.kind == "time" else to.sequence
    assert wanted is not None
    if wanted > end:
        raise UserError(
            f"partition {info.partition}: sequence number {wanted} is past its end (the next event will be "
            f"{end})"
        )
    if wanted < info.beginning:
        return info.beginning, f"events before {info.beginning} are no longer retained"
    return wanted, ""


def needs_offset(next_read: int, info: PartitionInfo) -> bool:
    """Whether the checkpoint must name event `next_read - 1` (its offset read from the hub): not when the
    next event is the first retained one ("nothing consumed" says so to both readers)."""
    return not info.empty and next_read > info.beginning


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (`2026-05-01T08:00:00Z`; without a zone it is UTC)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(
            f"--to-time {text!r}: expected an ISO 8601 time such as 2026-05-01T08:00:00Z"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def paused_first(held: dict[str, str], doing: str) -> UserError:
    """The refusal while live consumers own partitions: which, and how to pause the pool."""
    ordered = sorted(held.items(), key=lambda item: partition_sort_key(item[0]))
    listed = ", ".join(f"{partition} ({owner})" for partition, owner in ordered)
    return UserError(
        f"cannot {doing} while live consumers own partitions {listed}: pause the pool first "
        f"(kubectl annotate partitionedconsumer NAME {PAUSED_REPLICAS_ANNOTATION}=0, or that annotation in "
        "the manifest of hubshift run), then run this again once `hubshift checkpoints show` lists them free"
    )


# --- the commands -------------------------------------------------------------------------------------


@click.group(name="checkpoints")
def checkpoints() -> None:
    """Show a consumer group's checkpoints, or move them (to the start, the end, a time or a sequence
    number)."""


@checkpoints.command(name="show")
@group_options("adds each partition's retained events and backlog")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def show(output: str, **options: Any) -> None:
    """Each partition's checkpoint, owner and lease (and, with the hub, what it retains and the backlog)."""
    args = GroupArgs.from_options(options)
    snapshot = _snapshot(args)
    target = args.target()
    infos = asyncio.run(read_partitions(target)) if target is not None else None
    rows = [_row(snapshot, p, infos) for p in _known(snapshot, infos)]
    if output == "json":
        click.echo(json.dumps({"scope": str(args.scope), "partitions": rows}, indent=2))
        return
    table = _table(f"{args.scope}: checkpoints", rows, infos is not None)
    console = _console()
    console.print(table)
    if infos is None:
        console.print("what each partition retains, and its backlog: pass --eventhubs or --credential")


@checkpoints.command(name="reset")
@group_options("needed to find where the end, a time or a sequence number is")
@click.option("--to-start", "to_start", is_flag=True, help="The first event each partition retains.")
@click.option(
    "--to-end", "to_end", is_flag=True, help="After the last event enqueued now (skip the backlog)."
)
@click.option(
    "--to-time", "to_time", metavar="TIME", help="The first event enqueued at or after TIME (ISO 8601)."
)
@click.option(
    "--to-sequence", "to_sequence", type=click.IntRange(min=0), help="This sequence number, read next."
)
@click.option("--partitions", default=None, metavar="IDS", help="Only these partitions (0,3,7); default all.")
@click.option("--execute", is_flag=True, help="Write the checkpoints (without it: show the plan only).")
def reset(
    to_start: bool,
    to_end: bool,
    to_time: str | None,
    to_sequence: int | None,
    partitions: str | None,
    execute: bool,
    **options: Any,
) -> None:
    """Move the checkpoints of all partitions (or --partitions) to the start, the end, a time or a sequence
    number; the consumers read from there when they come back. Refused while live consumers own them."""
    to = _reset_to(to_start, to_end, to_time, to_sequence)
    args = GroupArgs.from_options(options)
    snapshot = _snapshot(args)
    target = args.target()
    if target is None and to.kind != "start":
        raise UserError(f"moving to {to.describe()} reads the hub: pass --eventhubs or --credential")
    infos = asyncio.run(read_partitions(target)) if target is not None else None
    chosen = _chosen(partitions, _known(snapshot, infos))
    held = live_owners(snapshot, chosen)
    if held:
        raise paused_first(held, "move checkpoints")
    plan = (
        [Planned(p, 0, EARLIEST, "the first event retained") for p in chosen]
        if infos is None or target is None
        else asyncio.run(_plan(target, infos, chosen, to))
    )
    _print_plan(args, snapshot, plan, to)
    if not execute:
        _console().print("dry run: nothing was written (add --execute to write these checkpoints)")
        return
    moved, taken = _apply(args, snapshot, plan)
    _console().print(f"moved {len(moved)} checkpoint(s) to {to.describe()}")
    if taken:
        raise UserError(
            f"partitions {', '.join(taken)} were claimed by a consumer meanwhile and keep their checkpoints: "
            "is the pool paused?"
        )


@click.command(name="release")
@group_options("needed for partitions that start at an enqueued time and consumed nothing yet")
@click.option("--partitions", default=None, metavar="IDS", help="Only these partitions (0,3,7); default all.")
def release(partitions: str | None, **options: Any) -> None:
    """End hubshift's ownership of a consumer group: its leases on the checkpoint blobs go (a gone owner's
    broken), the checkpoints stay in the Azure SDK's layout, and its EventProcessor (BlobCheckpointStore) or
    Azure Functions continue from them. Refused while live consumers own partitions: pause the pool first."""
    args = GroupArgs.from_options(options)
    snapshot = _snapshot(args)
    chosen = _chosen(partitions, [row.partition for row in snapshot.partitions])
    held = live_owners(snapshot, chosen)
    if held:
        raise paused_first(held, "release the consumer group")
    rows = {row.partition: row for row in snapshot.partitions}
    # The SDK reads "-1" as the start: a partition waiting for an enqueued time gets the position it means.
    waiting = [p for p in chosen if rows[p].checkpoint.consumed_nothing and rows[p].checkpoint.start]
    plan: list[Planned] = []
    if waiting:
        target = args.target()
        if target is None:
            raise UserError(
                f"partitions {', '.join(waiting)} consumed nothing yet and start at an enqueued time, which "
                "the SDK would read as the beginning: pass --eventhubs or --credential to write where they "
                "start"
            )
        infos = asyncio.run(read_partitions(target))
        starts = {rows[p].checkpoint.start for p in waiting}
        for start in starts:
            assert start is not None
            due = [p for p in waiting if rows[p].checkpoint.start == start]
            plan += asyncio.run(_plan(target, infos, due, ResetTo("time", time=start)))
    broken, after = _release(args, snapshot, chosen, plan)
    _print_release(args, after, chosen, broken)


# --- reading and writing ------------------------------------------------------------------------------


def _reset_to(to_start: bool, to_end: bool, to_time: str | None, to_sequence: int | None) -> ResetTo:
    given = [to_start, to_end, to_time is not None, to_sequence is not None]
    if sum(given) != 1:
        raise UserError("say where to: exactly one of --to-start, --to-end, --to-time or --to-sequence")
    if to_start:
        return ResetTo("start")
    if to_end:
        return ResetTo("end")
    if to_time is not None:
        return ResetTo("time", time=parse_time(to_time))
    return ResetTo("sequence", sequence=to_sequence)


def _snapshot(args: GroupArgs) -> OwnershipSnapshot:
    store = args.open_store()
    try:
        return take_snapshot(store, args.scope)
    except StoreError as exc:
        raise UserError(f"cannot read the ownership records of {args.scope}: {exc}") from None
    finally:
        store.close()


async def _plan(
    target: EventHubsTarget, infos: dict[str, PartitionInfo], chosen: Sequence[str], to: ResetTo
) -> list[Planned]:
    """Each chosen partition's new checkpoint, reading from the hub the events that say where."""
    probe = EventHubsProbe(target)
    plan = []
    try:
        for partition in chosen:
            info = infos[partition]
            first_at_time = None
            if to.kind == "time" and not info.empty:
                assert to.time is not None
                found = await probe.event_at(partition, to.time)
                first_at_time = None if found is None else found.sequence_number
            next_read, note = next_sequence(to, info, first_at_time)
            checkpoint = EARLIEST
            if needs_offset(next_read, info):
                before = await probe.event_at(partition, next_read - 1)
                if before is None or before.sequence_number != next_read - 1:
                    raise UserError(
                        f"partition {partition}: event {next_read - 1} could not be read (its offset is the "
                        "checkpoint); try again"
                    )
                checkpoint = Checkpoint(before.offset, before.sequence_number)
            plan.append(Planned(partition, next_read, checkpoint, note))
    finally:
        await probe.close()
    return plan


def _apply(
    args: GroupArgs, snapshot: OwnershipSnapshot, plan: Iterable[Planned]
) -> tuple[list[Moved], list[str]]:
    store = args.open_store()
    moved: list[Moved] = []
    taken: list[str] = []
    try:
        for planned in plan:
            row = snapshot.partition(planned.partition)
            try:
                moved.append(move_checkpoint(store, args.scope, row, planned.partition, planned.checkpoint))
            except TakenMeanwhile:
                taken.append(planned.partition)
    except StoreError as exc:
        raise UserError(f"writing the checkpoints of {args.scope} failed: {exc}") from None
    finally:
        store.close()
    return moved, taken


def _release(
    args: GroupArgs, snapshot: OwnershipSnapshot, chosen: Sequence[str], plan: Sequence[Planned]
) -> tuple[dict[str, str | None], OwnershipSnapshot]:
    """Release each chosen partition (writing the planned ones' positions first): partition -> the gone
    owner whose lease was broken, and the records after. A partition leased again means the pool runs."""
    planned = {p.partition: p for p in plan}
    store = args.open_store()
    broken: dict[str, str | None] = {}
    try:
        for partition in chosen:
            row = snapshot.partition(partition)
            assert row is not None
            if partition in planned:
                moved = move_checkpoint(store, args.scope, row, partition, planned[partition].checkpoint)
                broken[partition] = moved.broke_lease_of
            else:
                broken[partition] = release_ownership(store, args.scope, row)
        after = take_snapshot(store, args.scope)
    except TakenMeanwhile as exc:
        raise UserError(f"{exc}: is the pool paused? Run this again once it is") from None
    except StoreError as exc:
        raise UserError(f"releasing the leases of {args.scope} failed: {exc}") from None
    finally:
        store.close()
    again = {row.partition: row.owner for row in after.partitions if row.partition in chosen and row.owner}
    if again:
        raise paused_first(again, "release the consumer group (consumers claimed partitions again)")
    return broken, after


# --- output -------------------------------------------------------------------------------------------


def _known(snapshot: OwnershipSnapshot, infos: dict[str, PartitionInfo] | None) -> list[str]:
    """The partitions there are: the hub's when it was read, else those with a checkpoint blob."""
    found = set(infos) if infos is not None else {row.partition for row in snapshot.partitions}
    return sorted(found, key=partition_sort_key)


def _chosen(text: str | None, known: Sequence[str]) -> list[str]:
    if text is None:
        if not known:
            raise UserError("no partitions known: pass --eventhubs or --credential, or --partitions")
        return list(known)
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in chosen if known and p not in known]
    if not chosen or unknown:
        problem = f"unknown partitions {', '.join(unknown)}" if unknown else "none given"
        raise UserError(f"--partitions {text!r}: {problem} (the hub has {', '.join(known) or 'none known'})")
    return sorted(set(chosen), key=partition_sort_key)


def _row(
    snapshot: OwnershipSnapshot, partition: str, infos: dict[str, PartitionInfo] | None
) -> dict[str, Any]:
    row = snapshot.partition(partition)
    checkpoint = row.checkpoint if row is not None else None
    found: dict[str, Any] = {
        "partition": partition,
        "owner": None if row is None else row.owner,
        "ownerAlive": None if row is None else row.owner_alive,
        "leaseState": None if row is None else row.lease_state.value,
        "sequenceNumber": None if checkpoint is None else checkpoint.sequence_number,
        "offset": None if checkpoint is None else checkpoint.offset,
        "startsAt": None if checkpoint is None or checkpoint.start is None else checkpoint.start.isoformat(),
        "lastModified": None if row is None else row.last_modified.isoformat(),
    }
    info = None if infos is None else infos.get(partition)
    if info is not None:
        consumed = checkpoint.sequence_number if checkpoint is not None else -1
        found["retained"] = None if info.empty else [info.beginning, info.last_enqueued]
        found["backlog"] = max(0, info.last_enqueued - max(consumed, info.beginning - 1))
    return found


def _owner_text(owner: str | None, alive: bool | None) -> str:
    if owner is None:
        return "[dim](free)[/dim]"
    return owner if alive else f"{owner} [red](gone)[/red]"


def _table(title: str, rows: list[dict[str, Any]], with_hub: bool) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("Partition")
    table.add_column("Owner", overflow="fold")
    table.add_column("Sequence number", justify="right")
    table.add_column("Offset", justify="right", overflow="fold")
    table.add_column("Starts at")
    table.add_column("Last modified (UTC)")
    if with_hub:
        table.add_column("Retained", justify="right")
        table.add_column("Backlog", justify="right")
    for row in rows:
        cells = [
            row["partition"],
            _owner_text(row["owner"], row["ownerAlive"]),
            "-" if row["sequenceNumber"] is None else str(row["sequenceNumber"]),
            row["offset"] or "-",
            row["startsAt"] or "",
            (row["lastModified"] or "")[:19].replace("T", " ") or "[dim](no checkpoint)[/dim]",
        ]
        if with_hub:
            retained = row.get("retained")
            cells.append("empty" if retained is None else f"{retained[0]}..{retained[1]}")
            cells.append(str(row.get("backlog", "-")))
        table.add_row(*cells)
    return table


def _print_plan(args: GroupArgs, snapshot: OwnershipSnapshot, plan: Sequence[Planned], to: ResetTo) -> None:
    table = Table(title=f"{args.scope}: checkpoints to {to.describe()}", title_justify="left")
    for column in ("Partition", "Owner", "Now: sequence number", "Now: offset"):
        table.add_column(column, justify="right" if column.startswith("Now") else "left", overflow="fold")
    for column in ("New: sequence number", "New: offset", "Next event read"):
        table.add_column(column, justify="right", overflow="fold")
    table.add_column("Note")
    for planned in plan:
        row = snapshot.partition(planned.partition)
        table.add_row(
            planned.partition,
            _owner_text(None if row is None else row.owner, None if row is None else row.owner_alive),
            "-" if row is None else str(row.checkpoint.sequence_number),
            "-" if row is None else row.checkpoint.offset,
            str(planned.checkpoint.sequence_number),
            planned.checkpoint.offset,
            "the first retained" if planned.checkpoint.consumed_nothing else str(planned.next_sequence),
            planned.note,
        )
    _console().print(table)


def _print_release(
    args: GroupArgs, snapshot: OwnershipSnapshot, chosen: Sequence[str], broken: dict[str, str | None]
) -> None:
    table = Table(title=f"{args.scope}: released", title_justify="left")
    for column in ("Partition", "Was owned by", "Sequence number", "Offset", "Lease now"):
        table.add_column(column, overflow="fold")
    for partition in chosen:
        row = snapshot.partition(partition)
        assert row is not None
        owner = broken.get(partition)
        table.add_row(
            partition,
            "-" if owner is None else f"{owner} (gone: lease broken)",
            str(row.checkpoint.sequence_number),
            row.checkpoint.offset,
            "none",
        )
    console = _console()
    console.print(table)
    console.print(
        f"hubshift holds no lease in {args.scope} now: the Azure SDK's EventProcessor with "
        "BlobCheckpointStore on this container continues from these checkpoints. Keep the pool paused while "
        "it reads; to come back, stop it first (docs/checkpoints.md)."
    )


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 160))
