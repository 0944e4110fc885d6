"""The hubshift emulator (a local Event Hubs) for tests, benchmarks and the demo: the one way to start it.

    with running_emulator(hubs=["telemetry:8"], consumer_groups=["spark"]) as hub_server:
        EventHubProducerClient.from_connection_string(hub_server.connection_string, eventhub_name="telemetry")

By default it is a subprocess (`python -m hubshift.cli emulator --port 0 ...`), so its CPU can be measured
and it can be killed; `in_process=True` runs it on a background thread of this process instead.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, TypedDict, Unpack

P = ParamSpec("P")
ENDPOINT_PREFIX = "Endpoint="


@dataclass
class RunningEmulator:
    connection_string: str
    port: int
    process: subprocess.Popen[bytes] | None = None
    data_dir: Path | None = None
    log_path: Path | None = None
    _thread: object | None = field(default=None, repr=False)
    # with TLS: `host:port`, the fully qualified namespace a token credential connects to
    tls_namespace: str | None = None

    @property
    def pid(self) -> int:
        """The emulator's process id (this process when it runs in-process)."""
        return self.process.pid if self.process is not None else os.getpid()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout: float = 10) -> None:
        """Graceful stop (SIGTERM: connections dropped, the event store closed)."""
        if self._thread is not None:
            from hubshift.emulator.server import EmulatorThread  # lazy: a child process loads no server here

            assert isinstance(self._thread, EmulatorThread)
            self._thread.stop(timeout)
            return
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """Abrupt stop (SIGKILL), as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


class ServerOptions(TypedDict, total=False):
    """What the emulator serves, the same for a subprocess and an in-process server (each unset one: the
    emulator's default)."""

    consumer_groups: Sequence[str]
    data_dir: Path | None
    retention_minutes: float | None
    partition_size_mb: int | None
    key: str | None
    config_file: Path | None
    tls: tuple[Path, Path] | None  # (certificate, key) PEM files
    jwt_keys: Path | None
    jwt_issuers: Sequence[str]


def emulator_command(
    hubs: Sequence[str] = ("hub:4",),
    *,
    host: str | None = None,
    port: int = 0,
    extra_args: Sequence[str] = (),
    **options: Unpack[ServerOptions],
) -> list[str]:
    command = [sys.executable, "-m", "hubshift.cli", "emulator", "--port", str(port)]
    if host is not None:
        command += ["--host", host]
    tls = options.get("tls")
    if tls is not None:
        command += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1]), "--tls-port", "0"]
    jwt_keys = options.get("jwt_keys")
    if jwt_keys is not None:
        command += ["--jwt-key", str(jwt_keys)]
    for issuer in options.get("jwt_issuers", ()):
        command += ["--jwt-issuer", issuer]
    for hub in hubs:
        command += ["--hub", hub]
    for group in options.get("consumer_groups", ()):
        command += ["--consumer-group", group]
    valued = (
        ("--data-dir", options.get("data_dir")),
        ("--retention-minutes", options.get("retention_minutes")),
        ("--partition-size-mb", options.get("partition_size_mb")),
        ("--key", options.get("key")),
        ("--config", options.get("config_file")),
    )
    for flag, value in valued:
        if value is not None:
            command += [flag, str(value)]
    command += list(extra_args)
    return command


def start_emulator(
    hubs: Sequence[str] = ("hub:4",),
    *,
    extra_args: Sequence[str] = (),
    in_process: bool = False,
    startup_timeout: float = 30,
    host: str | None = None,
    wrapper: Sequence[str] = (),
    **options: Unpack[ServerOptions],
) -> RunningEmulator:
    """Start an emulator on a free port with these hubs (`NAME:PARTITIONS`); returns once it accepts
    connections. `host`: the address it listens on and its connection string names (default 127.0.0.1);
    `wrapper`: a command it runs under, which must exec it (e.g. `ip netns exec NS`, to serve inside a
    network namespace). `options` (`ServerOptions`): consumer groups, a data folder, retention, a key, a
    config file; `tls`: (certificate, key) PEM files for a TLS listener on another free port; `jwt_keys`,
    `jwt_issuers`: the keys Entra ID tokens are verified with, and the issuers accepted."""
    if in_process:
        if host is not None or wrapper:
            raise ValueError("an in-process emulator listens on 127.0.0.1 of this process's network")
        return _start_in_process(hubs, options)
    command = emulator_command(hubs, host=host, extra_args=extra_args, **options)
    tls = options.get("tls")
    with tempfile.NamedTemporaryFile(prefix="hubshift-emulator-", suffix=".log", delete=False) as log_file:
        log_path = Path(log_file.name)
        process = subprocess.Popen(
            [*wrapper, *command], stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL
        )
    assert process.stdout is not None
    lines = _read_lines(process.stdout, 2 if tls is not None else 1, startup_timeout)
    line = lines[0]
    if not line.startswith(ENDPOINT_PREFIX) or len(lines) < (2 if tls is not None else 1):
        process.kill()
        process.wait(timeout=10)
        raise RuntimeError(
            f"the emulator did not start ({' '.join(command[2:])}): "
            f"{(line + ' ' + log_path.read_text(errors='replace')).strip()[-2000:]}"
        )
    port = int(line.split(";")[0].rsplit(":", 1)[1])
    tls_namespace = lines[1].rsplit(" ", 1)[-1] if tls is not None else None
    return RunningEmulator(
        line, port, process, options.get("data_dir"), log_path, tls_namespace=tls_namespace
    )


def _read_lines(stream: object, count: int, timeout: float) -> list[str]:
    """The first `count` stdout lines (fewer, the first "", when the process exits or the timeout passes
    first)."""
    assert hasattr(stream, "fileno")
    deadline = time.monotonic() + timeout
    collected = b""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while collected.count(b"\n") < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                break
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                break
            collected += chunk
    lines = [line.strip() for line in collected.decode(errors="replace").split("\n")[:count]]
    return [line for line in lines if line] or [""]


def _start_in_process(hubs: Sequence[str], options: ServerOptions) -> RunningEmulator:
    from hubshift.emulator.config import EmulatorSettings, build_hubs  # lazy: only for an in-process server
    from hubshift.emulator.server import EmulatorThread  # lazy: only for an in-process server

    defaults = EmulatorSettings()
    retention_minutes = options.get("retention_minutes")
    partition_size_mb = options.get("partition_size_mb")
    tls = options.get("tls")
    data_dir = options.get("data_dir")
    settings = EmulatorSettings(
        port=0,
        hubs=build_hubs(list(hubs), list(options.get("consumer_groups", ())), options.get("config_file")),
        data_dir=data_dir,
        retention_minutes=retention_minutes if retention_minutes is not None else defaults.retention_minutes,
        partition_max_bytes=(partition_size_mb << 20) if partition_size_mb else defaults.partition_max_bytes,
        key=options.get("key"),
        tls_cert=tls[0] if tls is not None else None,
        tls_key=tls[1] if tls is not None else None,
        tls_port=0,
        jwt_keys=options.get("jwt_keys"),
        jwt_issuers=tuple(options.get("jwt_issuers", ())),
    )
    thread = EmulatorThread(settings)
    thread.start()
    return RunningEmulator(
        thread.connection_string,
        thread.port,
        None,
        data_dir,
        None,
        thread,
        tls_namespace=thread.tls_namespace,
    )


def _stopping_on_exit(
    start: Callable[P, RunningEmulator],
) -> Callable[P, AbstractContextManager[RunningEmulator]]:
    @contextmanager
    def started(*args: P.args, **kwargs: P.kwargs) -> Iterator[RunningEmulator]:
        server = start(*args, **kwargs)
        try:
            yield server
        finally:
            server.stop()

    return started


running_emulator = _stopping_on_exit(start_emulator)
"""`start_emulator` as a context manager that stops the emulator on exit."""
