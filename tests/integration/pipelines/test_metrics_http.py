"""The consumer's HTTP server on 127.0.0.1: /metrics, /healthz, /readyz and the assignment nudge."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from hubshift.consumer.http import ConsumerHTTPServer
from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.errors import UserError


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def post(url: str, body: bytes = b"") -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_endpoints() -> None:
    metrics = ConsumerMetrics("homes-0", hub="homes", consumer_group="$Default")
    metrics.partition_acquired("3")
    metrics.events.labels(*metrics.hub_labels, "3").inc(42)
    ready = threading.Event()
    nudges: list[int | None] = []
    server = ConsumerHTTPServer(metrics, ready=ready.is_set, on_assignment=nudges.append)
    with server:
        base = server.url
        assert base.startswith("http://127.0.0.1:")
        status, content_type, text = get(f"{base}/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert (
            'hubshift_consumer_events_total{consumer_group="$Default",hub="homes",partition="3"} 42.0' in text
        )
        assert "hubshift_consumer_owned_partitions 1.0" in text
        status, content_type, text = get(f"{base}/metrics", {"Accept": "application/openmetrics-text"})
        assert content_type.startswith("application/openmetrics-text") and text.endswith("# EOF\n")

        assert get(f"{base}/healthz")[0] == 200
        assert get(f"{base}/readyz")[:3:2] == (503, "not ready\n")
        ready.set()
        assert get(f"{base}/readyz")[:3:2] == (200, "ready\n")
        assert get(f"{base}/nope")[0] == 404

        assert post(f"{base}/assignment") == (202, '{"accepted":true}\n')
        assert post(f"{base}/assignment", b'{"generation": 7}')[0] == 202
        assert post(f"{base}/assignment", b"{not json")[0] == 400
        assert post(f"{base}/assignment", b'{"generation": "7"}')[0] == 400
        assert post(f"{base}/assignment", b"x" * 5000)[0] == 413
        assert post(f"{base}/elsewhere")[0] == 404
        assert post(f"{base}/metrics")[0] == 405
        assert nudges == [None, 7]
        assert "hubshift_consumer_nudges_total 2.0" in get(f"{base}/metrics")[2]  # the refused ones: not
    with pytest.raises(RuntimeError):
        server.port  # noqa: B018


def test_failing_probes_and_callbacks_answer_errors() -> None:
    def broken() -> bool:
        raise RuntimeError("agent gone")

    def broken_nudge(generation: int | None) -> None:
        raise RuntimeError("queue closed")

    with ConsumerHTTPServer(
        ConsumerMetrics("c"), live=broken, ready=broken, on_assignment=broken_nudge
    ) as server:
        assert get(f"{server.url}/healthz")[0] == 503
        assert get(f"{server.url}/readyz")[0] == 503
        assert post(f"{server.url}/assignment")[0] == 500
    with ConsumerHTTPServer(ConsumerMetrics("c")) as server:
        assert post(f"{server.url}/assignment")[0] == 501


def test_a_port_in_use_is_one_line() -> None:
    with ConsumerHTTPServer(ConsumerMetrics("a")) as first:
        clash = ConsumerHTTPServer(ConsumerMetrics("b"), port=first.port)
        with pytest.raises(UserError, match=f"metrics port {first.port} on 127.0.0.1"):
            clash.start()


def test_metrics_after_a_batch_are_scraped_as_json_friendly_numbers() -> None:
    metrics = ConsumerMetrics("c", process_metrics=False)
    with ConsumerHTTPServer(metrics) as server:
        text = get(f"{server.url}/metrics")[2]
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    assert all(name.startswith("hubshift_consumer_") for name in names)
    assert json.dumps(sorted(names))


def raw_exchange(
    port: int, request: bytes, send_more: bytes = b"", timeout: float = 5.0
) -> tuple[str, float]:
    """Send `request` (then `send_more`) on one socket; (the status line, seconds until the server answered
    and closed)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        if send_more:
            try:
                sock.sendall(send_more)
            except OSError:
                pass  # the server stopped reading and closed: what it should do
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:
            # The server closed with the client's bytes unread (what it should do with a hostile body), so
            # the kernel answered them with a reset, which may overtake the status line on a busy machine.
            if not answer:
                return RESET, time.monotonic() - started
    return answer.split(b"\r\n", 1)[0].decode(), time.monotonic() - started


RESET = "connection reset before the answer was read"


def refused(status: str, expected: str) -> bool:
    """The server answered `expected`, or closed without reading the body (a reset overtook the answer)."""
    return status.endswith(expected) or status == RESET


def test_hostile_bodies_are_refused_without_being_read() -> None:
    nudges: list[int | None] = []
    with ConsumerHTTPServer(ConsumerMetrics("c"), on_assignment=nudges.append) as server:
        head = b"POST /assignment HTTP/1.1\r\nHost: x\r\n"
        # Content-Length -1 once made the server read until the client closed (10 MiB answered 202).
        status, took = raw_exchange(server.port, head + b"Content-Length: -1\r\n\r\n", b"x" * (10 << 20))
        assert refused(status, "400 Bad Request") and took < 3
        status, took = raw_exchange(server.port, head + b"Content-Length: 10485760\r\n\r\n", b"x" * 65536)
        assert refused(status, "413 Request Entity Too Large") and took < 3
        chunked = head + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        assert raw_exchange(server.port, chunked)[0].endswith("411 Length Required")
        assert raw_exchange(server.port, head + b"Content-Length: 12abc\r\n\r\n")[0].endswith(
            "400 Bad Request"
        )
    assert nudges == []


def test_oversized_headers_are_refused_in_one_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="hubshift.consumer.http")
    with ConsumerHTTPServer(ConsumerMetrics("c")) as server:
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        many = b"".join(b"X-%d: y\r\n" % i for i in range(40))
        assert raw_exchange(server.port, head + many + b"\r\n")[0].endswith("400 Bad Request")
        long = b"X-Long: " + b"y" * 5000 + b"\r\n"
        assert raw_exchange(server.port, head + long + b"\r\n")[0].endswith("400 Bad Request")
        enough = head + many[: many.index(b"X-20:")] + b"Connection: close\r\n\r\n"
        assert raw_exchange(server.port, enough)[0].endswith("200 OK")
    # A client's mistake: no ERROR with a traceback and the client's bytes, one DEBUG line each.
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name.endswith(".requests")] == [
        ("DEBUG", "refused a malformed request: BadHttpMessage"),
        ("DEBUG", "refused a malformed request: LineTooLong"),
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def test_idle_and_trickling_connections_are_closed_at_the_deadline() -> None:
    with ConsumerHTTPServer(ConsumerMetrics("c"), deadline=1.0) as server:
        started = time.monotonic()
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        trickling = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        kept_alive = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        trickling.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        kept_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept_alive.recv(4096).startswith(b"HTTP/1.1 200 OK")
        with idle, trickling, kept_alive:
            for _ in range(15):  # bytes trickling in do not push the deadline back
                time.sleep(0.2)
                try:
                    trickling.sendall(b"a")
                except OSError:
                    break
            assert idle.recv(4096) == b""  # closed, nothing answered
            assert trickling.recv(4096) == b""
            assert kept_alive.recv(4096) == b""  # no next request within the deadline of the answer
        assert time.monotonic() - started < 4
