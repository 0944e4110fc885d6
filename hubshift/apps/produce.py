"""`hubshift produce`: a home-security sensor load for an Event Hub (tests, the demo, the benchmarks).

    hubshift produce --hub telemetry --homes 100000 --rate 2000 --duration 60
    hubshift produce --hub telemetry --rate 5000 --profile rise-fall --period 300   # the demo's load
    hubshift produce --hub telemetry --count 10000 --malformed-ratio 0.01 --output json

Homes `h000000`, `h000001`, ... each have `--sensors-per-home` sensors (motion, door, window, glass break,
smoke, ...); every event is one reading of a random sensor of a random home, in the format of
hubshift/pipelines/sensor_events.py, with the home as partition key. Events go out in batches every
`--interval` seconds at the rate the profile asks for. The partition of each key is the one the service
would pick (the SDK's own partition resolver), and the event carries the key, so consumers see it. At the
end (or on Ctrl-C) a summary says how many events went to each partition.

In-process (the demo, the benchmarks): `send_load(connection_string, hub, LoadSpec(...))`, or
`produce_load(spec, HubSender.connect(...))` to keep one connection for several loads.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import click

from hubshift.connections import chosen_identity, chosen_network, credential_options, network_options
from hubshift.errors import UserError
from hubshift.eventhubs.sender import send_events
from hubshift.eventhubs.target import EventHubsTarget, describe_error, hub_target, sdk_client
from hubshift.pipelines import sensor_events as ev
from hubshift.pipelines.sensor_events import SensorEvent
from hubshift.sinks.base import format_time
from hubshift.spec.hub import DEFAULT_EVENTHUBS_ENV

PROFILES = ("steady", "rise-fall")
MIN_RISE_FALL_SHARE = 0.1  # rise-fall never drops below this share of --rate, so the hub never goes idle


# --- the load, as plain data --------------------------------------------------------------------------


@dataclass(frozen=True)
class RateProfile:
    """Events per second at `t` seconds after the start.

    `steady`: `rate` throughout. `rise-fall`: from a tenth of `rate` up to `rate` at half of each period and
    back down (a smooth sin² wave). Points `T:RATE,T:RATE,...`: straight lines between the points, the last
    rate after the last point.
    """

    kind: str
    rate: float
    period: float = 120.0
    points: tuple[tuple[float, float], ...] = ()

    def rate_at(self, t: float) -> float:
        if self.kind == "steady":
            return self.rate
        if self.kind == "rise-fall":
            share = math.sin(math.pi * (t % self.period) / self.period) ** 2
            return self.rate * (MIN_RISE_FALL_SHARE + (1 - MIN_RISE_FALL_SHARE) * share)
        points = self.points
        if t <= points[0][0]:
            return points[0][1]
        for (t0, r0), (t1, r1) in itertools.pairwise(points):
            if t <= t1:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        return points[-1][1]

    def describe(self) -> str:
        if self.kind == "points":
            return ",".join(f"{t:g}:{r:g}" for t, r in self.points)
        return self.kind


def parse_profile(text: str, rate: float, period: float = 120.0) -> RateProfile:
    """`steady`, `rise-fall` or `T:RATE,T:RATE,...`; `UserError` naming the flag otherwise."""
    text = text.strip()
    if text in PROFILES:
        return RateProfile(text, rate, period)
    points: list[tuple[float, float]] = []
    try:
        for part in text.split(","):
            at, _, value = part.partition(":")
            points.append((float(at), float(value)))
    except ValueError:
        raise UserError(
            f"--profile {text!r}: expected steady, rise-fall, or points like 0:100,60:2000,120:100"
        ) from None
    if any(r < 0 or t < 0 for t, r in points):
        raise UserError(f"--profile {text!r}: times and rates must not be negative")
    if any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
        raise UserError(f"--profile {text!r}: times must increase")
    return RateProfile("points", max(r for _, r in points), period, tuple(points))


@dataclass(frozen=True)
class LoadSpec:
    homes: int = 1000
    sensors_per_home: int = 4
    rate: float = 100.0  # events per second (the peak of a rise-fall profile)
    duration: float | None = None  # seconds; with neither duration nor count: until stopped
    count: int | None = None
    profile: RateProfile | None = None  # default: steady at `rate`
    malformed_ratio: float = 0.0
    interval: float = 0.1  # seconds between send rounds
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.homes < 1:
            raise UserError("--homes must be at least 1")
        if self.sensors_per_home < 1:
            raise UserError("--sensors-per-home must be at least 1")
        if self.rate <= 0 and self.profile is None:
            raise UserError("--rate must be positive")
        if self.duration is not None and self.duration <= 0:
            raise UserError("--duration must be positive")
        if self.count is not None and self.count < 0:
            raise UserError("--count must not be negative")
        if not 0 <= self.malformed_ratio <= 1:
            raise UserError("--malformed-ratio must be between 0 and 1")
        if self.interval <= 0:
            raise UserError("--interval must be positive")

    @property
    def rate_profile(self) -> RateProfile:
        return self.profile or RateProfile("steady", self.rate)


def home_id(index: int) -> str:
    return f"h{index:06d}"


def sensor_type_of(sensor_index: int) -> str:
    """Sensor j of every home is of the same type: motion, door, window, glass break, smoke, ..."""
    return ev.SENSOR_TYPES[sensor_index % len(ev.SENSOR_TYPES)]


@dataclass(frozen=True)
class GeneratedEvent:
    partition_key: str
    body: bytes
    event: SensorEvent | None  # None: a malformed body (dead-letter tests)


class EventGenerator:
    """Random readings of random sensors; deterministic for a seed."""

    HEARTBEAT_SHARE = 0.6

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.random = random.Random(spec.seed)
        self._malformed = 0

    def next(self, now: datetime) -> GeneratedEvent:
        spec, rng = self.spec, self.random
        home = home_id(rng.randrange(spec.homes))
        sensor = rng.randrange(spec.sensors_per_home)
        kind = sensor_type_of(sensor)
        if rng.random() < self.HEARTBEAT_SHARE:
            event_type = ev.HEARTBEAT
        else:
            event_type = rng.choice(ev.SENSOR_EVENT_TYPES[kind])
        event = SensorEvent(home, f"{home}-s{sensor:02d}", kind, event_type, now)
        if spec.malformed_ratio and rng.random() < spec.malformed_ratio:
            return GeneratedEvent(home, self._malformed_body(event), None)
        return GeneratedEvent(home, event.to_json(), event)

    def _malformed_body(self, event: SensorEvent) -> bytes:
        # A rotation of the ways a body goes wrong; each is dead-lettered with its own reason.
        self._malformed += 1
        document = json.loads(event.to_json())
        match self._malformed % 5:
            case 0:
                return b"not json"
            case 1:
                return event.to_json()[:-7]  # cut short
            case 2:
                del document[ev.HOME_ID]
            case 3:
                document[ev.EVENT_TIME] = "yesterday"
            case _:
                return b"\xff\xfe" + event.to_json()  # not UTF-8
        return json.dumps(document).encode()


@dataclass
class ProduceSummary:
    hub: str
    partitions: dict[str, int] = field(default_factory=dict)  # events sent, per partition
    malformed: int = 0
    by_type: Counter[str] = field(default_factory=Counter)  # good events per "sensorType/eventType"
    homes: set[str] = field(default_factory=set)
    started_at: datetime | None = None
    duration_seconds: float = 0.0
    profile: str = "steady"

    @property
    def events(self) -> int:
        return sum(self.partitions.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "hub": self.hub,
            "events": self.events,
            "valid": self.events - self.malformed,
            "malformed": self.malformed,
            "partitions": dict(sorted(self.partitions.items(), key=lambda kv: _partition_order(kv[0]))),
            "byType": dict(sorted(self.by_type.items())),
            "homes": len(self.homes),
            "startedAt": format_time(self.started_at) if self.started_at else None,
            "durationSeconds": round(self.duration_seconds, 3),
            "eventsPerSecond": round(self.events / self.duration_seconds, 1)
            if self.duration_seconds
            else 0.0,
            "profile": self.profile,
        }


def _partition_order(partition: str) -> tuple[int, str]:
    return (int(partition), "") if partition.isdigit() else (1 << 62, partition)


# --- where events go ----------------------------------------------------------------------------------


class EventSender(Protocol):
    def partition_ids(self) -> list[str]: ...

    def partition_for(self, key: str) -> str: ...

    def send(self, partition: str, events: Sequence[GeneratedEvent]) -> None:
        """Send to one partition, each event carrying its partition key; raises if any was not sent."""
        ...

    def close(self) -> None: ...


class HubSender:
    """The azure-eventhub SDK's producer, sending to the partition the service would pick for each key."""

    def __init__(self, producer: Any, hub: str, partition_ids: list[str]) -> None:
        # The SDK's buffered producer's resolver: the service's own key hash (lookup3), untyped.
        from azure.eventhub._buffered_producer import _partition_resolver

        resolver: Any = _partition_resolver.PartitionResolver
        self.producer = producer
        self.hub = hub
        self._partition_ids = partition_ids
        self._resolver = resolver(partition_ids)
        self._cache: dict[str, str] = {}

    @classmethod
    def connect(cls, connection_string: str, hub: str) -> HubSender:
        """Connect with a connection string and read the partition ids; `UserError` (one line, no secret)
        when that fails."""
        return cls.connect_target(hub_target(hub, connection_string=connection_string))

    @classmethod
    def connect_target(cls, target: EventHubsTarget) -> HubSender:
        """Connect (a connection string or a token credential) and read the partition ids; `UserError`
        (one line, no secret) when that fails."""
        from azure.eventhub import EventHubProducerClient
        from azure.eventhub.exceptions import AuthenticationError, ConnectError, EventHubError

        hub, namespace = target.hub, target.fqns
        try:
            producer = sdk_client(EventHubProducerClient, target, retry_total=2)
        except ValueError:
            raise UserError(INVALID_CONNECTION_STRING) from None
        try:
            partition_ids = list(producer.get_partition_ids())
        except AuthenticationError as exc:
            producer.close()
            if "404" in str(exc) or "could not be found" in str(exc):
                raise UserError(f"Event Hub {hub!r} does not exist in namespace {namespace}") from None
            if target.identity is not None:
                raise UserError(describe_error(exc, target)) from None
            raise UserError(f"Event Hubs namespace {namespace} refused the credentials") from None
        except ConnectError as exc:
            producer.close()
            if target.identity is not None:
                raise UserError(describe_error(exc, target)) from None
            raise UserError(f"cannot reach the Event Hubs namespace {namespace}") from None
        except EventHubError as exc:
            producer.close()
            if target.identity is not None:
                raise UserError(describe_error(exc, target)) from None
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"Event Hub {hub!r} in {namespace}: {first}") from None
        return cls(producer, hub, partition_ids)

    def partition_ids(self) -> list[str]:
        return list(self._partition_ids)

    def partition_for(self, key: str) -> str:
        partition = self._cache.get(key)
        if partition is None:
            partition = self._cache[key] = str(self._resolver.get_partition_id_by_partition_key(key))
        return partition

    def send(self, partition: str, events: Sequence[GeneratedEvent]) -> None:
        from azure.eventhub import EventData

        outgoing = []
        for generated in events:
            data = EventData(generated.body)
            message = data.raw_amqp_message
            if message.annotations is None:
                message.annotations = {PARTITION_KEY_ANNOTATION: generated.partition_key}
            else:
                message.annotations[PARTITION_KEY_ANNOTATION] = generated.partition_key
            outgoing.append(data)
        too_large = send_events(self.producer, outgoing, partition_id=partition)
        if too_large:
            raise UserError(
                f"{len(too_large)} event(s) larger than Event Hub {self.hub!r} accepts were not sent"
            )

    def close(self) -> None:
        self.producer.close()


PARTITION_KEY_ANNOTATION = b"x-opt-partition-key"
INVALID_CONNECTION_STRING = (
    "the Event Hubs connection string is not valid (expected "
    "Endpoint=sb://NAMESPACE/;SharedAccessKeyName=NAME;SharedAccessKey=KEY)"
)


# --- the loop -----------------------------------------------------------------------------------------


def produce_load(
    spec: LoadSpec,
    sender: EventSender,
    *,
    hub: str = "",
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    on_round: Callable[[ProduceSummary], None] | None = None,
) -> ProduceSummary:
    """Send `spec`'s load through `sender` until its duration or count is reached (or `stop` is set);
    what was sent. Every `interval`, the events the profile owes since the start go out in one batch per
    partition."""
    profile = spec.rate_profile
    generator = EventGenerator(spec)
    summary = ProduceSummary(
        hub=hub,
        partitions={p: 0 for p in sender.partition_ids()},
        started_at=now(),
        profile=profile.describe(),
    )
    started = last = clock()
    end = None if spec.duration is None else started + spec.duration
    owed = 0.0
    while not (stop is not None and stop.is_set()):
        current = clock() if end is None else min(clock(), end)
        # the events owed over (last, current], at the rate in the middle of that span
        owed += profile.rate_at((last + current) / 2 - started) * (current - last)
        last = current
        due = int(owed + 1e-6)
        if spec.count is not None:
            due = min(due, spec.count - summary.events)
        if due > 0:
            owed -= due
            _send_round(generator, sender, due, now(), summary)
            if on_round is not None:
                on_round(summary)
        if end is not None and current >= end:
            break
        if spec.count is not None and summary.events >= spec.count:
            break
        next_round = current + spec.interval if end is None else min(current + spec.interval, end)
        pause = next_round - clock()
        if pause > 0:
            if stop is not None:
                stop.wait(pause)
            else:
                sleep(pause)
    summary.duration_seconds = clock() - started
    return summary


def send_load(
    connection_string: str,
    hub: str,
    spec: LoadSpec,
    *,
    stop: threading.Event | None = None,
    on_round: Callable[[ProduceSummary], None] | None = None,
) -> ProduceSummary:
    """Connect, send `spec`'s load to `hub`, close; what was sent (per partition, by type, malformed)."""
    sender = HubSender.connect(connection_string, hub)
    try:
        return produce_load(spec, sender, hub=hub, stop=stop, on_round=on_round)
    finally:
        sender.close()


def _send_round(
    generator: EventGenerator, sender: EventSender, due: int, moment: datetime, summary: ProduceSummary
) -> None:
    by_partition: dict[str, list[GeneratedEvent]] = {}
    for _ in range(due):
        generated = generator.next(moment)
        by_partition.setdefault(sender.partition_for(generated.partition_key), []).append(generated)
    for partition, events in by_partition.items():
        sender.send(partition, events)
        summary.partitions[partition] = summary.partitions.get(partition, 0) + len(events)
        for generated in events:
            summary.homes.add(generated.partition_key)
            if generated.event is None:
                summary.malformed += 1
            else:
                summary.by_type[f"{generated.event.sensor_type}/{generated.event.event_type}"] += 1


# --- the command --------------------------------------------------------------------------------------


@click.command(name="produce")
@click.option(
    "--connection-string",
    envvar=DEFAULT_EVENTHUBS_ENV,
    show_envvar=True,
    help="Event Hubs connection string (default: from the environment variable).",
)
@click.option("--hub", required=True, help="Event Hub name.")
@click.option(
    "--namespace",
    default=None,
    help="With --credential: the fully qualified namespace (myns.servicebus.windows.net).",
)
@credential_options("Send with this token credential instead of a connection string (needs --namespace)")
@network_options
@click.option("--homes", type=int, default=1000, show_default=True, help="Homes (partition keys).")
@click.option("--sensors-per-home", type=int, default=4, show_default=True)
@click.option("--rate", type=float, default=100.0, show_default=True, help="Events per second (peak).")
@click.option("--duration", type=float, default=None, help="Seconds to run.")
@click.option("--count", type=int, default=None, help="Events to send (stops at whichever comes first).")
@click.option(
    "--profile",
    default="steady",
    show_default=True,
    help="steady, rise-fall (low, up to --rate, low again each --period), or T:RATE,T:RATE,...",
)
@click.option("--period", type=float, default=120.0, show_default=True, help="Seconds per rise-fall wave.")
@click.option("--malformed-ratio", type=float, default=0.0, show_default=True, help="Share of broken bodies.")
@click.option("--interval", type=float, default=0.1, show_default=True, help="Seconds between send rounds.")
@click.option("--seed", type=int, default=None, help="Random seed (the same load again).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def produce(
    connection_string: str | None,
    hub: str,
    namespace: str | None,
    credential: str | None,
    client_id: str | None,
    transport: str | None,
    proxy: str | None,
    homes: int,
    sensors_per_home: int,
    rate: float,
    duration: float | None,
    count: int | None,
    profile: str,
    period: float,
    malformed_ratio: float,
    interval: float,
    seed: int | None,
    output: str,
) -> None:
    """Send a home-security sensor load to an Event Hub (partition key = home)."""
    identity = chosen_identity(credential, client_id)
    network = chosen_network(transport, proxy)
    if identity is not None:
        source = click.get_current_context().get_parameter_source("connection_string")
        if source is click.core.ParameterSource.COMMANDLINE:
            raise UserError("pass --connection-string or --credential, not both")
        if not namespace:
            raise UserError("--credential needs --namespace (myns.servicebus.windows.net)")
        connection_string = None
    elif not connection_string:
        raise UserError(
            f"no connection string: pass --connection-string or set {DEFAULT_EVENTHUBS_ENV} (or use a token "
            "credential: --credential with --namespace)"
        )
    target = hub_target(
        hub,
        connection_string=connection_string,
        identity=identity,
        namespace=namespace,
        network=network,
        source=f"--connection-string ({DEFAULT_EVENTHUBS_ENV})",
        namespace_from="--namespace",
        advice="leave --namespace out, or name the same one",
    )
    if period <= 0:
        raise UserError("--period must be positive")
    spec = LoadSpec(
        homes=homes,
        sensors_per_home=sensors_per_home,
        rate=rate,
        duration=duration,
        count=count,
        profile=parse_profile(profile, rate, period),
        malformed_ratio=malformed_ratio,
        interval=interval,
        seed=seed,
    )
    sender = HubSender.connect_target(target)
    stop = threading.Event()
    # Ctrl-C or SIGTERM end the load after the current round; the summary is still printed.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = produce_load(spec, sender, hub=hub, stop=stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sender.close()
    _print_summary(summary, output)


def _print_summary(summary: ProduceSummary, output: str) -> None:
    document = summary.to_json()
    if output == "json":
        click.echo(json.dumps(document, indent=1))
        return
    click.echo(
        f"sent {document['events']} events to {summary.hub} in {document['durationSeconds']} s "
        f"({document['eventsPerSecond']}/s, {document['homes']} homes, {document['malformed']} malformed)"
    )
    for partition, events in document["partitions"].items():
        click.echo(f"  partition {partition}: {events}")
