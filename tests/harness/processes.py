"""Ending a process a test started: by its own pid, gently first (`signal`), then SIGKILL."""

from __future__ import annotations

import signal as signals
import subprocess
from typing import Any


def end(process: subprocess.Popen[Any], signal: int = signals.SIGTERM, grace: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(signal)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
