"""The `replicate` pipeline: every event forwarded to another Event Hub (the replication task pattern of the
Event Hubs documentation), with the merge pattern's guard against sending an event back.

- A source partition's events with the same partition key go to the target as batches with that key, in
  their original order; the target keeps each stream together and in order whatever its partition count.
  Events without a key are spread by the service, or with `keepPartition` go to the target partition of
  the same id.
- Body and application properties are kept. The source's enqueued time (ISO 8601), sequence number,
  offset and partition are added as `repl-enqueue-time`, `repl-sequence`, `repl-offset` and
  `repl-partition`; when the event already carries them (it was replicated before), the new value is
  appended after a `;`.
- `skipReplicated`: events that carry `repl-sequence` are not forwarded (hubs mirrored both ways).
- An event the target refuses as too large becomes a dead letter with the reason; any other send failure
  fails the micro-batch, which runs again from the last commit: delivery to the target is at least once,
  and `repl-sequence` with the source partition identifies a repeat.

Each Spark task sends its own events with one producer (`process_task`), so nothing but configuration is
pickled to the Python workers; the commit record and the checkpoint follow only after every send of the
batch was acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from azure.eventhub import EventData
from pydantic import Field

from hubshift.eventhubs.management import EventHubsManagement
from hubshift.eventhubs.sender import producer_for, send_events
from hubshift.eventhubs.target import EventHubsTarget, resolve_target
from hubshift.pipelines.base import BuildContext, Location, Pipeline, PipelineKind, TaskResult
from hubshift.pipelines.editor import build_editor
from hubshift.sinks.base import dead_letter_text
from hubshift.spec import HubConnectionSpec, NamedConnection

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# The default variable of the target hub's connection string (replicate, route).
DEFAULT_REPLICATE_ENV = "HUBSHIFT_REPLICATE_CONNECTION_STRING"
REPL_ENQUEUE_TIME = "repl-enqueue-time"
REPL_SEQUENCE = "repl-sequence"
REPL_OFFSET = "repl-offset"
REPL_PARTITION = "repl-partition"
REASON_TOO_LARGE = "larger than the target Event Hub accepts"


class TargetHubSpec(HubConnectionSpec):
    """An Event Hub events are sent to, with a connection string or a token credential."""

    DEFAULT_VARIABLE = DEFAULT_REPLICATE_ENV

    keep_partition: bool = Field(
        default=False,
        description="Events without a partition key go to the target partition of the same id (the target "
        "needs at least as many partitions); otherwise the service spreads them.",
    )


class ReplicateSpec(TargetHubSpec):
    """Every event forwarded to another Event Hub, partition key, body and properties kept, the source's
    enqueued time, sequence number and offset added as `repl-enqueue-time`, `repl-sequence` and
    `repl-offset` (appended after a `;` when the event was replicated before)."""

    skip_replicated: bool = Field(
        default=False,
        description="Do not forward events that carry repl-sequence (the merge pattern: hubs mirrored both "
        "ways never send an event back).",
    )


@dataclass(frozen=True)
class Outgoing:
    """One event as it is sent to the target; `row`: its index among the task's rows."""

    row: int
    body: bytes
    properties: dict[str, str]


@dataclass
class SendGroup:
    """Events sent in order as batches with one partition key, or to one partition, or anywhere."""

    partition_key: str | None = None
    partition_id: str | None = None
    events: list[Outgoing] = field(default_factory=list)

    @property
    def batch_options(self) -> dict[str, str]:
        """`create_batch`'s arguments: the key or the partition, whichever is set."""
        options = {"partition_key": self.partition_key, "partition_id": self.partition_id}
        return {name: value for name, value in options.items() if value is not None}


def replicated_properties(
    properties: Iterable[tuple[str, str | None]] | Mapping[str, str | None] | None,
    enqueued_time: datetime | None,
    sequence: int | None,
    offset: str | None,
    partition: str | None,
) -> dict[str, str]:
    """The event's application properties with the source's metadata added (appended after `;`): its
    enqueued time, sequence number, offset and partition (`repl-partition`: the sequence number means
    nothing without it). An event without a sequence number (an editor's function made it) carries its
    properties as they are."""
    pairs = properties.items() if isinstance(properties, Mapping) else properties or ()
    found = {key: "" if value is None else value for key, value in pairs}
    if sequence is None:
        return found
    stamp = "" if enqueued_time is None else _iso(enqueued_time)
    for key, value in (
        (REPL_ENQUEUE_TIME, stamp),
        (REPL_SEQUENCE, str(sequence)),
        (REPL_OFFSET, offset or ""),
        (REPL_PARTITION, partition or ""),
    ):
        found[key] = f"{found[key]};{value}" if found.get(key) else value
    return found


def was_replicated(row: Mapping[str, Any]) -> bool:
    """Whether the event carries `repl-sequence` (a replication task forwarded it before)."""
    properties = row.get("properties")
    pairs = properties.keys() if isinstance(properties, Mapping) else (key for key, _ in properties or ())
    return any(key == REPL_SEQUENCE for key in pairs)


def plan_sends(
    rows: Sequence[Mapping[str, Any]], *, keep_partition: bool, skip_replicated: bool
) -> list[SendGroup]:
    """The groups to send, per source partition: one per partition key in the order the keys first
    appear, then the events without a key. Rows in the event row schema."""
    groups: dict[tuple[str | None, str | None], SendGroup] = {}
    for index, row in enumerate(rows):
        properties = row.get("properties")
        if skip_replicated and was_replicated(row):
            continue
        source = row.get("partition")
        partition = None if source is None else str(source)
        key = row.get("partition_key")
        group = groups.get((partition, key))
        if group is None:
            if key is not None:
                group = SendGroup(partition_key=key)
            else:
                group = SendGroup(partition_id=partition if keep_partition else None)
            groups[(partition, key)] = group
        group.events.append(
            Outgoing(
                index,
                bytes(row.get("body") or b""),
                replicated_properties(
                    properties,
                    row.get("enqueued_time"),
                    row.get("sequence_number"),
                    row.get("offset"),
                    partition,
                ),
            )
        )
    keyed = [g for g in groups.values() if g.partition_key is not None]
    return keyed + [g for g in groups.values() if g.partition_key is None]


class ReplicatePipeline:
    name = "replicate"

    def __init__(
        self, target: EventHubsTarget, *, keep_partition: bool = False, skip_replicated: bool = False
    ) -> None:
        self.target = target
        self.keep_partition = keep_partition
        self.skip_replicated = skip_replicated

    @classmethod
    def from_spec(cls, spec: ReplicateSpec, environ: Mapping[str, str]) -> ReplicatePipeline:
        return cls(
            target_of(NamedConnection(LOCATION, spec, "pipeline"), environ),
            keep_partition=spec.keep_partition,
            skip_replicated=spec.skip_replicated,
        )

    def prepare(self, events: DataFrame) -> DataFrame:
        return events

    def process_task(self, rows: pa.Table) -> TaskResult:
        return TaskResult(dead_letters=self.forward(rows.to_pylist()))

    def forward(self, events: Sequence[Mapping[str, Any]]) -> list[str]:
        """Send the events (rows in the event row schema, in order); the dead letters."""
        groups = plan_sends(events, keep_partition=self.keep_partition, skip_replicated=self.skip_replicated)
        if not groups:
            return []
        producer = producer_for(self.target)
        return [
            dead_letter_text(events[index], REASON_TOO_LARGE)
            for group in groups
            for index in send_group(producer, group)
        ]


def send_group(producer: Any, group: SendGroup) -> list[int]:
    """Send the group's events in order, as few batches as fit; the rows of events too large to send."""
    events = []
    for outgoing in group.events:
        event = EventData(outgoing.body)
        properties: dict[str | bytes, Any] = {key: value for key, value in outgoing.properties.items()}
        event.properties = properties
        events.append(event)
    return [group.events[index].row for index in send_events(producer, events, **group.batch_options)]


def target_of(target: NamedConnection, environ: Mapping[str, str]) -> EventHubsTarget:
    """A target hub's block resolved: its connection string from the environment variable it names, or its
    namespace and token credential."""
    assert isinstance(target.connection, HubConnectionSpec)
    return resolve_target(target.connection, environ, target.path)


def probe_targets(targets: Sequence[NamedConnection], environ: Mapping[str, str]) -> None:
    """At start-up, each target hub: reachable, the credentials accepted, the hub there (`UserError`)."""
    for target in targets:
        probe = EventHubsManagement(target_of(target, environ), retry_total=1)
        try:
            probe.probe()
        finally:
            probe.close()


def _iso(moment: datetime) -> str:
    utc = moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond:06d}Z"


LOCATION: Location = ("spec", "consumer", "pipeline", "replicate")


def _connections(block: ReplicateSpec, location: Location) -> list[NamedConnection]:
    return [NamedConnection(location, block, "pipeline")]


def _check(block: ReplicateSpec, environ: Mapping[str, str], location: Location) -> None:
    probe_targets(_connections(block, location), environ)


def _build(block: ReplicateSpec, context: BuildContext) -> Pipeline:
    return build_editor(ReplicatePipeline.from_spec(block, context.environ), context.editor, context.state)


PIPELINE = PipelineKind[ReplicateSpec](
    name="replicate",
    annotation=ReplicateSpec | None,
    field=Field(default=None, description="The target Event Hub (type replicate)."),
    required="replicate (the target hub)",
    build=_build,
    connections=_connections,
    check=_check,
    takes_editor=True,
)
