"""The editor's built-in steps that run in Python, inside the Spark task (the editor pattern: transcoding,
transformation, validation, filtering, enrichment), as plain functions over events.

Each step takes the task's events in order and returns those that go on; an event a step refuses becomes a
dead letter with the step's reason (and the body the event arrived with). No step raises for a bad event:
a body that is not JSON, not gzip, too large once decompressed or against the schema is that event's
problem, never the batch's. The steps that need Spark (a SQL `filter`, a user's `function`) live in
`editor.py`, which also puts the steps in order.

`dedupe` keeps state across micro-batches: per source partition, the first event of each key seen within
the window, in the sink's store (`_state/`), read before and written after each batch. An event whose key
is known under another sequence number within the window is a repeat and is dropped; the event that is
recorded itself (a batch run again after a failure, a partition read again after a crash or a handoff)
goes on, so a replay never loses an event.
"""

from __future__ import annotations

import gzip as gzip_format
import io
import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hubshift.errors import UserError
from hubshift.pipelines.steps import EditorStepSpec, EventFieldSpec

if TYPE_CHECKING:
    from hubshift.sinks.base import ObjectStore

_UNPARSED: Any = object()
MISSING: Any = object()  # a JSON field that is not there


class NotJson(ValueError):
    """The body is not a JSON document (the reason is the message)."""


@dataclass
class Event:
    """One event on its way through the editor: its row (the event row schema, hubshift/eventhubs/rows.py)
    with the body as edited so far; `received` is the body it arrived with (what a dead letter carries)."""

    row: dict[str, Any]
    received: bytes | None = None
    _document: Any = field(default=_UNPARSED, repr=False)

    @classmethod
    def of(cls, row: dict[str, Any]) -> Event:
        body = row.get("body")
        return cls(row, None if body is None else bytes(body))

    @property
    def body(self) -> bytes:
        body = self.row.get("body")
        return b"" if body is None else bytes(body)

    def set_body(self, body: bytes) -> None:
        self.row["body"] = body
        self._document = _UNPARSED

    def document(self) -> Any:
        """The body as JSON (parsed once until the body changes); `NotJson` when it is not."""
        if self._document is _UNPARSED:
            try:
                self._document = json.loads(self.body)
            except (UnicodeDecodeError, ValueError) as exc:
                self._document = NotJson(f"the body is not JSON ({_short(exc)})")
        if isinstance(self._document, NotJson):
            raise self._document
        return self._document

    def set_document(self, document: Any) -> None:
        self.row["body"] = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
        self._document = document

    def properties(self) -> dict[str, str | None]:
        found = self.row.get("properties")
        if not found:
            return {}
        return dict(found.items() if isinstance(found, Mapping) else found)

    def dead_letter_row(self) -> dict[str, Any]:
        """The row a dead letter is written from: the event as it arrived."""
        return {**self.row, "body": self.received}


Dead = list[tuple[Event, str]]


# --- reading one value of an event -------------------------------------------------------------------


def json_path(path: str) -> tuple[str, ...]:
    """`a.b.c` (or `$.a.b.c`) as its names."""
    return tuple(path.removeprefix("$.").split("."))


def json_value(document: Any, path: Sequence[str]) -> Any:
    """The value at `path` in a JSON document; `MISSING` when a name is not there."""
    value = document
    for name in path:
        if isinstance(value, dict) and name in value:
            value = value[name]
        elif isinstance(value, list) and name.isdigit() and int(name) < len(value):
            value = value[int(name)]
        else:
            return MISSING
    return value


def json_text(value: Any) -> str | None:
    """A JSON value as text to compare: strings as they are, others as their JSON (5, 2.5, true); null and
    missing: None."""
    if value is MISSING or value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class FieldReader:
    """Reads the value an `EventField` names from an event: text, or None when the event has none."""

    def __init__(self, spec: EventFieldSpec) -> None:
        self.partition_key = bool(spec.partition_key)
        self.property = spec.property
        self.path = None if spec.json_field is None else json_path(spec.json_field)

    def describe(self) -> str:
        if self.partition_key:
            return "partition key"
        if self.property is not None:
            return f"property {self.property}"
        return f"field {'.'.join(self.path or ())}"

    def read(self, event: Event) -> str | None:
        if self.partition_key:
            key = event.row.get("partition_key")
            return None if key is None else str(key)
        if self.property is not None:
            return event.properties().get(self.property)
        assert self.path is not None
        try:
            return json_text(json_value(event.document(), self.path))
        except NotJson:
            return None


# --- the steps ---------------------------------------------------------------------------------------


class PythonStep(Protocol):
    name: str

    def apply(self, events: list[Event], dead: Dead) -> list[Event]:
        """The events that go on, in order; the refused ones are appended to `dead` with the reason."""
        ...


class JsonStep:
    """A step over the JSON body: an event whose body is not JSON (or, with `objects_only`, not an object)
    is refused; `edit` changes the document and says whether the event goes on."""

    name = "json"
    objects_only = False

    def edit(self, event: Event, document: Any) -> str | bool:
        """True: the event goes on; False: it is dropped; a text: it is refused for that reason."""
        raise NotImplementedError

    def apply(self, events: list[Event], dead: Dead) -> list[Event]:
        kept = []
        for event in events:
            try:
                document = event.document()
            except NotJson as exc:
                dead.append((event, f"{self.name}: {exc}"))
                continue
            if self.objects_only and not isinstance(document, dict):
                dead.append((event, f"{self.name}: the body is not a JSON object"))
                continue
            outcome = self.edit(event, document)
            if outcome is True:
                kept.append(event)
            elif outcome is not False:
                dead.append((event, f"{self.name}: {outcome}"))
        return kept


class SelectStep(JsonStep):
    """A new JSON body of chosen fields: output name -> path in the body (absent fields are left out)."""

    name = "select"

    def __init__(self, fields: Mapping[str, str]) -> None:
        self.fields = {out: json_path(path) for out, path in fields.items()}

    def edit(self, event: Event, document: Any) -> str | bool:
        chosen = {out: json_value(document, path) for out, path in self.fields.items()}
        event.set_document({out: value for out, value in chosen.items() if value is not MISSING})
        return True


def flatten_document(document: Mapping[str, Any], separator: str, prefix: str = "") -> dict[str, Any]:
    """Nested objects as one level, their names joined by `separator` (lists stay values)."""
    flat: dict[str, Any] = {}
    for name, value in document.items():
        joined = f"{prefix}{separator}{name}" if prefix else str(name)
        if isinstance(value, dict) and value:
            flat.update(flatten_document(value, separator, joined))
        else:
            flat[joined] = value
    return flat


class FlattenStep(JsonStep):
    name = "flatten"
    objects_only = True

    def __init__(self, separator: str = ".") -> None:
        self.separator = separator

    def edit(self, event: Event, document: Any) -> str | bool:
        event.set_document(flatten_document(document, self.separator))
        return True


@cache
def _schema_validator(schema_text: str) -> Any:
    import jsonschema

    schema = json.loads(schema_text)
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)


def check_json_schema(schema: Mapping[str, Any], where: str) -> None:
    """`UserError` (one line) when `schema` is not a valid JSON Schema."""
    import jsonschema

    document = dict(schema)
    try:
        jsonschema.validators.validator_for(document, default=jsonschema.Draft202012Validator).check_schema(
            document
        )
    except jsonschema.SchemaError as exc:
        raise UserError(f"{where}: not a valid JSON Schema: {_short(exc.message)}") from None


class ValidateStep(JsonStep):
    """Events whose JSON body does not satisfy the schema are dead letters with the first reason."""

    name = "validate"

    def __init__(self, schema: Mapping[str, Any]) -> None:
        # Text: the compiled validator is made once per Python worker (`_schema_validator`), not pickled.
        self.schema_text = json.dumps(schema, sort_keys=True)

    def edit(self, event: Event, document: Any) -> str | bool:
        import jsonschema

        error = jsonschema.exceptions.best_match(_schema_validator(self.schema_text).iter_errors(document))
        if error is None:
            return True
        where = "/".join(str(part) for part in error.absolute_path) or "(the body)"
        return f"the body does not match the JSON Schema at {where}: {_short(error.message)}"


def load_table(path: str) -> dict[str, dict[str, Any]]:
    """An enrich step's lookup table from a JSON file: an object of objects (`UserError` otherwise)."""
    where = f"editor enrich table {path}"
    try:
        table = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UserError(f"{where}: not JSON ({_short(exc)})") from None
    if not isinstance(table, dict) or not all(isinstance(row, dict) for row in table.values()):
        raise UserError(f"{where}: expected a JSON object whose values are objects")
    return {str(key): row for key, row in table.items()}


class EnrichStep(JsonStep):
    """Fields from a static lookup table added to the JSON body (at the top, or under `into`)."""

    name = "enrich"
    objects_only = True

    def __init__(
        self,
        key: EventFieldSpec,
        table: Mapping[str, Mapping[str, Any]],
        into: str | None = None,
        on_missing: str = "keep",
    ) -> None:
        self.key = FieldReader(key)
        self.table = {k: dict(v) for k, v in table.items()}
        self.into = into
        self.on_missing = on_missing

    def apply(self, events: list[Event], dead: Dead) -> list[Event]:
        # Events whose key is not in the table are decided first: kept as they are need not be JSON.
        kept: list[Event] = []
        found: list[Event] = []
        for event in events:
            value = self.key.read(event)
            if value is not None and value in self.table:
                found.append(event)
            elif self.on_missing == "deadLetter":
                dead.append((event, f"enrich: {self.key.describe()} {value!r} is not in the table"))
            elif self.on_missing == "keep":
                kept.append(event)
        going_on = {id(event) for event in kept} | {id(event) for event in super().apply(found, dead)}
        return [event for event in events if id(event) in going_on]

    def edit(self, event: Event, document: Any) -> str | bool:
        extra = self.table[self.key.read(event) or ""]
        event.set_document({**document, **extra} if self.into is None else {**document, self.into: extra})
        return True


class GzipStep:
    name = "gzip"

    def __init__(self, level: int = 6) -> None:
        self.level = level

    def apply(self, events: list[Event], dead: Dead) -> list[Event]:
        for event in events:
            # mtime 0: the same event compresses to the same bytes when a batch runs again.
            event.set_body(gzip_format.compress(event.body, compresslevel=self.level, mtime=0))
        return events


def gunzip_body(body: bytes, max_bytes: int) -> bytes:
    """The decompressed body; `ValueError` (the reason) when it is not gzip or is larger than `max_bytes`."""
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    output = io.BytesIO()
    data = body
    try:
        while data:
            chunk = decompressor.decompress(data, max_bytes + 1 - output.tell())
            output.write(chunk)
            if output.tell() > max_bytes:
                raise ValueError(f"the body decompresses to more than {max_bytes} bytes")
            data = decompressor.unconsumed_tail
            if decompressor.eof:
                data = decompressor.unused_data  # another gzip member follows
                if data:
                    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        if not decompressor.eof:
            raise ValueError("the body is not gzip data (truncated)")
    except zlib.error:
        raise ValueError("the body is not gzip data") from None
    return output.getvalue()


class GunzipStep:
    name = "gunzip"

    def __init__(self, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes

    def apply(self, events: list[Event], dead: Dead) -> list[Event]:
        kept = []
        for event in events:
            try:
                event.set_body(gunzip_body(event.body, self.max_bytes))
            except ValueError as exc:
                dead.append((event, f"gunzip: {exc}"))
                continue
            kept.append(event)
        return kept


# --- dedupe: state across batches -------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    sequence: int
    enqueued_us: int | None


def _micros(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    utc = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return int(utc.timestamp() * 1_000_000)


def dedupe_partition(
    events: Sequence[Event], key: Callable[[Event], str | None], state: dict[str, Seen], window_us: int
) -> tuple[list[Event], list[Event]]:
    """One source partition's events (in sequence order): (kept, dropped as repeats). `state` (key -> the
    first event of the key within the window) is updated, and pruned of records older than a window before
    the batch's first event."""
    kept: list[Event] = []
    dropped: list[Event] = []
    oldest: int | None = None
    for event in events:
        value = key(event)
        sequence = event.row.get("sequence_number")
        enqueued = _micros(event.row.get("enqueued_time"))
        if enqueued is not None:
            oldest = enqueued if oldest is None else min(oldest, enqueued)
        if value is None or sequence is None:
            kept.append(event)
            continue
        seen = state.get(value)
        if seen is None:
            state[value] = Seen(sequence, enqueued)
            kept.append(event)
        elif seen.sequence == sequence:
            kept.append(event)  # the recorded event itself, read again
        elif enqueued is None or seen.enqueued_us is None or abs(enqueued - seen.enqueued_us) <= window_us:
            dropped.append(event)
        else:
            if sequence > seen.sequence:
                state[value] = Seen(sequence, enqueued)
            kept.append(event)
    if oldest is not None:
        # Kept back to a window before this batch's first event: a replay of this batch (from its start)
        # meets the records its first run met, so it forwards every event that run forwarded.
        horizon = oldest - window_us
        for value in [v for v, s in state.items() if s.enqueued_us is not None and s.enqueued_us < horizon]:
            del state[value]
    return kept, dropped


class DedupeStep:
    """Drops repeats of a key within a window, per source partition; state in `store` (see the module)."""

    name = "dedupe"

    def __init__(
        self, key: EventFieldSpec, window_seconds: float, store: ObjectStore | None, folder: str
    ) -> None:
        self.key = FieldReader(key)
        self.window_us = int(window_seconds * 1_000_000)
        self.store = store
        self.folder = folder

    def _state_name(self, partition: str) -> str:
        return f"{self.folder}/{partition}.json"

    def load(self, partition: str) -> dict[str, Seen]:
        if self.store is None:
            return {}
        try:
            data = json.loads(self.store.get(self._state_name(partition)))
        except FileNotFoundError:
            return {}
        return {key: Seen(int(entry[0]), entry[1]) for key, entry in data["keys"].items()}

    def save(self, partition: str, state: Mapping[str, Seen]) -> None:
        if self.store is None:
            return
        document = {"keys": {key: [seen.sequence, seen.enqueued_us] for key, seen in state.items()}}
        self.store.put(self._state_name(partition), json.dumps(document, separators=(",", ":")).encode())

    def apply(self, events: list[Event], dead: Dead) -> list[Event]:
        by_partition: dict[str, list[Event]] = {}
        for event in events:
            by_partition.setdefault(str(event.row.get("partition") or "_"), []).append(event)
        dropped: set[int] = set()
        for partition, own in by_partition.items():
            own.sort(key=lambda e: e.row.get("sequence_number") or 0)
            state = self.load(partition)
            before = dict(state)
            _, repeats = dedupe_partition(own, self.key.read, state, self.window_us)
            dropped.update(id(event) for event in repeats)
            if state != before:
                self.save(partition, state)
        return [event for event in events if id(event) not in dropped]


# --- from the manifest ---------------------------------------------------------------------------------


def python_step(spec: EditorStepSpec, index: int, state: ObjectStore | None) -> PythonStep | None:
    """The Python step an editor entry describes; None for the steps Spark runs (function, filter)."""
    if spec.select is not None:
        return SelectStep(spec.select)
    if spec.flatten is not None:
        return FlattenStep(spec.flatten.separator)
    if spec.validate_ is not None:
        check_json_schema(spec.validate_.json_schema, f"editor step {index + 1} (validate)")
        return ValidateStep(spec.validate_.json_schema)
    if spec.dedupe is not None:
        return DedupeStep(spec.dedupe.key, spec.dedupe.window_seconds, state, f"_state/dedupe-{index + 1}")
    if spec.enrich is not None:
        enrich = spec.enrich
        table: Mapping[str, Mapping[str, Any]] = (
            enrich.table if enrich.table is not None else load_table(enrich.path or "")
        )
        return EnrichStep(enrich.key, table, enrich.into, enrich.on_missing)
    if spec.gzip is not None:
        return GzipStep(spec.gzip.level)
    if spec.gunzip is not None:
        return GunzipStep(spec.gunzip.max_bytes)
    return None


def run_steps(steps: Sequence[PythonStep], events: list[Event]) -> tuple[list[Event], Dead]:
    """The events every step let through, in order, and the dead letters with their reasons."""
    dead: Dead = []
    for step in steps:
        if not events:
            break
        events = step.apply(events, dead)
    return events, dead


def _short(error: object, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
