"""The residents' page and the views it reads, served on 127.0.0.1 (`hubshift views --serve PORT`).

`page/index.html` is a static page (no build step, no framework): it reads `views/index.json` and the
window files (`pipelines/aggregate_view.py` describes them) and shows one home's counts per sensor
type over the recent windows, refreshing itself. This server hands out that page and, from the sink's
store (a folder or a Blob container), only the view files: `index.json` and `window=<UTC time>.json`.
Nothing else is readable and nothing is written; it answers GET and HEAD only, on the loopback address,
from an aiohttp server in the background (`hubshift.webserver`; each store read in a worker thread).
"""

from __future__ import annotations

import asyncio
import re
from http import HTTPStatus
from importlib import resources

from aiohttp import web

from hubshift.sinks.base import ObjectStore
from hubshift.sinks.layout import VIEWS
from hubshift.webserver import BackgroundServer

LOOPBACK = "127.0.0.1"
VIEW_NAME = re.compile(r"^/views/(index\.json|window=\d{8}T\d{6}Z\.json)$")
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"
    ),
}
SERVER_NAME = "hubshift-views"
METHODS = ("GET", "HEAD")
HTML_TYPE = "text/html; charset=utf-8"
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain"


def page() -> bytes:
    """The residents' page, as shipped in the package."""
    return resources.files("hubshift.apps").joinpath("page/index.html").read_bytes()


class ViewsServer:
    """The page and the views of `store` on 127.0.0.1:`port` (0: a free port), in the background."""

    def __init__(self, store: ObjectStore, port: int = 0) -> None:
        self.store = store
        self.html = page()
        self._server = BackgroundServer(self._answer, host=LOOPBACK, port=port, name="views-page")

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> ViewsServer:
        self._server.start()
        return self

    def close(self) -> None:
        self._server.close()

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in METHODS:
            refused = _response(HTTPStatus.METHOD_NOT_ALLOWED, b"method not allowed\n", TEXT_TYPE)
            refused.headers["Allow"] = ", ".join(METHODS)
            return refused
        path = request.path
        if path in ("/", "/index.html"):
            return _response(HTTPStatus.OK, self.html, HTML_TYPE)
        match = VIEW_NAME.match(path)
        if match is None:
            return _response(HTTPStatus.NOT_FOUND, b"not found\n", TEXT_TYPE)
        try:
            body = await asyncio.to_thread(self.store.get, f"{VIEWS}/{match.group(1)}")
        except FileNotFoundError:
            return _response(HTTPStatus.NOT_FOUND, b"no such view yet\n", TEXT_TYPE)
        except Exception:  # the store failing: the page shows it and tries again
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, b"the views cannot be read\n", TEXT_TYPE)
        return _response(HTTPStatus.OK, body, JSON_TYPE)


def _response(status: HTTPStatus, body: bytes, content_type: str) -> web.Response:
    """An answer as the page expects it: never cached, with the security headers."""
    headers = {
        "Content-Type": content_type,
        "Cache-Control": "no-store",
        "Server": SERVER_NAME,
        **SECURITY_HEADERS,
    }
    return web.Response(status=status, body=body, headers=headers)
