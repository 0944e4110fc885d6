"""What a person gets wrong when starting a consumer: one clear line, a non-zero exit, no traceback and no
secret, before anything is claimed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hubshift.testing.azurite import Azurite
from hubshift.testing.emulator import RunningEmulator
from hubshift.testing.ports import free_port
from tests.fixtures.consumer import consumer_environ, consumer_manifest

pytestmark = pytest.mark.timeout(300)
OPTIONS = ("--http-port", "0")
KEY = "c2VjcmV0LWtleS1mb3ItdGhlLXRlc3Q="


def consume(manifest: Path, environ: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    command = [sys.executable, "-m", "hubshift.cli", "consume", "-f", str(manifest), "--id", "c0"]
    result = subprocess.run(
        [*command, *OPTIONS, "--scratch", str(tmp_path / "scratch")],
        env={**os.environ, **environ},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, result.stderr


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("hubshift: error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return consumer_manifest(
        tmp_path / "consumer.yaml", store={"sqlite": {"path": str(tmp_path / "store.db")}}, sink=tmp_path
    )


def test_a_malformed_manifest(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: hubshift.dev/v1alpha1\nkind: PartitionedConsumer\nmetadata: {name: x}\n")
    code, stderr = consume(path, {}, tmp_path)
    assert code != 0
    assert "spec: required field is missing" in one_line(stderr)
    path.write_text("kind: [unclosed\n")
    code, stderr = consume(path, {}, tmp_path)
    assert code != 0 and "not valid YAML" in one_line(stderr)


def test_a_missing_connection_string(manifest: Path, tmp_path: Path) -> None:
    environ = {k: "" for k in consumer_environ("", "")}
    code, stderr = consume(manifest, environ, tmp_path)
    assert code != 0
    assert "HUBSHIFT_EVENTHUBS_CONNECTION_STRING is not set" in one_line(stderr)


def test_bad_credentials(emulator_factory: object, manifest: Path, tmp_path: Path) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"], key=KEY)  # type: ignore[operator]
    wrong = emulator.connection_string.replace(KEY, "d3Jvbmc=")
    assert wrong != emulator.connection_string
    code, stderr = consume(manifest, consumer_environ(wrong), tmp_path)
    line = one_line(stderr)
    assert code != 0 and "credentials were refused" in line
    assert "d3Jvbmc=" not in stderr


def test_an_unreachable_hub_and_a_missing_one(
    emulator_factory: object, manifest: Path, tmp_path: Path
) -> None:
    emulator: RunningEmulator = emulator_factory(["other:2"])  # type: ignore[operator]
    code, stderr = consume(manifest, consumer_environ(emulator.connection_string), tmp_path)
    assert code != 0 and "does not exist" in one_line(stderr)
    closed = emulator.connection_string.replace(f":{emulator.port}", f":{free_port()}")
    code, stderr = consume(manifest, consumer_environ(closed), tmp_path)
    assert code != 0 and "cannot connect" in one_line(stderr)


def test_bad_store_credentials(
    emulator_factory: object, azurite: Azurite, blob_container: str, tmp_path: Path
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    manifest = consumer_manifest(
        tmp_path / "consumer.yaml", store={"blob": {"container": blob_container}}, sink=tmp_path
    )
    storage = azurite.connection_string.replace(
        azurite.connection_string.split("AccountKey=")[1][:8], "AAAAAAAA"
    )
    code, stderr = consume(manifest, consumer_environ(emulator.connection_string, storage), tmp_path)
    assert code != 0
    line = one_line(stderr)
    assert "AccountKey=" not in line
