"""The consumers' range logs (`hubshift.consumer.ranges`), read and analysed: what was processed, and what
twice."""

from __future__ import annotations

import contextlib
import json
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
