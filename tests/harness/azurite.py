"""Azurite, Microsoft's open-source Blob storage emulator, from npm: installed once into a cache outside
the repository (keyed by version) and started on a free 127.0.0.1 port with a fresh data folder; with
`tls`, over HTTPS, and with `oauth`, accepting Microsoft Entra ID bearer tokens (`--oauth basic`: issuer,
audience and lifetime checked, not the signature)."""

from __future__ import annotations

import fcntl
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.harness.ports import free_port, wait_for_port

AZURITE_VERSION = "3.37.0"
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, the same on every machine).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def cache_root() -> Path:
    return Path(os.environ.get("HUBSHIFT_CACHE", Path.home() / ".cache" / "hubshift"))


def azurite_binary() -> Path:
    """The `azurite-blob` launcher, installing Azurite from npm on first use."""
    prefix = cache_root() / f"azurite-{AZURITE_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "azurite-blob"
    if binary.exists():
        return binary
    prefix.mkdir(parents=True, exist_ok=True)
    with (prefix / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError("npm is needed to install Azurite (the Blob storage emulator)")
            subprocess.run(
                [
                    npm,
                    "install",
                    "--prefix",
                    str(prefix),
                    f"azurite@{AZURITE_VERSION}",
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
    return binary


def connection_string(port: int, host: str = "127.0.0.1", scheme: str = "http") -> str:
    return (
        f"DefaultEndpointsProtocol={scheme};"
        f"AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint={scheme}://{host}:{port}/{ACCOUNT};"
    )


@dataclass
class Azurite:
    port: int
    process: subprocess.Popen[bytes]
    data_dir: Path
    scheme: str = "http"
    host: str = "127.0.0.1"
    access_log: Path | None = None  # one line per request (`requests_in` counts them)

    @property
    def connection_string(self) -> str:
        return connection_string(self.port, self.host, self.scheme)

    @property
    def account_url(self) -> str:
        """The account's Blob endpoint, for a token credential (HTTPS only: a bearer token needs TLS)."""
        return f"{self.scheme}://{self.host}:{self.port}/{ACCOUNT}"

    @contextmanager
    def unreachable(self) -> Iterator[None]:
        """Azurite frozen (SIGSTOP): connections open but nothing answers, like a store that went away;
        it answers again (SIGCONT) when the block ends, whatever happens inside."""
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_azurite(
    data_dir: Path | None = None,
    attempts: int = 3,
    port: int | None = None,
    host: str = "127.0.0.1",
    wrapper: Sequence[str] = (),
    *,
    tls: tuple[Path, Path] | None = None,
    oauth: bool = False,
    access_log: Path | None = None,
) -> Azurite:
    """Azurite on a free port (or `port`: a restart where clients expect it), its data in `data_dir`. It
    listens on `host` (the address its connection string names), under `wrapper` (a command that execs
    it, e.g. `ip netns exec NS` to serve inside a network namespace). `tls`: (certificate, key) PEM files
    to serve HTTPS with; `oauth`: accept bearer tokens (needs `tls`); `access_log`: the file Azurite's
    access log goes to (a line per request, appended), else none is written."""
    binary = azurite_binary()
    secure: list[str] = []
    if tls is not None:
        secure += ["--cert", str(tls[0]), "--key", str(tls[1])]
    if oauth:
        secure += ["--oauth", "basic"]
    data = data_dir or Path(tempfile.mkdtemp(prefix="hubshift-azurite-"))
    last_error = ""
    for attempt in range(attempts if port is None else attempts * 3):
        if port is not None and attempt:
            time.sleep(1)  # the old process's port may take a moment to come free
        port_now = free_port() if port is None else port
        output = access_log.open("ab") if access_log is not None else subprocess.DEVNULL
        process = subprocess.Popen(
            [
                *wrapper,
                str(binary),
                "--blobHost",
                host,
                "--blobPort",
                str(port_now),
                "--location",
                str(data),
                *(["--silent"] if access_log is None else []),
                "--skipApiVersionCheck",
                "--loose",
                "--disableProductStyleUrl",
                *secure,
            ],
            stdout=output,
            stderr=subprocess.PIPE,
        )
        if not isinstance(output, int):
            output.close()  # the process has its own
        if wait_for_port(port_now, timeout=30, host=host):
            scheme = "https" if tls else "http"
            return Azurite(port_now, process, data, scheme, host, access_log)
        process.kill()
        _, err = process.communicate(timeout=10)
        last_error = err.decode(errors="replace")[-500:]
    raise RuntimeError(f"Azurite did not start: {last_error}")


# 127.0.0.1 - - [27/Nov/2026:12:25:36 +0000] "PUT /devstoreaccount1/box/ns/hub/cg/ownership/0 HTTP/1.1" 201 -
_ACCESS_LINE = re.compile(r'\[([^\]]+)\] "[A-Z]+ /[^/ ?]+/([^/ ?]+)[/ ?]')


def requests_in(access_log: Path, container: str, since: float, until: float) -> int:
    """The requests to `container` in Azurite's access log between `since` and `until` (epoch seconds; the
    log's times are whole seconds, so the seconds `since` and `until` fall in count whole)."""
    first, last = math.floor(since), math.floor(until)
    count = 0
    with access_log.open(errors="replace") as lines:
        for line in lines:
            found = _ACCESS_LINE.search(line)
            if found is None or found.group(2) != container:
                continue
            at = datetime.strptime(found.group(1), "%d/%b/%Y:%H:%M:%S %z").timestamp()
            count += first <= at <= last
    return count


@contextmanager
def running_azurite(
    data_dir: Path | None = None, *, tls: tuple[Path, Path] | None = None, oauth: bool = False
) -> Iterator[Azurite]:
    server = start_azurite(data_dir, tls=tls, oauth=oauth)
    try:
        yield server
    finally:
        server.stop()
