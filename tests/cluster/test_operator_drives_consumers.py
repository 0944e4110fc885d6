"""The production path end to end on a real kube-apiserver: `hubshift operator` with its installed control
loop (kopf daemon + `cluster_loop` + `KubernetesRuntime`), reading the connection strings from Secrets,
drives REAL `hubshift consume` processes, one per consumer pod KWOK runs for the StatefulSet
(`PodProcessRunner`), over the hubshift emulator and a Blob store on Azurite.

KWOK's pod IPs are fake, so the operator's nudges (POST /assignment) go nowhere: the consumers find each
new generation by listing the store (every second here), as they do when a nudge is lost.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import parse_connection_string

from hubshift.operator.kubernetes.api import consumer_pod_labels
from hubshift.ownership.model import OwnershipSnapshot
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.store import LeaseStore
from hubshift.ownership.stores.locations import open_store
from hubshift.spec import DEFAULT_EVENTHUBS_ENV, DEFAULT_STORAGE_ENV
from tests.fixtures.cluster import eventually
from tests.fixtures.operator import CRS, example_manifest
from tests.harness.control_plane import ApiError, ControlPlane, PodProcessRunner

pytestmark = pytest.mark.timeout(240)

NAME = "homes"
HUB = "telemetry"
PARTITIONS = [str(p) for p in range(8)]
DELAY_SECONDS = 8  # the holddown (a lost consumer's; a deleted pod's partitions move at once)
LEASE_SECONDS, LIST_SECONDS, HANDOFF_SECONDS = 15, 1, 5


def manifest(namespace: str, container: str, sink: Path) -> dict[str, Any]:
    """examples/homes.yaml with small timings, the emulator's hub and the test's Blob container."""
    document = example_manifest(namespace)
    spec = document["spec"]
    spec["eventHubs"].pop("namespace")  # the connection string's endpoint names the emulator
    spec["checkpointStore"]["blob"]["container"] = container
    spec["consumer"]["checkpoint"] = {"everySeconds": 1, "everyEvents": 1}
    spec["consumer"]["sink"] = {"type": "folder", "folder": {"path": str(sink)}}
    spec["scaling"].update(minReplicas=2, maxReplicas=4, pollingIntervalSeconds=1)
    spec["rebalance"] = {
        "delaySeconds": DELAY_SECONDS,
        "maxHandoffSeconds": HANDOFF_SECONDS,
        "leaseDurationSeconds": LEASE_SECONDS,
    }
    return document


def secret(name: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"connectionString": value},
    }


def owners_by_consumer(assignment: dict[str, str]) -> dict[str, list[str]]:
    by_consumer: dict[str, list[str]] = {}
    for partition, consumer in sorted(assignment.items(), key=lambda item: int(item[0])):
        by_consumer.setdefault(consumer, []).append(partition)
    return by_consumer


class World:
    """What the test watches: the CR's status, the store's ownership table, the pod processes."""

    def __init__(
        self, plane: ControlPlane, namespace: str, store: LeaseStore, scope: Scope, operator: Any
    ) -> None:
        self.plane = plane
        self.namespace = namespace
        self.store = store
        self.scope = scope
        self.operator = operator
        self.runner: PodProcessRunner | None = None
        self.last_snapshot: OwnershipSnapshot | None = None

    def cr(self) -> dict[str, Any]:
        return self.plane.request("GET", f"{CRS.format(ns=self.namespace)}/{NAME}")

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.cr().get("status") or {}
        return status

    def snapshot(self) -> OwnershipSnapshot:
        self.last_snapshot = take_snapshot(self.store, self.scope)
        return self.last_snapshot

    def balanced(self, consumers: set[str]) -> tuple[dict[str, Any], OwnershipSnapshot] | None:
        """Phase Ready over exactly `consumers`, the record assigning every partition to one of them (an
        even share each), and the store's leases exactly as the record says, held by live members."""
        status = self.status()
        if status.get("phase") != "Ready" or status.get("readyReplicas") != len(consumers):
            return None
        if status.get("currentReplicas") != len(consumers):
            return None
        snapshot = self.snapshot()
        record = snapshot.assignment
        if record is None or record.generation != status.get("assignmentGeneration"):
            return None
        if sorted(record.partitions, key=int) != PARTITIONS or set(record.partitions.values()) != consumers:
            return None
        shares = [len(p) for p in owners_by_consumer(dict(record.partitions)).values()]
        if max(shares) - min(shares) > 1:
            return None
        if snapshot.owners != dict(record.partitions):
            return None
        if any(not row.owner_alive for row in snapshot.partitions):
            return None
        reported = {a["consumer"]: a["partitions"] for a in status.get("assignment", [])}
        if reported != owners_by_consumer(dict(record.partitions)):
            return None
        return status, snapshot

    def describe(self, what: str) -> Callable[[], str]:
        def text() -> str:
            try:
                status = json.dumps(self.status(), indent=1)[-2500:]
            except ApiError as error:
                status = str(error)
            snapshot = self.last_snapshot
            table = (
                "no snapshot"
                if snapshot is None
                else f"owners {snapshot.owners}, members {snapshot.live_members}, "
                f"record {None if snapshot.assignment is None else dict(snapshot.assignment.partitions)}"
            )
            processes = "no runner"
            if self.runner is not None:
                processes = f"pod processes {self.runner.pids()}, errors {self.runner.errors}"
                logs = sorted(self.runner.log_dir.glob("*.log"))
                processes += "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)
            return (
                f"{what}\nstatus: {status}\n{table}\n{processes}\n--- operator\n{self.operator.log()[-4000:]}"
            )

        return text


def produce(connection_string: str, per_partition: int, first: int) -> None:
    """`per_partition` events to every partition, numbered from `first` in their bodies."""
    from azure.eventhub import EventData, EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=HUB)
    with producer:
        for partition in PARTITIONS:
            batch = producer.create_batch(partition_id=partition)
            for number in range(first, first + per_partition):
                batch.add(EventData(json.dumps({"partition": partition, "n": number})))
            producer.send_batch(batch)


def ranges_read(folder: Path) -> dict[str, list[tuple[int, int]]]:
    """Per partition, the (first, last) sequence ranges the consumers' handlers finished (sdk engine)."""
    found: dict[str, list[tuple[int, int]]] = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                found.setdefault(str(record["partition"]), []).append((record["first"], record["last"]))
    return found


def cordon(plane: ControlPlane, unschedulable: bool) -> None:
    for node in plane.nodes:
        plane.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": unschedulable}})


def event_reasons(plane: ControlPlane, namespace: str) -> list[str]:
    """The reasons of the Events on the PartitionedConsumer, oldest first."""
    items = plane.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    mine = [e for e in items if e["involvedObject"]["kind"] == "PartitionedConsumer"]
    return [e["reason"] for e in sorted(mine, key=lambda e: e["metadata"]["name"])]


def checkpoints_at(snapshot: OwnershipSnapshot, sequence_number: int) -> bool:
    rows = {row.partition: row for row in snapshot.partitions}
    return all(p in rows and rows[p].checkpoint.sequence_number == sequence_number for p in PARTITIONS)


def consumer_processes(
    plane: ControlPlane, world: World, hub: Any, azurite: Any, tmp_path: Path, *options: str
) -> tuple[PodProcessRunner, Path]:
    """A runner (not started) of one SDK-engine `hubshift consume` per consumer pod, reading the manifest
    the operator wrote to the pool's ConfigMap with the Secrets' values as its environment (`options`
    added to each command), and the folder of their range logs."""
    config_map = eventually(
        lambda: plane.request("GET", f"/api/v1/namespaces/{world.namespace}/configmaps/{NAME}-manifest"),
        timeout=60,
        what=world.describe("the manifest ConfigMap"),
    )
    manifest_file = tmp_path / "manifest.yaml"
    manifest_file.write_text(config_map["data"]["manifest.yaml"])
    ranges = tmp_path / "ranges"
    ranges.mkdir()
    command = [
        sys.executable,
        "-m",
        "hubshift.cli",
        "consume",
        *("-f", str(manifest_file), "--id", "{pod}", "--engine", "sdk", "--http-port", "0"),
        *("--scratch", str(tmp_path / "scratch" / "{pod}"), "--list-interval", str(LIST_SECONDS)),
        *("--ranges", str(ranges / "{pod}.jsonl"), "--grace-seconds", "10", *options),
    ]
    selector = ",".join(f"{k}={v}" for k, v in consumer_pod_labels(NAME).items())
    environment = {
        DEFAULT_EVENTHUBS_ENV: hub.connection_string,
        DEFAULT_STORAGE_ENV: azurite.connection_string,
    }
    runner = PodProcessRunner(
        plane, world.namespace, selector, command, env=environment, log_dir=tmp_path / "pods"
    )
    return runner, ranges


def test_the_operator_drives_real_consumer_processes_through_scale_out(
    control_plane: ControlPlane,
    kube_namespace: str,
    start_operator: Any,
    emulator_factory: Any,
    azurite: Any,
    blob_container: str,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    started = time.monotonic()
    hub = emulator_factory([f"{HUB}:{len(PARTITIONS)}"])
    for name, value in (
        ("telemetry-eventhubs", hub.connection_string),
        ("telemetry-storage", azurite.connection_string),
    ):
        control_plane.request("POST", f"/api/v1/namespaces/{ns}/secrets", secret(name, value))

    # The operator as in production: the installed control loop, the chart's RBAC, Secrets read by it.
    operator = start_operator(control_loop=None)
    document = manifest(ns, blob_container, tmp_path / "sink")
    control_plane.request("POST", CRS.format(ns=ns), document)

    store = open_store(azurite.connection_string, blob_container)
    fqns = parse_connection_string(hub.connection_string).fully_qualified_namespace.lower()
    world = World(control_plane, ns, store, Scope(fqns, HUB, "$Default"), operator)

    def produce_and_wait_for_checkpoints(first: int) -> None:
        """Ten more events to every partition; wait until their owners checkpoint the last of them."""
        produce(hub.connection_string, per_partition=10, first=first)
        eventually(
            lambda: checkpoints_at(world.snapshot(), first + 9),
            timeout=30,
            what=world.describe(f"checkpoints at sequence number {first + 9}"),
        )

    try:
        # The manifest the pods mount, as the operator wrote it; the Secrets as the pods' environment.
        runner, ranges = consumer_processes(control_plane, world, hub, azurite, tmp_path)
        with runner:
            world.runner = runner
            first = {f"{NAME}-0", f"{NAME}-1"}
            runner.wait_for_pods(first, timeout=60)

            # 1. Two consumers (minReplicas), every partition owned by exactly one, as the record says.
            status, snapshot = eventually(
                lambda: world.balanced(first), timeout=60, what=world.describe("two balanced consumers")
            )
            assert status["partitionCount"] == len(PARTITIONS)
            assert status["observedGeneration"] == world.cr()["metadata"]["generation"]
            generation = status["assignmentGeneration"]
            ready_at = time.monotonic() - started

            # 2. Events are read and checkpointed by their owners.
            produce_and_wait_for_checkpoints(first=0)

            # 3. Scale out (planned): the control loop publishes the plan for four consumers and scales the
            #    StatefulSet, KWOK runs the new pods, and each takes its planned share when it is ready.
            control_plane.request(
                "PATCH", f"{CRS.format(ns=ns)}/{NAME}", {"spec": {"scaling": {"minReplicas": 4}}}
            )
            four = {f"{NAME}-{i}" for i in range(4)}
            runner.wait_for_pods(four, timeout=60)
            status, snapshot = eventually(
                lambda: world.balanced(four), timeout=60, what=world.describe("four balanced consumers")
            )
            assert status["assignmentGeneration"] > generation
            assert status["desiredReplicas"] == 4
            statefulset = control_plane.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/{NAME}")
            assert statefulset["spec"]["replicas"] == 4
            assert snapshot.assignment is not None
            after_scale_out = dict(snapshot.assignment.partitions)
            generation = status["assignmentGeneration"]
            scaled_at = time.monotonic() - started

            # The new owners carry on from the handed-off checkpoints: nothing lost, nothing read twice.
            produce_and_wait_for_checkpoints(first=10)
            read = ranges_read(ranges)
            for partition in PARTITIONS:
                numbers = [n for first_, last in read.get(partition, []) for n in range(first_, last + 1)]
                assert sorted(numbers) == list(range(20)), (partition, read.get(partition))

            # 4. A consumer pod deleted (a `kubectl delete pod`, an eviction): its partitions move to the
            #    others while it is away and the new pod is given its share back. The nodes are cordoned
            #    meanwhile, so the new pod stays Pending while the others read the victim's partitions:
            #    events produced then are read by them, once.
            victim = f"{NAME}-3"
            held = sorted(p for p, c in after_scale_out.items() if c == victim)
            old_pid = runner.pids()[victim]
            cordon(control_plane, True)
            # KWOK removes a deleted pod at once (finalizers too), where a kubelet keeps it until its
            # container stopped: the operator sees it stopping or already gone, and either way moves its
            # partitions (a planned move, or after the holddown). The node tier sees the kubelet's way.
            pod_path = f"/api/v1/namespaces/{ns}/pods/{victim}"
            try:
                control_plane.request("DELETE", pod_path)
                deleted_at = time.monotonic()

                def taken_over() -> bool:
                    owners = world.snapshot().owners
                    others = four - {victim}
                    return old_pid not in runner.pids().values() and all(
                        owners.get(p) in others for p in held
                    )

                eventually(
                    taken_over, timeout=30, what=world.describe(f"{victim}'s partitions read by others")
                )
                away = time.monotonic() - deleted_at
                produce_and_wait_for_checkpoints(first=20)  # read by the others while the new pod waits
            finally:
                cordon(control_plane, False)
            runner.wait_for_pods(four, timeout=30)
            status, snapshot = eventually(
                lambda: world.balanced(four), timeout=60, what=world.describe("balanced after the restart")
            )
            assert status["assignmentGeneration"] > generation
            assert [e.kind for e in runner.events if e.pod == victim].count("started") == 2
            assert not [e for e in runner.events if e.kind == "exited"], runner.events
            reasons = event_reasons(control_plane, ns)
            assert "ScalingOut" in reasons, reasons
            assert operator.process.poll() is None, operator.log()
            assert "control-loop cycle failed" not in operator.log()
            read = ranges_read(ranges)
            for partition in PARTITIONS:  # nothing lost, nothing read twice, through the stop and the return
                numbers = [n for first_, last in read.get(partition, []) for n in range(first_, last + 1)]
                assert sorted(numbers) == list(range(30)), (partition, read.get(partition))

            # 5. The operator killed (SIGKILL) mid-rebalance: a scale-in to two starts the drain of two
            #    consumers; a new operator continues the published generation (no extra move), the pool
            #    ends balanced over two, and no partition ever had two readers.
            two = {f"{NAME}-0", f"{NAME}-1"}
            control_plane.request(
                "PATCH",
                f"{CRS.format(ns=ns)}/{NAME}",
                {"metadata": {"annotations": {"autoscaling.hubshift.dev/paused-replicas": "2"}}},
            )
            draining_deadline = time.monotonic() + 10
            while world.status().get("phase") != "Rebalancing" and time.monotonic() < draining_deadline:
                time.sleep(0.05)
            drain_generation = world.status().get("assignmentGeneration")
            operator.process.kill()  # SIGKILL: nothing finished, nothing closed
            operator.process.wait(timeout=10)
            operator = start_operator(control_loop=None)
            world.operator = operator
            runner.wait_for_pods(two, timeout=60)
            status, snapshot = eventually(
                lambda: world.balanced(two), timeout=90, what=world.describe("two balanced after the kill")
            )
            assert status["assignmentGeneration"] <= drain_generation + 1, "the new operator moved more"
            produce_and_wait_for_checkpoints(first=30)
            read = ranges_read(ranges)
            for partition in PARTITIONS:
                numbers = [n for first_, last in read.get(partition, []) for n in range(first_, last + 1)]
                assert sorted(set(numbers)) == list(range(40)), (partition, read.get(partition))
            assert operator.process.poll() is None, operator.log()
        print(
            f"balanced over 2 after {ready_at:.1f} s, over 4 after {scaled_at:.1f} s; "
            f"a deleted pod's partitions read by others {away:.1f} s after the deletion"
        )
    finally:
        store.close()


def revisions(plane: ControlPlane, namespace: str) -> tuple[str | None, dict[str, str]]:
    """The StatefulSet's update revision and each live pod's revision."""
    statefulset = plane.request("GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{NAME}")
    selector = ",".join(f"{k}={v}" for k, v in consumer_pod_labels(NAME).items())
    pods = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")["items"]
    live = {
        p["metadata"]["name"]: p["metadata"]["labels"].get("controller-revision-hash", "")
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }
    return (statefulset.get("status") or {}).get("updateRevision"), live


def test_the_operator_replaces_real_consumer_processes_one_at_a_time_for_a_new_image(
    control_plane: ControlPlane,
    kube_namespace: str,
    start_operator: Any,
    emulator_factory: Any,
    azurite: Any,
    blob_container: str,
    tmp_path: Path,
) -> None:
    """A new image (spec.consumer.image) on a pool of three, as `kubectl apply` or `helm upgrade` brings
    it: the StatefulSet is OnDelete, the operator surges to four, hands each old pod's share to the pod
    ready for it, evicts the old pod once it holds nothing (the chart grants pods/eviction, the PDB counts
    it), and shrinks back; every event read exactly once, at least three consumer processes throughout."""
    ns = kube_namespace
    hub = emulator_factory([f"{HUB}:{len(PARTITIONS)}"])
    for name, value in (
        ("telemetry-eventhubs", hub.connection_string),
        ("telemetry-storage", azurite.connection_string),
    ):
        control_plane.request("POST", f"/api/v1/namespaces/{ns}/secrets", secret(name, value))
    operator = start_operator(control_loop=None)
    document = manifest(ns, blob_container, tmp_path / "sink")
    document["spec"]["scaling"].update(minReplicas=3, maxReplicas=4)
    control_plane.request("POST", CRS.format(ns=ns), document)
    store = open_store(azurite.connection_string, blob_container)
    fqns = parse_connection_string(hub.connection_string).fully_qualified_namespace.lower()
    world = World(control_plane, ns, store, Scope(fqns, HUB, "$Default"), operator)
    try:
        runner, ranges = consumer_processes(
            control_plane, world, hub, azurite, tmp_path, "--stop-follow-seconds", "3"
        )
        three = {f"{NAME}-{i}" for i in range(3)}
        with runner:
            world.runner = runner
            runner.wait_for_pods(three, timeout=60)
            eventually(lambda: world.balanced(three), timeout=60, what=world.describe("three balanced"))
            produce(hub.connection_string, per_partition=10, first=0)
            before, pods = revisions(control_plane, ns)
            assert before is not None and set(pods.values()) == {before}

            started = time.monotonic()
            control_plane.request(
                "PATCH",
                f"{CRS.format(ns=ns)}/{NAME}",
                {"spec": {"consumer": {"image": "hubshift:0.1.0-new"}}},
            )
            fewest = len(three)
            produced = False

            def rolled() -> bool:
                nonlocal fewest, produced
                fewest = min(fewest, len(runner.pids()))
                if not produced and time.monotonic() - started > 3:
                    produce(hub.connection_string, per_partition=10, first=10)  # while pods are replaced
                    produced = True
                revision, pods = revisions(control_plane, ns)
                done = (
                    revision not in (None, before) and set(pods) == three and set(pods.values()) == {revision}
                )
                return done and world.balanced(three) is not None

            eventually(rolled, timeout=150, what=world.describe("every pod at the new revision, balanced"))
            took = time.monotonic() - started
            produce(hub.connection_string, per_partition=10, first=20)
            eventually(
                lambda: checkpoints_at(world.snapshot(), 29),
                timeout=30,
                what=world.describe("checkpoints at sequence number 29"),
            )
            read = ranges_read(ranges)
            for partition in PARTITIONS:
                numbers = sorted(
                    n for first_, last in read.get(partition, []) for n in range(first_, last + 1)
                )
                assert numbers == list(range(30)), (partition, read.get(partition))  # nothing read twice
            assert fewest >= len(three), f"only {fewest} consumer processes at one point"
            reasons = event_reasons(control_plane, ns)
            assert reasons.count("Replacing") == 3, reasons
            assert "RolloutStarted" in reasons and "RolloutDone" in reasons, reasons
            # No pod waited out a holddown. (A HandoffForced may come: KWOK reports a pod Ready before its
            # process runs, so a partition released to it can wait past maxHandoffSeconds to be claimed.)
            assert "Holddown" not in reasons[reasons.index("RolloutStarted") :], reasons
            assert world.status()["rollout"]["phase"] == "Done"
            replaced = [e.pod for e in runner.events if e.kind == "stopping"]
            assert sorted(replaced) == sorted([*three, f"{NAME}-3"]), runner.events  # and the surge pod
            assert operator.process.poll() is None, operator.log()
        print(f"three pods replaced in {took:.1f} s; at least {fewest} consumer processes throughout")
    finally:
        store.close()
