"""Reading the aggregate output without Spark: only committed batches, overlaps after a crash removed,
and the views a web page fetches."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks import FolderStore
from tests.harness.aggregates import stamp, write_batch

W0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
W1 = W0 + timedelta(minutes=1)


def test_sums_partials_of_committed_batches_only(tmp_path: Path) -> None:
    store = FolderStore(tmp_path)
    write_batch(store, "a-1", [("0", 0, 9)], [(W0, "h1", "motion", "0", 6), (W0, "h1", "door", "0", 4)])
    write_batch(store, "b-1", [("0", 10, 14)], [(W0, "h1", "motion", "0", 3), (W1, "h1", "motion", "0", 2)])
    write_batch(store, "c-1", [("0", 15, 99)], [(W0, "h1", "motion", "0", 85)], commit=False)
    view = AggregateView(store)
    assert view.refresh() == 2
    assert view.refresh() == 0
    assert view.count(W0, "h1", "motion") == 9
    assert view.count(W1, "h1", "motion") == 2
    assert view.count(W0, "h2", "motion") == 0
    assert view.total() == 15
    counts = view.counts()
    assert counts[(W0, "h1", "motion")].window_end == W1
    assert counts[(W0, "h1", "motion")].last_event_time == W0 + timedelta(seconds=30)


def test_a_crash_replay_is_not_counted_twice(tmp_path: Path) -> None:
    store = FolderStore(tmp_path)
    # a checkpointed at 9, wrote 10-19 and died; b re-read 10-19 (and more) in two batches
    write_batch(store, "a-1", [("0", 0, 9)], [(W0, "h1", "motion", "0", 10)], at=1)
    write_batch(
        store,
        "a-2",
        [("0", 10, 19), ("1", 0, 4)],
        [(W0, "h1", "motion", "0", 10), (W0, "h2", "motion", "1", 5)],
        at=2,
    )
    write_batch(store, "b-1", [("0", 10, 14)], [(W0, "h1", "motion", "0", 5)], at=3)
    write_batch(store, "b-2", [("0", 15, 24)], [(W0, "h1", "motion", "0", 10)], at=4)
    view = AggregateView(store)
    view.refresh()
    assert view.count(W0, "h1", "motion") == 25  # sequence numbers 0-24, once each
    assert view.count(W0, "h2", "motion") == 5  # partition 1 of a-2 was never replayed


def test_views_for_a_web_page(tmp_path: Path) -> None:
    store = FolderStore(tmp_path)
    write_batch(store, "a-1", [("0", 0, 9)], [(W0, "h1", "motion", "0", 6), (W0, "h2", "door", "0", 4)])
    write_batch(store, "a-2", [("0", 10, 11)], [(W1, "h1", "motion", "0", 2)])
    view = AggregateView(store)
    view.refresh()
    written = view.write_views(now=lambda: W1)
    assert written == [
        "views/window=20261121T100000Z.json",
        "views/window=20261121T100100Z.json",
        "views/index.json",
    ]
    window = json.loads(store.get("views/window=20261121T100000Z.json"))
    assert window == {
        "windowStart": "2026-11-21T10:00:00.000Z",
        "windowEnd": "2026-11-21T10:01:00.000Z",
        "events": 10,
        "homes": {"h1": {"motion": 6}, "h2": {"door": 4}},
    }
    index = json.loads(store.get("views/index.json"))
    assert index["updatedAt"] == "2026-11-21T10:01:00.000Z"
    assert index["windows"][1] == {
        "windowStart": "2026-11-21T10:01:00.000Z",
        "windowEnd": "2026-11-21T10:02:00.000Z",
        "events": 2,
        "homes": 1,
        "file": "window=20261121T100100Z.json",
    }
    assert view.windows() == index["windows"]


def views_manifest(path: Path, sink: Path, pipeline: dict[str, object] | None = None) -> Path:
    from tests.fixtures.consumer import consumer_manifest

    return consumer_manifest(
        path,
        store={"sqlite": {"path": str(path.parent / "store.db")}},
        sink=sink,
        consumer={"pipeline": pipeline} if pipeline is not None else None,
    )


def run_hubshift(args: list[str], capsys: Any) -> tuple[int, str, str]:
    from hubshift.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_hubshift_views_writes_the_committed_totals_for_a_web_page(tmp_path: Path, capsys: Any) -> None:
    sink = tmp_path / "sink"
    store = FolderStore(sink)
    write_batch(store, "a-1", [("0", 0, 9)], [(W0, "h1", "motion", "0", 6), (W1, "h2", "door", "0", 4)])
    write_batch(store, "b-1", [("0", 10, 19)], [(W0, "h1", "motion", "0", 85)], commit=False)
    manifest = views_manifest(tmp_path / "homes.yaml", sink)

    code, out, err = run_hubshift(["views", "-f", str(manifest)], capsys)

    assert (code, err) == (0, "")
    assert "2 windows, 10 events (1 new batches, 1 in all)" in out
    index = json.loads((sink / "views" / "index.json").read_text())
    assert [(w["windowStart"], w["events"], w["homes"]) for w in index["windows"]] == [
        (stamp(W0), 6, 1),
        (stamp(W1), 4, 1),
    ]
    first = json.loads((sink / "views" / index["windows"][0]["file"]).read_text())
    assert first["homes"] == {"h1": {"motion": 6}}


def test_hubshift_views_refuses_what_it_cannot_project_in_one_line(tmp_path: Path, capsys: Any) -> None:
    function = views_manifest(
        tmp_path / "function.yaml", tmp_path / "sink", {"type": "function", "function": "mod:fn"}
    )
    code, _, err = run_hubshift(["views", "-f", str(function)], capsys)
    assert code != 0 and "pipeline is 'function'" in err and len(err.strip().splitlines()) == 1

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    unwritable = views_manifest(tmp_path / "blocked.yaml", blocked / "sink")
    code, _, err = run_hubshift(["views", "-f", str(unwritable)], capsys)
    assert code != 0 and "cannot write there" in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
