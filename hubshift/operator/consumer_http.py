"""The operator's HTTP calls to its consumers: the nudge (`POST /assignment`: read the assignment record
now), the readiness probe the local runtime uses (`GET /readyz`) and the work a consumer did, for its
capacity, with the partitions whose state it is restoring (`GET /metrics`). Short timeouts: a consumer
that does not answer lists the store on its own within its list interval, and its capacity is measured
from the others."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

NUDGE_TIMEOUT_SECONDS = 1.0
READY_TIMEOUT_SECONDS = 1.0
WORK_TIMEOUT_SECONDS = 1.0
# The consumer's counters of events processed and of seconds spent processing them (their names are
# hubshift/consumer/metrics.py's); every series of each is summed, whatever its labels.
EVENTS_SAMPLE = "hubshift_consumer_events_total"
BUSY_SAMPLE = "hubshift_consumer_batch_duration_seconds_sum"
RESTORING_SAMPLE = "hubshift_consumer_state_restoring_since_seconds"

Nudger = Callable[[str, int], Awaitable[bool]]


async def nudge_consumer(address: str, generation: int, timeout: float = NUDGE_TIMEOUT_SECONDS) -> bool:
    """`POST http://<address>/assignment`: re-read the assignment now. False when it did not answer 202."""
    return (
        await _status("POST", f"http://{address}/assignment", timeout, json={"generation": generation}) == 202
    )


async def consumer_ready(address: str, timeout: float = READY_TIMEOUT_SECONDS) -> bool | None:
    """`GET http://<address>/readyz`: True when it answered 200, False for another answer (the consumer
    says it is not ready: starting, stopping), None when it did not answer in time."""
    status = await _status("GET", f"http://{address}/readyz", timeout)
    return None if status is None else status == 200


@dataclass(frozen=True)
class ConsumerFigures:
    """What one consumer's `/metrics` says: its work (events processed, seconds spent processing them; None
    when it does not export both) and a streaming job's partitions whose state it is restoring (partition ->
    when its query started, as a Unix time)."""

    work: tuple[float, float] | None
    restoring: dict[str, float]


async def consumer_figures(address: str, timeout: float = WORK_TIMEOUT_SECONDS) -> ConsumerFigures | None:
    """`GET http://<address>/metrics`: its work and the partitions it is restoring; None when it did not
    answer 200."""
    answer = await _request("GET", f"http://{address}/metrics", timeout, read=True)
    if answer is None or answer[0] != 200:
        return None
    try:
        return parse_figures(answer[1])
    except ValueError:  # not an exposition
        return None


def parse_figures(exposition: str) -> ConsumerFigures:
    """The work (events processed, seconds spent processing them, each summed over its series; None unless
    both are exported) and the partitions being restored, from a Prometheus exposition, in one pass."""
    totals: dict[str, float] = {}
    restoring: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in (EVENTS_SAMPLE, BUSY_SAMPLE):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
            elif sample.name == RESTORING_SAMPLE and "partition" in sample.labels:
                restoring[str(sample.labels["partition"])] = sample.value
    work = (totals[EVENTS_SAMPLE], totals[BUSY_SAMPLE]) if len(totals) == 2 else None
    return ConsumerFigures(work, restoring)


async def _status(method: str, url: str, timeout: float, json: object = None) -> int | None:
    answer = await _request(method, url, timeout, json=json)
    return None if answer is None else answer[0]


async def _request(
    method: str, url: str, timeout: float, *, json: object = None, read: bool = False
) -> tuple[int, str] | None:
    """(status, body when `read`) of one request; None when it did not answer in time."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.request(method, url, json=json) as response,
        ):
            return response.status, await response.text() if read else ""
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
