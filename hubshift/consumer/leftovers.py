"""What a consumer killed outright (SIGKILL, an OOM kill) can leave running on a machine: its Spark driver's
JVM. PySpark's JVM ends when its Python driver's pipe closes, but a JVM that outlived its driver was seen
still running its query's tasks, logging shuffle files missing after the consumer's next run emptied the
same scratch folder. So each run records its JVM (`record`), and the next run of the same consumer, before
it empties the scratch folder, ends the one it finds still running (`end_previous`): only that process,
identified by its pid and its start time (a pid reused by something else is left alone). In a pod this
never happens: the container's processes end with it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

RECORD = "driver-jvm"


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22); None if it is gone (or
    a zombie, dead and waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def record(scratch: Path, pid: int) -> None:
    """Remember this run's JVM (its pid and start time) in the scratch folder."""
    started = _started(pid)
    if started is not None:
        (scratch / RECORD).write_text(f"{pid} {started}\n")


def end_previous(scratch: Path, wait: float = 10.0) -> bool:
    """End the JVM a previous run of this consumer recorded, if that very process still runs (SIGKILL: its
    driver is gone, nothing of it is worth keeping). True when one was ended."""
    try:
        pid_text, started = (scratch / RECORD).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return False
    if pid == os.getpid() or _started(pid) != started:
        return False
    log.warning("the Spark JVM of this consumer's previous run (pid %d) still runs: ending it", pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + wait
    while _started(pid) == started and time.monotonic() < deadline:
        time.sleep(0.05)
    return True
