"""PostgreSQL from Debian's packages (tools/postgresql installs them), started for a test or a benchmark:
a fresh cluster (initdb) in a temporary folder, one server on a free 127.0.0.1 port with a password, stopped
by its own pid and removed after. As root (PostgreSQL refuses to run as root) the server runs as the
`postgres` user the package made."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.harness.ports import free_port, wait_for_port

USER = "hubshift"
DATABASE = "hubshift"
# How long a new server may take to accept its first connection (a loaded 2-core machine: a few seconds).
STARTUP_TIMEOUT = 60.0


def server_binaries() -> Path | None:
    """The folder holding initdb and postgres: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    on_path = shutil.which("initdb")
    if on_path is not None and (Path(on_path).resolve().parent / "postgres").exists():
        return Path(on_path).resolve().parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[4]))
    return found[-1].parent if found else None


def missing_reason() -> str | None:
    """Why a PostgreSQL server cannot be started here, or None."""
    if server_binaries() is None:
        return "PostgreSQL is not installed (tools/postgresql installs it from Debian)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    return None


@dataclass
class Postgres:
    port: int
    process: subprocess.Popen[bytes]
    folder: Path
    password: str = field(repr=False)

    @property
    def conninfo(self) -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown: end sessions, checkpoint, exit
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def start_postgres() -> Postgres:
    """A new server with database and user `hubshift`; raises with the server's log when it does not
    start."""
    reason = missing_reason()
    if reason is not None:
        raise RuntimeError(reason)
    binaries = server_binaries()
    assert binaries is not None
    folder = Path(tempfile.mkdtemp(prefix="hubshift-postgres-"))
    run_as: dict[str, object] = {}
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        run_as = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
    password = secrets.token_hex(12)
    password_file = folder / "password"
    password_file.write_text(password + "\n")
    if run_as:
        os.chown(password_file, int(str(run_as["user"])), int(str(run_as["group"])))
    data = folder / "data"
    subprocess.run(
        [
            str(binaries / "initdb"),
            "-D",
            str(data),
            "-U",
            USER,
            "--pwfile",
            str(password_file),
            "--auth",
            "scram-sha-256",
            "-E",
            "UTF8",
            "--locale",
            "C",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        cwd=folder,
        **run_as,  # type: ignore[arg-type]
    )
    password_file.unlink()
    port = free_port()
    log = (folder / "server.log").open("wb")
    process = subprocess.Popen(
        [
            str(binaries / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(folder),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "shared_buffers=64MB",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=folder,
        **run_as,  # type: ignore[arg-type]
    )
    server = Postgres(port, process, folder, password)
    try:
        connection = first_connection(server, f"postgresql://{USER}:{password}@127.0.0.1:{port}/postgres")
    except BaseException:
        server.stop()
        raise
    with connection:
        connection.execute(f"CREATE DATABASE {DATABASE}")
    return server


def first_connection(
    server: Postgres, conninfo: str, timeout: float = STARTUP_TIMEOUT
) -> psycopg.Connection[tuple[object, ...]]:
    """The first connection that PostgreSQL accepts, retried until `timeout`: the port opens before the
    server accepts sessions (on a busy machine it answered `FATAL: the database system is starting up`
    for a while after). Raises with the server's log when it exits or the time is up."""
    deadline = time.monotonic() + timeout
    if not wait_for_port(server.port, timeout):
        raise RuntimeError(f"PostgreSQL did not open its port in {timeout:.0f} s:\n{server.log()[-2000:]}")
    while True:
        try:
            return psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as error:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"PostgreSQL exited ({server.process.returncode}) while starting:\n{server.log()[-2000:]}"
                ) from error
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"PostgreSQL accepted no connection in {timeout:.0f} s ({error}):\n{server.log()[-2000:]}"
                ) from error
            time.sleep(0.1)
