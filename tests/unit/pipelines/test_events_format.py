"""The home-security event format: one definition for the producer, the pipeline and its tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from hubshift.pipelines import sensor_events as ev
from hubshift.pipelines.sensor_events import InvalidEvent, SensorEvent, parse_event
from hubshift.sinks.base import format_time

MOMENT = datetime(2026, 11, 21, 10, 0, 1, 123456, tzinfo=UTC)


def test_body_round_trips_with_millisecond_utc_time() -> None:
    event = SensorEvent("h000042", "h000042-s03", "motion", "detected", MOMENT)
    body = event.to_json()
    assert json.loads(body) == {
        "homeId": "h000042",
        "sensorId": "h000042-s03",
        "sensorType": "motion",
        "eventType": "detected",
        "eventTime": "2026-11-21T10:00:01.123Z",
    }
    parsed = parse_event(body)
    assert parsed.home_id == "h000042"
    assert parsed.event_time == MOMENT.replace(microsecond=123000)
    assert event.partition_key == "h000042"


def test_format_time_converts_to_utc() -> None:
    plus_two = MOMENT.astimezone(timezone(timedelta(hours=2)))
    assert format_time(plus_two) == "2026-11-21T10:00:01.123Z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T10:00:01Z", datetime(2026, 11, 21, 10, 0, 1, tzinfo=UTC)),
        ("2026-11-21T10:00:01", datetime(2026, 11, 21, 10, 0, 1, tzinfo=UTC)),
        ("2026-11-21 10:00:01.5", datetime(2026, 11, 21, 10, 0, 1, 500000, tzinfo=UTC)),
        ("2026-11-21T12:00:01+02:00", datetime(2026, 11, 21, 10, 0, 1, tzinfo=UTC)),
    ],
)
def test_event_time_forms(text: str, expected: datetime) -> None:
    body = json.dumps({"homeId": "h", "sensorType": "door", "eventType": "open", "eventTime": text})
    assert parse_event(body.encode()).event_time == expected


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (None, ev.REASON_EMPTY),
        (b"", ev.REASON_EMPTY),
        (b"{", ev.REASON_NOT_JSON_OBJECT),
        (b'"text"', ev.REASON_NOT_JSON_OBJECT),
        (b"\xff\xfe{}", ev.REASON_NOT_JSON_OBJECT),
        (b'{"sensorType":"door","eventType":"open","eventTime":"2026-11-21T10:00:00Z"}', "homeId is missing"),
        (b'{"homeId":"h","eventType":"open","eventTime":"2026-11-21T10:00:00Z"}', "sensorType is missing"),
        (b'{"homeId":"h","sensorType":"door","eventTime":"2026-11-21T10:00:00Z"}', "eventType is missing"),
        (b'{"homeId":"h","sensorType":"door","eventType":"open"}', ev.REASON_EVENT_TIME),
        (
            b'{"homeId":"h","sensorType":"door","eventType":"open","eventTime":"2026-11-21"}',
            ev.REASON_EVENT_TIME,
        ),
        (
            b'{"homeId":"h","sensorType":"door","eventType":"open","eventTime":"2026-13-01T00:00:00Z"}',
            ev.REASON_EVENT_TIME,
        ),
    ],
)
def test_invalid_bodies_name_the_reason(body: bytes | None, reason: str) -> None:
    with pytest.raises(InvalidEvent) as error:
        parse_event(body)
    assert error.value.reason == reason


def test_non_text_ids_are_read_as_their_json_text_like_spark() -> None:
    body = b'{"homeId":42,"sensorType":"door","eventType":"open","eventTime":"2026-11-21T10:00:00Z"}'
    assert parse_event(body).home_id == "42"


def test_every_sensor_type_has_event_types() -> None:
    assert ev.SENSOR_TYPES[:4] == ("motion", "door", "window", "glass_break")
    assert all(ev.SENSOR_EVENT_TYPES[t] for t in ev.SENSOR_TYPES)
