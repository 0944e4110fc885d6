"""The operator's `/metrics` over a real socket on 127.0.0.1 (`OperatorMetrics.serve`, aiohttp in the
background): the exposition as a scraper asks for it, nothing but `/metrics`, a taken port refused with the
system's reason, and the port free again once closed."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
from collections.abc import Iterator

import pytest

from hubshift.operator.metrics import OperatorMetrics
from hubshift.webserver import BackgroundServer


def ask(
    port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


@pytest.fixture
def metrics_server() -> Iterator[BackgroundServer]:
    metrics = OperatorMetrics()
    metrics.initialise("team", "homes")
    metrics.current_replicas.labels("team", "homes").set(3)
    server = metrics.serve(0, address="127.0.0.1")
    yield server
    server.close()


def test_a_scrape_gets_the_exposition_the_scraper_asks_for(metrics_server: BackgroundServer) -> None:
    server = metrics_server
    status, headers, body = ask(server.port, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b'hubshift_current_replicas{consumer="homes",namespace="team"} 3.0' in body
    openmetrics = {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"}
    status, headers, body = ask(server.port, "/metrics", headers=openmetrics)
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body).endswith(b"# EOF\n")
    status, headers, body = ask(server.port, "/metrics", "HEAD")
    assert status == 200 and int(headers["Content-Length"]) > 0 and body == b""


def test_nothing_but_metrics_is_served(metrics_server: BackgroundServer) -> None:
    server = metrics_server
    assert ask(server.port, "/")[0] == 404
    assert ask(server.port, "/metrics/../etc/passwd")[0] == 404
    status, headers, _ = ask(server.port, "/metrics", "POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_a_taken_port_is_refused_with_the_systems_reason_and_a_closed_server_frees_its_port() -> None:
    metrics = OperatorMetrics()
    first = metrics.serve(0, address="127.0.0.1")
    port = first.port
    with pytest.raises(OSError) as refused:
        metrics.serve(port, address="127.0.0.1")
    assert refused.value.strerror == "Address already in use"
    first.close()
    with socket.create_server(("127.0.0.1", port)):
        pass  # bindable again
    again = metrics.serve(port, address="127.0.0.1")
    try:
        assert ask(port, "/metrics")[0] == 200
    finally:
        again.close()
    assert not [t for t in threading.enumerate() if t.name == "hubshift-metrics"]
