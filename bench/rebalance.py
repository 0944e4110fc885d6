"""Rebalancing 32 partitions: hubshift (the local runtime, delaySeconds 5) beside the Azure SDK's own
processor (EventHubConsumerClient + BlobCheckpointStore) twice, at its defaults and tuned for speed, on the
same emulator and Azurite.

Sides (`--sides`, default all three):
- `hubshift`: the control loop over `hubshift consume --engine sdk` processes. The scale-outs, the
  scale-in and the cold start are changes of the spec's replica bounds, so they are planned (published at
  once, each new consumer's share handed over when it is ready); the crash is unplanned and waits out the
  holddown.
- `hubshift-delay0`: the same with `delaySeconds` 0, in the crash only (the one scenario with a holddown):
  what waiting to see whether a lost consumer comes back costs.
- `sdk`: the processor at its defaults (greedy, 30 s load-balancing interval, 180 s ownership expiry).
- `sdk-tuned`: the processor tuned for speed: `load_balancing_strategy=BALANCED`,
  `load_balancing_interval` 0.1 s, `partition_ownership_expiration_interval` 2 s. azure-eventhub 5.15.1
  checks neither value (`_eventprocessor/event_processor.py`: the expiry defaults to 6 x the interval, the
  loop sleeps `interval x (1 + 0.2 x random())` after each `claim_ownership`; `ownership_manager.py`: an
  ownership is claimable once `last_modified + expiry < now`, where `last_modified` is the blob's
  Last-Modified, whole seconds). So the interval can go to zero, and below about 0.1 s a cycle (one
  listing, one conditional write per owned partition) takes longer than the sleep: 0.1 s is the fastest
  cadence. The expiry must cover a renewal cycle plus the second Last-Modified drops: measured with
  `--probe-tuning` (eight balanced processors, 60-90 s once balanced, 64 events/s, this 2-core machine
  under load; docs/benchmarks.md, "Rebalancing"): an expiry of 1 s steals constantly, 1.5 s now and then
  (0 to 6 moves at intervals of 0.05-0.25 s, constantly at 0.5 s), 2 s never did at intervals up to 0.5 s
  (a 1 s interval needs 2.5 s). Its price: about 230 storage requests a second for eight processors (74 at
  0.5 s, 41 at 1 s).

Scenarios (`--scenarios`, default all): 1->8 consumers, 8->4 graceful, 8->4 crash (kill -9, the four do
not come back), 0->8 cold start. Each scenario of each side reads its own fresh hub (32 partitions) while a
steady load (`--rate` events/s per hub) flows, and keeps its records in its own container.

Per scenario and side:
- time to balanced: from the moment the new consumers are up and registered (hubshift: `/readyz`, i.e.
  joined; SDK: the process is inside `receive_batch`), or from the stop/kill for the scale-ins, until
  every partition is read by exactly one live consumer and the counts are within ±1 over the consumers
  that should remain. hubshift's reader of a partition is its lease holder; the SDK's is the process
  that opened the partition (`on_partition_initialize`) and has not closed it. Sampled every 0.25 s.
- moves: a partition's reader becoming a different consumer (a first reader counts for the cold start).
- events replayed: sequence numbers processed more than once, from every consumer's batch log.
- unowned partition-seconds: partitions without a live reader, integrated over the same interval.
- storage operations: real HTTP requests to Azurite through a counting proxy (one per side), over the same
  interval (the SDK side's consumers; hubshift's consumers and its control loop).
- for the scale-outs and the cold start, the same three from the change itself too (the new consumers
  started, before they register): time to balanced, unowned partition-seconds and storage requests
  `from start`, beside the figures from registration (a consumer claiming its share before it reports ready
  shows only in these).
After the table, each scenario's speed-up over the tuned SDK and both sides' storage requests.

The SDK runs are capped (`--sdk-timeout`, 240 s; 45 s with `--quick`) and reported as "> T".
Consumers are SDK-engine processes (no Spark: this compares ownership protocols, not JVM start-up);
`--engine spark` runs hubshift's side with Spark consumers instead (heavy on 2 cores).

    .venv/bin/python bench/rebalance.py [--quick] [--sides hubshift,sdk-tuned,sdk]
        [--scenarios 1to8,8to4-graceful,8to4-crash,0to8-cold]
    .venv/bin/python bench/rebalance.py --probe-tuning 0.1:2,0.25:1.5,1:2    # steady-state stealing
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

# The shared harness (Azurite, the emulator's helpers) lives in the repository's tests/harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.azurite import connection_string as azurite_connection_string
from tests.harness.ranges import count_replays, read_range_logs

RESULTS = Path(__file__).resolve().parent / "results" / "rebalance.json"
PARTITIONS = 32
SCENARIOS = ("1to8", "8to4-graceful", "8to4-crash", "0to8-cold")
COUNTS = {"1to8": (1, 8), "8to4-graceful": (8, 4), "8to4-crash": (8, 4), "0to8-cold": (0, 8)}  # before, after
SCALE_OUTS = ("1to8", "0to8-cold")
MINIMUM_MOVES = {"1to8": 28, "8to4-graceful": 16, "8to4-crash": 16, "0to8-cold": 32}
DELAY_SECONDS = 5.0
SAMPLE_SECONDS = 0.25
# The SDK needs about two minutes to spread 32 partitions over 8 processes before a scale-in starts.
SDK_SETTLE_SECONDS = 400.0
CHECKPOINT_SECONDS = 5.0  # both sides checkpoint each partition at most this often
# Once the starting pool is balanced, it reads this long before the change (checkpoints written, events
# in flight), so a crash has something to replay.
WARM_SECONDS = CHECKPOINT_SECONDS + 3


@dataclass(frozen=True)
class SdkTuning:
    """How one SDK side configures `EventHubConsumerClient`; None keeps the SDK's own default."""

    side: str  # its name in --sides
    label: str  # its name in the table
    strategy: str | None = None  # load_balancing_strategy
    interval: float | None = None  # load_balancing_interval, seconds
    expiry: float | None = None  # partition_ownership_expiration_interval, seconds

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.strategy is not None:
            options["load_balancing_strategy"] = self.strategy
        if self.interval is not None:
            options["load_balancing_interval"] = self.interval
        if self.expiry is not None:
            options["partition_ownership_expiration_interval"] = self.expiry
        return options


# The SDK tuned for speed: the module's docstring says why these two numbers (measured with --probe-tuning).
TUNED_INTERVAL_SECONDS = 0.1
TUNED_EXPIRY_SECONDS = 2.0
SDK_DEFAULTS = SdkTuning("sdk", "azure sdk (defaults)")
SDK_TUNED = SdkTuning(
    "sdk-tuned", "azure sdk (tuned)", "balanced", TUNED_INTERVAL_SECONDS, TUNED_EXPIRY_SECONDS
)
SDK_SIDES = {tuning.side: tuning for tuning in (SDK_DEFAULTS, SDK_TUNED)}
# hubshift with `delaySeconds` 0: no holddown. It differs from `hubshift` only where the holddown applies
# (an unplanned change: the crash), so it runs only there and shows what the holddown costs.
NO_HOLDDOWN = "hubshift-delay0"
UNPLANNED = ("8to4-crash",)
HUBSHIFT_SIDES = {"hubshift": DELAY_SECONDS, NO_HOLDDOWN: 0.0}  # side -> its delaySeconds
SIDES = (*HUBSHIFT_SIDES, *SDK_SIDES)
HUB_PREFIX = {"hubshift": "h", NO_HOLDDOWN: "z", "sdk": "s", "sdk-tuned": "t"}


def runs(scenario: str, side: str) -> bool:
    """Whether `side` runs `scenario` (the no-holddown side only where a holddown applies)."""
    return side != NO_HOLDDOWN or scenario in UNPLANNED


# --- counting storage requests ---------------------------------------------------------------------------


class CountingProxy(threading.Thread):
    """A TCP proxy in front of Azurite that counts HTTP requests (request line + headers + body)."""

    def __init__(self, upstream_port: int, on_request: Callable[[bytes], None] | None = None) -> None:
        super().__init__(daemon=True, name="counting-proxy")
        self.upstream_port = upstream_port
        self.on_request = on_request  # each request's head (request line and headers), as it passes
        self.count = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await server.serve_forever()

    def start_and_wait(self) -> CountingProxy:
        self.start()
        self._ready.wait(10)
        return self

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._requests(reader, up_writer), self._pipe(up_reader, writer))

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.count += 1
                if self.on_request is not None:
                    self.on_request(head)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip() or 0)
                body = await reader.readexactly(length) if length else b""
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


# --- observing who reads what ------------------------------------------------------------------------------


@dataclass
class Outcome:
    side: str
    scenario: str
    balanced_seconds: float | None  # None: not within the timeout
    timeout: float
    moves: int
    minimum_moves: int
    replayed: int
    processed: int
    unowned_partition_seconds: float
    storage_requests: int
    planned_moves: int | None = None
    notes: list[str] = field(default_factory=list)
    # From the change itself (the new consumers started), for the scale-outs; the same as above otherwise.
    from_start_seconds: float | None = None
    unowned_from_start: float = 0.0
    storage_requests_from_start: int = 0

    @property
    def balanced(self) -> str:
        return f"> {self.timeout:.0f}" if self.balanced_seconds is None else f"{self.balanced_seconds:.1f}"


Readers = Callable[[], dict[str, set[str]]]


class Watch:
    """Samples the readers of every partition; counts moves and unowned partition-seconds."""

    def __init__(self, readers: Readers, count_first: bool) -> None:
        self.readers = readers
        self.count_first = count_first
        self.last: dict[str, str] = {}
        self.moves = 0
        self.unowned = 0.0
        self._at: float | None = None

    def from_now(self) -> None:
        """Count unowned partition-seconds from here (the change itself)."""
        self.unowned = 0.0
        self._at = time.monotonic()

    def sample(self) -> dict[str, set[str]]:
        now = time.monotonic()
        current = self.readers()
        if self._at is not None:
            self.unowned += sum(1 for p in range(PARTITIONS) if not current.get(str(p))) * (now - self._at)
        self._at = now
        for partition, readers in current.items():
            if len(readers) != 1:
                continue
            (reader,) = readers
            before = self.last.get(partition)
            if before != reader and (before is not None or self.count_first):
                self.moves += 1
            self.last[partition] = reader
        return current


def is_balanced(readers: dict[str, set[str]], consumers: int) -> bool:
    if any(len(readers.get(str(p), ())) != 1 for p in range(PARTITIONS)):
        return False
    counts: dict[str, int] = {}
    for names in readers.values():
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return len(counts) == consumers and max(counts.values()) - min(counts.values()) <= 1


async def until_balanced(watch: Watch, consumers: int, timeout: float, started: float) -> float | None:
    while time.monotonic() - started < timeout:
        readers = await asyncio.to_thread(watch.sample)
        if is_balanced(readers, consumers):
            return time.monotonic() - started
        await asyncio.sleep(SAMPLE_SECONDS)
    return None


async def run_scenario(
    side: str,
    scenario: str,
    readers: Readers,
    ready: Callable[[], int],
    change: Callable[[], None],
    proxy: CountingProxy,
    timeout: float,
    settle_seconds: float,
) -> Outcome:
    """One scenario, measured the same way for both sides: the starting pool balanced (within
    `settle_seconds`) and reading for WARM_SECONDS, then `change()` (start the new consumers, or stop or kill
    the leaving ones) and the time until `readers()` is balanced over the consumers that remain. Replays are
    left at 0: the caller counts them once its consumers have stopped."""
    before, after = COUNTS[scenario]
    if before:
        settle = Watch(readers, count_first=True)
        if await until_balanced(settle, before, settle_seconds, time.monotonic()) is None:
            raise RuntimeError(f"{side} {scenario}: the starting pool of {before} did not balance")
        await asyncio.sleep(WARM_SECONDS)
    watch = Watch(readers, count_first=scenario == "0to8-cold")
    watch.sample()
    requests_at_change = requests_before = proxy.count
    changed = time.monotonic()
    watch.from_now()
    change()
    unowned_before = 0.0
    if scenario in SCALE_OUTS:  # timed from the moment the new consumers are registered, and from the change
        while ready() < after:
            watch.sample()
            await asyncio.sleep(SAMPLE_SECONDS)
        watch.sample()
        requests_before = proxy.count
        unowned_before = watch.unowned
    started = time.monotonic()
    seconds = await until_balanced(watch, after, timeout, started)
    requests = proxy.count - requests_before
    requests_from_start = proxy.count - requests_at_change
    await asyncio.sleep(CHECKPOINT_SECONDS + 1)  # the new owners re-read what they re-read
    return Outcome(
        side,
        scenario,
        seconds,
        timeout,
        watch.moves,
        MINIMUM_MOVES[scenario],
        replayed=0,
        processed=0,
        unowned_partition_seconds=round(watch.unowned - unowned_before, 1),
        storage_requests=requests,
        from_start_seconds=None if seconds is None else round(started + seconds - changed, 1),
        unowned_from_start=round(watch.unowned, 1),
        storage_requests_from_start=requests_from_start,
    )


class Load(threading.Thread):
    """`rate` events/s to a hub, spread over its partitions, until stopped."""

    def __init__(self, connection_string: str, hub: str, rate: float) -> None:
        super().__init__(daemon=True, name=f"load-{hub}")
        self.connection_string, self.hub, self.rate = connection_string, hub, rate
        self.halt = threading.Event()

    def run(self) -> None:
        from hubshift.apps.produce import LoadSpec, send_load

        spec = LoadSpec(homes=1000, rate=self.rate, seed=3, interval=0.25)
        with contextlib.suppress(Exception):  # the emulator stops at the end of the run
            send_load(self.connection_string, self.hub, spec, stop=self.halt)


# --- hubshift's side ---------------------------------------------------------------------------------------


def hubshift_manifest(
    hub: str, container: str, output: Path, replicas: int, delay: float = DELAY_SECONDS
) -> dict[str, Any]:
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "bench"},
        "spec": {
            "eventHubs": {"hub": hub},
            "checkpointStore": {"blob": {"container": container}},
            "consumer": {
                "checkpoint": {"everySeconds": CHECKPOINT_SECONDS},
                "sink": {"type": "folder", "folder": {"path": str(output)}},
                "spark": {"master": "local[1]", "triggerIntervalSeconds": 1, "driverMemory": "512m"},
            },
            # A fixed pool (the scenarios set the count); 0: stay at zero whatever the backlog.
            "scaling": {"minReplicas": replicas, "maxReplicas": replicas}
            if replicas
            else {"minReplicas": 0, "maxReplicas": 8, "activation": {"unprocessedEvents": 10**9}},
            "rebalance": {"delaySeconds": delay, "maxHandoffSeconds": 15},
        },
    }


async def run_hubshift(
    scenario: str,
    env: dict[str, str],
    azurite_direct: str,
    proxy: CountingProxy,
    workdir: Path,
    hub: str,
    engine: str,
    timeout: float,
    delay: float = DELAY_SECONDS,
) -> Outcome:
    from hubshift.manifest import parse_manifest
    from hubshift.operator.local.runner import LocalOperator
    from hubshift.ownership.snapshot import take_snapshot
    from hubshift.ownership.stores.locations import open_store

    before, after = COUNTS[scenario]
    # Each side's own container, output and work folder: the replays are counted from this run's logs only.
    run = f"{scenario}-delay{delay:g}"
    container = f"hs-{scenario.replace('to', '-')}-{int(time.time()) % 100000}"
    output = workdir / f"hubshift-{run}"
    manifest_path = workdir / f"hubshift-{run}.yaml"

    def manifest_for(replicas: int) -> Any:
        return parse_manifest(hubshift_manifest(hub, container, output, replicas, delay))

    manifest_path.write_text(yaml.safe_dump(hubshift_manifest(hub, container, output, max(before, 1), delay)))
    operator = LocalOperator(
        manifest_path, manifest_for(before), workdir / f"work-{run}", engine=engine, environ=env
    )
    loop = await operator.open()
    direct = open_store(azurite_direct, container, create=True)
    scope = loop.scope
    runtime = operator.runtime

    def readers() -> dict[str, set[str]]:
        alive = {p.name for p in runtime.processes.values() if p.process.poll() is None}
        rows = {row.partition: row for row in take_snapshot(direct, scope).partitions}
        result: dict[str, set[str]] = {}
        for partition in (str(p) for p in range(PARTITIONS)):
            row = rows.get(partition)
            owner = None if row is None or row.free else row.owner
            result[partition] = {owner} if owner is not None and owner in alive else set()
        return result

    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(operator.run(stop))
    planned = [0]

    def count_moves(report: Any) -> None:
        for action in report.actions:
            if type(action).__name__ == "PublishAssignment":
                planned[0] += len(action.moves)

    def change() -> None:
        operator.on_report = count_moves
        if scenario == "8to4-crash":  # kill -9 the four highest ordinals; they do not come back
            for ordinal in range(after, before):
                runtime.kill(ordinal, restart=False)
        else:
            operator.apply(manifest_for(after))

    def ready() -> int:
        return sum(1 for p in runtime.processes.values() if p.ready)

    side = "hubshift" if engine == "sdk" else "hubshift (spark)"
    if delay != DELAY_SECONDS:
        side += f" (delaySeconds {delay:g})"
    settle_seconds = 120 if engine == "sdk" else SDK_SETTLE_SECONDS  # eight JVMs start slowly
    try:
        outcome = await run_scenario(side, scenario, readers, ready, change, proxy, timeout, settle_seconds)
    finally:
        stop.set()
        await task
        await operator.shutdown(grace=20)
        direct.close()
    # Spark consumers write aggregates, not batch ranges: replays are not counted for them (-1).
    distinct, replayed = count_replays(read_range_logs(output / "ranges")) if engine == "sdk" else (0, -1)
    return replace(outcome, replayed=replayed, processed=distinct, planned_moves=planned[0])


# --- the Azure SDK's side ----------------------------------------------------------------------------------


def sdk_worker(config: dict[str, Any]) -> None:
    """One EventHubConsumerClient + BlobCheckpointStore with the side's options (a separate process)."""
    from azure.eventhub import EventHubConsumerClient
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore

    name = config["name"]
    log = Path(config["log"]).open("a")  # noqa: SIM115  # the process's lifetime
    lock = threading.Lock()

    def write(document: dict[str, Any]) -> None:
        with lock:
            log.write(json.dumps({"consumer": name, "at": time.time(), **document}) + "\n")
            log.flush()

    store = BlobCheckpointStore.from_connection_string(config["storage"], config["container"])
    client = EventHubConsumerClient.from_connection_string(
        config["eventhubs"],
        consumer_group="$Default",
        eventhub_name=config["hub"],
        checkpoint_store=store,
        **config["options"],  # the side's tuning; nothing for the SDK's defaults
    )
    last_checkpoint: dict[str, float] = {}

    def on_batch(context: Any, events: list[Any]) -> None:
        if not events:
            return
        write(
            {
                "kind": "batch",
                "partition": context.partition_id,
                "first": events[0].sequence_number,
                "last": events[-1].sequence_number,
                "events": len(events),
            }
        )
        if time.monotonic() - last_checkpoint.get(context.partition_id, 0.0) >= CHECKPOINT_SECONDS:
            context.update_checkpoint(events[-1])
            last_checkpoint[context.partition_id] = time.monotonic()

    def on_open(context: Any) -> None:
        write({"kind": "open", "partition": context.partition_id})

    def on_close(context: Any, reason: Any) -> None:
        write({"kind": "close", "partition": context.partition_id, "reason": str(reason)})

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=client.close, daemon=True).start())
    write({"kind": "ready"})
    with contextlib.suppress(Exception):
        client.receive_batch(
            on_event_batch=on_batch,
            on_partition_initialize=on_open,
            on_partition_close=on_close,
            starting_position="-1",
            max_wait_time=1,
        )
    write({"kind": "stopped"})


@dataclass
class SdkPool:
    hub: str
    container: str
    eventhubs: str
    storage: str
    folder: Path
    tuning: SdkTuning
    workers: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, ordinal: int) -> None:
        config = {
            "name": f"sdk-{ordinal}",
            "hub": self.hub,
            "container": self.container,
            "eventhubs": self.eventhubs,
            "storage": self.storage,
            "log": str(self.folder / f"sdk-{ordinal}.jsonl"),
            "options": self.tuning.client_options(),
        }
        self.workers[ordinal] = subprocess.Popen(
            [sys.executable, __file__, "--sdk-worker", json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.folder / f"sdk-{ordinal}.err").open("ab"),
            start_new_session=True,
        )

    def alive(self) -> set[str]:
        return {f"sdk-{o}" for o, w in self.workers.items() if w.poll() is None}

    def lines(self) -> list[dict[str, Any]]:
        return read_range_logs(self.folder)

    def readers(self) -> dict[str, set[str]]:
        alive = self.alive()
        open_by: dict[str, set[str]] = {str(p): set() for p in range(PARTITIONS)}
        for line in self.lines():
            if line.get("kind") == "open":
                open_by[line["partition"]].add(line["consumer"])
            elif line.get("kind") == "close":
                open_by[line["partition"]].discard(line["consumer"])
        return {p: names & alive for p, names in open_by.items()}

    def ready(self) -> int:
        alive = self.alive()
        return len({line["consumer"] for line in self.lines() if line.get("kind") == "ready"} & alive)

    def stop(self, ordinal: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.workers[ordinal].send_signal(sig)

    def stop_all(self) -> None:
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for worker in self.workers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=max(0.1, deadline - time.monotonic()))
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=10)


def sdk_pool(
    tuning: SdkTuning, label: str, eventhubs: str, proxy: CountingProxy, workdir: Path, hub: str, azurite: str
) -> SdkPool:
    """An SDK pool over its own fresh container, its storage requests through `proxy`."""
    from azure.storage.blob import BlobServiceClient

    container = f"{tuning.side}-{label}-{int(time.time() * 10) % 1000000}".replace("_", "-")
    with BlobServiceClient.from_connection_string(azurite) as service:
        service.create_container(container)
    folder = workdir / f"{tuning.side}-{label}"
    folder.mkdir(parents=True, exist_ok=True)
    return SdkPool(hub, container, eventhubs, azurite_connection_string(proxy.port), folder, tuning)


async def run_sdk(
    scenario: str,
    tuning: SdkTuning,
    eventhubs: str,
    proxy: CountingProxy,
    workdir: Path,
    hub: str,
    timeout: float,
    azurite_direct: str,
) -> Outcome:
    before, after = COUNTS[scenario]
    pool = sdk_pool(tuning, scenario.replace("to", "-"), eventhubs, proxy, workdir, hub, azurite_direct)

    def change() -> None:
        if scenario in SCALE_OUTS:
            for ordinal in range(before, after):
                pool.start(ordinal)
        else:
            sig = signal.SIGTERM if scenario == "8to4-graceful" else signal.SIGKILL
            for ordinal in range(after, before):
                pool.stop(ordinal, sig)

    try:
        for ordinal in range(before):
            pool.start(ordinal)
        # The SDK's own start: one pod claims all 32 in its first cycle.
        outcome = await run_scenario(
            tuning.label, scenario, pool.readers, pool.ready, change, proxy, timeout, SDK_SETTLE_SECONDS
        )
    finally:
        pool.stop_all()
    batches = [line for line in pool.lines() if line.get("kind") == "batch"]
    distinct, replayed = count_replays(batches)
    return replace(outcome, replayed=replayed, processed=distinct)


# --- the run -----------------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, console: Console) -> list[Outcome]:
    from hubshift.emulator.launch import running_emulator
    from hubshift.spec import DEFAULT_EVENTHUBS_ENV, DEFAULT_STORAGE_ENV
    from tests.harness.azurite import running_azurite

    scenarios = [s for s in args.scenarios.split(",") if s]
    sides = [s for s in args.sides.split(",") if s]
    hubs = [
        f"{HUB_PREFIX[side]}{i}:{PARTITIONS}"
        for i, scenario in enumerate(scenarios)
        for side in sides
        if runs(scenario, side)
    ]
    workdir = Path(tempfile.mkdtemp(prefix="hubshift-bench-rebalance-"))
    outcomes: list[Outcome] = []
    with running_emulator(hubs) as emulator, running_azurite(workdir / "azurite") as azurite:
        proxies = {side: CountingProxy(azurite.port).start_and_wait() for side in sides}
        for index, scenario in enumerate(scenarios):
            for side in (s for s in sides if runs(scenario, s)):
                hub = f"{HUB_PREFIX[side]}{index}"
                load = Load(emulator.connection_string, hub, args.rate)
                load.start()
                console.print(f"[bold]{scenario}[/bold]: {side} ...")
                try:
                    if side in HUBSHIFT_SIDES:
                        env = dict(
                            os.environ,
                            **{
                                DEFAULT_EVENTHUBS_ENV: emulator.connection_string,
                                DEFAULT_STORAGE_ENV: azurite_connection_string(proxies[side].port),
                            },
                        )
                        outcome = await run_hubshift(
                            scenario,
                            env,
                            azurite.connection_string,
                            proxies[side],
                            workdir,
                            hub,
                            args.engine,
                            args.hubshift_timeout,
                            HUBSHIFT_SIDES[side],
                        )
                    else:
                        outcome = await run_sdk(
                            scenario,
                            SDK_SIDES[side],
                            emulator.connection_string,
                            proxies[side],
                            workdir,
                            hub,
                            args.sdk_timeout,
                            azurite.connection_string,
                        )
                finally:
                    load.halt.set()
                    load.join(10)
                console.print(
                    f"  balanced {outcome.balanced} s, {outcome.moves} moves, {outcome.replayed} replayed, "
                    f"{outcome.unowned_partition_seconds} unowned partition-s, "
                    f"{outcome.storage_requests} storage requests"
                )
                outcomes.append(outcome)
    return outcomes


@dataclass
class Steady:
    """A balanced pool of eight tuned SDK processors left alone: does it keep stealing?"""

    interval: float
    expiry: float
    balanced_after: float | None  # seconds from the start of the eight processes
    moves: int  # reader changes once balanced
    unbalanced_seconds: float  # time not balanced once balanced
    requests_per_second: float  # storage requests of the eight, once balanced


async def probe_tuning(args: argparse.Namespace, console: Console) -> list[Steady]:
    """For each INTERVAL:EXPIRY, eight balanced-strategy processors on a fresh hub: the time until they are
    balanced, then `--probe-seconds` of steady state in which any move is a steal nobody needed."""
    from hubshift.emulator.launch import running_emulator
    from tests.harness.azurite import running_azurite

    pairs = [tuple(float(x) for x in pair.split(":")) for pair in args.probe_tuning.split(",") if pair]
    workdir = Path(tempfile.mkdtemp(prefix="hubshift-bench-tuning-"))
    results: list[Steady] = []
    with (
        running_emulator([f"p{i}:{PARTITIONS}" for i in range(len(pairs))]) as emulator,
        running_azurite(workdir / "azurite") as azurite,
    ):
        proxy = CountingProxy(azurite.port).start_and_wait()
        for index, (interval, expiry) in enumerate(pairs):
            tuning = SdkTuning("probe", f"balanced {interval:g}/{expiry:g}", "balanced", interval, expiry)
            hub = f"p{index}"
            load = Load(emulator.connection_string, hub, args.rate)
            load.start()
            pool = sdk_pool(
                tuning, str(index), emulator.connection_string, proxy, workdir, hub, azurite.connection_string
            )
            try:
                started = time.monotonic()
                for ordinal in range(8):
                    pool.start(ordinal)
                watch = Watch(pool.readers, count_first=False)
                balanced = await until_balanced(watch, 8, 120, started)
                watch.moves = 0
                requests = proxy.count
                window = time.monotonic()
                unbalanced = 0.0
                while time.monotonic() - window < args.probe_seconds:
                    before = time.monotonic()
                    if not is_balanced(await asyncio.to_thread(watch.sample), 8):
                        unbalanced += SAMPLE_SECONDS
                    await asyncio.sleep(max(0.0, SAMPLE_SECONDS - (time.monotonic() - before)))
                elapsed = time.monotonic() - window
                result = Steady(
                    interval,
                    expiry,
                    None if balanced is None else round(balanced, 1),
                    watch.moves,
                    round(unbalanced, 1),
                    round((proxy.count - requests) / elapsed, 1),
                )
            finally:
                pool.stop_all()
                load.halt.set()
                load.join(10)
            console.print(f"  {tuning.label}: {result}")
            results.append(result)
    return results


def report(outcomes: list[Outcome], args: argparse.Namespace, console: Console) -> dict[str, Any]:
    table = Table(
        title=f"rebalance, {PARTITIONS} partitions, hubshift delaySeconds {DELAY_SECONDS:g} "
        f"(target: balanced within {DELAY_SECONDS + 5:g} s)"
    )
    for column in (
        "scenario",
        "side",
        "balanced (s)",
        "moves (min)",
        "replayed",
        "unowned partition-s",
        "storage requests",
        "from start: balanced (s) / unowned partition-s / storage requests",
    ):
        table.add_column(column)
    for o in outcomes:
        table.add_row(
            o.scenario,
            o.side,
            o.balanced,
            f"{o.moves} ({o.minimum_moves})",
            "n/a" if o.replayed < 0 else str(o.replayed),
            f"{o.unowned_partition_seconds:g}",
            str(o.storage_requests),
            f"{'> timeout' if o.from_start_seconds is None else f'{o.from_start_seconds:g}'} / "
            f"{o.unowned_from_start:g} / {o.storage_requests_from_start}",
        )
    console.print(table)
    comparisons = compare(outcomes)
    for line in comparisons:
        console.print(line)
    return {
        "partitions": PARTITIONS,
        "delaySeconds": DELAY_SECONDS,
        "ratePerHub": args.rate,
        "engine": args.engine,
        "checkpointSeconds": CHECKPOINT_SECONDS,
        "sdkTuned": asdict(SDK_TUNED),
        "outcomes": [asdict(o) | {"balanced": o.balanced} for o in outcomes],
        "againstTunedSdk": comparisons,
    }


def compare(outcomes: list[Outcome]) -> list[str]:
    """Per scenario: how much faster hubshift was than the tuned SDK, and the storage requests of each."""
    lines = []
    for scenario in SCENARIOS:
        peer = next((o for o in outcomes if o.scenario == scenario and o.side == SDK_TUNED.label), None)
        for ours in (o for o in outcomes if o.scenario == scenario and o.side.startswith("hubshift")):
            if peer is None or ours.balanced_seconds is None:
                continue
            peer_seconds = peer.timeout if peer.balanced_seconds is None else peer.balanced_seconds
            factor = peer_seconds / max(ours.balanced_seconds, SAMPLE_SECONDS)
            at_least = ">" if peer.balanced_seconds is None else ""
            lines.append(
                f"{scenario}: {ours.side} {at_least}{factor:.1f}x faster than the tuned SDK "
                f"({ours.balanced} s vs {peer.balanced} s), storage requests {ours.storage_requests} vs "
                f"{peer.storage_requests}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--sides", default=",".join(SIDES), help=f"any of {', '.join(SIDES)}")
    parser.add_argument("--engine", choices=["sdk", "spark"], default="sdk", help="hubshift's consumers")
    parser.add_argument("--rate", type=float, default=64.0, help="events/s per hub during each scenario")
    parser.add_argument("--sdk-timeout", type=float, default=240.0)
    parser.add_argument("--hubshift-timeout", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="cap the SDK at 45 s")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--probe-tuning",
        metavar="INTERVAL:EXPIRY,...",
        help="instead of the scenarios: steady-state stealing of 8 balanced-strategy SDK processors per pair",
    )
    parser.add_argument("--probe-seconds", type=float, default=60.0)
    parser.add_argument("--sdk-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sdk_worker:
        sdk_worker(json.loads(args.sdk_worker))
        return 0
    console = Console()
    if args.probe_tuning:
        steady = asyncio.run(probe_tuning(args, console))
        table = Table(
            title=f"8 SDK processors (balanced) on {PARTITIONS} partitions, {args.probe_seconds:g} s"
        )
        for column in (
            "interval / expiry (s)",
            "balanced after (s)",
            "moves",
            "unbalanced (s)",
            "requests/s",
        ):
            table.add_column(column)
        for r in steady:
            after = "-" if r.balanced_after is None else f"{r.balanced_after:g}"
            row = (f"{r.interval:g} / {r.expiry:g}", after, str(r.moves), f"{r.unbalanced_seconds:g}")
            table.add_row(*row, f"{r.requests_per_second:g}")
        console.print(table)
        path = args.output.with_name("rebalance-tuning.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([asdict(r) for r in steady], indent=1))
        console.print(f"wrote {path}")
        return 0
    if args.quick:
        args.sdk_timeout = min(args.sdk_timeout, 45.0)
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    unknown = set(args.sides.split(",")) - set(SIDES)
    if unknown:
        parser.error(f"unknown sides {sorted(unknown)}; choose from {', '.join(SIDES)}")
    outcomes = asyncio.run(bench(args, console))
    result = report(outcomes, args, console)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    console.print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
