"""The aggregate's reading of a task's bodies with Arrow (`read_bodies`): for every body exactly the verdict
of the reference, `parse_event` (fields, or the dead-letter reason), whichever path decided it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift.pipelines import sensor_events as ev
from hubshift.pipelines.bodies import EVENT_TIME_US, REASON, read_bodies

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
Verdict = tuple[str | None, str | None, str | None, int | None, str | None]


def reference(body: bytes | None) -> Verdict:
    try:
        event = ev.parse_event(body)
    except ev.InvalidEvent as invalid:
        return (None, None, None, None, invalid.reason)
    micros = (event.event_time - EPOCH) // timedelta(microseconds=1)
    return (event.home_id, event.sensor_type, event.event_type, micros, None)


def verdicts(bodies: list[bytes | None]) -> list[Verdict]:
    read = read_bodies(pa.array(bodies, pa.binary()))
    names = (ev.HOME_ID, ev.SENSOR_TYPE, ev.EVENT_TYPE, EVENT_TIME_US, REASON)
    return list(zip(*(read.column(name).to_pylist() for name in names), strict=True))


def body(**fields: object) -> bytes:
    document = {
        "homeId": "h1",
        "sensorType": "motion",
        "eventType": "detected",
        "eventTime": "2026-11-21T10:00:00Z",
    }
    document.update(fields)
    return json.dumps({k: v for k, v in document.items() if v is not ...}).encode()


GOOD = [
    ev.SensorEvent(f"h{n:03d}", "s", "door", "open", T0 + timedelta(seconds=n)).to_json() for n in range(300)
]

ODD = [
    None,
    b"",
    b" ",
    b"not json",
    b"[1, 2]",
    b'"text"',
    b"\xff\xfe{}",
    b"\xef\xbb\xbf" + GOOD[0],  # a byte order mark
    GOOD[0] + GOOD[1],  # two objects on one line
    GOOD[0] + b"\x00",
    GOOD[0].replace(b",", b",\n"),  # line breaks between the fields: a good event
    GOOD[0].replace(b",", b",\r"),
    b"\t " + GOOD[0] + b" \t",
    body(homeId=5),
    body(homeId=None),
    body(homeId=""),
    body(homeId=...),
    body(sensorType={"a": 1}),
    body(eventType=[1]),
    body(eventType=True),
    body(homeId="h\u00e9\U0001f600"),
    body(homeId='a"b\\c\n'),
    b'{"homeId":"h1","homeId":"h2","sensorType":"m","eventType":"x","eventTime":"2026-11-21T10:00:00Z"}',
    b'{"homeId":"h\\u0031","sensorType":"m","eventType":"x","eventTime":"2026-11-21T10:00:00Z","x":NaN}',
    b'{"homeId":"h","sensorType":"m","eventType":"x","eventTime":"2026-11-21T10:00:00Z","x":1e999}',
    b'{"homeId":"h","sensorType":"m","eventType":"x","eventTime":"2026-11-21T10:00:00Z","x":'
    + b"[" * 5000
    + b"]" * 5000
    + b"}",
    body(eventTime=...),
    body(eventTime=1700000000),
    body(eventTime="yesterday"),
    body(eventTime="2026-11-21T10:00:00"),
    body(eventTime="2026-11-21 10:00:00.5"),
    body(eventTime="2026-11-21T12:00:00+02:00"),
    body(eventTime="2026-11-21T10:00:00.1234567Z"),  # .NET's seven digits
    body(eventTime="2026-11-21T10:00:00.123456789-05:30"),
    body(eventTime="2026-02-30T10:00:00Z"),
    body(eventTime="2026-11-21T24:00:00Z"),
    body(eventTime="2026-11-21T10:00:00+24:00"),
    body(eventTime="9999-12-31T23:59:59-01:00"),  # beyond year 9999 in UTC
    body(eventTime="0001-01-01T00:30:00+01:00"),  # before year 1 in UTC
    body(eventTime="0000-12-31T23:30:00-01:00"),  # year 0 refused before the offset applies
    body(eventTime="\u0662\u0660\u0662\u0666-11-21T10:00:00Z"),  # Unicode digits
]


def test_well_formed_bodies_are_read_by_arrow_as_python_reads_them() -> None:
    assert verdicts(list(GOOD)) == [reference(b) for b in GOOD]


@pytest.mark.parametrize("odd", ODD, ids=range(len(ODD)))
def test_each_odd_body_among_good_ones_gets_the_reference_verdict(odd: bytes | None) -> None:
    bodies = [*GOOD[:150], odd, *GOOD[150:]]
    assert verdicts(bodies) == [reference(b) for b in bodies]


def test_many_odd_bodies_at_once() -> None:
    bodies = [b for pair in zip(GOOD, ODD * 8, strict=False) for b in pair]
    assert verdicts(bodies) == [reference(b) for b in bodies]


def test_a_lone_surrogate_becomes_a_question_mark() -> None:
    # Python reads `\ud800` into a string UTF-8 cannot hold; Spark's JVM wrote `?` for it too.
    (verdict,) = verdicts(
        [b'{"homeId":"h\\ud800","sensorType":"m","eventType":"x","eventTime":"2026-11-21T10:00:00Z"}']
    )
    assert verdict[0] == "h?" and verdict[4] is None


def test_no_bodies() -> None:
    assert verdicts([]) == []


_TEXT = st.one_of(st.text(max_size=6), st.sampled_from(["h1", "motion", "", " "]))
_VALUE = st.one_of(
    st.none(),
    _TEXT,
    st.integers(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)
_TIME = st.one_of(
    _VALUE,
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat(sep=" ")),
    st.from_regex(ev.EVENT_TIME_PATTERN, fullmatch=True),
)


@st.composite
def _bodies(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.sampled_from(["event", "event", "event", "bytes", "odd"]))
    if kind == "bytes":
        return draw(st.one_of(st.none(), st.binary(max_size=40)))
    if kind == "odd":
        return draw(st.sampled_from(ODD))
    document = {
        name: draw(value)
        for name, value in (
            ("homeId", _VALUE),
            ("sensorType", _VALUE),
            ("eventType", _VALUE),
            ("eventTime", _TIME),
        )
        if draw(st.booleans()) or draw(st.booleans())
    }
    text = json.dumps(
        document, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, None, 1]))
    )
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=150, deadline=None)
@given(st.lists(_bodies(), max_size=80))
def test_any_bodies_get_the_reference_verdict(bodies: list[bytes | None]) -> None:
    # The one known difference: a lone surrogate (from a `\ud800` escape) is `?` (test above).
    expected = [
        tuple(v.encode("utf-8", "replace").decode() if isinstance(v, str) else v for v in reference(b))
        for b in bodies
    ]
    assert verdicts(bodies) == expected
