"""Microsoft Entra ID instead of keys, proven through azure-identity's own code on 127.0.0.1: a managed
identity endpoint (the App Service protocol azure-identity's `ManagedIdentityCredential` speaks) signs
JWTs; the emulator speaks AMQP over TLS and checks them on `$cbs`; Azurite over HTTPS checks them on every
Blob request. Nothing in hubshift knows it is a test: the spec names a credential, azure-identity gets and
refreshes the tokens, the SDKs send them.

The pool test runs `hubshift run --engine sdk` with tokens that expire every 45 s: the consumers read,
checkpoint and hand a partition off, their tokens are renewed on the open links without losing an event,
and when the identity starts getting tokens Event Hubs refuses, the status says what to fix. No token
appears in any log line, status, Event or error.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.azure_storage import BlobContainer
from hubshift.connections import open_checkpoint_store
from hubshift.errors import UserError
from hubshift.eventhubs.management import EventHubsProbe, ProbeError
from hubshift.eventhubs.target import EventHubsTarget, sdk_client
from hubshift.identity import IdentityCredential
from hubshift.sinks.blob import BlobStore
from hubshift.spec import CheckpointStoreSpec
from tests.fixtures.consumer import wait_for
from tests.fixtures.identity import MANAGED_IDENTITY, Entra
from tests.fixtures.runtime import start_run
from tests.harness.identity import EVENTHUBS_RESOURCE, STORAGE_RESOURCE, secrets_in
from tests.harness.ranges import count_replays, read_range_logs

HUBSHIFT = [sys.executable, "-m", "hubshift.cli"]


def hub(entra: Entra) -> EventHubsTarget:
    return EventHubsTarget(None, entra.namespace, "hub", "$Default", MANAGED_IDENTITY)


def token_container(entra: Entra, name: str) -> BlobContainer:
    return BlobContainer(
        name, account_url=entra.azurite.account_url, token=IdentityCredential(MANAGED_IDENTITY)
    )


def store_spec(entra: Entra, container: str) -> dict[str, Any]:
    return {
        "blob": {
            "container": container,
            "accountUrl": entra.azurite.account_url,
            "credential": {"type": "managedIdentity"},
        }
    }


def keyless_manifest(path: Path, entra: Entra, container: str, replicas: int) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "hubshift.dev/v1alpha1",
                "kind": "PartitionedConsumer",
                "metadata": {"name": "homes"},
                "spec": {
                    "eventHubs": {
                        "namespace": entra.namespace,
                        "hub": "hub",
                        "credential": {"type": "managedIdentity"},
                    },
                    "checkpointStore": store_spec(entra, container),
                    "consumer": {
                        "sink": {"type": "folder", "folder": {"path": str(path.parent / "out")}},
                        "checkpoint": {"everySeconds": 2, "everyEvents": 100},
                    },
                    "scaling": {
                        "minReplicas": replicas,
                        "maxReplicas": replicas,
                        "pollingIntervalSeconds": 2,
                    },
                    "rebalance": {"delaySeconds": 1, "maxHandoffSeconds": 10, "leaseDurationSeconds": 15},
                },
            }
        )
    )
    return path


def run_cli(entra: Entra, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HUBSHIFT, *args],
        env={**os.environ, **entra.environ},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hubshift: error: "), stderr
    return lines[0]


# --- the SDK over TLS with a token; plain AMQP beside it ------------------------------------------------


@pytest.mark.timeout(120)
def test_the_sdk_sends_and_receives_over_tls_with_a_managed_identity_token(entra: Entra) -> None:
    from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient

    producer = sdk_client(EventHubProducerClient, hub(entra))
    with producer:
        assert sorted(producer.get_partition_ids()) == ["0", "1", "2", "3"]
        producer.send_batch([EventData(f"token-{i}") for i in range(3)], partition_id="1")
    # The same hub over plain AMQP with the development connection string (SAS) keeps working.
    plain = EventHubProducerClient.from_connection_string(
        entra.emulator.connection_string, eventhub_name="hub"
    )
    with plain:
        plain.send_batch([EventData("plain")], partition_id="1")
    received: list[bytes] = []
    consumer = sdk_client(EventHubConsumerClient, hub(entra), consumer_group="$Default")

    def on_event(_context: Any, event: Any) -> None:
        received.append(b"".join(event.body))
        if len(received) == 4:
            consumer.close()

    with consumer:
        consumer.receive(on_event, partition_id="1", starting_position="-1", max_wait_time=20)
    assert received == [b"token-0", b"token-1", b"token-2", b"plain"]
    assert {issued.resource for issued in entra.endpoint.issued} == {EVENTHUBS_RESOURCE}
    assert "refused" not in entra.emulator.log()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "service_says"),
    [
        ("wrong-key", "InvalidSignature: The token has an invalid signature."),
        ("expired", "ExpiredToken: The token is expired."),
    ],
)
def test_a_wrong_or_expired_token_is_refused_with_the_services_error(
    entra: Entra, mode: str, service_says: str
) -> None:
    entra.endpoint.mode = mode

    async def read() -> str:
        probe = EventHubsProbe(hub(entra), request_timeout=30)
        try:
            await probe.partitions()
        except ProbeError as refused:
            return str(refused)
        finally:
            await probe.close()
        raise AssertionError("the hub was read with a bad token")

    message = asyncio.run(read())
    assert message.startswith(f"Event Hubs namespace {entra.namespace}, hub 'hub': the token of credential ")
    assert service_says in message, message
    assert "Azure Event Hubs Data Receiver" in message and "\n" not in message
    assert not secrets_in(message, entra.endpoint.tokens())
    assert service_says.split(":")[0] in entra.emulator.log()  # the emulator refused it on $cbs


# --- Blob: the checkpoint store and the sink on Azurite over HTTPS -------------------------------------


@pytest.mark.timeout(120)
def test_the_checkpoint_store_and_the_blob_sink_with_a_token(entra: Entra, tmp_path: Path) -> None:
    spec = CheckpointStoreSpec.model_validate(store_spec(entra, "tokens-store"))
    store = open_checkpoint_store(spec, {})
    try:
        assert store.create("scope/checkpoint/0", {"offset": "-1"})
        store.acquire_lease("scope/checkpoint/0", "11111111-1111-1111-1111-111111111111", -1)
        assert [entry.name for entry in store.list("scope/")] == ["scope/checkpoint/0"]
    finally:
        store.close()
    sink = BlobStore(token_container(entra, "tokens-sink"), "out")
    sink.ensure()
    sink.put("a/b.json", b"{}")
    assert (sink.get("a/b.json"), sink.list("a/")) == (b"{}", ["a/b.json"])
    assert {issued.resource for issued in entra.endpoint.issued} == {STORAGE_RESOURCE}

    entra.endpoint.mode = "expired"
    from hubshift import identity

    identity._CREDENTIALS.clear()  # a new process: no token cached
    with pytest.raises(UserError) as refused:
        open_checkpoint_store(spec, {})
    message = str(refused.value)
    assert (
        "refused the credentials (AuthenticationFailed: Lifetime validation failed. The token is expired.)"
        in (message)
    )
    assert "Storage Blob Data Contributor" in message and "\n" not in message
    assert not secrets_in(message, entra.endpoint.tokens())


# --- start-up with a token that is refused: one line that says what to fix -----------------------------


@pytest.mark.timeout(200)
def test_a_refused_token_at_start_up_is_one_line(entra: Entra, tmp_path: Path) -> None:
    manifest = keyless_manifest(tmp_path / "homes.yaml", entra, "tokens-startup", replicas=1)
    open_checkpoint_store(CheckpointStoreSpec.model_validate(store_spec(entra, "tokens-startup")), {}).close()
    entra.endpoint.mode = "wrong-key"  # Azurite checks no signature, Event Hubs does
    consume = run_cli(
        entra,
        "consume",
        "-f",
        str(manifest),
        "--id",
        "c0",
        "--engine",
        "sdk",
        "--scratch",
        str(tmp_path / "s"),
    )
    assert consume.returncode != 0
    line = one_error_line(consume.stderr)
    assert "the token of credential managedIdentity was refused: InvalidSignature" in line, line
    status = run_cli(
        entra,
        "status",
        "--store",
        entra.azurite.account_url,
        "--container",
        "tokens-startup",
        "--namespace",
        entra.namespace,
        "--hub",
        "hub",
        "--credential",
        "managedIdentity",
    )
    assert "InvalidSignature" in one_error_line(status.stderr)
    entra.endpoint.mode = "expired"  # now both refuse; the store is opened first
    consume = run_cli(
        entra,
        "consume",
        "-f",
        str(manifest),
        "--id",
        "c0",
        "--engine",
        "sdk",
        "--scratch",
        str(tmp_path / "s"),
    )
    line = one_error_line(consume.stderr)
    assert "The token is expired" in line and "credential managedIdentity" in line, line
    produce = run_cli(
        entra,
        "produce",
        "--hub",
        "hub",
        "--namespace",
        entra.namespace,
        "--credential",
        "managedIdentity",
        "--count",
        "1",
    )
    assert "ExpiredToken" in one_error_line(produce.stderr)
    everything = consume.stderr + status.stderr + produce.stderr
    assert not secrets_in(everything, entra.endpoint.tokens())


# --- a pool end to end: read, checkpoint, hand off; tokens renewed; a refused one reported ---------------


def assigned(workdir: Path) -> set[str]:
    try:
        status = json.loads((workdir / "status.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return set()
    return {a["consumer"] for a in status.get("assignment", [])} if status.get("phase") == "Ready" else set()


def ready_condition(workdir: Path) -> dict[str, Any]:
    try:
        conditions = json.loads((workdir / "status.json").read_text())["status"].get("conditions", [])
    except (OSError, ValueError, KeyError):
        return {}
    return next((c for c in conditions if c.get("type") == "Ready"), {})


def status_message(workdir: Path) -> str:
    try:
        return (workdir / "status.json").read_text()
    except OSError:
        return ""


def eventually(condition: Callable[[], object], timeout: float, what: str, log: Callable[[], str]) -> None:
    wait_for(condition, timeout, what, on_timeout=log)


@pytest.mark.timeout(420)
def test_a_token_credential_pool_reads_checkpoints_hands_off_and_renews_its_tokens(
    entra: Entra, tmp_path: Path
) -> None:
    entra.endpoint.lifetime = 45  # every token expires mid-run: refreshed on the open links, or they fail
    manifest = keyless_manifest(tmp_path / "homes.yaml", entra, "tokens-pool", replicas=1)
    workdir = tmp_path / "work"
    env = {**os.environ, **entra.environ}
    run = start_run(manifest, workdir, env, 240, tmp_path)

    def logs() -> str:
        consumer_logs = "".join(
            p.read_text(errors="replace") for p in sorted((workdir / "logs").glob("*.log"))
        )
        return consumer_logs + entra.emulator.log()[-3000:]

    produce: subprocess.Popen[str] | None = None
    try:
        eventually(lambda: assigned(workdir) == {"homes-0"}, 90, "homes-0 reading", logs)
        produce = subprocess.Popen(
            [
                *HUBSHIFT,
                "produce",
                "--hub",
                "hub",
                "--namespace",
                entra.namespace,
                "--credential",
                "managedIdentity",
                "--rate",
                "20",
                "--duration",
                "110",
                "--output",
                "json",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(50)  # past the first tokens' expiry
        keyless_manifest(manifest, entra, "tokens-pool", replicas=2)  # as `kubectl apply`: a handoff
        eventually(
            lambda: assigned(workdir) == {"homes-0", "homes-1"}, 90, "two consumers after a handoff", logs
        )
        produced_out, produced_err = produce.communicate(timeout=150)
        assert produce.returncode == 0, produced_err
        produced = json.loads(produced_out)
        total = produced["events"]
        assert total > 1500

        def read_all() -> bool:
            distinct, _ = count_replays(read_range_logs(tmp_path / "out" / "ranges"))
            return distinct == total

        eventually(read_all, 60, f"all {total} events read", logs)

        # The checkpoints, as `hubshift status` reads them with a token from the store and the hub.
        shown = run_cli(
            entra,
            "status",
            "--store",
            entra.azurite.account_url,
            "--container",
            "tokens-pool",
            "--namespace",
            entra.namespace,
            "--hub",
            "hub",
            "--credential",
            "managedIdentity",
            "--output",
            "json",
        )
        assert shown.returncode == 0, shown.stderr
        document = json.loads(shown.stdout)
        assert {row["owner"] for row in document["partitions"]} == {"homes-0", "homes-1"}
        assert sum(row["backlog"] for row in document["partitions"]) < 200

        emulator_log = entra.emulator.log()  # before the refusals below detach the links
        # The identity now gets tokens Event Hubs refuses: the status says what to fix.
        entra.endpoint.mode = "wrong-key"
        eventually(
            lambda: "InvalidSignature" in status_message(workdir), 120, "the refusal in status.json", logs
        )
        # Then no token at all (the identity's roles and assignment gone): once the cached ones expire the
        # store refuses the control loop too, and the status stops saying the pool is Ready.
        entra.endpoint.mode = "refuse"
        eventually(lambda: ready_condition(workdir).get("status") == "False", 150, "Ready False", logs)
        assert "no token from credential" in ready_condition(workdir).get("message", "")
    finally:
        if produce is not None and produce.poll() is None:
            produce.kill()
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
        _, run_stderr = run.communicate(timeout=120)

    distinct, replayed = count_replays(read_range_logs(tmp_path / "out" / "ranges"))
    assert (distinct, replayed) == (total, 0), "every event read once: a graceful handoff replays nothing"
    status = json.loads((workdir / "status.json").read_text())["status"]
    refusal = next(c for c in status["conditions"] if "InvalidSignature" in c.get("message", ""))
    assert "the token of credential managedIdentity was refused" in refusal["message"]
    assert "Azure Event Hubs Data Receiver" in refusal["message"]

    lines = emulator_log.lower().splitlines()
    renewed = [line for line in lines if "/consumergroups/" in line and "renewed" in line]
    assert renewed, "the consumers' tokens were renewed on their open connections"
    expired = [line for line in lines if "/consumergroups/" in line and "expired" in line]
    assert not expired, "no receiving link outlived its token"
    issued = entra.endpoint.issued_for(EVENTHUBS_RESOURCE)
    assert max(i.at for i in issued) - min(i.at for i in issued) > 90, "tokens were issued all run long"

    # No token in any log line, status, Event or error.
    everything = [
        run_stderr,
        logs(),
        entra.emulator.log(),
        (workdir / "status.json").read_text(),
        *(p.read_text(errors="replace") for p in workdir.glob("*.log")),
        produced_err,
    ]
    leaked = secrets_in("\n".join(everything), entra.endpoint.tokens())
    assert not leaked, leaked


@pytest.mark.timeout(120)
def test_views_reads_a_blob_sink_with_the_command_lines_credential(entra: Entra, tmp_path: Path) -> None:
    """A manifest written for connection strings, its sink on an account URL: `--credential` reaches the one
    connection `hubshift views` opens (the sink), whatever the rest of the manifest names."""
    path = tmp_path / "views.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "hubshift.dev/v1alpha1",
                "kind": "PartitionedConsumer",
                "metadata": {"name": "homes"},
                "spec": {
                    "eventHubs": {"hub": "hub", "connectionStringEnv": "UNSET_EVENTHUBS"},
                    "checkpointStore": {"sqlite": {"path": str(tmp_path / "store.db")}},
                    "consumer": {
                        "sink": {
                            "type": "blob",
                            "blob": {
                                "container": "views-sink",
                                "accountUrl": entra.azurite.account_url,
                                "connectionStringEnv": "UNSET_SINK",
                            },
                        }
                    },
                },
            }
        )
    )
    without = run_cli(entra, "views", "-f", str(path))
    assert without.returncode != 0 and "UNSET_SINK is not set" in without.stderr
    done = run_cli(entra, "views", "-f", str(path), "--credential", "managedIdentity")
    assert done.returncode == 0, done.stderr
    store = BlobStore(token_container(entra, "views-sink"))
    assert "views/index.json" in store.list("views/")
