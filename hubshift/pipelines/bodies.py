"""Reading a Spark task's event bodies with Arrow: for every body the verdict of `events.parse_event`
(the event's fields, or the dead-letter reason), with the well-formed bodies read in C++.

Two paths, one answer:

- **Arrow** reads the bodies that can be lines of newline-delimited JSON (a `{` first, no line break or
  NUL), joined with newlines, with `pyarrow.json` (four string fields, other fields ignored); then the
  `eventTime` texts that have the expected shape are converted by Arrow's ISO 8601 cast. A body is decided
  here only when it is certainly a good event: valid UTF-8, exactly one JSON object, the three required
  fields non-empty strings, a time Python reads to the same instant. A block Arrow refuses is read again
  in halves, so one bad body does not send its neighbours down the slow path.
- **`parse_event`**, the reference, reads every other body one by one in Python (the empty ones, those
  with line breaks, not JSON, a field missing or not a string, a time Arrow cannot cast, ...) and gives its
  fields or its reason.

So each body gets exactly `parse_event`'s verdict, and the usual batch (all well-formed) costs about a
microsecond of C++ per event.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from hubshift.pipelines import sensor_events as ev

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

_T = TypeVar("_T", "pa.Array", "pa.Table")

# The columns `read_bodies` returns.
REASON = "reason"
EVENT_TIME_US = "event_time_us"
TEXT_FIELDS = ev.REQUIRED_TEXT_FIELDS

# Below this many bodies a block Arrow refuses is not split further: its bodies go to `parse_event`.
SMALLEST_BLOCK = 32
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The instants Python's datetime holds (parse_event refuses others), in microseconds since the epoch.
_MIN_US = (datetime(1, 1, 1, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_MAX_US = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
# Bodies longer than this (so possibly nested deeper than half of it) with at least this many `[` and `{`
# go to Python, which fails on nesting near 1,000 deep.
_LONG = 400
_MAX_BRACKETS = 100
# Fractions of a second beyond microseconds: Python truncates them, Arrow's cast refuses them.
_SUB_MICROSECONDS = r"(\.\d{6})\d+"


def read_bodies(bodies: pa.Array | pa.ChunkedArray) -> pa.Table:
    """Per body: `homeId`, `sensorType`, `eventType` (strings) and `event_time_us` (int64) of a good event,
    else null and `reason` (the dead-letter reason, null for a good event)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(bodies, pa.ChunkedArray):
        bodies = bodies.combine_chunks() if bodies.num_chunks else pa.array([], pa.binary())
    if bodies.type != pa.binary():  # large_binary (Spark's large variable types): 32-bit offsets here
        bodies = bodies.cast(pa.binary())
    count = len(bodies)
    chosen = pa.array(np.flatnonzero(_one_line(bodies)))
    if len(chosen) == count:
        fields = _read_json(bodies)
    else:
        fields = _scatter(_read_json(bodies.take(chosen)), chosen.to_numpy(), count)
    micros = _event_times(fields.column(ev.EVENT_TIME))
    good = pc.is_valid(micros)
    for name in TEXT_FIELDS:
        text = fields.column(name)
        good = pc.and_(good, pc.fill_null(pc.greater(pc.binary_length(text), 0), False))
    columns: dict[str, pa.Array | pa.ChunkedArray] = {name: fields.column(name) for name in TEXT_FIELDS}
    columns[EVENT_TIME_US] = micros
    undecided = np.flatnonzero(~good.to_numpy(zero_copy_only=False))
    if len(undecided) == 0:
        columns[REASON] = pa.nulls(count, pa.string())
        return pa.table(columns)
    # The reference reads the rest one by one; its good events replace Arrow's partial reading.
    found: dict[str, list[object]] = {name: [] for name in (*TEXT_FIELDS, EVENT_TIME_US)}
    reasons: list[str | None] = [None] * count
    for index in undecided.tolist():
        try:
            event = ev.parse_event(bodies[index].as_py())
        except ev.InvalidEvent as invalid:
            reasons[index] = invalid.reason
            for values in found.values():
                values.append(None)
            continue
        found[ev.HOME_ID].append(_utf8(event.home_id))
        found[ev.SENSOR_TYPE].append(_utf8(event.sensor_type))
        found[ev.EVENT_TYPE].append(_utf8(event.event_type))
        found[EVENT_TIME_US].append((event.event_time - _EPOCH) // timedelta(microseconds=1))
    mask = np.zeros(count, dtype=bool)
    mask[undecided] = True
    replace = pa.array(mask)
    for name in TEXT_FIELDS:
        column = _one_chunk(columns[name])
        columns[name] = pc.replace_with_mask(column, replace, pa.array(found[name], column.type))
    columns[EVENT_TIME_US] = pc.replace_with_mask(
        _one_chunk(micros), replace, pa.array(found[EVENT_TIME_US], pa.int64())
    )
    columns[REASON] = pa.array(reasons, pa.string())
    return pa.table(columns)


def _one_line(bodies: pa.Array) -> npt.NDArray[np.bool_]:
    """Which bodies Arrow may read as lines of JSON: a `{` first (Arrow would skip a byte order mark that
    Python refuses), no line break or NUL, and, when long, few brackets (Python gives up on nesting near
    1,000 deep, Arrow does not). Others go to Python. On the buffer with numpy: regular expressions over
    every body cost more than reading the JSON."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    count = len(bodies)
    _, offset_buffer, data = bodies.buffers()
    if count == 0 or offset_buffer is None or data is None:
        return np.zeros(count, dtype=bool)
    offsets = np.frombuffer(offset_buffer, np.int32, count=count + 1, offset=4 * bodies.offset)
    starts, ends = offsets[:-1], offsets[1:]
    content = np.frombuffer(data, np.uint8)
    ok = ends > starts
    if bodies.null_count:
        ok &= bodies.is_valid().to_numpy(zero_copy_only=False)
    ok[ok] = content[starts[ok]] == ord("{")
    # Line breaks and NUL: the rare bytes below 14 first, then which they are.
    low = np.flatnonzero(content[offsets[0] : offsets[-1]] < 14) + offsets[0]
    breaks = low[np.isin(content[low], (0, 10, 13))]
    if len(breaks):
        ok[np.searchsorted(offsets, breaks, side="right") - 1] = False
    long = np.flatnonzero(ok & (ends - starts > _LONG))
    if len(long):
        brackets = pc.count_substring_regex(bodies.take(pa.array(long)), "[\\[{]").to_numpy()
        ok[long[brackets >= _MAX_BRACKETS]] = False
    return ok


def _read_json(bodies: pa.Array) -> pa.Table:
    """The four string fields of each body; all null where Arrow could not read the body as one object."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    schema = _json_schema()
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")

    def read(block: pa.Array) -> pa.Table:
        # Invalid UTF-8 fails the cast (Arrow's JSON reader would take it); a line per body.
        lines = pc.binary_join_element_wise(block.cast(pa.string()), "\n", "")
        _, offset_buffer, data = lines.buffers()
        assert offset_buffer is not None and data is not None
        offsets = np.frombuffer(offset_buffer, np.int32, count=len(lines) + 1, offset=4 * lines.offset)
        start, end = int(offsets[0]), int(offsets[-1])
        text = data.slice(start, end - start)
        table = pj.read_json(
            pa.BufferReader(text),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, end - start + 1)),
            parse_options=options,
        )
        if table.num_rows != len(block):  # `{..}{..}` on one line: two rows, and not JSON for Python
            raise ValueError("not one object per line")
        return table.select(schema.names)

    return _in_halves(bodies, read, lambda n: pa.table({f.name: pa.nulls(n, f.type) for f in schema}))


def _event_times(text: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Microseconds since the epoch where Arrow reads the time as Python does; null elsewhere."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = _one_chunk(text)
    # `\d` is ASCII here (RE2) and Unicode in Python's pattern: what matches here matches there. Python's
    # fromisoformat refuses year 0 before the offset is applied; a time without a zone is UTC.
    shaped = pc.and_(
        pc.fill_null(pc.match_substring_regex(text, ev.EVENT_TIME_PATTERN), False),
        pc.invert(pc.fill_null(pc.starts_with(text, "0000"), True)),
    )
    zoned = pc.fill_null(pc.match_substring_regex(text, ev.ZONED_PATTERN), False)
    complete = pc.if_else(zoned, text, pc.binary_join_element_wise(text, "Z", ""))
    complete = pc.if_else(shaped, complete, pa.scalar(None, pa.string()))
    stamp = pa.timestamp("us", tz="UTC")

    def cast(block: pa.Array) -> pa.Array:
        try:
            return block.cast(stamp)
        except pa.ArrowInvalid:
            return pc.replace_substring_regex(block, _SUB_MICROSECONDS, r"\1").cast(stamp)

    micros = _in_halves(complete, cast, lambda n: pa.nulls(n, stamp)).cast(pa.int64())
    # Beyond Python's datetime (after the offset is applied) parse_event refuses the time.
    inside = pc.and_(pc.greater_equal(micros, _MIN_US), pc.less_equal(micros, _MAX_US))
    return pc.if_else(pc.fill_null(inside, False), micros, pa.scalar(None, pa.int64()))


def _in_halves(values: pa.Array, convert: Callable[[pa.Array], _T], unknown: Callable[[int], _T]) -> _T:
    """`convert(values)`; when it fails, each half converted alone, down to `SMALLEST_BLOCK` values, whose
    result is `unknown(n)` (all null: decided one by one later)."""
    import pyarrow as pa

    try:
        return convert(values)
    except (pa.ArrowInvalid, ValueError):
        if len(values) <= SMALLEST_BLOCK:
            return unknown(len(values))
    half = len(values) // 2
    first = _in_halves(values.slice(0, half), convert, unknown)
    second = _in_halves(values.slice(half), convert, unknown)
    if isinstance(first, pa.Table):
        return pa.concat_tables([first, second]).combine_chunks()
    return pa.concat_arrays([first, second])


def _scatter(table: pa.Table, positions: npt.NDArray[np.int64], count: int) -> pa.Table:
    """`table`'s rows at `positions` of a table of `count` rows, null elsewhere."""
    import numpy as np
    import pyarrow as pa

    where = np.full(count, -1, dtype=np.int64)
    where[positions] = np.arange(table.num_rows, dtype=np.int64)
    return table.take(pa.array(where, mask=where < 0))


def _one_chunk(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    return values


def _json_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([(name, pa.string()) for name in (*TEXT_FIELDS, ev.EVENT_TIME)])


def _utf8(text: str) -> str:
    # A JSON `\ud800` escape gives Python a lone surrogate, which UTF-8 (and Arrow) cannot hold: it becomes
    # `?`, as Java's encoder makes it.
    return text.encode("utf-8", "replace").decode("utf-8")
