"""Reading the aggregate pipeline's output: exact window totals from the committed partial counts.

The consumers write partial counts per batch (`aggregate.py`); this sums them. It reads only committed
batches and, per partition, only a non-overlapping set of them (`commits.select_counted`), so a window's
count is exact after graceful handoffs and also after a crash replayed part of a partition. It needs no
Spark: the demo's live view, the tests and a small web backend use it.

For a static web page, `write_views` projects the totals into the sink:

    views/index.json                      {"windows": [{"windowStart", "windowEnd", "events", "homes",
                                                        "file": "window=20261121T100000Z.json"}, ...]}
    views/window=20261121T100000Z.json    {"windowStart", "windowEnd", "events",
                                           "homes": {"h000042": {"motion": 4, "door": 1}, ...}}

Run it from one place (the demo, `hubshift views`): a view is rewritten whole from all committed partials.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hubshift.pipelines.aggregate import OUTPUT
from hubshift.sinks.base import ObjectStore, format_time
from hubshift.sinks.commits import BatchRecord, select_counted
from hubshift.sinks.layout import COMMITS, VIEWS

# (window start, home, sensor type)
WindowKey = tuple[datetime, str, str]


@dataclass(frozen=True)
class WindowCount:
    window_start: datetime
    window_end: datetime
    home_id: str
    sensor_type: str
    count: int
    last_event_time: datetime | None


@dataclass
class _Partial:
    window_end: datetime
    count: int
    last_event_time: datetime | None


class AggregateView:
    """Incremental: `refresh()` reads only commit records (and their files) it has not seen yet."""

    def __init__(self, store: ObjectStore, output: str = OUTPUT) -> None:
        self.store = store
        self.output = output
        self._records: dict[str, BatchRecord] = {}
        # stem -> partition -> key -> partial
        self._partials: dict[str, dict[str, dict[WindowKey, _Partial]]] = {}
        self._counted: dict[str, frozenset[str]] = {}
        self._totals: dict[WindowKey, WindowCount] | None = None  # counts(), until new records come

    def refresh(self) -> int:
        """Read new commit records; how many."""
        fresh = 0
        for name in self.store.list(f"{COMMITS}/"):
            if name in self._records:
                continue
            record = BatchRecord.from_json(self.store.get(name))
            self._partials[record.stem] = self._read_partials(record)
            self._records[name] = record
            fresh += 1
        if fresh:
            self._counted = select_counted(self._records.values())
            self._totals = None
        return fresh

    @property
    def records(self) -> list[BatchRecord]:
        return list(self._records.values())

    def _read_partials(self, record: BatchRecord) -> dict[str, dict[WindowKey, _Partial]]:
        partials: dict[str, dict[WindowKey, _Partial]] = defaultdict(dict)
        for file in record.files_of(self.output):
            for line in self.store.get(file.name).decode().splitlines():
                if not line:
                    continue
                row = json.loads(line)
                key = (_time(row["windowStart"]), str(row["homeId"]), str(row["sensorType"]))
                last = _time(row["lastEventTime"]) if row.get("lastEventTime") else None
                into = partials[str(row["partition"])]
                known = into.get(key)
                if known is None:
                    into[key] = _Partial(_time(row["windowEnd"]), int(row["count"]), last)
                else:  # the same key from two Spark tasks of one batch
                    known.count += int(row["count"])
                    known.last_event_time = _latest(known.last_event_time, last)
        return partials

    def counts(self) -> dict[WindowKey, WindowCount]:
        """Every window's total per home and sensor type (summed once per refresh that found records)."""
        if self._totals is None:
            self._totals = self._sum()
        return self._totals

    def _sum(self) -> dict[WindowKey, WindowCount]:
        totals: dict[WindowKey, _Partial] = {}
        for stem, partitions in self._partials.items():
            counted = self._counted.get(stem, frozenset())
            for partition, partials in partitions.items():
                if partition not in counted:
                    continue
                for key, partial in partials.items():
                    total = totals.get(key)
                    if total is None:
                        totals[key] = _Partial(partial.window_end, partial.count, partial.last_event_time)
                    else:
                        total.count += partial.count
                        total.last_event_time = _latest(total.last_event_time, partial.last_event_time)
        return {
            key: WindowCount(key[0], value.window_end, key[1], key[2], value.count, value.last_event_time)
            for key, value in sorted(totals.items())
        }

    def count(self, window_start: datetime, home_id: str, sensor_type: str) -> int:
        found = self.counts().get((window_start, home_id, sensor_type))
        return found.count if found is not None else 0

    def total(self) -> int:
        return sum(c.count for c in self.counts().values())

    def windows(self) -> list[dict[str, Any]]:
        """One entry per window: start, end, events, homes (what `views/index.json` lists)."""
        return _index(self.counts().values())

    def write_views(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> list[str]:
        """Project the totals into `views/` for a web page; the names written."""
        counts = list(self.counts().values())
        by_window: dict[datetime, list[WindowCount]] = defaultdict(list)
        for count in counts:
            by_window[count.window_start].append(count)
        written: list[str] = []
        for start, rows in sorted(by_window.items()):
            name = f"{VIEWS}/{window_file(start)}"
            self.store.put(name, json.dumps(window_document(rows), separators=(",", ":")).encode())
            written.append(name)
        index = {"updatedAt": format_time(now()), "windows": _index(counts)}
        self.store.put(f"{VIEWS}/index.json", json.dumps(index, indent=1).encode())
        written.append(f"{VIEWS}/index.json")
        return written


def window_file(start: datetime) -> str:
    return f"window={start.astimezone(UTC):%Y%m%dT%H%M%SZ}.json"


def window_document(rows: Iterable[WindowCount]) -> dict[str, Any]:
    rows = list(rows)
    homes: dict[str, dict[str, int]] = defaultdict(dict)
    for row in rows:
        homes[row.home_id][row.sensor_type] = row.count
    return {
        "windowStart": format_time(rows[0].window_start),
        "windowEnd": format_time(rows[0].window_end),
        "events": sum(r.count for r in rows),
        "homes": dict(sorted(homes.items())),
    }


def _index(counts: Iterable[WindowCount]) -> list[dict[str, Any]]:
    events: dict[datetime, int] = defaultdict(int)
    homes: dict[datetime, set[str]] = defaultdict(set)
    ends: dict[datetime, datetime] = {}
    for count in counts:
        events[count.window_start] += count.count
        homes[count.window_start].add(count.home_id)
        ends[count.window_start] = count.window_end
    return [
        {
            "windowStart": format_time(start),
            "windowEnd": format_time(ends[start]),
            "events": events[start],
            "homes": len(homes[start]),
            "file": window_file(start),
        }
        for start in sorted(events)
    ]


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
