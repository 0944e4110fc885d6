"""What a person gets wrong when starting a consumer: one clear line, a non-zero exit, no traceback and no
secret, before anything is claimed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hubshift.emulator.launch import RunningEmulator
from tests.fixtures.consumer import consume_to_exit, consumer_environ, consumer_manifest, error_line
from tests.harness.azurite import Azurite
from tests.harness.ports import free_port

pytestmark = pytest.mark.timeout(300)
KEY = "c2VjcmV0LWtleS1mb3ItdGhlLXRlc3Q="


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return consumer_manifest(
        tmp_path / "consumer.yaml", store={"sqlite": {"path": str(tmp_path / "store.db")}}, sink=tmp_path
    )


def test_a_malformed_manifest(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: hubshift.dev/v1alpha1\nkind: PartitionedConsumer\nmetadata: {name: x}\n")
    code, stderr = consume_to_exit(path, {}, tmp_path)
    assert code != 0
    assert "spec: required field is missing" in error_line(stderr)
    path.write_text("kind: [unclosed\n")
    code, stderr = consume_to_exit(path, {}, tmp_path)
    assert code != 0 and "not valid YAML" in error_line(stderr)


def test_a_missing_connection_string(manifest: Path, tmp_path: Path) -> None:
    environ = {k: "" for k in consumer_environ("", "")}
    code, stderr = consume_to_exit(manifest, environ, tmp_path)
    assert code != 0
    assert "HUBSHIFT_EVENTHUBS_CONNECTION_STRING is not set" in error_line(stderr)


def test_bad_credentials(emulator_factory: object, manifest: Path, tmp_path: Path) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"], key=KEY)  # type: ignore[operator]
    wrong = emulator.connection_string.replace(KEY, "d3Jvbmc=")
    assert wrong != emulator.connection_string
    code, stderr = consume_to_exit(manifest, consumer_environ(wrong), tmp_path)
    line = error_line(stderr)
    assert code != 0 and "credentials were refused" in line
    assert "d3Jvbmc=" not in stderr


def test_an_unreachable_hub_and_a_missing_one(
    emulator_factory: object, manifest: Path, tmp_path: Path
) -> None:
    emulator: RunningEmulator = emulator_factory(["other:2"])  # type: ignore[operator]
    code, stderr = consume_to_exit(manifest, consumer_environ(emulator.connection_string), tmp_path)
    assert code != 0 and "does not exist" in error_line(stderr)
    closed = emulator.connection_string.replace(f":{emulator.port}", f":{free_port()}")
    code, stderr = consume_to_exit(manifest, consumer_environ(closed), tmp_path)
    assert code != 0 and "cannot connect" in error_line(stderr)


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
    code, stderr = consume_to_exit(manifest, consumer_environ(emulator.connection_string, storage), tmp_path)
    assert code != 0
    line = error_line(stderr)
    assert "AccountKey=" not in line


def test_an_unknown_log_level(manifest: Path, tmp_path: Path) -> None:
    code, stderr = consume_to_exit(manifest, {}, tmp_path, "--log-level", "nonsense")
    assert code != 0 and "--log-level 'nonsense'" in error_line(stderr)


def test_a_scratch_folder_holding_other_files_is_refused_and_left_alone(
    emulator_factory: object, manifest: Path, tmp_path: Path
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])  # type: ignore[operator]
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    environ = consumer_environ(emulator.connection_string)
    code, stderr = consume_to_exit(manifest, environ, tmp_path, scratch=precious)
    assert code != 0 and "holds files hubshift did not write" in error_line(stderr)
    assert (precious / "thesis.tex").read_text() == "years of work"
