"""The aggregate pipeline's committed output, written without Spark: a batch's partial counts and its
commit record, as the consumers write them (the view reader's tests, the residents' page in a browser)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hubshift.sinks import FolderStore
from hubshift.sinks.commits import BatchRecord, PartitionRange, WrittenFile

W0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def write_batch(
    store: FolderStore,
    stem: str,
    ranges: list[tuple[str, int, int]],
    rows: list[tuple[datetime, str, str, str, int]],
    *,
    commit: bool = True,
    at: int = 0,
) -> None:
    lines = [
        json.dumps(
            {
                "windowStart": stamp(start),
                "windowEnd": stamp(start + timedelta(minutes=1)),
                "homeId": home,
                "sensorType": kind,
                "partition": partition,
                "count": count,
                "lastEventTime": stamp(start + timedelta(seconds=30)),
            }
        )
        for start, home, kind, partition, count in rows
    ]
    name = f"aggregates/window=x/{stem}-000.jsonl"
    store.put(name, ("\n".join(lines) + "\n").encode())
    if commit:
        record = BatchRecord(
            consumer_id=stem.split("-")[0],
            run="r",
            batch_id=0,
            stem=stem,
            pipeline="aggregate",
            committed_at=W0 + timedelta(seconds=at),
            partitions=tuple(PartitionRange(p, a, b, str(b), b - a + 1) for p, a, b in ranges),
            files=(WrittenFile("output", "aggregates", name, len(lines)),),
        )
        store.put(record.name, record.to_json())
