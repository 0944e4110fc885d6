"""Counting what SDK-engine consumers processed, and what they processed twice, from their range logs."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.ranges import count_replays, read_range_logs


def test_overlaps_count_as_replays_per_partition() -> None:
    lines = [
        {"partition": "0", "first": 0, "last": 9},
        {"partition": "0", "first": 5, "last": 14},  # 5..9 again: 5 replays
        {"partition": "0", "first": 20, "last": 20},  # a gap is not a replay
        {"partition": "1", "first": 0, "last": 0},
    ]
    assert count_replays(lines) == (17, 5)


def test_logs_are_read_across_consumers_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "c-0.jsonl").write_text(json.dumps({"partition": "0", "first": 0, "last": 3}) + "\n")
    (tmp_path / "c-1.jsonl").write_text(
        json.dumps({"partition": "0", "first": 4, "last": 7}) + '\n{"partition": "0", "fir'
    )
    lines = read_range_logs(tmp_path)
    assert len(lines) == 2
    assert count_replays(lines) == (8, 0)
