"""Storage operations a day for 8 consumers x 32 partitions: hubshift's defaults beside the Azure SDK's.

Both sides run for real against one Azurite, in the same run, and every HTTP request they send is counted
(azure-core `raw_response_hook`, so retries count too):

- hubshift: 8 ownership agents (threads) with `hubshift.ownership.timing.DEFAULT_TIMING`: join, renew
  the membership lease, list the scope and run the fallback balancer, checkpoint every owned partition
  each checkpoint interval. After the counting window one agent crashes (stops without releasing) and
  the bench measures how long until its partitions are owned again.
- the Azure SDK: 8 `EventHubConsumerClient`s with `BlobCheckpointStore` (azure-eventhub 5.15.1 defaults:
  30 s load-balancing interval, 180 s ownership expiry, greedy) on the hubshift emulator, a producer
  keeping every partition busy, and `update_checkpoint` at most once per checkpoint interval per
  partition (the same cadence as hubshift). If the emulator cannot start, `--sdk-peer ownership-manager`
  drives the SDK's own `OwnershipManager` + `BlobCheckpointStore` loop at its default interval instead.

Each side is counted over the same window once it is balanced; counts are extrapolated to a day.

    .venv/bin/python bench/store_ops.py [--window 90] [--sdk-peer processor|ownership-manager]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from rich.console import Console
from rich.table import Table

# The shared harness (Azurite, the emulator's helpers) lives in the repository's tests/harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hubshift.azure_storage import BlobContainer
from hubshift.ownership.balancer import balance
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition, release_partition
from hubshift.ownership.membership import Membership, join_pool, leave, renew
from hubshift.ownership.model import Checkpoint, OwnershipSnapshot, PartitionLease
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseConflict, LeaseLost, StoreError
from hubshift.ownership.stores.blob import BlobLeaseStore
from hubshift.ownership.timing import DEFAULT_TIMING, Timing
from tests.harness.azurite import running_azurite
from tests.harness.ownership import failover_seconds, owned_by

DAY = 86_400
CONSUMERS = 8
PARTITIONS = [str(p) for p in range(32)]
HUB = "orders"
SCOPE = Scope("bench.servicebus.windows.net", HUB, "$Default")
RESULTS = Path(__file__).resolve().parent / "results" / "store_ops.json"
# The Python SDK's defaults (azure-eventhub 5.15.1: its EventProcessor's load-balancing interval and
# ownership expiration, six intervals).
SDK_INTERVAL = 30.0
SDK_EXPIRY = 6 * SDK_INTERVAL
SDK_JITTER = 0.2


# -- counting ------------------------------------------------------------------------------------------


def classify(method: str, url: str, headers: Any) -> str:
    """What a storage request is for: list, lease-<action>, write-<record>, read."""
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    comp = query.get("comp", [""])[0]
    path = unquote(parsed.path) + " " + query.get("prefix", [""])[0]
    if comp == "list":
        return "list"
    if comp == "lease":
        return f"lease-{headers.get('x-ms-lease-action', '?')}"
    if method == "PUT":
        for record in ("checkpoint", "ownership", "consumers", "assignment"):
            if f"/{record}" in path:
                return f"write-{record}"
        return "write-other"
    return "read"


class RequestCounter:
    """Counts every request one side sends; only those inside the open window are kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self.counts: Counter[str] = Counter()
        self.window_seconds = 0.0
        self._opened_at = 0.0

    def hook(self, response: Any) -> None:
        request = response.http_request
        kind = classify(request.method, request.url, request.headers)
        with self._lock:
            if self._open:
                self.counts[kind] += 1

    def open(self) -> None:
        with self._lock:
            self.counts.clear()
            self._open = True
            self._opened_at = time.monotonic()

    def close(self) -> None:
        with self._lock:
            self._open = False
            self.window_seconds = time.monotonic() - self._opened_at


@dataclass
class SideResult:
    name: str
    settings: str
    window_seconds: float
    counts: dict[str, int]
    per_day: dict[str, int]
    expected_per_day: dict[str, int]
    failover_worst_seconds: float
    failover_measured_seconds: float | None
    notes: list[str] = field(default_factory=list)


def per_day(counts: Counter[str], window: float, groups: dict[str, Callable[[str], bool]]) -> dict[str, int]:
    result = {
        group: round(sum(n for kind, n in counts.items() if belongs(kind)) * DAY / window)
        for group, belongs in groups.items()
    }
    result["total"] = round(sum(counts.values()) * DAY / window)
    return result


# -- hubshift ------------------------------------------------------------------------------------------

HUBSHIFT_GROUPS: dict[str, Callable[[str], bool]] = {
    "liveness": lambda k: k == "lease-renew",
    "listing": lambda k: k == "list",
    "checkpoints": lambda k: k == "write-checkpoint",
    "claims and other": lambda k: k not in ("lease-renew", "list", "write-checkpoint"),
}


class HubshiftAgent(threading.Thread):
    """One consumer's ownership traffic at hubshift's defaults, without the reading."""

    def __init__(
        self, name: str, connection_string: str, container: str, counter: RequestCounter, timing: Timing
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer = name
        self.timing = timing
        self.store = BlobLeaseStore.from_container(
            BlobContainer(container, connection_string), timing=timing, raw_response_hook=counter.hook
        )
        self.leases: dict[str, PartitionLease] = {}
        self.snapshot: OwnershipSnapshot | None = None
        self.stopping = threading.Event()
        self.crash = False
        self.joined = threading.Event()
        self.position = 0
        self.errors = 0

    def run(self) -> None:
        timing = self.timing
        membership: Membership = join_pool(
            self.store, SCOPE, self.consumer, clock=time.monotonic, timing=timing
        )
        self.joined.set()
        start = time.monotonic()
        next_list = start + random.uniform(0, 2)
        next_checkpoint = start + random.uniform(0, timing.checkpoint_interval_seconds)
        next_renew = membership.renew_due
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= next_renew:
                try:
                    membership = renew(self.store, membership, clock=time.monotonic)
                    next_renew = membership.renew_due
                except StoreError:
                    self.errors += 1
                    next_renew = now + 2
            if now >= next_list:
                first = self.snapshot is None
                self.cycle()
                # Claim at once on start-up, then list at a random phase, as consumers started apart do.
                next_list = now + (random.uniform(0, 1) if first else 1) * timing.list_interval_seconds
            if now >= next_checkpoint:
                self.checkpoint_all()
                next_checkpoint += timing.checkpoint_interval_seconds
            self.stopping.wait(max(0.0, min(next_renew, next_list, next_checkpoint) - time.monotonic()))
        if not self.crash:
            for lease in self.leases.values():
                release_partition(self.store, lease)
            leave(self.store, membership)
        self.store.close()

    def cycle(self) -> None:
        try:
            snapshot = take_snapshot(self.store, SCOPE, previous=self.snapshot)
        except StoreError:
            self.errors += 1
            return
        self.snapshot = snapshot
        mine = set(owned_by(snapshot, self.consumer))
        self.leases = {p: lease for p, lease in self.leases.items() if p in mine}
        owners: dict[str, str | None] = {p: None for p in PARTITIONS}
        owners.update({row.partition: row.owner for row in snapshot.partitions})
        for claim in balance(self.consumer, PARTITIONS, owners, snapshot.live_members):
            try:
                lease = claim_partition(self.store, SCOPE, claim.partition, self.consumer, force=claim.force)
            except (LeaseConflict, StoreError):
                continue
            self.leases[lease.partition] = lease

    def checkpoint_all(self) -> None:
        for partition, lease in list(self.leases.items()):
            self.position += 1
            try:
                self.leases[partition] = write_checkpoint(
                    self.store, lease, Checkpoint(str(self.position * 1000), self.position)
                )
            except LeaseLost:
                del self.leases[partition]
            except StoreError:
                self.errors += 1


def wait_until(condition: Callable[[], bool], timeout: float, step: float = 0.5) -> float | None:
    """Seconds until `condition` held, or None after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        time.sleep(step)
    return None


def run_hubshift(connection_string: str, window: float, timing: Timing, console: Console) -> SideResult:
    container = "hubshift-bench"
    observer = BlobLeaseStore.from_container(BlobContainer(container, connection_string))
    observer.ensure_container(create=True)
    counter = RequestCounter()
    agents = [HubshiftAgent(f"consumer-{i}", connection_string, container, counter, timing) for i in range(8)]
    for agent in agents:
        agent.start()

    def balanced(excluded: frozenset[str] = frozenset()) -> bool:
        """All partitions held by live agents (not `excluded`), within one of each other."""
        snapshot = take_snapshot(observer, SCOPE)
        live = [m for m in snapshot.live_members if m not in excluded]
        held = Counter(p.owner for p in snapshot.partitions if p.owner in live and not p.free)
        counts = list(held.values())
        return sum(counts) == len(PARTITIONS) and len(held) == len(live) and max(counts) - min(counts) <= 1

    settled = wait_until(balanced, 120)
    console.print(f"hubshift: 8 agents balanced after {settled or 120:.1f} s; counting {window:.0f} s")
    counter.open()
    time.sleep(window)
    counter.close()

    victim = agents[-1]
    victim.crash = True
    victim.stopping.set()
    victim.join(timeout=30)
    crashed_at = time.monotonic()
    console.print(f"hubshift: {victim.consumer} crashed (nothing released); waiting for its partitions")
    failover = wait_until(lambda: balanced(frozenset({victim.consumer})), 180)
    measured = None if failover is None else round(time.monotonic() - crashed_at, 1)
    for agent in agents[:-1]:
        agent.stopping.set()
    for agent in agents[:-1]:
        agent.join(timeout=30)
    observer.close()

    lease, renew_every = timing.membership_lease_seconds, timing.renew_interval_seconds
    expected = {
        "liveness": round(CONSUMERS * DAY / renew_every),
        "listing": round(CONSUMERS * DAY / timing.list_interval_seconds),
        "checkpoints": round(len(PARTITIONS) * DAY / timing.checkpoint_interval_seconds),
        "claims and other": 0,
    }
    expected["total"] = sum(expected.values())
    return SideResult(
        name="hubshift",
        settings=(
            f"membership lease {lease} s renewed every {renew_every:g} s, list every "
            f"{timing.list_interval_seconds:g} s, checkpoint every {timing.checkpoint_interval_seconds:g} s"
        ),
        window_seconds=round(counter.window_seconds, 1),
        counts=dict(counter.counts),
        per_day=per_day(counter.counts, counter.window_seconds, HUBSHIFT_GROUPS),
        expected_per_day=expected,
        failover_worst_seconds=failover_seconds(timing),
        failover_measured_seconds=measured,
        notes=[f"agent request errors: {sum(a.errors for a in agents)}"],
    )


# -- the Azure SDK -------------------------------------------------------------------------------------

SDK_GROUPS: dict[str, Callable[[str], bool]] = {
    "liveness": lambda k: k == "write-ownership",
    "listing": lambda k: k == "list",
    "checkpoints": lambda k: k == "write-checkpoint",
    "claims and other": lambda k: k not in ("write-ownership", "list", "write-checkpoint"),
}


def sdk_balanced(observer: Any) -> bool:
    """Every partition owned (unexpired), by 8 owners holding 4 each (read with an uncounted client)."""
    now = time.time()
    owners: Counter[str] = Counter()
    for blob in observer.list_blobs(include=["metadata"]):
        owner = blob.metadata.get("ownerid") if "/ownership/" in blob.name else None
        if owner and blob.last_modified.timestamp() + SDK_EXPIRY > now:
            owners[owner] += 1
    fair = len(PARTITIONS) // CONSUMERS
    return len(owners) == CONSUMERS and set(owners.values()) == {fair}


def run_sdk_processor(
    connection_string: str, window: float, checkpoint_every: float, console: Console
) -> tuple[RequestCounter, str]:
    from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
    from azure.storage.blob import ContainerClient

    from hubshift.emulator.launch import start_emulator

    emulator = start_emulator([f"{HUB}:{len(PARTITIONS)}"])
    container = "sdk-bench"
    observer = ContainerClient.from_connection_string(connection_string, container)
    observer.create_container()
    counter = RequestCounter()
    stop = threading.Event()
    clients: list[Any] = []

    def produce() -> None:
        connection = emulator.connection_string
        with EventHubProducerClient.from_connection_string(connection, eventhub_name=HUB) as producer:
            while not stop.is_set():
                for p in PARTITIONS:
                    batch = producer.create_batch(partition_id=p)
                    batch.add(EventData(b'{"home": 1, "sensor": "door", "event": "open"}'))
                    producer.send_batch(batch)
                stop.wait(2)

    def consume(client: Any) -> None:
        last: dict[str, float] = {}

        def on_event(context: Any, event: Any) -> None:
            now = time.monotonic()
            if event is not None and now - last.get(context.partition_id, 0.0) >= checkpoint_every:
                context.update_checkpoint(event)
                last[context.partition_id] = now

        client.receive(on_event=on_event, starting_position="-1")

    threads = [threading.Thread(target=produce, daemon=True)]
    for _ in range(CONSUMERS):
        store = BlobCheckpointStore.from_connection_string(
            connection_string, container, raw_response_hook=counter.hook
        )
        client = EventHubConsumerClient.from_connection_string(
            emulator.connection_string, consumer_group="$Default", eventhub_name=HUB, checkpoint_store=store
        )
        clients.append(client)
        threads.append(threading.Thread(target=consume, args=(client,), daemon=True))
    try:
        for thread in threads:
            thread.start()
        settled = wait_until(lambda: sdk_balanced(observer), 300, step=2)
        if settled is None:
            console.print("SDK processors: not balanced after 300 s; counting anyway")
        else:
            console.print(f"SDK processors: balanced after {settled:.0f} s; counting {window:.0f} s")
        counter.open()
        time.sleep(window)
        counter.close()
    finally:
        stop.set()
        for client in clients:
            client.close()
        emulator.stop()
        observer.close()
    return counter, "EventHubConsumerClient + BlobCheckpointStore on the hubshift emulator"


def run_sdk_ownership_manager(
    connection_string: str, window: float, checkpoint_every: float, console: Console
) -> tuple[RequestCounter, str]:
    """The SDK processor's storage loop without an Event Hub: its OwnershipManager and BlobCheckpointStore."""
    from azure.eventhub._eventprocessor.common import LoadBalancingStrategy
    from azure.eventhub._eventprocessor.ownership_manager import OwnershipManager
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
    from azure.storage.blob import ContainerClient

    container = "sdk-bench"
    observer = ContainerClient.from_connection_string(connection_string, container)
    observer.create_container()
    counter = RequestCounter()
    stop = threading.Event()
    hub_client = SimpleNamespace(
        _address=SimpleNamespace(hostname=SCOPE.fqns), eventhub_name=HUB, get_partition_ids=lambda: PARTITIONS
    )

    def processor() -> None:
        store = BlobCheckpointStore.from_connection_string(
            connection_string, container, raw_response_hook=counter.hook
        )
        manager = OwnershipManager(
            hub_client,  # type: ignore[arg-type]
            "$default",
            str(uuid.uuid4()),
            store,
            SDK_EXPIRY,
            LoadBalancingStrategy.GREEDY,
            None,
        )
        owned: set[str] = set()
        next_cycle = time.monotonic() + random.uniform(0, 5)
        next_checkpoint = time.monotonic() + checkpoint_every
        position = 0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_cycle:  # the processor's loop: claim, list checkpoints for new claims, sleep
                claimed = set(manager.claim_ownership())
                if claimed - owned:
                    manager.get_checkpoints()
                owned = claimed
                next_cycle = now + SDK_INTERVAL + SDK_INTERVAL * random.random() * SDK_JITTER
            if now >= next_checkpoint:
                for p in owned:
                    position += 1
                    store.update_checkpoint(
                        {
                            "fully_qualified_namespace": SCOPE.fqns,
                            "eventhub_name": HUB,
                            "consumer_group": "$default",
                            "partition_id": p,
                            "offset": str(position),
                            "sequence_number": position,
                        }
                    )
                next_checkpoint += checkpoint_every
            stop.wait(max(0.0, min(next_cycle, next_checkpoint) - time.monotonic()))
        store.close()

    threads = [threading.Thread(target=processor, daemon=True) for _ in range(CONSUMERS)]
    for thread in threads:
        thread.start()
    settled = wait_until(lambda: sdk_balanced(observer), 300, step=2)
    console.print(f"SDK ownership managers: balanced after {settled or 300:.0f} s; counting {window:.0f} s")
    counter.open()
    time.sleep(window)
    counter.close()
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    observer.close()
    return counter, "the SDK's OwnershipManager + BlobCheckpointStore loop (no Event Hub)"


def sdk_result(counter: RequestCounter, how: str, checkpoint_every: float) -> SideResult:
    cycle = SDK_INTERVAL * (1 + SDK_JITTER / 2)
    expected = {
        "liveness": round(len(PARTITIONS) * DAY / cycle),
        "listing": round(CONSUMERS * DAY / cycle),
        "checkpoints": round(len(PARTITIONS) * DAY / checkpoint_every),
        "claims and other": 0,
    }
    expected["total"] = sum(expected.values())
    return SideResult(
        name="Azure SDK processor",
        settings=(
            f"load balancing every {SDK_INTERVAL:g}-{SDK_INTERVAL * (1 + SDK_JITTER):g} s, ownership expiry "
            f"{SDK_EXPIRY:g} s, greedy; checkpoint every {checkpoint_every:g} s"
        ),
        window_seconds=round(counter.window_seconds, 1),
        counts=dict(counter.counts),
        per_day=per_day(counter.counts, counter.window_seconds, SDK_GROUPS),
        expected_per_day=expected,
        failover_worst_seconds=SDK_EXPIRY + SDK_INTERVAL * (1 + SDK_JITTER),
        failover_measured_seconds=None,
        notes=[how, "failover: not measured (it takes over 3 minutes); worst case from the defaults"],
    )


# -- report --------------------------------------------------------------------------------------------


def report(results: list[SideResult], checkpoint_every: float, console: Console) -> dict[str, Any]:
    """The table, and the verdict: ownership traffic (where the protocols differ) plus the checkpoints of
    the common cadence, since both sides checkpoint each partition at most once per interval."""
    cadence = round(len(PARTITIONS) * DAY / checkpoint_every)
    table = Table(
        title="Storage requests per day, 8 consumers x 32 partitions (counted on Azurite, extrapolated)",
        title_justify="left",
    )
    table.add_column("")
    for column in ("liveness", "listing", "ownership", "checkpoints", "claims+other", "total", "total*"):
        table.add_column(column, justify="right")
    table.add_column("crash failover", justify="right")
    summary: dict[str, dict[str, int]] = {}
    for r in results:
        d = r.per_day
        ownership = d["liveness"] + d["listing"]
        total = ownership + d["claims and other"] + cadence
        summary[r.name] = {"ownership": ownership, "total_at_common_cadence": total}
        seconds = r.failover_measured_seconds
        measured = "" if seconds is None else f" (measured {seconds:g} s)"
        table.add_row(
            r.name,
            f"{d['liveness']:,}",
            f"{d['listing']:,}",
            f"{ownership:,}",
            f"{d['checkpoints']:,}",
            f"{d['claims and other']:,}",
            f"{d['total']:,}",
            f"{total:,}",
            f"≤ {r.failover_worst_seconds:g} s{measured}",
        )
    console.print(table)
    console.print(
        f"total* = ownership + claims + checkpoints at the common cadence ({cadence:,} a day: each "
        f"partition every {checkpoint_every:g} s). Crash failover: until a crashed consumer's partitions are "
        "owned again, without an operator (worst case from the defaults)."
    )
    hub, sdk = results
    ratio = sdk.failover_worst_seconds / hub.failover_worst_seconds
    hub_total = summary[hub.name]["total_at_common_cadence"]
    sdk_total = summary[sdk.name]["total_at_common_cadence"]
    ok = hub_total <= sdk_total and ratio >= 4
    for r in results:
        console.print(f"{r.name}: {r.settings}; counted {r.window_seconds:g} s; {'; '.join(r.notes)}")
        console.print(f"  requests in the window: {dict(sorted(r.counts.items()))}")
        console.print(f"  arithmetic per day: {r.expected_per_day}")
    console.print(
        f"target (total ≤ the SDK's at a failover ≥ 4x shorter): {'met' if ok else 'NOT met'}: "
        f"{hub_total:,} vs {sdk_total:,} requests a day, failover {ratio:.1f}x shorter"
    )
    return {
        "consumers": CONSUMERS,
        "partitions": len(PARTITIONS),
        "checkpoint_interval_seconds": checkpoint_every,
        "sides": [asdict(r) for r in results],
        "summary": summary,
        "failover_ratio": round(ratio, 2),
        "target_met": ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=90.0, help="seconds counted on each side")
    parser.add_argument("--sdk-peer", choices=["processor", "ownership-manager"], default="processor")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 150))
    timing = DEFAULT_TIMING
    outcome: dict[str, Any] = {}

    with running_azurite() as azurite:
        connection_string = azurite.connection_string

        def hubshift_side() -> None:
            outcome["hubshift"] = run_hubshift(connection_string, args.window, timing, console)

        side = threading.Thread(target=hubshift_side)
        side.start()
        every = timing.checkpoint_interval_seconds
        sdk: tuple[RequestCounter, str] | None = None
        if args.sdk_peer == "processor":
            try:
                sdk = run_sdk_processor(connection_string, args.window, every, console)
            except Exception as exc:  # without a working emulator: the SDK's own loop, and say so
                console.print(f"SDK processor peer unavailable ({type(exc).__name__}: {exc}); "
                              "driving the SDK's OwnershipManager loop instead")  # fmt: skip
        if sdk is None:
            sdk = run_sdk_ownership_manager(connection_string, args.window, every, console)
        side.join()
    counter, how = sdk
    document = report([outcome["hubshift"], sdk_result(counter, how, every)], every, console)
    document["command"] = " ".join(["bench/store_ops.py", *sys.argv[1:]])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    console.print(f"wrote {args.output}")
    if not document["target_met"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
