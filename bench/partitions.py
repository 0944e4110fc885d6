"""One consumer owning many partitions (32, 128, 256, 1,024): what it costs idle and under a steady load,
hubshift's consumer beside the Azure SDK's processor, in one run.

Sides, each in a process of its own (the one measured), on a hub and a Blob container of its own, taking
turns (never at once: CPU is what is measured), on one emulator (`--max-connections` raised: both sides
open one connection per partition) and one Azurite, every server on 127.0.0.1:

- `hubshift`: `hubshift consume --engine sdk` (the ownership agent and the receivers as a Spark consumer
  runs them, without Spark: the SDK engine's handler writes one range line per batch), the defaults
  (`ownership/timing.py`: list every 20 s, membership renewed every 15 s, checkpoints every 10 s); alone in
  its pool, it claims every partition itself (the fallback balancer; no operator).
- `sdk`: `EventHubConsumerClient` with `BlobCheckpointStore` at azure-eventhub 5.15.1's defaults (greedy,
  30 s load-balancing interval, 180 s ownership expiry), `receive_batch` writing the same range line per
  batch and `update_checkpoint` at most every 10 s per partition (hubshift's cadence).

Per side and size: the time until every partition is owned and has its connection; then, after a settling
pause, CPU over `--idle-seconds` of quiet (a consumer of idle partitions); then `--rate` events/s to every
partition (at most `--max-total-rate` over all, from a producer process of its own, each partition in turn)
for `--load-seconds`: CPU, CPU per event processed, enqueue-to-processed latency p50/p99/max of
every event enqueued in that window (tests/harness/ranges.event_latencies), events left unprocessed
`--tail-seconds` after it; memory (RSS), threads and TCP sockets at the end of the load; storage requests
(every HTTP request through a counting proxy in front of Azurite) per partition-hour, idle and loaded.

    nice -n 10 .venv/bin/python bench/partitions.py [--quick] [--sizes 32,128,256,1024] [--sides hubshift,sdk]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

# The shared harness (Azurite, ports, range logs) lives in the repository's tests/harness; the counting
# proxy in bench/rebalance.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rebalance import CountingProxy
from bench.store_ops import classify
from hubshift.ownership.timing import DEFAULT_TIMING
from tests.harness.azurite import connection_string as azurite_connection_string
from tests.harness.azurite import start_azurite
from tests.harness.ports import free_port
from tests.harness.processes import end
from tests.harness.ranges import event_latencies, percentile, read_range_logs

RESULTS = Path(__file__).resolve().parent / "results" / "partitions.json"
SIZES = (32, 128, 256, 1024)
SIDES = ("hubshift", "sdk")
BEFORE = "hubshift-before"  # with --baseline REV: hubshift's consumer as that commit has it
PREFIX = {"hubshift": "h", "sdk": "s", BEFORE: "b"}
HOUR = 3600.0
CHECKPOINT_SECONDS = DEFAULT_TIMING.checkpoint_interval_seconds  # both sides' cadence
SETTLE_SECONDS = 5.0  # after the last connection opened, before anything is measured
OWNED_METRIC = "hubshift_consumer_owned_partitions"


# --- the SDK's processor (a child process) ----------------------------------------------------------------


def sdk_child(config: dict[str, Any]) -> None:
    """One `EventHubConsumerClient` + `BlobCheckpointStore` at the SDK's defaults, a range line per batch."""
    from azure.eventhub import EventHubConsumerClient
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore

    log = Path(config["log"]).open("a")  # noqa: SIM115  # the process's lifetime
    lock = threading.Lock()
    last_checkpoint: dict[str, float] = {}

    def write(document: dict[str, Any]) -> None:
        with lock:
            log.write(json.dumps({"consumer": "sdk", "at": time.time(), **document}) + "\n")
            log.flush()

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
                "firstEnqueued": events[0].enqueued_time.timestamp(),
                "lastEnqueued": events[-1].enqueued_time.timestamp(),
            }
        )
        now = time.monotonic()
        if now - last_checkpoint.get(context.partition_id, 0.0) >= CHECKPOINT_SECONDS:
            context.update_checkpoint(events[-1])
            last_checkpoint[context.partition_id] = now

    store = BlobCheckpointStore.from_connection_string(config["storage"], config["container"])
    client = EventHubConsumerClient.from_connection_string(
        config["eventhubs"], consumer_group="$Default", eventhub_name=config["hub"], checkpoint_store=store
    )
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=client.close, daemon=True).start())
    with contextlib.suppress(Exception):
        client.receive_batch(
            on_event_batch=on_batch,
            on_partition_initialize=lambda context: write(
                {"kind": "open", "partition": context.partition_id}
            ),
            starting_position="-1",
        )


# --- the load (a child process) ---------------------------------------------------------------------------


def producer_child(config: dict[str, Any]) -> None:
    """The load, on one link to the hub (the emulator routes each batch without a partition to the next
    partition in turn, as the service spreads them): one event to every partition first, `ready`; on `go`,
    batches of `rate` events (rounded, at least one) round the partitions, as many a second as make `rate`
    events/s per partition, for `seconds`; then `sent N`."""
    from azure.eventhub import EventData, EventHubProducerClient

    partitions, rate, seconds = int(config["partitions"]), float(config["rate"]), float(config["seconds"])
    per_batch = max(1, round(rate))
    batches_per_second = partitions * rate / per_batch
    with EventHubProducerClient.from_connection_string(
        config["eventhubs"], eventhub_name=config["hub"]
    ) as producer:
        for _ in range(partitions):
            producer.send_batch([EventData(b"open")])
        sent = partitions
        print("ready", flush=True)
        sys.stdin.readline()
        started = time.monotonic()
        batches = 0
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * batches_per_second) + 1 - batches
            for _ in range(due):
                producer.send_batch([EventData(b"x" * 100) for _ in range(per_batch)])
            batches += max(0, due)
            sent += max(0, due) * per_batch
            time.sleep(0.005)
    print(f"sent {sent}", flush=True)


# --- counting storage requests by kind -----------------------------------------------------------------


def request_kind(head: bytes) -> str:
    """What an HTTP request to the store is for (bench/store_ops.py's kinds: list, lease-<action>,
    write-<record>, read), from its head: the request line and the headers."""
    lines = head.decode("latin-1").split("\r\n")
    method, _, rest = lines[0].partition(" ")
    target = rest.rsplit(" ", 1)[0]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return classify(method, target, headers)


def per_partition_hour(requests: int, partitions: int, seconds: float) -> float | None:
    """Requests in `seconds` by a consumer of `partitions` partitions, per partition and hour."""
    return None if seconds <= 0 else round(requests * HOUR / partitions / seconds, 1)


# --- one side, one size -----------------------------------------------------------------------------------


@dataclass
class Run:
    side: str
    partitions: int
    open_seconds: float | None = None
    idle_seconds: float = 0.0
    idle_cpu_percent: float | None = None
    load_seconds: float = 0.0
    rate_per_partition: float = 0.0
    sent: int = 0
    processed_in_window: int = 0
    busy_cpu_percent: float | None = None
    emulator_cpu_percent: float | None = None  # the emulator's, in the same window (a bottleneck?)
    cpu_us_per_event: float | None = None  # busy CPU over the events processed in the window
    net_cpu_us_per_event: float | None = None  # the same less the idle CPU
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    unprocessed: int = 0
    rss_mib: float | None = None
    threads: int | None = None
    sockets_eventhubs: int | None = None
    sockets_storage: int | None = None
    storage_requests_idle: int = 0
    storage_requests_load: int = 0
    storage_per_partition_hour_idle: float | None = None
    storage_per_partition_hour_load: float | None = None
    storage_kinds_idle: dict[str, int] = field(default_factory=dict)
    storage_kinds_load: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def hubshift_manifest(hub: str, container: str, output: Path) -> dict[str, Any]:
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "partitions"},
        "spec": {
            "eventHubs": {"hub": hub},
            "checkpointStore": {"blob": {"container": container}},
            "consumer": {"engine": "sdk", "sink": {"type": "folder", "folder": {"path": str(output)}}},
            "scaling": {"minReplicas": 1, "maxReplicas": 1},
        },
    }


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def sockets(process: psutil.Process, port: int) -> int:
    """TCP connections of `process` to 127.0.0.1:`port`."""
    return sum(1 for c in process.net_connections(kind="tcp") if c.raddr and c.raddr.port == port)


def owned_by_hubshift(http_port: int) -> int:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(OWNED_METRIC + " ") or line.startswith(OWNED_METRIC + "{"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def opened_by_sdk(folder: Path) -> int:
    return len({line["partition"] for line in read_range_logs(folder) if line.get("kind") == "open"})


def run_one(side: str, size: int, servers: dict[str, Any], args: argparse.Namespace, work: Path) -> Run:
    run = Run(side, size)
    hub, container = f"{PREFIX[side]}{size}", f"{PREFIX[side]}-{size}"
    folder = work / hub
    folder.mkdir(parents=True)
    kinds: Counter[str] = Counter()
    kinds_lock = threading.Lock()

    def count_kind(head: bytes) -> None:
        kind = request_kind(head)
        with kinds_lock:
            kinds[kind] += 1

    def kinds_now() -> Counter[str]:
        with kinds_lock:
            return Counter(kinds)

    proxy = CountingProxy(servers["azurite_port"], count_kind)
    proxy.start_and_wait()
    storage = azurite_connection_string(proxy.port)
    eventhubs = servers["eventhubs"]
    ranges = folder / "ranges"
    ranges.mkdir()
    err = (folder / "consumer.err").open("ab")
    http_port = free_port()
    cwd = None
    if side in ("hubshift", BEFORE):
        manifest = folder / "manifest.yaml"
        manifest.write_text(yaml.safe_dump(hubshift_manifest(hub, container, folder / "out")))
        command = [sys.executable, "-m", "hubshift.cli", "consume", "-f", str(manifest), "--id", "c0"]
        command += ["--http-port", str(http_port), "--ranges", str(ranges / "c0.jsonl")]
        command += ["--scratch", str(folder / "scratch"), "--log-level", "warning"]
        env = os.environ | {
            "HUBSHIFT_EVENTHUBS_CONNECTION_STRING": eventhubs,
            "HUBSHIFT_STORAGE_CONNECTION_STRING": storage,
        }
        if side == BEFORE:  # `python -m` imports from its working folder first: the baseline's hubshift
            cwd = servers["baseline"]
    else:
        from azure.storage.blob import ContainerClient

        with ContainerClient.from_connection_string(storage, container) as box:
            box.create_container()
        config = {"eventhubs": eventhubs, "storage": storage, "container": container, "hub": hub}
        config["log"] = str(ranges / "sdk.jsonl")
        command = [sys.executable, __file__, "--sdk-child", json.dumps(config)]
        env = dict(os.environ)
    consumer = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=cwd
    )
    process = psutil.Process(consumer.pid)
    try:
        started = time.monotonic()
        owned = 0
        while time.monotonic() - started < args.open_timeout:
            if consumer.poll() is not None:
                raise RuntimeError(f"{side} {size}: the consumer exited ({folder / 'consumer.err'})")
            owned = owned_by_hubshift(http_port) if side != "sdk" else opened_by_sdk(ranges)
            if owned >= size and sockets(process, servers["emulator_port"]) >= size:
                run.open_seconds = round(time.monotonic() - started, 1)
                break
            time.sleep(1)
        if run.open_seconds is None:
            run.notes.append(
                f"not every partition open after {args.open_timeout:g} s: {owned} owned, "
                f"{sockets(process, servers['emulator_port'])} connections; measured as it was"
            )
        time.sleep(SETTLE_SECONDS)

        # idle
        cpu, requests, since = cpu_seconds(process), proxy.count, time.monotonic()
        kinds_before = kinds_now()
        time.sleep(args.idle_seconds)
        run.storage_kinds_idle = dict(kinds_now() - kinds_before)
        run.idle_seconds = round(time.monotonic() - since, 1)
        run.idle_cpu_percent = round((cpu_seconds(process) - cpu) / run.idle_seconds * 100, 1)
        run.storage_requests_idle = proxy.count - requests
        run.storage_per_partition_hour_idle = per_partition_hour(
            run.storage_requests_idle, size, run.idle_seconds
        )
        print(
            f"{side} {size}: open in {run.open_seconds} s, idle CPU {run.idle_cpu_percent} %, "
            f"{run.storage_requests_idle} storage requests in {run.idle_seconds} s",
            flush=True,
        )

        # loaded
        run.rate_per_partition = min(args.rate, args.max_total_rate / size)
        load = {"eventhubs": eventhubs, "hub": hub, "partitions": size}
        load |= {"rate": run.rate_per_partition, "seconds": args.load_seconds}
        with subprocess.Popen(
            [sys.executable, __file__, "--producer-child", json.dumps(load)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as producer:
            assert producer.stdin is not None and producer.stdout is not None
            if producer.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{side} {size}: the producer did not start")
            time.sleep(2)  # the opening events handled before the window
            cpu, requests = cpu_seconds(process), proxy.count
            emulator = psutil.Process(servers["emulator_pid"])
            emulator_cpu = cpu_seconds(emulator)
            kinds_before = kinds_now()
            window_start, since = time.time(), time.monotonic()
            producer.stdin.write("go\n")
            producer.stdin.flush()
            answer = producer.stdout.readline().split()
            run.load_seconds = round(time.monotonic() - since, 1)
            window_end = time.time()
            run.busy_cpu_percent = round((cpu_seconds(process) - cpu) / run.load_seconds * 100, 1)
            run.emulator_cpu_percent = round(
                (cpu_seconds(emulator) - emulator_cpu) / run.load_seconds * 100, 1
            )
            run.storage_requests_load = proxy.count - requests
            run.storage_kinds_load = dict(kinds_now() - kinds_before)
            memory = process.memory_info().rss
            run.threads = process.num_threads()
            run.sockets_eventhubs = sockets(process, servers["emulator_port"])
            run.sockets_storage = sockets(process, proxy.port)
            producer.stdin.close()
            producer.wait(30)
        run.sent = int(answer[1]) - size if len(answer) == 2 else 0
        run.storage_per_partition_hour_load = per_partition_hour(
            run.storage_requests_load, size, run.load_seconds
        )
        run.rss_mib = round(memory / 2**20, 1)
        deadline = time.monotonic() + args.tail_seconds
        while True:
            latencies = event_latencies(read_range_logs(ranges), window_start, window_end)
            if len(latencies) >= run.sent or time.monotonic() > deadline:
                break
            time.sleep(2)
        lines = read_range_logs(ranges)
        run.processed_in_window = sum(
            int(line["events"])
            for line in lines
            if line.get("kind", "batch") == "batch" and window_start <= float(line["at"]) < window_end
        )
        busy_cpu = run.busy_cpu_percent / 100 * run.load_seconds
        idle_cpu = (run.idle_cpu_percent or 0.0) / 100 * run.load_seconds
        if run.processed_in_window:
            run.cpu_us_per_event = round(busy_cpu / run.processed_in_window * 1e6, 1)
            run.net_cpu_us_per_event = round((busy_cpu - idle_cpu) / run.processed_in_window * 1e6, 1)
        run.unprocessed = max(0, run.sent - len(latencies))
        ordered = sorted(latencies)
        run.p50, run.p99 = (
            None if (v := percentile(ordered, q)) is None else round(v, 3) for q in (0.5, 0.99)
        )
        run.max = round(ordered[-1], 3) if ordered else None
    finally:
        end(consumer, grace=20)  # its shutdown is not measured (the SDK joins a thread per partition)
        err.close()
    return run


def print_run(run: Run) -> None:
    print(
        f"{run.side:8} {run.partitions:5}: open {run.open_seconds} s; idle CPU {run.idle_cpu_percent} %; "
        f"load {run.rate_per_partition:g}/s/partition ({run.sent} sent, "
        f"{run.processed_in_window} in window): "
        f"CPU {run.busy_cpu_percent} % (emulator {run.emulator_cpu_percent} %), "
        f"{run.cpu_us_per_event} us/event (net {run.net_cpu_us_per_event}); "
        f"p50 {run.p50} s p99 {run.p99} s max {run.max} s, {run.unprocessed} unprocessed; "
        f"RSS {run.rss_mib} MiB, {run.threads} threads, {run.sockets_eventhubs} hub sockets, "
        f"{run.sockets_storage} storage sockets; storage/partition-hour idle "
        f"{run.storage_per_partition_hour_idle} load {run.storage_per_partition_hour_load} "
        f"{'; '.join(run.notes)}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="partition counts, in order")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--idle-seconds", type=float, default=45.0)
    parser.add_argument("--load-seconds", type=float, default=45.0)
    parser.add_argument(
        "--tail-seconds", type=float, default=30.0, help="after the load, for the last events"
    )
    parser.add_argument("--rate", type=float, default=40.0, help="events/s to each partition")
    parser.add_argument("--max-total-rate", type=float, default=1280.0, help="events/s over all partitions")
    parser.add_argument("--open-timeout", type=float, default=240.0)
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help=f"also run hubshift's consumer as commit REV has it (side {BEFORE!r}, before a fix)",
    )
    parser.add_argument("--quick", action="store_true", help="32 and 1,024 partitions, 25 s windows")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--sdk-child", help=argparse.SUPPRESS)
    parser.add_argument("--producer-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sdk_child:
        sdk_child(json.loads(args.sdk_child))
        return 0
    if args.producer_child:
        producer_child(json.loads(args.producer_child))
        return 0
    if args.quick:
        args.sizes, args.idle_seconds, args.load_seconds = "32,1024", 25.0, 25.0
    sizes = [int(s) for s in args.sizes.split(",")]
    sides = args.sides.split(",")
    if args.baseline:
        sides.insert(0, BEFORE)

    from hubshift.emulator.launch import start_emulator

    hubs = [f"{PREFIX[side]}{size}:{size}" for size in sizes for side in sides]
    connections = 2 * max(sizes) + 256  # a side's consumer, the producer, a closing side's leftovers
    emulator = start_emulator(hubs, extra_args=["--max-connections", str(connections)], startup_timeout=120)
    azurite = start_azurite()
    work = Path(tempfile.mkdtemp(prefix="hubshift-partitions-"))
    servers = {
        "eventhubs": emulator.connection_string,
        "emulator_port": emulator.port,
        "emulator_pid": emulator.pid,
    }
    servers["azurite_port"] = azurite.port
    if args.baseline:
        baseline = work / "baseline"
        baseline.mkdir()
        archive = subprocess.run(
            ["git", "archive", args.baseline, "hubshift"],
            cwd=Path(__file__).resolve().parents[1],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
        servers["baseline"] = str(baseline)
    runs: list[Run] = []
    started = time.time()
    try:
        for size in sizes:
            for side in sides:
                try:
                    run = run_one(side, size, servers, args, work)
                except RuntimeError as exc:
                    run = Run(side, size, notes=[str(exc)])
                runs.append(run)
                print_run(run)
    finally:
        emulator.stop()
        azurite.stop()
    document = {
        "command": " ".join(["bench/partitions.py", *(argv if argv is not None else sys.argv[1:])]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "minutes": round((time.time() - started) / 60, 1),
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("sdk_child", "producer_child", "output")
        },
        "work": str(work),
        "runs": [asdict(run) for run in runs],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=1, default=str) + "\n")
    print(f"wrote {args.output} (run data in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
