"""Events as rows: the columns the consumer's Spark source produces, their Arrow schema, and received
AMQP messages turned into one Arrow record batch in that schema.

A received batch also has a column for each event's system properties (`system_properties`: the AMQP
properties section and the message annotations, keyed as the SDK's `EventData.system_properties` keys
them), filled only when the manifest asks for them (`spark.includeSystemProperties`), and the Spark source
hands that column on only then, so the default columns stay what they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from hubshift.eventhubs.sdk_internals import EventData, RawMessage, RawMessageProperties

EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("partition", "string"),
    ("sequence_number", "bigint"),
    ("offset", "string"),
    ("enqueued_time", "timestamp"),
    ("partition_key", "string"),
    ("body", "binary"),
    ("properties", "map<string,string>"),
)

# The optional column: every received batch and spool segment has it, filled only for
# spark.includeSystemProperties.
SYSTEM_PROPERTIES = "system_properties"

# DDL string accepted by `DataSource.schema()` and `spark.createDataFrame(..., schema=...)`.
EVENT_SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in EVENT_COLUMNS)

_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bigint": pa.int64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "binary": pa.binary(),
    "map<string,string>": pa.map_(pa.string(), pa.string()),
}

# The Arrow schema Spark expects from `read()` for the event row schema (checked against pyspark's own
# conversion in the unit tests: Spark refuses a batch whose schema differs in any way).
EVENT_ARROW_SCHEMA = pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in EVENT_COLUMNS])
_PROPERTIES_TYPE = EVENT_ARROW_SCHEMA.field("properties").type

# What a received batch and a spool segment hold: the event columns and the system properties.
RECEIVED_ARROW_SCHEMA = EVENT_ARROW_SCHEMA.append(pa.field(SYSTEM_PROPERTIES, _PROPERTIES_TYPE))


def event_schema_ddl(system_properties: bool) -> str:
    """The Spark source's columns: the event columns, and the system properties when asked for."""
    return (
        f"{EVENT_SCHEMA_DDL}, {SYSTEM_PROPERTIES} map<string,string>"
        if system_properties
        else EVENT_SCHEMA_DDL
    )


def as_received(table: pa.Table) -> pa.Table:
    """`table` in the received schema: a segment spooled before the system properties were kept gets the
    column, empty."""
    if SYSTEM_PROPERTIES in table.schema.names:
        return table
    return table.append_column(
        pa.field(SYSTEM_PROPERTIES, _PROPERTIES_TYPE), pa.nulls(table.num_rows, _PROPERTIES_TYPE)
    )


def without_system_properties(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch in the received schema in the event schema (the system properties column left out)."""
    return batch.drop_columns([SYSTEM_PROPERTIES])


_SEQUENCE = b"x-opt-sequence-number"
_OFFSET = b"x-opt-offset"
_ENQUEUED = b"x-opt-enqueued-time"
_PARTITION_KEY = b"x-opt-partition-key"


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _properties(values: dict[Any, Any] | None) -> list[tuple[str, str | None]] | None:
    if not values:
        return None
    return [(_text(k) or "", _text(v)) for k, v in values.items()]


# The AMQP properties section's fields by the names the SDK's system properties give them.
_PROPERTY_KEYS = tuple((name, name.replace("_", "-")) for name in RawMessageProperties._fields)


def _system_properties(
    section: Any, annotations: dict[Any, Any] | None
) -> list[tuple[str, str | None]] | None:
    """The event's system properties, as `EventData.system_properties` has them: the properties section's
    fields that are set (`message-id`, `correlation-id`, `content-type`, ...) and every annotation."""
    found: list[tuple[str, str | None]] = []
    if section is not None:
        for field, key in _PROPERTY_KEYS:
            value = getattr(section, field, None)
            if value:
                found.append((key, _text(value)))
    if annotations:
        found.extend((_text(k) or "", _text(v)) for k, v in annotations.items())
    return found or None


def events_to_batch(
    partition: str, events: Sequence[Any], *, system_properties: bool = False
) -> pa.RecordBatch:
    """Received messages as one record batch in the received schema; the system properties column empty
    unless `system_properties` (a consumer that does not hand them on neither reads nor spools them).

    `events` are the SDK's raw AMQP messages (what `adopt_raw_messages` makes a consumer deliver) or its
    `EventData`: the annotations are read directly (ten times cheaper per event than the public
    properties), with the public properties as the fallback.
    """
    sequence: list[int] = []
    offsets: list[str | None] = []
    enqueued: list[int | None] = []
    keys: list[str | None] = []
    bodies: list[bytes] = []
    properties: list[list[tuple[str, str | None]] | None] = []
    system: list[list[tuple[str, str | None]] | None] = []
    for event in events:
        raw = _readable_message(event)
        if raw is not None:
            annotations = raw.message_annotations or {}
            sequence.append(annotations[_SEQUENCE])
            offsets.append(_text(annotations.get(_OFFSET)))
            millis = annotations.get(_ENQUEUED)
            enqueued.append(None if millis is None else int(millis) * 1000)
            keys.append(_text(annotations.get(_PARTITION_KEY)))
            data = raw.data or b""
            bodies.append(data if isinstance(data, bytes) else b"".join(data))
            properties.append(_properties(raw.application_properties))
            if system_properties:
                system.append(_system_properties(raw.properties, annotations))
            continue
        if isinstance(event, RawMessage):
            event = EventData._from_message(event)
        sequence.append(event.sequence_number)
        offsets.append(_text(event.offset))
        moment = event.enqueued_time
        enqueued.append(None if moment is None else int(moment.timestamp() * 1_000_000))
        keys.append(_text(event.partition_key))
        bodies.append(_body(event))
        properties.append(_properties(event.properties))
        if system_properties:
            system.append(_properties(event.system_properties))
    count = len(sequence)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition] * count, pa.string()),
            pa.array(sequence, pa.int64()),
            pa.array(offsets, pa.string()),
            pa.array(enqueued, pa.timestamp("us", tz="UTC")),
            pa.array(keys, pa.string()),
            pa.array(bodies, pa.binary()),
            pa.array(properties, _PROPERTIES_TYPE),
            pa.array(system, _PROPERTIES_TYPE) if system_properties else pa.nulls(count, _PROPERTIES_TYPE),
        ],
        schema=RECEIVED_ARROW_SCHEMA,
    )


def _readable_message(event: Any) -> RawMessage | None:
    """The raw AMQP message behind `event` (itself, or an `EventData`'s) when its annotations and data body
    can be read directly; None for anything else, which takes the public properties."""
    raw = event if isinstance(event, RawMessage) else getattr(event, "_message", None)
    if isinstance(raw, RawMessage) and raw.data is not None and _SEQUENCE in (raw.message_annotations or {}):
        return raw
    return None


def _body(event: Any) -> bytes:
    try:
        body = event.body
    except ValueError:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    try:
        return b"".join(part if isinstance(part, bytes) else str(part).encode() for part in body)
    except TypeError:
        return str(body).encode()
