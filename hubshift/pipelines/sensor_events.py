"""The home-security event: the JSON body the producer sends and the aggregate pipeline reads.

One event is one sensor reading from one home (the seeds' scenario: 100,000 homes, motion detectors,
door/window sensors, glass-break detectors, ...). The body is a JSON object:

    {"homeId": "h000042", "sensorId": "h000042-s03", "sensorType": "motion",
     "eventType": "detected", "eventTime": "2026-11-21T10:00:01.123Z"}

`homeId`, `sensorType`, `eventType` and `eventTime` are required; `sensorId` is informational. `eventTime`
is an ISO 8601 date and time to the second or finer, with `Z` or a `+hh:mm` offset (without one it is read
as UTC): `EVENT_TIME_PATTERN`. Sensor and event types are open sets:
a new kind of sensor (a carbon monoxide detector added to every home) is counted like any other. The
partition key of every event is its `homeId`, so one home's events stay in order in one partition.

Events that break these rules are dead-lettered with one of the `REASON_*` strings below, by the Spark
pipeline and by `parse_event` alike.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from hubshift.sinks.base import format_time

HOME_ID = "homeId"
SENSOR_ID = "sensorId"
SENSOR_TYPE = "sensorType"
EVENT_TYPE = "eventType"
EVENT_TIME = "eventTime"

# Valid in Python's `re` and in RE2 (Arrow's compute functions, `pipelines/bodies.py`).
EVENT_TIME_PATTERN = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})?$"
ZONED_PATTERN = r"(Z|[+-]\d{2}:\d{2})$"

# What each kind of sensor reports; every sensor also sends a periodic `heartbeat`.
HEARTBEAT = "heartbeat"
SENSOR_EVENT_TYPES: dict[str, tuple[str, ...]] = {
    "motion": ("detected", "clear"),
    "door": ("open", "closed"),
    "window": ("open", "closed"),
    "glass_break": ("alarm",),
    "smoke": ("alarm", "clear"),
    "carbon_monoxide": ("alarm", "clear"),
    "water_leak": ("alarm", "clear"),
}
SENSOR_TYPES: tuple[str, ...] = tuple(SENSOR_EVENT_TYPES)

REASON_EMPTY = "body is empty"
REASON_NOT_JSON_OBJECT = "body is not a JSON object (or not UTF-8)"
REASON_EVENT_TIME = f"{EVENT_TIME} is missing or not an ISO 8601 timestamp"


def reason_missing(field: str) -> str:
    return f"{field} is missing"


REQUIRED_TEXT_FIELDS = (HOME_ID, SENSOR_TYPE, EVENT_TYPE)


@dataclass(frozen=True)
class SensorEvent:
    home_id: str
    sensor_id: str
    sensor_type: str
    event_type: str
    event_time: datetime

    def to_json(self) -> bytes:
        return json.dumps(
            {
                HOME_ID: self.home_id,
                SENSOR_ID: self.sensor_id,
                SENSOR_TYPE: self.sensor_type,
                EVENT_TYPE: self.event_type,
                EVENT_TIME: format_time(self.event_time),
            },
            separators=(",", ":"),
        ).encode()

    @property
    def partition_key(self) -> str:
        return self.home_id


class InvalidEvent(ValueError):
    """An event body that breaks the format; `reason` is what the dead letter records."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_event(body: bytes | None) -> SensorEvent:
    """The event in a body, or `InvalidEvent` with the same reason the Spark pipeline gives."""
    if not body:
        raise InvalidEvent(REASON_EMPTY)
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: nested too deep
        raise InvalidEvent(REASON_NOT_JSON_OBJECT) from None
    if not isinstance(document, dict):
        raise InvalidEvent(REASON_NOT_JSON_OBJECT)
    text = {field: _as_text(document.get(field)) for field in (*REQUIRED_TEXT_FIELDS, SENSOR_ID)}
    for field in REQUIRED_TEXT_FIELDS:
        if not text[field]:
            raise InvalidEvent(reason_missing(field))
    raw_time = document.get(EVENT_TIME)
    if not isinstance(raw_time, str) or not re.fullmatch(EVENT_TIME_PATTERN, raw_time):
        raise InvalidEvent(REASON_EVENT_TIME)
    try:
        moment = datetime.fromisoformat(raw_time.replace("Z", "+00:00"))
        # An offset can take the instant out of the years 1-9999 (OverflowError).
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise InvalidEvent(REASON_EVENT_TIME) from None
    return SensorEvent(
        home_id=str(text[HOME_ID]),
        sensor_id=text[SENSOR_ID] or "",
        sensor_type=str(text[SENSOR_TYPE]),
        event_type=str(text[EVENT_TYPE]),
        event_time=moment,
    )


def _as_text(value: object) -> str | None:
    # Spark's from_json reads any JSON value into a string column as its JSON text.
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))
