"""The consumers' range logs (`hubshift.consumer.ranges`), read and analysed: what was processed, and what
twice."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def read_range_logs(folder: Path) -> list[dict[str, Any]]:
    """Every line the consumers' `RangeLog`s wrote under `folder` (a line cut short by a crash is skipped)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        for text in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(text))
    return lines


def count_replays(lines: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """(distinct events processed, events processed more than once) over range-log lines."""
    by_partition: dict[str, list[tuple[int, int]]] = {}
    for line in lines:
        by_partition.setdefault(str(line["partition"]), []).append((int(line["first"]), int(line["last"])))
    distinct = replayed = 0
    for ranges in by_partition.values():
        covered = -1
        for first, last in sorted(ranges):
            replayed += max(0, min(last, covered) - first + 1)
            distinct += max(0, last - max(first, covered + 1) + 1)
            covered = max(covered, last)
    return distinct, replayed


def handoffs(lines: Iterable[Mapping[str, Any]], since: float = float("-inf")) -> list[tuple[float, float]]:
    """Each handoff a partition went through after `since`, as (the seconds its events went unprocessed, when
    the new owner's first batch was handled): from the last batch its old owner handled to the first its
    new owner did (a new owner is another consumer, or the same one claiming again at a higher owner level
    after a restart), in time order per partition."""
    by_partition: dict[str, list[Mapping[str, Any]]] = {}
    for line in lines:
        by_partition.setdefault(str(line["partition"]), []).append(line)
    found: list[tuple[float, float]] = []
    for batches in by_partition.values():
        previous: Mapping[str, Any] | None = None
        for line in sorted(batches, key=lambda item: float(item["at"])):
            at = float(line["at"])
            if previous is not None and at >= since:
                moved = (line["consumer"], line["ownerLevel"]) != (
                    previous["consumer"],
                    previous["ownerLevel"],
                )
                if moved:
                    found.append((at - float(previous["at"]), at))
            previous = line
    return found


def handoff_gaps(lines: Iterable[Mapping[str, Any]], since: float = float("-inf")) -> list[float]:
    """The seconds of each handoff after `since` (`handoffs`)."""
    return [gap for gap, _ in handoffs(lines, since)]


def worst_wait(lines: Iterable[Mapping[str, Any]], since: float, until: float) -> float | None:
    """The longest an event waited to be processed among the batches handled in [since, until): a batch's
    handling time minus its first event's enqueued time (the worst partition's lag in seconds at that
    moment); None without such a batch (or a log written before it said when events were enqueued)."""
    waits = [
        float(line["at"]) - float(line["firstEnqueued"])
        for line in lines
        if line.get("firstEnqueued") is not None and since <= float(line["at"]) < until
    ]
    return max(waits) if waits else None


def event_latencies(lines: Iterable[Mapping[str, Any]], since: float, until: float) -> list[float]:
    """Enqueue-to-processed seconds of every event enqueued in [since, until), at its first processing: a
    batch line's handling time (`at`) minus each event's enqueued time, the events taken as evenly spread
    between the batch's first and last enqueued times (lines without them, or not batches, are skipped)."""
    first_seen: dict[tuple[str, int], float] = {}
    for line in lines:
        if line.get("kind", "batch") != "batch" or line.get("firstEnqueued") is None:
            continue
        first, last = int(line["first"]), int(line["last"])
        begun, ended = float(line["firstEnqueued"]), float(line["lastEnqueued"])
        span = max(last - first, 1)
        for sequence in range(first, last + 1):
            enqueued = begun + (ended - begun) * (sequence - first) / span
            if not since <= enqueued < until:
                continue
            latency = max(0.0, float(line["at"]) - enqueued)
            key = (str(line["partition"]), sequence)
            if key not in first_seen or latency < first_seen[key]:
                first_seen[key] = latency
    return list(first_seen.values())


def percentile(values: Iterable[float], fraction: float) -> float | None:
    """The nearest-rank percentile (`fraction` 0.5 for the median, 0.99 for p99); None without values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]
