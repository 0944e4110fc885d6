"""The folder store (atomic files, listing), the layout's names, and building sinks from the manifest."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hubshift.errors import UserError
from hubshift.sinks import BlobStore, FileSink, FolderStore, SinkSpec, build_sink, build_store
from hubshift.sinks.layout import batch_stem, data_file, dead_letter_file, safe_name


def test_put_get_list(tmp_path: Path) -> None:
    store = FolderStore(tmp_path)
    store.put("aggregates/window=1/a.jsonl", b"1\n")
    store.put("aggregates/window=2/b.jsonl", b"2\n")
    store.put("_batches/a.json", b"{}")
    store.put("aggregates/window=1/a.jsonl", b"replaced\n")
    assert store.get("aggregates/window=1/a.jsonl") == b"replaced\n"
    assert store.list("aggregates/") == ["aggregates/window=1/a.jsonl", "aggregates/window=2/b.jsonl"]
    assert store.list("aggregates/window=2") == ["aggregates/window=2/b.jsonl"]
    assert store.list("_batches/") == ["_batches/a.json"]
    assert store.list("missing/") == []
    assert len(store.list()) == 3
    with pytest.raises(FileNotFoundError):
        store.get("nope")


def test_temporary_files_are_never_listed_and_names_stay_inside(tmp_path: Path) -> None:
    store = FolderStore(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".a.jsonl.1234.tmp").write_text("partial")
    assert store.list() == []
    with pytest.raises(ValueError, match="outside"):
        store.put("../escape", b"")


def test_relative_roots_become_absolute_for_spark_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = FolderStore(Path("out"))
    assert store.root == tmp_path / "out"
    assert pickle.loads(pickle.dumps(store)) == store


def test_names() -> None:
    assert safe_name("homes-0") == "homes-0"
    assert safe_name("a/b c:d") == "a_b_c_d"
    assert safe_name("///") == "consumer"
    stem = batch_stem("homes-0", "ab12cd34", 17)
    assert stem == "homes-0-ab12cd34-000000017"
    assert data_file("aggregates", "window=20261121T100000Z", stem, 1) == (
        "aggregates/window=20261121T100000Z/homes-0-ab12cd34-000000017-001.jsonl"
    )
    assert data_file("results", None, stem, 0) == "results/homes-0-ab12cd34-000000017-000.jsonl"
    day = datetime(2026, 11, 21, tzinfo=UTC)
    assert dead_letter_file(day, stem, 2) == "date=2026-11-21/homes-0-ab12cd34-000000017-002.jsonl"


def test_folder_sink_defaults(tmp_path: Path) -> None:
    spec = SinkSpec.model_validate({"folder": {"path": str(tmp_path / "out")}})
    sink = build_sink(spec, environ={})
    assert isinstance(sink, FileSink)
    assert sink.store == FolderStore(tmp_path / "out")
    assert sink.dead_letter_store == FolderStore(tmp_path / "out" / "dead-letter")
    assert build_store(spec, environ={}) == sink.store
    other = build_sink(spec, environ={})
    assert other.run != sink.run  # each consumer process writes under its own run


def test_dead_letter_path_overrides(tmp_path: Path) -> None:
    spec = SinkSpec.model_validate(
        {"folder": {"path": str(tmp_path)}, "deadLetterPath": str(tmp_path / "dl")}
    )
    sink = build_sink(spec, environ={})
    assert isinstance(sink, FileSink)
    assert sink.dead_letter_store == FolderStore(tmp_path / "dl")


def test_blob_sink_reads_the_connection_string_from_the_named_variable() -> None:
    spec = SinkSpec.model_validate(
        {"type": "blob", "blob": {"container": "homes", "prefix": "/out/", "connectionStringEnv": "MY_SINK"}}
    )
    with pytest.raises(UserError, match="environment variable MY_SINK is not set"):
        build_sink(spec, environ={})
    sink = build_sink(spec, environ={"MY_SINK": "AccountName=x;AccountKey=secret"}, check=False)
    assert isinstance(sink, FileSink)
    assert isinstance(sink.store, BlobStore) and isinstance(sink.dead_letter_store, BlobStore)
    assert (sink.store.container.name, sink.store.prefix) == ("homes", "out")
    assert sink.dead_letter_store.prefix == "out/dead-letter"
    assert "secret" not in repr(sink.store) and "secret" not in sink.describe()


def test_blob_sink_with_a_malformed_connection_string_is_one_line() -> None:
    spec = SinkSpec.model_validate({"type": "blob", "blob": {"container": "homes"}})
    with pytest.raises(UserError) as error:
        build_sink(spec, environ={"HUBSHIFT_SINK_CONNECTION_STRING": "garbage-secret"})
    assert "not valid" in str(error.value)
    assert "garbage-secret" not in str(error.value)


def test_an_unwritable_folder_fails_at_start_up_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    spec = SinkSpec.model_validate({"folder": {"path": str(blocker / "out")}})
    with pytest.raises(UserError, match=f"sink folder {blocker / 'out'}: cannot write there"):
        build_sink(spec, environ={})
    assert build_sink(spec, environ={}, check=False).describe() == f"folder {blocker / 'out'}"
