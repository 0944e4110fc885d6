"""The local runtime: the control loop's consumers as processes on this machine (`hubshift run`, the demo).

`LocalRuntime` is a `ConsumerRuntime` in which replica `i` is the process
`hubshift consume -f MANIFEST --id <name>-<i> --http-port P` (the StatefulSet's pod naming, so the
rebalance machine's ordinals work unchanged), with its own HTTP port on 127.0.0.1 for `/readyz`,
`/metrics` and the nudge. Like a StatefulSet it starts the missing ordinals below the replica count,
restarts a process that died (after a short back-off), and on scale-in sends SIGTERM to the highest
ordinals, which hand their partitions off and exit. Each process runs in its own session, so a Ctrl-C in
the terminal reaches only `hubshift run`, which then stops them in order.

Status goes to `<workdir>/status.json`, Events to `<workdir>/events.log`; `hubshift status` reads the
assignment record from the store. Every consumer's `/metrics` is listed in `<workdir>/prometheus-targets.json`
(Prometheus's file_sd format, with the labels the chart's PodMonitor gives a pod: `namespace`, `consumer`,
`pod`), so a local Prometheus scrapes the pool as it changes. `runner.LocalOperator` runs the control loop
over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TypedDict, Unpack

from hubshift.manifest import PartitionedConsumer
from hubshift.operator.consumer_http import consumer_ready
from hubshift.operator.rebalance import consumer_name
from hubshift.operator.runtime import ConsumerInstance

log = logging.getLogger(__name__)

READINESS_POLL_SECONDS = 0.25
# A ready consumer that stops answering its readiness probe (a busy machine: its HTTP thread waits for the
# interpreter) is taken for not ready only after this long without an answer, as a pod's readiness probe
# fails only after its failureThreshold: one late answer is no change of the pool. A consumer that answers
# "not ready" (it is stopping) is taken at its word at once.
UNANSWERED_SECONDS = 5.0
RESTART_BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0)
EVENTS_KEPT = 50
TARGETS_FILE = "prometheus-targets.json"


def readiness(ready: bool, answer: bool | None, unanswered_since: float | None, now: float) -> bool:
    """A consumer's readiness after a probe: its answer, or, when it did not answer, what it was until it
    has not answered for `UNANSWERED_SECONDS`."""
    if answer is not None:
        return answer
    return ready and (unanswered_since is None or now - unanswered_since < UNANSWERED_SECONDS)


@dataclass
class ConsumerProcess:
    """One consumer process (a pod's counterpart)."""

    name: str
    ordinal: int
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float
    ready: bool = False
    terminating: bool = False
    log_file: IO[bytes] | None = field(default=None, repr=False)
    unanswered_since: float | None = None  # readiness probes left unanswered since then

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def instance(self) -> ConsumerInstance:
        return ConsumerInstance(self.name, self.ordinal, self.ready, self.address, self.terminating)


@dataclass(frozen=True)
class RecordedEvent:
    at: float
    reason: str
    message: str
    warning: bool


class ProcessOptions(TypedDict, total=False):
    """How the consumer processes are started: `engine` (spark or sdk, default spark), the environment they
    get (`environ`, default this process's) and more arguments for `hubshift consume` (`extra_args`)."""

    engine: str
    environ: Mapping[str, str] | None
    extra_args: tuple[str, ...]


class LocalRuntime:
    """`ConsumerRuntime` over local `hubshift consume` processes."""

    def __init__(
        self,
        manifest_path: Path,
        consumer: PartitionedConsumer,
        workdir: Path,
        *,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        **processes: Unpack[ProcessOptions],
    ) -> None:
        self.manifest_path = manifest_path.resolve()
        self.consumer = consumer
        self.name = consumer.metadata.name
        self.workdir = workdir
        self.engine = processes.get("engine", "spark")
        environ = processes.get("environ")
        self.environ = dict(environ if environ is not None else os.environ)
        self.extra_args = processes.get("extra_args", ())
        self.on_change = on_change
        self.clock = clock
        self.replica_count = 0
        self.processes: dict[int, ConsumerProcess] = {}
        self.events: deque[RecordedEvent] = deque(maxlen=EVENTS_KEPT)
        self.status: dict[str, object] = {}
        self.held: set[int] = set()  # ordinals not restarted (a consumer that does not come back)
        self.exits: list[tuple[str, int | None]] = []  # (name, exit code) of every process that ended
        self._restarts: dict[int, tuple[int, float]] = {}  # ordinal -> (failures in a row, not before)
        self._stopping = False
        self._supervisor: asyncio.Task[None] | None = None
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    # --- ConsumerRuntime -------------------------------------------------------------------------

    async def consumers(self) -> list[ConsumerInstance]:
        return [p.instance() for _, p in sorted(self.processes.items())]

    async def replicas(self) -> int:
        return self.replica_count

    async def set_replicas(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"replica count must be >= 0, not {count}")
        if count != self.replica_count:
            log.info("%s: replicas %d -> %d", self.name, self.replica_count, count)
        self.replica_count = count
        self._reconcile()

    async def revision(self) -> str | None:
        return None  # processes are not versioned: a changed manifest applies to the ones started next

    async def replace_consumer(self, name: str) -> bool:
        running = next((p for p in self.processes.values() if p.name == name), None)
        if running is not None and not running.terminating:
            self.terminate(running)  # it is started again at its ordinal once it has exited
        return True

    async def record_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        event = RecordedEvent(self.clock(), reason, message, warning)
        self.events.append(event)
        (log.warning if warning else log.info)("%s: %s: %s", self.name, reason, message)
        line = json.dumps({"at": _iso(event.at), "reason": reason, "message": message, "warning": warning})
        with (self.workdir / "events.log").open("a") as handle:
            handle.write(line + "\n")

    async def publish_status(self, status: dict[str, object]) -> None:
        self.status = status
        document = {
            "name": self.name,
            "updatedAt": _iso(self.clock()),
            "status": status,
            "consumers": [
                {
                    "name": p.name,
                    "pid": p.pid,
                    "address": p.address,
                    "ready": p.ready,
                    "stopping": p.terminating,
                }
                for _, p in sorted(self.processes.items())
            ],
        }
        _write_atomically(self.workdir / "status.json", json.dumps(document, indent=1))
        self.write_targets()

    def write_targets(self) -> None:
        """The consumers' `/metrics` for Prometheus (file_sd), labelled as in a cluster."""
        namespace = self.consumer.metadata.namespace
        targets = [
            {
                "targets": [p.address],
                "labels": {"namespace": namespace, "consumer": self.name, "pod": p.name},
            }
            for _, p in sorted(self.processes.items())
            if not p.terminating
        ]
        _write_atomically(self.workdir / TARGETS_FILE, json.dumps(targets, indent=1))

    # --- processes -------------------------------------------------------------------------------

    def start_supervising(self) -> None:
        if self._supervisor is None:
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="supervisor")

    def command(self, name: str, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "hubshift.cli",
            "consume",
            "-f",
            str(self.manifest_path),
            "--id",
            name,
            "--engine",
            self.engine,
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(port),
            "--scratch",
            str(self.workdir / "scratch" / name),
            *self.extra_args,
        ]

    def _start(self, ordinal: int) -> ConsumerProcess:
        name = consumer_name(self.name, ordinal)  # the StatefulSet's naming, which planned changes rely on
        port = free_port()
        log_path = self.workdir / "logs" / f"{name}.log"
        log_file = log_path.open("ab")
        process = subprocess.Popen(
            self.command(name, port),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=self.environ,
            start_new_session=True,  # a terminal's Ctrl-C goes to `hubshift run` only
        )
        started = ConsumerProcess(name, ordinal, port, process, log_path, self.clock(), log_file=log_file)
        self.processes[ordinal] = started
        log.info("%s: started %s (pid %d, port %d)", self.name, name, process.pid, port)
        return started

    def _reconcile(self) -> None:
        """Start missing ordinals below the replica count; ask the ones at or above it to stop."""
        if self._stopping:
            return
        now = self.clock()
        for ordinal in range(self.replica_count):
            if ordinal in self.processes or ordinal in self.held:
                continue
            _, not_before = self._restarts.get(ordinal, (0, 0.0))
            if now >= not_before:
                self._start(ordinal)
        for ordinal, running in self.processes.items():
            if ordinal >= self.replica_count and not running.terminating:
                self.terminate(running)

    def terminate(self, running: ConsumerProcess) -> None:
        """SIGTERM: the consumer hands its partitions off and exits."""
        running.terminating = True
        running.ready = False
        with contextlib.suppress(ProcessLookupError):
            running.process.send_signal(signal.SIGTERM)
        self.on_change()

    def kill(self, ordinal: int, *, restart: bool = True) -> int:
        """SIGKILL (a crash). With `restart=False` the ordinal is not started again until `release`."""
        running = self.processes[ordinal]
        if not restart:
            self.held.add(ordinal)
        running.process.kill()
        return running.pid

    def release(self, ordinal: int) -> None:
        """Let a held ordinal start again."""
        self.held.discard(ordinal)
        self._restarts.pop(ordinal, None)
        self._reconcile()

    async def _supervise(self) -> None:
        while True:
            changed = self._reap()
            changed |= await self._poll_readiness()
            self._reconcile()
            if changed:
                self.on_change()
            await asyncio.sleep(READINESS_POLL_SECONDS)

    def _reap(self) -> bool:
        changed = False
        for ordinal, running in list(self.processes.items()):
            code = running.process.poll()
            if code is None:
                continue
            changed = True
            del self.processes[ordinal]
            if running.log_file is not None:
                running.log_file.close()
            self.exits.append((running.name, code))
            if running.terminating and code == 0:
                log.info("%s: %s stopped after handing off", self.name, running.name)
                self._restarts.pop(ordinal, None)
                continue
            failures, _ = self._restarts.get(ordinal, (0, 0.0))
            delay = RESTART_BACKOFF_SECONDS[min(failures, len(RESTART_BACKOFF_SECONDS) - 1)]
            if self.clock() - running.started_at > 60:
                failures, delay = 0, RESTART_BACKOFF_SECONDS[0]
            self._restarts[ordinal] = (failures + 1, self.clock() + delay)
            restarting = ordinal not in self.held and ordinal < self.replica_count
            log.warning(
                "%s: %s exited with %s%s (log: %s)",
                self.name,
                running.name,
                code,
                f"; restarting in {delay:g}s" if restarting else "",
                running.log_path,
            )
        return changed

    async def _poll_readiness(self) -> bool:
        running = [p for p in self.processes.values() if not p.terminating]
        results = await asyncio.gather(*(consumer_ready(p.address) for p in running))
        changed = False
        now = self.clock()
        for process, answer in zip(running, results, strict=True):
            ready = readiness(process.ready, answer, process.unanswered_since, now)
            process.unanswered_since = None if answer is not None else (process.unanswered_since or now)
            if process.ready != ready and not process.terminating:
                process.ready = ready
                changed = True
        return changed

    async def stop_all(self, grace: float) -> None:
        """Stop every consumer: SIGTERM (graceful handoff), then SIGKILL whatever outlives `grace`."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None
        for running in self.processes.values():
            if running.process.poll() is None and not running.terminating:
                running.terminating = True
                with contextlib.suppress(ProcessLookupError):
                    running.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(p.process.poll() is None for p in self.processes.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for running in self.processes.values():
            if running.process.poll() is None:
                log.warning("%s: %s did not stop within %gs: killing it", self.name, running.name, grace)
                running.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.process.wait(timeout=10)
            if running.log_file is not None:
                running.log_file.close()
        self.processes.clear()


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=UTC).isoformat(timespec="seconds")
