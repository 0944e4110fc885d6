"""The residents' page in a real browser: `hubshift views --serve` on 127.0.0.1 over a sink holding the
aggregate's committed counts, and Debian's Chromium, headless, driven over the Chrome DevTools protocol.
The page loads, shows the totals the views hold for the chosen home, and updates by itself when a new
window is committed; a screenshot of each state is kept (HUBSHIFT_SCREENSHOTS=FOLDER keeps a copy there).
Skips, saying why, without Chromium (tools/observability installs it)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks import FolderStore
from tests.harness.aggregates import write_batch
from tests.harness.ports import free_port, wait_for_port
from tests.harness.processes import end

HUBSHIFT = [sys.executable, "-m", "hubshift.cli"]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1100,900",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]
READ_PAGE = """JSON.stringify({
  home: document.body.dataset.home,
  windows: Number(document.body.dataset.windows || 0),
  error: document.getElementById("error").textContent,
  totals: Object.fromEntries([...document.querySelectorAll("[data-total]")]
    .map((e) => [e.dataset.total, Number(e.textContent)])),
})"""


class Browser:
    """One page of a headless Chromium, over the DevTools protocol (a websocket on 127.0.0.1)."""

    def __init__(self, binary: str, profile: Path, url: str) -> None:
        import websocket

        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            assert self.process.poll() is None, "chromium exited"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            pages = [t for t in json.loads(response.read()) if t["type"] == "page"]
        self.socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        self.socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == number:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    def read(self) -> dict[str, Any]:
        """What the page shows now; empty while it is still loading (the expression then throws)."""
        result = self.call("Runtime.evaluate", expression=READ_PAGE, returnByValue=True)["result"]
        if "value" not in result:
            return {}
        document: dict[str, Any] = json.loads(result["value"])
        return document

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        keep = os.environ.get("HUBSHIFT_SCREENSHOTS")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(keep) / path.name)
        return path

    def close(self) -> None:
        try:
            self.socket.close()
        finally:
            end(self.process, grace=10)


@pytest.fixture
def views_server(tmp_path: Path) -> Iterator[tuple[FolderStore, int]]:
    """`hubshift views --serve` over a folder sink, projecting every second; ended by its pid after."""
    sink = tmp_path / "sink"
    manifest = tmp_path / "homes.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "hubshift.dev/v1alpha1",
                "kind": "PartitionedConsumer",
                "metadata": {"name": "homes"},
                "spec": {
                    "eventHubs": {"hub": "homes"},
                    "checkpointStore": {"sqlite": {"path": str(tmp_path / "store.db")}},
                    "consumer": {"sink": {"type": "folder", "folder": {"path": str(sink)}}},
                },
            }
        )
    )
    port = free_port()
    process = subprocess.Popen(
        [*HUBSHIFT, "views", "-f", str(manifest), "--serve", str(port), "--every", "1", "--duration", "240"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for_port(port, 60), "hubshift views --serve did not listen"
        yield FolderStore(sink), port
    finally:
        end(process, signal.SIGINT, grace=15)


def wait_until(browser: Browser, wanted: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = browser.read()
        if all(seen.get(k) == v for k, v in wanted.items()):
            return seen
        time.sleep(0.3)
    raise AssertionError(f"the page shows {seen}, not {wanted}")


def totals_of(store: FolderStore, home: str) -> dict[str, int]:
    """What the views hold for `home` over every window, per sensor type and in all."""
    view = AggregateView(store)
    view.refresh()
    totals: dict[str, int] = {}
    for (_, home_id, kind), count in view.counts().items():
        if home_id == home:
            totals[kind] = totals.get(kind, 0) + count.count
    totals["all"] = sum(totals.values())
    return totals


def test_the_page_shows_a_homes_totals_and_updates_when_a_window_arrives(
    tmp_path: Path, chromium: str, views_server: tuple[FolderStore, int]
) -> None:
    store, port = views_server
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=4)
    windows = [start + timedelta(minutes=i) for i in range(4)]
    rows = [
        (windows[0], "h000042", "motion", "0", 6),
        (windows[0], "h000042", "door", "0", 2),
        (windows[1], "h000042", "motion", "0", 3),
        (windows[1], "h000007", "smoke", "1", 1),
        (windows[2], "h000042", "window", "0", 4),
        (windows[2], "h000042", "door", "0", 1),
    ]
    write_batch(store, "homes-0-1", [("0", 0, 15), ("1", 0, 0)], rows)
    expected = totals_of(store, "h000042")
    assert expected == {"motion": 9, "door": 3, "window": 4, "all": 16}

    browser = Browser(chromium, tmp_path / "profile", f"http://127.0.0.1:{port}/?home=h000042&refresh=1")
    try:
        shown = wait_until(browser, {"home": "h000042", "windows": 3, "totals": expected})
        assert shown["error"] == ""
        first = browser.screenshot(tmp_path / "residents-page-1.png")

        # a new window is committed: the page shows it without being reloaded
        write_batch(store, "homes-0-2", [("0", 16, 20)], [(windows[3], "h000042", "motion", "0", 5)], at=1)
        expected = totals_of(store, "h000042")
        assert expected == {"motion": 14, "door": 3, "window": 4, "all": 21}
        wait_until(browser, {"home": "h000042", "windows": 4, "totals": expected})
        second = browser.screenshot(tmp_path / "residents-page-2.png")
    finally:
        browser.close()
    assert first.stat().st_size > 10_000 and second.stat().st_size > 10_000


def test_the_server_hands_out_the_page_and_the_views_only(views_server: tuple[FolderStore, int]) -> None:
    store, port = views_server
    write_batch(
        store, "homes-0-1", [("0", 0, 0)], [(datetime(2026, 1, 1, tzinfo=UTC), "h1", "motion", "0", 1)]
    )
    base = f"http://127.0.0.1:{port}"

    def get(path: str) -> tuple[int, bytes, str]:
        try:
            with urllib.request.urlopen(base + path, timeout=10) as response:
                return response.status, response.read(), response.headers["Content-Type"]
        except urllib.error.HTTPError as error:
            return error.code, b"", ""

    status, body, kind = get("/")
    assert status == 200 and b"views/index.json" in body and kind.startswith("text/html")
    deadline = time.monotonic() + 15
    while True:  # the next projection pass (every second) lists the window
        status, body, kind = get("/views/index.json")
        if status == 200 and json.loads(body)["windows"]:
            break
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.3)
    assert kind == "application/json"
    window = json.loads(body)["windows"][0]["file"]
    assert json.loads(get(f"/views/{window}")[1])["homes"] == {"h1": {"motion": 1}}
    for path in (
        "/views/../homes.yaml",
        "/commits/",
        "/views/index.json.bak",
        "/etc/passwd",
        "/views/%2e%2e/x",
    ):
        assert get(path)[0] == 404, path
