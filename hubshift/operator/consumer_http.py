"""The operator's HTTP calls to its consumers: the nudge (`POST /assignment`: read the assignment record
now) and the readiness probe the local runtime uses (`GET /readyz`). Short timeouts: a consumer that does
not answer lists the store on its own within its list interval."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp

NUDGE_TIMEOUT_SECONDS = 1.0
READY_TIMEOUT_SECONDS = 0.5

Nudger = Callable[[str, int], Awaitable[bool]]


async def nudge_consumer(address: str, generation: int, timeout: float = NUDGE_TIMEOUT_SECONDS) -> bool:
    """`POST http://<address>/assignment`: re-read the assignment now. False when it did not answer 202."""
    return (
        await _status("POST", f"http://{address}/assignment", timeout, json={"generation": generation}) == 202
    )


async def consumer_ready(address: str, timeout: float = READY_TIMEOUT_SECONDS) -> bool:
    """`GET http://<address>/readyz` answered 200."""
    return await _status("GET", f"http://{address}/readyz", timeout) == 200


async def _status(method: str, url: str, timeout: float, **kwargs: object) -> int | None:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.request(method, url, **kwargs) as response,  # type: ignore[arg-type]
        ):
            return response.status
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
