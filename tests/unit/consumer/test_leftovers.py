"""A consumer killed outright leaves its Spark JVM running: the next run of the same consumer ends that very
process before it empties the scratch folder, and nothing else (a pid reused by another process)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hubshift.consumer import leftovers
from hubshift.consumer.app import Scratch


def test_the_next_run_ends_the_jvm_its_previous_run_left_and_only_that(tmp_path: Path) -> None:
    scratch = Scratch.claim(tmp_path / "scratch")
    left = subprocess.Popen(["sleep", "300"])  # the JVM of a consumer that was killed -9
    other = subprocess.Popen(["sleep", "300"])
    try:
        leftovers.record(scratch.path, left.pid)
        Scratch.claim(scratch.path)  # the consumer's next run
        assert left.wait(timeout=10) == -9
        # A record whose process is gone and whose pid now names another process: left alone.
        (scratch.path / leftovers.RECORD).write_text(f"{other.pid} 1\n")
        assert not leftovers.end_previous(scratch.path)
        assert other.poll() is None
    finally:
        for process in (left, other):
            process.kill()
            process.wait()
