"""The load generator's plan, without a hub: rates, profiles, totals, keys, malformed events."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence

import pytest

from hubshift.apps.produce import (
    EventGenerator,
    GeneratedEvent,
    LoadSpec,
    ProduceSummary,
    RateProfile,
    home_id,
    parse_profile,
    produce_load,
)
from hubshift.errors import UserError
from hubshift.pipelines import sensor_events as ev


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class RecordingSender:
    def __init__(self, partitions: int = 4) -> None:
        self.ids = [str(p) for p in range(partitions)]
        self.sent: dict[str, list[GeneratedEvent]] = defaultdict(list)
        self.rounds = 0

    def partition_ids(self) -> list[str]:
        return list(self.ids)

    def partition_for(self, key: str) -> str:
        return self.ids[sum(key.encode()) % len(self.ids)]

    def send(self, partition: str, events: Sequence[GeneratedEvent]) -> None:
        self.rounds += 1
        self.sent[partition].extend(events)

    def close(self) -> None:
        pass


def run(spec: LoadSpec, sender: RecordingSender | None = None) -> tuple[RecordingSender, ProduceSummary]:
    sender = sender or RecordingSender()
    clock = FakeClock()
    summary = produce_load(spec, sender, hub="h", clock=clock, sleep=clock.sleep)
    return sender, summary


def test_steady_rate_for_a_duration_sends_rate_times_duration() -> None:
    sender, summary = run(LoadSpec(homes=50, rate=200, duration=10, seed=1))
    assert summary.events == 2000
    assert sum(len(v) for v in sender.sent.values()) == 2000
    assert summary.partitions == {p: len(sender.sent[p]) for p in sender.ids}
    assert summary.duration_seconds == pytest.approx(10)


def test_count_stops_exactly_and_keys_stay_in_their_partition() -> None:
    sender, summary = run(LoadSpec(homes=30, rate=1000, count=777, seed=2))
    assert summary.events == 777
    for partition, events in sender.sent.items():
        assert {sender.partition_for(e.partition_key) for e in events} == {partition}
        for generated in events:
            assert generated.event is not None
            assert generated.event.home_id == generated.partition_key
            parsed = ev.parse_event(generated.body)
            assert (parsed.home_id, parsed.sensor_id) == (generated.event.home_id, generated.event.sensor_id)
    assert len(summary.homes) <= 30


def test_malformed_share_and_reasons() -> None:
    sender, summary = run(LoadSpec(homes=10, rate=1000, count=4000, malformed_ratio=0.1, seed=3))
    malformed = [e for events in sender.sent.values() for e in events if e.event is None]
    assert summary.malformed == len(malformed)
    assert 300 < len(malformed) < 500
    reasons = set()
    for generated in malformed:
        with pytest.raises(ev.InvalidEvent) as error:
            ev.parse_event(generated.body)
        reasons.add(error.value.reason)
    assert reasons == {ev.REASON_NOT_JSON_OBJECT, "homeId is missing", ev.REASON_EVENT_TIME}
    good = sum(summary.by_type.values())
    assert good == 4000 - len(malformed)


def test_the_same_seed_gives_the_same_load() -> None:
    first, _ = run(LoadSpec(homes=100, rate=500, count=300, seed=9))
    second, _ = run(LoadSpec(homes=100, rate=500, count=300, seed=9))
    keys = {p: [e.partition_key for e in events] for p, events in first.sent.items()}
    assert keys == {p: [e.partition_key for e in events] for p, events in second.sent.items()}


def test_sensors_of_a_home_cover_the_sensor_types() -> None:
    generator = EventGenerator(LoadSpec(homes=1, sensors_per_home=4, seed=4))
    from datetime import UTC, datetime

    seen = {generator.next(datetime(2026, 1, 1, tzinfo=UTC)).event for _ in range(400)}
    assert {e.sensor_type for e in seen if e} == {"motion", "door", "window", "glass_break"}
    assert {e.sensor_id for e in seen if e} == {f"{home_id(0)}-s{i:02d}" for i in range(4)}
    assert any(e.event_type == ev.HEARTBEAT for e in seen if e)


def test_rise_fall_rises_and_falls() -> None:
    profile = parse_profile("rise-fall", 1000, period=100)
    assert profile.rate_at(0) == pytest.approx(100)
    assert profile.rate_at(50) == pytest.approx(1000)
    assert profile.rate_at(100) == pytest.approx(100)
    assert profile.rate_at(25) < profile.rate_at(50) > profile.rate_at(75)
    _, summary = run(LoadSpec(rate=1000, duration=100, profile=profile, seed=5))
    # the mean of 0.1 + 0.9 sin^2 over a period is 0.55
    assert summary.events == pytest.approx(55_000, rel=0.01)


def test_points_profile_is_piecewise_linear() -> None:
    profile = parse_profile("0:100, 10:1100, 20:100", 5)
    assert profile == RateProfile("points", 1100, 120.0, ((0, 100), (10, 1100), (20, 100)))
    assert [profile.rate_at(t) for t in (0, 5, 10, 15, 20, 30)] == [100, 600, 1100, 600, 100, 100]
    assert profile.describe() == "0:100,10:1100,20:100"


@pytest.mark.parametrize(
    ("text", "message"),
    [("wobble", "expected steady, rise-fall"), ("0:1,0:2", "times must increase"), ("0:-1", "negative")],
)
def test_bad_profiles_are_one_line(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_profile(text, 10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"homes": 0}, "--homes"),
        ({"sensors_per_home": 0}, "--sensors-per-home"),
        ({"rate": 0}, "--rate"),
        ({"duration": -1}, "--duration"),
        ({"count": -1}, "--count"),
        ({"malformed_ratio": 2}, "--malformed-ratio"),
        ({"interval": 0}, "--interval"),
    ],
)
def test_bad_load_is_one_line(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(UserError, match=message):
        LoadSpec(**kwargs)  # type: ignore[arg-type]


def test_stop_ends_the_load() -> None:
    stop = threading.Event()
    stop.set()
    summary = produce_load(LoadSpec(rate=100), RecordingSender(), stop=stop)
    assert summary.events == 0


def test_summary_json() -> None:
    _, summary = run(LoadSpec(homes=5, rate=100, count=50, seed=1))
    document = summary.to_json()
    assert document["events"] == 50
    assert document["valid"] == 50
    assert list(document["partitions"]) == ["0", "1", "2", "3"]
    assert sum(document["byType"].values()) == 50
    assert document["profile"] == "steady"
