"""Commit records: what one batch wrote and which events it covered, and which records count.

A record is written after all of a batch's files, so a reader never sees half a batch. It names the
files and, per Event Hubs partition, the sequence-number range the batch read. After a graceful handoff
ranges never overlap (the new owner starts right after the old owner's final checkpoint). After a crash, or
a consumer deposed mid-batch, two records can cover the same events: the dead consumer's last batches and
the new owner's re-reads from the checkpoint. `select_counted` keeps, per partition, a set of records whose
ranges do not overlap and that together cover the most events, so each event is counted exactly once.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from hubshift.sinks.layout import commit_file

RECORD_VERSION = 1
Destination = Literal["output", "dead-letter"]


@dataclass(frozen=True)
class PartitionRange:
    """The events of one Event Hubs partition in one batch."""

    partition: str
    first_sequence_number: int
    last_sequence_number: int
    last_offset: str  # the offset of the last event: what a checkpoint after this batch records
    events: int
    first_enqueued_time: datetime | None = None
    last_enqueued_time: datetime | None = None


@dataclass(frozen=True)
class WrittenFile:
    destination: Destination
    output: str  # the pipeline output's name ("aggregates", "results") or "dead-letter"
    name: str  # path inside the sink (or the dead-letter location)
    rows: int


@dataclass(frozen=True)
class BatchRecord:
    consumer_id: str
    run: str
    batch_id: int
    stem: str
    pipeline: str
    committed_at: datetime
    partitions: tuple[PartitionRange, ...]
    files: tuple[WrittenFile, ...]

    @property
    def name(self) -> str:
        return commit_file(self.stem)

    def files_of(self, output: str) -> list[WrittenFile]:
        return [f for f in self.files if f.destination == "output" and f.output == output]

    def to_json(self) -> bytes:
        document = {
            "version": RECORD_VERSION,
            "consumerId": self.consumer_id,
            "run": self.run,
            "batchId": self.batch_id,
            "stem": self.stem,
            "pipeline": self.pipeline,
            "committedAt": _time(self.committed_at),
            "partitions": [
                {
                    "partition": p.partition,
                    "firstSequenceNumber": p.first_sequence_number,
                    "lastSequenceNumber": p.last_sequence_number,
                    "lastOffset": p.last_offset,
                    "events": p.events,
                    "firstEnqueuedTime": _time(p.first_enqueued_time),
                    "lastEnqueuedTime": _time(p.last_enqueued_time),
                }
                for p in self.partitions
            ],
            "files": [
                {"destination": f.destination, "output": f.output, "name": f.name, "rows": f.rows}
                for f in self.files
            ],
        }
        return json.dumps(document, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BatchRecord:
        document: dict[str, Any] = json.loads(data)
        if document.get("version") != RECORD_VERSION:
            raise ValueError(f"unknown commit record version {document.get('version')!r}")
        return cls(
            consumer_id=document["consumerId"],
            run=document["run"],
            batch_id=int(document["batchId"]),
            stem=document["stem"],
            pipeline=document["pipeline"],
            committed_at=datetime.fromisoformat(document["committedAt"]),
            partitions=tuple(
                PartitionRange(
                    partition=str(p["partition"]),
                    first_sequence_number=int(p["firstSequenceNumber"]),
                    last_sequence_number=int(p["lastSequenceNumber"]),
                    last_offset=str(p["lastOffset"]),
                    events=int(p["events"]),
                    first_enqueued_time=_parse_time(p.get("firstEnqueuedTime")),
                    last_enqueued_time=_parse_time(p.get("lastEnqueuedTime")),
                )
                for p in document["partitions"]
            ),
            files=tuple(
                WrittenFile(
                    destination=f["destination"], output=f["output"], name=f["name"], rows=int(f["rows"])
                )
                for f in document["files"]
            ),
        )


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def select_counted(records: Iterable[BatchRecord]) -> dict[str, frozenset[str]]:
    """stem -> the partitions whose rows in that record count.

    Per partition: the heaviest (most events) set of pairwise non-overlapping ranges, by weighted interval
    scheduling; ties go to the record committed first, then the smaller stem, so the answer is stable.
    """
    by_partition: dict[str, list[tuple[PartitionRange, BatchRecord]]] = defaultdict(list)
    for record in records:
        for part in record.partitions:
            by_partition[part.partition].append((part, record))
    chosen: dict[str, set[str]] = defaultdict(set)
    for partition, entries in by_partition.items():
        for record in _heaviest_disjoint(entries):
            chosen[record.stem].add(partition)
    return {stem: frozenset(parts) for stem, parts in chosen.items()}


def _heaviest_disjoint(entries: list[tuple[PartitionRange, BatchRecord]]) -> list[BatchRecord]:
    entries = sorted(
        entries,
        key=lambda e: (e[0].last_sequence_number, e[0].first_sequence_number, e[1].committed_at, e[1].stem),
    )
    ends = [part.last_sequence_number for part, _ in entries]
    best = [0] * (len(entries) + 1)  # best[i]: heaviest weight using the first i entries
    take = [False] * (len(entries) + 1)
    previous = [0] * (len(entries) + 1)
    for i, (part, _) in enumerate(entries, start=1):
        # entries ending before this one starts: the first j entries
        j = bisect.bisect_left(ends, part.first_sequence_number, 0, i - 1)
        previous[i] = j
        with_it = best[j] + part.events
        if with_it > best[i - 1]:
            best[i], take[i] = with_it, True
        else:
            best[i] = best[i - 1]
    picked: list[BatchRecord] = []
    i = len(entries)
    while i > 0:
        if take[i]:
            picked.append(entries[i - 1][1])
            i = previous[i]
        else:
            i -= 1
    return picked


@dataclass(frozen=True)
class BatchSummary:
    """What one micro-batch put durably in the sink (`process_batch`'s answer): the consumer may checkpoint
    exactly its partitions."""

    consumer_id: str
    batch_id: int
    # Per Event Hubs partition: first/last sequence number, the last event's offset, event count.
    partitions: Mapping[str, PartitionRange]
    outputs: Mapping[str, int] = field(default_factory=dict)  # rows written per output
    dead_letters: int = 0
    files: tuple[WrittenFile, ...] = ()
    stem: str | None = None  # None: an empty batch, nothing written or committed
    duration_seconds: float = 0.0

    @property
    def events(self) -> int:
        return sum(p.events for p in self.partitions.values())
