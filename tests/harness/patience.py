"""How long a test waits: a deadline `timeout` seconds away that, given `progress`, moves on whenever what
`progress` returns changes (a consumer still committing on a busy machine is not stuck), and never lies
more than `at_most` seconds after the start. Shared by the waits that poll (`wait_for`, `Pool.until`)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Patience:
    def __init__(
        self,
        timeout: float,
        progress: Callable[[], object] | None = None,
        at_most: float | None = None,
    ) -> None:
        self.timeout = timeout
        self.progress = progress
        self.started = time.monotonic()
        self.limit = self.started + at_most if at_most is not None else float("inf")
        self.deadline = self.started + timeout
        self.last = progress() if progress is not None else None

    def run_out(self) -> bool:
        """Whether the wait is over: asks `progress` once and moves the deadline on a change."""
        if self.progress is not None and (now := self.progress()) != self.last:
            self.last = now
            self.deadline = min(time.monotonic() + self.timeout, self.limit)
        return time.monotonic() > self.deadline

    def describe(self) -> str:
        """`after N s` or `after N s without progress`, for the failure's message."""
        stalled = " without progress" if self.progress is not None else ""
        return f"after {self.timeout:g} s{stalled}"
