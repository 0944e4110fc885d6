"""The residents' page and the views it reads, served on 127.0.0.1 (`hubshift views --serve PORT`).

`page/index.html` is a static page (no build step, no framework): it reads `views/index.json` and the
window files (`pipelines/aggregate_view.py` describes them) and shows one home's counts per sensor
type over the recent windows, refreshing itself. This server hands out that page and, from the sink's
store (a folder or a Blob container), only the view files: `index.json` and `window=<UTC time>.json`.
Nothing else is readable and nothing is written; it answers GET and HEAD only, on the loopback address,
from the standard library's threading server (a thread per request, each a small file).
"""

from __future__ import annotations

import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import unquote

from hubshift.sinks.base import ObjectStore
from hubshift.sinks.layout import VIEWS

HOST = "127.0.0.1"
VIEW_NAME = re.compile(r"^/views/(index\.json|window=\d{8}T\d{6}Z\.json)$")
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"
    ),
}


def page() -> bytes:
    """The residents' page, as shipped in the package."""
    return resources.files("hubshift.apps").joinpath("page/index.html").read_bytes()


class ViewsServer:
    """The page and the views of `store` on 127.0.0.1:`port` (0: a free port), in a daemon thread."""

    def __init__(self, store: ObjectStore, port: int = 0) -> None:
        html = page()

        class Handler(BaseHTTPRequestHandler):
            server_version = "hubshift-views"
            sys_version = ""

            def do_GET(self) -> None:
                self._answer(send_body=True)

            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def _answer(self, *, send_body: bool) -> None:
                path = unquote(self.path.split("?", 1)[0])
                if path in ("/", "/index.html"):
                    self._send(HTTPStatus.OK, html, "text/html; charset=utf-8", send_body)
                    return
                match = VIEW_NAME.match(path)
                if match is None:
                    self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", send_body)
                    return
                try:
                    body = store.get(f"{VIEWS}/{match.group(1)}")
                except FileNotFoundError:
                    self._send(HTTPStatus.NOT_FOUND, b"no such view yet\n", "text/plain", send_body)
                    return
                except Exception:  # the store failing: the page shows it and tries again
                    self._send(
                        HTTPStatus.SERVICE_UNAVAILABLE, b"the views cannot be read\n", "text/plain", send_body
                    )
                    return
                self._send(HTTPStatus.OK, body, "application/json", send_body)

            def _send(self, status: HTTPStatus, body: bytes, content_type: str, send_body: bool) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                for name, value in SECURITY_HEADERS.items():
                    self.send_header(name, value)
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a page refreshing every few seconds would fill the terminal

        self._server = ThreadingHTTPServer((HOST, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="views-page", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def start(self) -> ViewsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
