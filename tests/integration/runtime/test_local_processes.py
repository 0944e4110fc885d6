"""The local runtime's process supervision, with stand-in consumers (a tiny HTTP server each): it starts the
missing ordinals, restarts a crashed one like a StatefulSet, keeps a held one down, stops the highest
ordinals with SIGTERM on scale-in, and stops everything by PID at the end."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hubshift.manifest import parse_manifest
from hubshift.operator.local.processes import LocalRuntime

STAND_IN = """
import http.server, signal, sys, threading
port = int(sys.argv[sys.argv.index("--http-port") + 1])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ready")
    def log_message(self, *args): pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
server.serve_forever()
"""


class StandInRuntime(LocalRuntime):
    def command(self, name: str, port: int) -> list[str]:
        return [sys.executable, "-c", STAND_IN, "--id", name, "--http-port", str(port)]


def runtime(tmp_path: Path) -> StandInRuntime:
    consumer = parse_manifest(
        {
            "apiVersion": "hubshift.dev/v1alpha1",
            "kind": "PartitionedConsumer",
            "metadata": {"name": "homes"},
            "spec": {"eventHubs": {"hub": "hub"}, "checkpointStore": {"sqlite": {"path": "x.db"}}},
        }
    )
    return StandInRuntime(tmp_path / "m.yaml", consumer, tmp_path / "work")


async def until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def wait_ready(pool: StandInRuntime, expected: list[str], timeout: float = 20) -> None:
    """Until exactly `expected` (in ordinal order) are ready."""
    deadline = time.monotonic() + timeout
    while (names := [c.name for c in await pool.consumers() if c.ready]) != expected:
        assert time.monotonic() < deadline, f"{names} != {expected}"
        await asyncio.sleep(0.1)


@pytest.mark.timeout(60)
async def test_start_restart_hold_scale_in_and_stop(tmp_path: Path) -> None:
    pool = runtime(tmp_path)
    changes: list[float] = []
    pool.on_change = lambda: changes.append(time.monotonic())
    pool.start_supervising()
    try:
        await pool.set_replicas(3)
        await wait_ready(pool, ["homes-0", "homes-1", "homes-2"])
        instances = await pool.consumers()
        assert all(i.address and i.address.startswith("127.0.0.1:") for i in instances)
        assert len({i.address for i in instances}) == 3, "each consumer has its own port"

        first_pid = pool.processes[1].pid
        pool.kill(1)  # a crash: restarted with the same identity
        await until(lambda: 1 in pool.processes and pool.processes[1].pid != first_pid, 10)
        await wait_ready(pool, ["homes-0", "homes-1", "homes-2"])
        assert ("homes-1", -9) in pool.exits

        pool.kill(2, restart=False)  # lost for good: not started again while held
        await asyncio.sleep(2.5)
        assert 2 not in pool.processes
        pool.release(2)
        await wait_ready(pool, ["homes-0", "homes-1", "homes-2"])

        await pool.set_replicas(1)  # scale-in: SIGTERM to the highest ordinals, which exit 0
        await wait_ready(pool, ["homes-0"])
        await until(lambda: set(pool.processes) == {0}, 10)
        assert sorted(pool.exits[-2:]) == [("homes-1", 0), ("homes-2", 0)], "both stopped ones exit 0"
        assert changes, "exits and readiness changes wake the control loop"
    finally:
        pids = [p.pid for p in pool.processes.values()]
        await pool.stop_all(grace=5)
    assert not pool.processes
    for pid in pids:
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        )
