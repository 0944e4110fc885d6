"""Deploys and node drains on real pods, side by side in one run, on the deployed scenarios' cluster, operator
and servers (tests/scenarios/deployed.py runs `measure_rollouts` between its scenarios).

Two pools of four SDK-engine pods (`consumer.engine: sdk`: real consumers without the JVM, so pod start-up is
seconds) read a hub of eight partitions, each in its own consumer group, under one steady load:
`fleet-rolling` with the StatefulSet's own RollingUpdate (`rebalance.rollout.strategy: RollingUpdate`),
`fleet-operator` with the rollout the operator drives (the default). Each gets a new image (the same image
under a new tag: a new revision of its StatefulSet, as a new build would be), one after the other; then
`kubectl drain` evicts the pods of both through the Eviction API, with the node uncordoned at once so that
replacements come back (a one-node cluster has nowhere else to put them).

Per side and per change, every time from the change itself (the `kubectl patch`, the drain) to the pool
balanced again on new pods: the time; the events read twice (the consumers' range logs, on a hostPath
volume that outlives the pods); the partition-seconds without a live owner (the store, sampled every
0.25 s); the fewest consumers reading at once; each handoff's time (from a partition's last batch under
its old owner to its first under the new one: p50, p99, max); the worst partition's lag in seconds during
the change against the steady window before it, as the range logs show it (a batch's handling minus its
first event's enqueued time) and as the operator's status reports it (`lagSeconds`); the operator's
rebalances and forced moves (its Events), container restarts; the storage requests the side made in
that window (its consumers' and the operator's, to its own checkpoint container, counted from Azurite's
access log to the whole second); which of the issue's targets were met (p99
handoff within 3 s, the worst lag at most twice the steady one). Written to
bench/results/<cluster>_rollout.json; the range logs, Events and the operator's log stay in the test's
folder.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hubshift.apps.produce import HubSender, LoadSpec, produce_load
from hubshift.connections import event_hubs_target, open_checkpoint_store, ownership_scope
from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumer, parse_manifest
from hubshift.operator.kubernetes.render import CONSUMER_LABEL
from hubshift.ownership.model import Phase
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseStore
from hubshift.spec import API_VERSION, KIND
from tests.harness.azurite import requests_in
from tests.harness.ranges import count_replays, handoffs, percentile, worst_wait
from tests.scenarios.cluster import JSON, PodWatch, ScenarioCluster, pod_ready, sampling

if TYPE_CHECKING:
    from tests.scenarios.deployed import Deployment

REPO_ROOT = Path(__file__).resolve().parents[2]
FLEET_HUB, FLEET_PARTITIONS = "fleet", 8
POOL_SIZE = 4
LOAD_PER_SECOND = 160.0  # over the eight partitions
STEADY_SECONDS = 10.0  # the window before each change the lag is compared with
SAMPLE_SECONDS = 0.25
CHANGE_SECONDS = 420.0  # a bound on one rollout or drain (pods start in seconds; a loaded machine is slower)
START_SECONDS = 360.0
CATCH_UP_SECONDS = 120.0
MAX_HANDOFF_SECONDS = 15  # rebalance.maxHandoffSeconds: a handoff longer than this would be forced
HANDOFF_TARGET_SECONDS = 3.0  # Solace's bound for a partition's handoff (the issue's target)
SIDES = (("fleet-rolling", "RollingUpdate"), ("fleet-operator", "Operator"))
# Each pool reads the hub in its own consumer group, named after it: in one group their epoch receivers
# would take partitions from each other (Event Hubs' owner-level rule), a replay at every such theft.
FLEET_CONSUMER_GROUPS = tuple(name for name, _ in SIDES)
FORCED = re.compile(r"\((\d+) forced\)")  # in the operator's Rebalancing Events


def pool_manifest(name: str, strategy: str, image: str, secrets: tuple[str, str], claim: str) -> JSON:
    """A pool of SDK-engine consumers on the fleet hub, its range logs on the volume `claim`."""
    eventhubs, storage = secrets
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "eventHubs": {
                "hub": FLEET_HUB,
                "consumerGroup": name,
                "connectionStringSecretRef": {"name": eventhubs, "key": "connectionString"},
            },
            "checkpointStore": {
                "blob": {
                    "container": f"{name}-checkpoints",
                    "connectionStringSecretRef": {"name": storage, "key": "connectionString"},
                }
            },
            "consumer": {
                "image": image,
                "engine": "sdk",
                "resources": {"requests": {"cpu": "50m", "memory": "192Mi"}, "limits": {"memory": "768Mi"}},
                "checkpoint": {"everySeconds": 2, "everyEvents": 5000},
                "sink": {"type": "folder", "folder": {"path": "out", "volume": {"claimName": claim}}},
            },
            "scaling": {
                "minReplicas": POOL_SIZE,
                "maxReplicas": POOL_SIZE + 1,  # room for the operator's one extra pod
                "pollingIntervalSeconds": 2,
                "target": {"unprocessedEventsPerReplica": 1_000_000},  # the pool's size stays put
            },
            "rebalance": {
                "delaySeconds": 5,
                "maxHandoffSeconds": MAX_HANDOFF_SECONDS,
                "rollout": {"strategy": strategy},
            },
        },
    }


def ranges_volume(namespace: str, name: str, path: str) -> list[JSON]:
    """A hostPath PersistentVolume and its claim: the range logs outlive the pods that write them."""
    volume = f"{namespace}-{name}-ranges"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],  # one node: every pod of the pool mounts it
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": path, "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": f"{name}-ranges"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"{name}-ranges", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds
    owners: dict[str, str | None]
    live: frozenset[str]
    lag_seconds: float | None  # the operator's status.lagSeconds, when read in this sample


@dataclass
class Pool:
    """One side: its PartitionedConsumer, its store, its range logs on the node."""

    cluster: ScenarioCluster
    namespace: str
    name: str
    strategy: str
    folder: str  # the range logs' hostPath on the node
    document: JSON
    consumer: PartitionedConsumer
    environ: dict[str, str]
    watch: PodWatch
    storage_log: Path | None  # Azurite's access log (the pool's requests are those to its container)
    store: LeaseStore | None = None

    @classmethod
    def create(
        cls, deployment: Deployment, namespace: str, name: str, strategy: str, secrets: tuple[str, str]
    ) -> Pool:
        cluster = deployment.cluster
        folder = cluster.node_folder(f"{namespace}-{name}")
        document = pool_manifest(name, strategy, cluster.image.reference, secrets, f"{name}-ranges")
        consumer = parse_manifest({**document, "metadata": {"name": name, "namespace": namespace}})
        spec = consumer.spec
        assert spec.checkpoint_store.blob is not None
        environ = {
            spec.event_hubs.connection_string_variable: deployment.eventhubs,
            spec.checkpoint_store.blob.connection_string_variable: deployment.storage,
        }
        assert deployment.watch is not None
        log = deployment.azurite.access_log if deployment.azurite is not None else None
        watch = deployment.watch
        return cls(cluster, namespace, name, strategy, folder, document, consumer, environ, watch, log)

    def apply(self) -> None:
        self.cluster.apply(*ranges_volume(self.namespace, self.name, self.folder))
        self.cluster.kubectl("-n", self.namespace, "apply", "-f", "-", input=json.dumps(self.document))

    def delete(self) -> None:
        self.cluster.kubectl(
            "-n", self.namespace, "delete", "pcon", self.name, "--wait=true", check=False, timeout=120
        )
        self.cluster.kubectl(
            "-n", self.namespace, "delete", "pvc", f"{self.name}-ranges", "--wait=false", check=False
        )
        self.cluster.kubectl(
            "delete", "pv", f"{self.namespace}-{self.name}-ranges", "--wait=false", check=False
        )
        if self.store is not None:
            self.store.close()

    def set_image(self, image: str) -> None:
        patch = {"spec": {"consumer": {"image": image}}}
        self.cluster.kubectl(
            "-n", self.namespace, "patch", "pcon", self.name, "--type", "merge", "-p", json.dumps(patch)
        )

    # -- what it looks like

    def pods(self) -> list[JSON]:
        """The pool's pods as the namespace's watch last saw them (no kubectl per look: the samples and the
        checks would load the two cores the pods run on)."""
        latest: dict[str, JSON] = {}
        for event in self.watch.history_of_label(CONSUMER_LABEL, self.name):
            pod = event["object"]
            if event["type"] == "DELETED":
                latest.pop(pod["metadata"]["name"], None)
            else:
                latest[pod["metadata"]["name"]] = pod
        return [latest[name] for name in sorted(latest)]

    def snapshot_parts(self) -> tuple[dict[str, str | None], frozenset[str], Any]:
        if self.store is None:
            spec = self.consumer.spec
            self.store = open_checkpoint_store(spec.checkpoint_store, self.environ, create=False)
        scope = ownership_scope(event_hubs_target(self.consumer.spec.event_hubs, self.environ))
        snapshot = take_snapshot(self.store, scope)
        owners = {row.partition: (None if row.free else row.owner) for row in snapshot.partitions}
        return owners, frozenset(snapshot.live_members), snapshot.assignment

    def settled(
        self, *, revision_changed_from: str | None = None, not_uids: frozenset[str] = frozenset()
    ) -> bool:
        """Balanced over exactly POOL_SIZE Ready pods at the StatefulSet's update revision (another than
        `revision_changed_from`), none of them one of `not_uids`: the change is over. The store and the
        watch first; the StatefulSet is asked only when they say so."""
        try:
            owners, live, record = self.snapshot_parts()
        except UserError:  # the store's container, before the pool's first consumer made it
            return False
        if record is None or record.phase is not Phase.READY or dict(record.partitions) != owners:
            return False
        pods = [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]
        if len(pods) != POOL_SIZE or len(owners) != FLEET_PARTITIONS or not all(pod_ready(p) for p in pods):
            return False
        if any(p["metadata"]["uid"] in not_uids for p in pods):
            return False
        shares = [list(owners.values()).count(p["metadata"]["name"]) for p in pods]
        if not set(owners.values()) <= live or max(shares) - min(shares) > 1 or min(shares) == 0:
            return False
        statefulset = self.cluster.get("-n", self.namespace, "statefulset", self.name)
        revision = (statefulset.get("status") or {}).get("updateRevision")
        if revision in (None, revision_changed_from) or statefulset["spec"]["replicas"] != POOL_SIZE:
            return False
        return all(p["metadata"]["labels"].get("controller-revision-hash") == revision for p in pods)

    def revision(self) -> str | None:
        statefulset = self.cluster.get("-n", self.namespace, "statefulset", self.name)
        return (statefulset.get("status") or {}).get("updateRevision")

    def uids(self) -> frozenset[str]:
        return frozenset(p["metadata"]["uid"] for p in self.pods())

    def restarts(self, since: float, until: float) -> int:
        """Container restarts of the pool's pods between `since` and `until` (a liveness probe's kill, a
        crash), from the watch."""
        counts: dict[str, tuple[int, int]] = {}  # pod uid -> (restarts before, restarts by `until`)
        for event in self.watch.history_of_label(CONSUMER_LABEL, self.name):
            seen = float(event.get("seenAt", 0.0))
            uid = event["object"]["metadata"]["uid"]
            statuses = (event["object"].get("status") or {}).get("containerStatuses") or []
            count = sum(int(s.get("restartCount", 0)) for s in statuses)
            first, last = counts.get(uid, (count, count))
            if seen < since:
                first = count
            if seen <= until:
                last = count
            counts[uid] = (first, last)
        return sum(max(0, last - first) for first, last in counts.values())

    def rebalances(self, since: float, until: float) -> list[str]:
        """The operator's Rebalancing Events on the pool between `since` and `until` (epoch seconds)."""
        found = self.cluster.get(
            "-n", self.namespace, "events", "--field-selector", f"involvedObject.name={self.name}"
        )["items"]
        messages = []
        for event in found:
            stamp = event.get("lastTimestamp") or event.get("eventTime") or ""
            at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0
            if event.get("reason") == "Rebalancing" and since - 1 <= at <= until + 1:
                messages.append(str(event.get("message", "")))
        return messages

    def fewest_ready(self, since: float, until: float) -> int | None:
        """The fewest of the pool's pods Ready at once between `since` and `until`, from the watch."""
        ready: dict[str, bool] = {}
        fewest: int | None = None
        for event in self.watch.history_of_label(CONSUMER_LABEL, self.name):
            pod = event["object"]
            ready[pod["metadata"]["name"]] = event["type"] != "DELETED" and pod_ready(pod)
            if since <= float(event.get("seenAt", 0.0)) <= until:
                count = sum(ready.values())
                fewest = count if fewest is None else min(fewest, count)
        return fewest

    def storage_requests(self, since: float, until: float) -> int | None:
        """The requests the pool (its consumers and the operator for it) made to its checkpoint container
        between `since` and `until`, as Azurite logged them."""
        if self.storage_log is None:
            return None
        container = self.document["spec"]["checkpointStore"]["blob"]["container"]
        return requests_in(self.storage_log, container, since, until)

    def lag_seconds(self) -> float | None:
        status = self.cluster.get("-n", self.namespace, "pcon", self.name).get("status") or {}
        lag = status.get("lagSeconds")
        return float(lag) if isinstance(lag, int | float) else None

    def range_lines(self) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        for text in self.cluster.read_node_files(self.folder, "ranges/*.jsonl").values():
            for line in text.splitlines():
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a pod's end
        return lines


def sample(pool: Pool, lag: bool) -> Sample | None:
    """The pool's ownership now (and the operator's lag when `lag`); None when the store or the API server
    did not answer this once (a gap in the samples, not a failure)."""
    try:
        owners, live, _ = pool.snapshot_parts()
        return Sample(time.time(), owners, live, pool.lag_seconds() if lag else None)
    except Exception:
        return None


@dataclass
class Load:
    """A steady load on a thread until stopped: `send(spec, stop)` sends it and says how many events went."""

    send: Callable[[LoadSpec, threading.Event], int]
    rate: float
    seed: int
    homes: int = 300
    stop: threading.Event = field(default_factory=threading.Event)
    sent: int = 0
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> Load:
        spec = LoadSpec(homes=self.homes, rate=self.rate, seed=self.seed, interval=0.2)

        def run() -> None:
            try:
                self.sent = self.send(spec, self.stop)
            except BaseException as error:
                self.error = error

        self.thread = threading.Thread(target=run, name="load", daemon=True)
        self.thread.start()
        return self

    def finish(self) -> int:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=60)
        if self.error is not None:
            raise self.error
        return self.sent


def fleet_sender(connection_string: str) -> Callable[[LoadSpec, threading.Event], int]:
    """Sends a load to the fleet hub (nothing recorded: the range logs say what was handled)."""

    def send(spec: LoadSpec, stop: threading.Event) -> int:
        sender = HubSender.connect(connection_string, FLEET_HUB)
        try:
            return produce_load(spec, sender, hub=FLEET_HUB, stop=stop).events
        finally:
            sender.close()

    return send


def figures(
    pool: Pool, samples: Sequence[Sample], lines: Sequence[dict[str, Any]], changed: float, ended: float
) -> JSON:
    """One side's figures for one change (module docstring)."""
    during = [s for s in samples if changed <= s.at <= ended]
    before = [s for s in samples if changed - STEADY_SECONDS <= s.at < changed]
    unowned = (
        sum(sum(1 for owner in s.owners.values() if owner is None or owner not in s.live) for s in during)
        * SAMPLE_SECONDS
    )
    readers = [len({o for o in s.owners.values() if o is not None and o in s.live}) for s in during]
    gaps = [gap for gap, at in handoffs(lines, changed) if at <= ended]
    _, replayed_before = count_replays(line for line in lines if float(line["at"]) < changed)
    _, replayed_after = count_replays(line for line in lines if float(line["at"]) <= ended)

    def worst(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return round(max(known), 3) if known else None

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    rebalances = pool.rebalances(changed, ended)
    return {
        "seconds": round(ended - changed, 1),
        "storageRequests": pool.storage_requests(changed, ended),
        "eventsReplayed": replayed_after - replayed_before,
        "rebalances": len(rebalances),
        "forcedMoves": sum(int(found) for m in rebalances for found in FORCED.findall(m)),
        "containerRestarts": pool.restarts(changed, ended),
        "unownedPartitionSeconds": round(unowned, 2),
        "fewestConsumersReading": min(readers) if readers else None,  # a handoff's instant included
        "fewestReadyPods": pool.fewest_ready(changed, ended),
        "handoffs": len(gaps),
        "handoffSecondsP50": rounded(percentile(gaps, 0.5)),
        "handoffSecondsP99": rounded(percentile(gaps, 0.99)),
        "handoffSecondsMax": rounded(max(gaps) if gaps else None),
        "worstLagSecondsBefore": rounded(worst_wait(lines, changed - STEADY_SECONDS, changed)),
        "worstLagSecondsDuring": rounded(worst_wait(lines, changed, ended)),
        "statusLagSecondsBefore": worst([s.lag_seconds for s in before]),
        "statusLagSecondsDuring": worst([s.lag_seconds for s in during]),
    } | {"targetsMet": targets_met(gaps, lines, samples, changed, ended)}


def targets_met(
    gaps: Sequence[float],
    lines: Sequence[dict[str, Any]],
    samples: Sequence[Sample],
    changed: float,
    ended: float,
) -> JSON:
    """The issue's targets for one change: p99 handoff at most HANDOFF_TARGET_SECONDS; the worst lag during
    it at most twice the steady window's, by the range logs and by the operator's status."""
    p99 = percentile(gaps, 0.99)
    before, during = worst_wait(lines, changed - STEADY_SECONDS, changed), worst_wait(lines, changed, ended)
    status_before = [s.lag_seconds for s in samples if changed - STEADY_SECONDS <= s.at < changed]
    status_during = [s.lag_seconds for s in samples if changed <= s.at <= ended]
    known_before = [v for v in status_before if v is not None]
    known_during = [v for v in status_during if v is not None]
    return {
        "handoffP99": p99 is not None and p99 <= HANDOFF_TARGET_SECONDS,
        "lagAtMostTwiceSteady": None if before is None or during is None else during <= 2 * before,
        "statusLagAtMostTwiceSteady": (
            None if not known_before or not known_during else max(known_during) <= 2 * max(known_before)
        ),
    }


def change_and_measure(
    deployment: Deployment,
    pools: Sequence[Pool],
    change: Callable[[], object],
    settled: dict[str, Callable[[], bool]],
    what: str,
) -> dict[str, JSON]:
    """Steady for STEADY_SECONDS, `change`, then until every pool is `settled`: each pool's figures."""
    ended: dict[str, float] = {}
    with _all_sampled(pools) as samples:
        time.sleep(STEADY_SECONDS)
        changed = time.time()
        change()
        deadline = time.monotonic() + CHANGE_SECONDS
        while len(ended) < len(pools):
            for pool in pools:
                if pool.name not in ended and settled[pool.name]():
                    ended[pool.name] = time.time()
            if time.monotonic() > deadline:
                raise AssertionError(
                    deployment.describe(f"{what}: not settled: {sorted(set(settled) - set(ended))}")
                )
            time.sleep(1.0)
        time.sleep(2)  # the last batches reach the logs
    return {
        pool.name: figures(pool, samples[pool.name], pool.range_lines(), changed, ended[pool.name])
        for pool in pools
    }


@contextmanager
def _all_sampled(pools: Sequence[Pool]) -> Iterator[dict[str, list[Sample]]]:
    """Every pool sampled every SAMPLE_SECONDS (the operator's lag every eighth time: the status changes every
    polling interval, 2 s) while the block runs."""
    counter = itertools.count()

    def probe() -> list[Sample | None]:
        lag = next(counter) % 8 == 0
        return [sample(pool, lag) for pool in pools]

    with sampling(probe, every=SAMPLE_SECONDS) as rounds:
        found: dict[str, list[Sample]] = {pool.name: [] for pool in pools}
        yield found
    for taken in rounds:
        for pool, one in zip(pools, taken, strict=True):
            if one is not None:
                found[pool.name].append(one)


def drain(cluster: ScenarioCluster, pools: Sequence[Pool]) -> threading.Thread:
    """`kubectl drain` of the node the pools run on, for their pods only (the Eviction API, one pod of a
    pool at a time as its PodDisruptionBudget allows, retried every 5 s), the node uncordoned as soon as
    it is cordoned: the only node, it must take the replacements back."""
    (pod, *_) = pools[0].pods()
    node = pod["spec"]["nodeName"]
    selector = f"{CONSUMER_LABEL} in ({','.join(p.name for p in pools)})"
    finished: list[str] = []

    def run() -> None:
        result = cluster.kubectl(
            "drain", node, "--pod-selector", selector, "--ignore-daemonsets", "--delete-emptydir-data",
            "--timeout", f"{int(CHANGE_SECONDS)}s", timeout=CHANGE_SECONDS + 30, check=False,
        )  # fmt: skip
        finished.append(f"exit {result.returncode}: {result.stderr.strip()[-500:]}")

    thread = threading.Thread(target=run, name="kubectl-drain", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not cluster.get("node", node)["spec"].get("unschedulable"):
        assert time.monotonic() < deadline and not finished, (
            f"kubectl drain did not cordon {node}: {finished}"
        )
        time.sleep(0.1)
    cluster.kubectl("uncordon", node)
    return thread


def keep_diagnostics(deployment: Deployment, pools: Sequence[Pool]) -> None:
    """The pools' range logs and Events and the operator's log, in the test's folder (what a failed figure
    is read from)."""
    folder = deployment.workdir / "rollouts"
    folder.mkdir(exist_ok=True)
    try:
        for pool in pools:
            (folder / f"{pool.name}.jsonl").write_text("\n".join(json.dumps(x) for x in pool.range_lines()))
        events = deployment.cluster.get("-n", pools[0].namespace, "events")
        (folder / "events.json").write_text(json.dumps(events))
        for pod in deployment.operator_pods():
            (folder / f"{pod['metadata']['name']}.log").write_text(deployment.operator_log(pod))
        print(f"rollouts: diagnostics in {folder}")
    except Exception as error:  # a diagnostic, never the test's outcome
        print(f"rollouts: diagnostics not kept: {error}")


def measure_rollouts(deployment: Deployment, namespace: str, secrets: tuple[str, str]) -> JSON:
    """Both pools up, a new image for each in turn, then both drained: the figures (also written to
    bench/results/<cluster>_rollout.json)."""
    cluster = deployment.cluster
    pools = [Pool.create(deployment, namespace, name, strategy, secrets) for name, strategy in SIDES]
    started = time.monotonic()
    result: JSON = {
        "cluster": cluster.name,
        "pool": POOL_SIZE,
        "partitions": FLEET_PARTITIONS,
        "loadPerSecond": LOAD_PER_SECOND,
    }
    try:
        for pool in pools:
            pool.apply()
        for pool in pools:
            deployment.wait(
                lambda p=pool: p.settled(), START_SECONDS, f"{pool.name} balanced over {POOL_SIZE} pods"
            )
        image = cluster.tag_image(f"{cluster.image.tag}-rollout")
        load_started = time.time()
        load = Load(fleet_sender(deployment.eventhubs), LOAD_PER_SECOND, seed=23, homes=400).start()
        try:
            deployment.wait(
                lambda: all(any(float(line["at"]) > load_started for line in p.range_lines()) for p in pools),
                START_SECONDS,
                "both pools reading the load",
            )
            rollouts: dict[str, JSON] = {}
            for pool in pools:
                before = pool.revision()
                rollouts.update(
                    change_and_measure(
                        deployment,
                        [pool],
                        lambda p=pool: p.set_image(image.reference),  # type: ignore[misc]
                        {pool.name: lambda p=pool, b=before: p.settled(revision_changed_from=b)},  # type: ignore[misc]
                        f"{pool.name}: a new image",
                    )
                )
            uids = {pool.name: pool.uids() for pool in pools}
            draining: list[threading.Thread] = []
            drained = change_and_measure(
                deployment,
                pools,
                lambda: draining.append(drain(cluster, pools)),
                {p.name: lambda p=p: p.settled(not_uids=uids[p.name]) for p in pools},  # type: ignore[misc]
                "kubectl drain",
            )
        finally:
            sent = load.finish()
        for thread in draining:
            thread.join(timeout=60)
        for pool in pools:
            counted: list[tuple[int, int]] = []

            def caught_up(p: Pool = pool, into: list[tuple[int, int]] = counted) -> bool:
                into.append(count_replays(p.range_lines()))
                return into[-1][0] >= sent

            deployment.wait(caught_up, CATCH_UP_SECONDS, f"{pool.name} handled the {sent} events sent")
            distinct, replayed = counted[-1]
            result.setdefault("totals", {})[pool.name] = {
                "sent": sent,
                "handled": distinct,
                "replayed": replayed,
            }
        result["rollout"] = rollouts
        result["drain"] = drained
    finally:
        keep_diagnostics(deployment, pools)
        for pool in pools:
            pool.delete()
    result["wallSeconds"] = round(time.monotonic() - started, 1)
    result["finishedAt"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = REPO_ROOT / "bench" / "results" / f"{cluster.name}_rollout.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result
