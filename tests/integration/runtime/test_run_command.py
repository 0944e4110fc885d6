"""`hubshift run -f MANIFEST` as a user runs it: errors a person can act on, and a run whose phase and
assignment `hubshift status` shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from hubshift.emulator.launch import RunningEmulator
from hubshift.spec import DEFAULT_EVENTHUBS_ENV
from tests.fixtures.runtime import start_run

HUBSHIFT = [sys.executable, "-m", "hubshift.cli"]


def write_manifest(path: Path, store: Path, replicas: int = 2) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "hubshift.dev/v1alpha1",
                "kind": "PartitionedConsumer",
                "metadata": {"name": "homes"},
                "spec": {
                    "eventHubs": {"hub": "hub"},
                    "checkpointStore": {"sqlite": {"path": str(store)}},
                    "consumer": {"sink": {"type": "folder", "folder": {"path": str(path.parent / "out")}}},
                    "scaling": {
                        "minReplicas": replicas,
                        "maxReplicas": replicas,
                        "pollingIntervalSeconds": 1,
                    },
                    "rebalance": {"delaySeconds": 1, "maxHandoffSeconds": 5},
                },
            }
        )
    )
    return path


@pytest.mark.timeout(60)
def test_a_missing_connection_string_is_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "m.yaml", tmp_path / "store.db")
    env = {k: v for k, v in os.environ.items() if k != DEFAULT_EVENTHUBS_ENV}
    result = subprocess.run(
        [*HUBSHIFT, "run", "-f", str(manifest), "--engine", "sdk"],
        capture_output=True,
        text=True,
        env=env,
        timeout=50,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert DEFAULT_EVENTHUBS_ENV in result.stderr and "Traceback" not in result.stderr


@pytest.mark.timeout(60)
def test_an_unwritable_workdir_is_one_line(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "m.yaml", tmp_path / "store.db")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = subprocess.run(
        [*HUBSHIFT, "run", "-f", str(manifest), "--engine", "sdk", "--workdir", str(blocker / "work")],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith(f"hubshift: error: --workdir {blocker / 'work'}")


def assigned(workdir: Path) -> set[str]:
    try:
        status = json.loads((workdir / "status.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return set()
    return {a["consumer"] for a in status.get("assignment", [])} if status.get("phase") == "Ready" else set()


def wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.mark.timeout(150)
def test_run_applies_a_changed_manifest_and_shows_phase_and_assignment_through_status(
    tmp_path: Path, emulator_factory: object
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:4"])  # type: ignore[operator]
    manifest = write_manifest(tmp_path / "m.yaml", tmp_path / "store.db", replicas=1)
    env = dict(os.environ, **{DEFAULT_EVENTHUBS_ENV: emulator.connection_string})
    workdir = tmp_path / "work"
    run = start_run(manifest, workdir, env, 40, tmp_path)
    try:
        wait_for(lambda: assigned(workdir) == {"homes-0"}, 30)
        write_manifest(manifest, tmp_path / "store.db", replicas=2)  # as `kubectl apply` of a new version
        wait_for(lambda: assigned(workdir) == {"homes-0", "homes-1"}, 30)
        _, stderr = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr[-2000:]
    assert emulator.connection_string.split("SharedAccessKey=")[1] not in stderr, "no secret in the log"
    status = json.loads((workdir / "status.json").read_text())
    assert status["status"]["phase"] == "Ready"
    assert {a["consumer"] for a in status["status"]["assignment"]} == {"homes-0", "homes-1"}
    shown = subprocess.run(
        [
            *HUBSHIFT,
            "status",
            "--store",
            f"sqlite:///{tmp_path / 'store.db'}",
            "--namespace",
            f"127.0.0.1:{emulator.port}",
            "--hub",
            "hub",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    document = json.loads(shown.stdout)
    assert document["phase"] == "Ready"
    assert set(document["assignment"].values()) == {"homes-0", "homes-1"}
