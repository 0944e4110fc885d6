"""How the ownership agent reports failures that repeat, as a pure decision: which log line each failure
and recovery gets.

A refused credential makes every store request fail: the membership renewal every second, each due
checkpoint, each listing. One warning tells a person what to fix; the same warning seventy times in a minute
hides everything else. So, per kind of operation (renewal, listing, checkpoint, ...):

- the first failure of a run of failures warns once, with the whole reason; a kind that starts failing for
  the very reason another kind already warned about says so at info;
- repeats are counted and logged at debug, with at most one short info line per `summary_seconds` saying it
  still fails (how often, since when, and the latest reason when it differs from the first);
- the first success after a run logs one info line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# At most one "still failing" line per kind this often.
SUMMARY_SECONDS = 60.0

Level = Literal["debug", "info", "warning"]


@dataclass(frozen=True)
class LogLine:
    level: Level
    message: str


@dataclass
class _Run:
    """A run of failures of one kind."""

    reason: str  # the first one's, the one the warning gave
    since: float
    failures: int = 1
    summarised_at: float = 0.0


@dataclass
class FailureLog:
    """The runs of failures under way, by kind; each decision takes `now` (seconds, any clock)."""

    summary_seconds: float = SUMMARY_SECONDS
    _runs: dict[str, _Run] = field(default_factory=dict)

    def failed(self, kind: str, reason: str, now: float, *, where: str = "") -> LogLine:
        """`kind` failed for `reason` (`where`: which partition, for the message)."""
        at = f" ({where})" if where else ""
        run = self._runs.get(kind)
        if run is None:
            same = next((k for k, r in self._runs.items() if r.reason == reason), None)
            self._runs[kind] = _Run(reason, since=now, summarised_at=now)
            if same is not None:
                return LogLine("info", f"{kind} failed{at} too, for the same reason as {same} (retrying)")
            return LogLine("warning", f"{kind} failed{at} (retrying): {reason}")
        run.failures += 1
        if now - run.summarised_at < self.summary_seconds:
            return LogLine("debug", f"{kind} failed{at} again ({run.failures} times): {reason}")
        run.summarised_at = now
        latest = "" if reason == run.reason else f"; latest: {reason}"
        return LogLine(
            "info", f"{kind} still failing: {run.failures} times in {now - run.since:.0f}s{latest}"
        )

    def succeeded(self, kind: str, now: float) -> LogLine | None:
        """`kind` worked: one line when that ends a run of failures, else none."""
        run = self._runs.pop(kind, None)
        if run is None:
            return None
        times = "once" if run.failures == 1 else f"{run.failures} times"
        return LogLine("info", f"{kind} works again (it failed {times} in {now - run.since:.0f}s)")
