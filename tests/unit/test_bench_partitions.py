"""bench/partitions.py's arithmetic: what a store request is for (from its head, as the counting proxy sees
it) and requests per partition-hour."""

from __future__ import annotations

import pytest

from bench.partitions import per_partition_hour, request_kind


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"PUT /devstoreaccount1/h-32/ns/hub/$default/checkpoint/3?comp=metadata HTTP/1.1\r\nHost: a\r\n\r\n",
         "write-checkpoint"),
        (b"PUT /devstoreaccount1/s-32/ns/hub/$default/ownership/7 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
         "write-ownership"),
        (b"PUT /devstoreaccount1/h-32/ns/hub/cg/hubshift/consumers/c0?comp=lease HTTP/1.1\r\n"
         b"X-MS-Lease-Action: renew\r\n\r\n", "lease-renew"),
        (b"GET /devstoreaccount1/h-32?restype=container&comp=list&prefix=ns/hub/ HTTP/1.1\r\n\r\n", "list"),
        (b"HEAD /devstoreaccount1/h-32/ns/hub/cg/hubshift/assignment HTTP/1.1\r\n\r\n", "read"),
    ],
)  # fmt: skip
def test_a_request_is_classified_from_its_request_line_and_headers(head: bytes, kind: str) -> None:
    assert request_kind(head) == kind


def test_requests_per_partition_hour() -> None:
    assert per_partition_hour(32, 32, 10.0) == 360.0  # one request a partition every 10 s
    assert per_partition_hour(4, 1024, 30.0) == 0.5
    assert per_partition_hour(5, 8, 0.0) is None
