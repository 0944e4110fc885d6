"""What the sinks Spark writes decide without Spark: which partitions a batch still adds after a replay
(`to_write`), which one frame they write (`single_output`), and the names under which the `parquet` and
`json` sinks publish a batch's files (`final_name`, `is_data_file`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubshift.errors import UserError
from hubshift.sinks.base import Output, PipelineResult
from hubshift.sinks.commits import PartitionRange
from hubshift.sinks.files import final_name, is_data_file
from hubshift.sinks.layout import batch_stem
from hubshift.sinks.spark_writer import dead_letter_folder, java_reason, single_output, to_write

PARTITIONS = st.sampled_from([str(p) for p in range(8)])


def span(partition: str, first: int, last: int) -> PartitionRange:
    return PartitionRange(partition, first, last, str(last * 100), last - first + 1)


ranges_strategy = st.dictionaries(
    PARTITIONS,
    st.tuples(st.integers(0, 10_000), st.integers(0, 500)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=8,
).map(lambda spans: {p: span(p, first, last) for p, (first, last) in spans.items()})
written_strategy = st.dictionaries(PARTITIONS, st.integers(-1, 12_000), max_size=8)


# --- to_write: a replay adds only what the sink lacks ------------------------------------------------


def test_to_write_examples() -> None:
    ranges = {"0": span("0", 10, 19), "1": span("1", 0, 4), "2": span("2", 7, 7)}
    assert to_write(ranges, {}) == {"0": 19, "1": 4, "2": 7}
    assert to_write(ranges, {"0": 19, "1": 2}) == {"1": 4, "2": 7}  # 0 is all there; 1 partly
    assert to_write(ranges, {"0": 25, "1": 4, "2": 7}) == {}  # a replay of a committed batch
    assert to_write(ranges, {"3": 100}) == {"0": 19, "1": 4, "2": 7}  # another partition's progress
    assert to_write({}, {"0": 1}) == {}


@given(ranges_strategy, written_strategy)
def test_to_write_is_exactly_the_partitions_that_move_forward(
    ranges: dict[str, PartitionRange], written: dict[str, int]
) -> None:
    todo = to_write(ranges, written)
    assert set(todo) <= set(ranges)
    for partition, done in ranges.items():
        moves = done.last_sequence_number > written.get(partition, -1)
        assert (partition in todo) == moves
        if moves:
            assert todo[partition] == done.last_sequence_number  # the high-water mark after this batch
    # Idempotent: once the batch's marks are recorded, the same batch adds nothing.
    assert to_write(ranges, {**written, **todo}) == {}


# --- single_output: a Spark sink writes one DataFrame ------------------------------------------------


def test_a_pipeline_with_no_output_writes_nothing() -> None:
    assert single_output(PipelineResult(outputs={}), "delta") is None


def test_two_outputs_are_refused_naming_them() -> None:
    frame: Any = object()  # never read: the outputs are counted before any frame is touched
    result = PipelineResult(outputs={"results": Output(frame), "aggregates": Output(frame)})
    with pytest.raises(UserError) as refused:
        single_output(result, "parquet")
    assert str(refused.value) == (
        "sink parquet takes one DataFrame; the pipeline returned 2 outputs (aggregates, results)"
    )


def test_dead_letters_beside_the_table_or_where_placed() -> None:
    assert dead_letter_folder("/data/orders/", None) == "/data/orders/_dead_letters"
    assert dead_letter_folder("abfss://t@a.dfs.core.windows.net/x", None).endswith("/x/_dead_letters")
    assert dead_letter_folder("/data/orders", "/dead") == "/dead"


# --- the files a batch publishes ---------------------------------------------------------------------

STEM = batch_stem("orders-0", "a1b2c3d4", 42)
SPARK_NAMES = [
    "part-00000-3f2c1a9e-1b2c-4d5e-8f90-123456789abc-c000.snappy.parquet",
    "part-00001-3f2c1a9e-1b2c-4d5e-8f90-123456789abc.c000.snappy.parquet",
    "part-00000-3f2c1a9e-1b2c-4d5e-8f90-123456789abc-c000.json",
    "part-00003-3f2c1a9e-1b2c-4d5e-8f90-123456789abc-c000.json.gz",
]


@pytest.mark.parametrize("name", SPARK_NAMES)
def test_spark_data_files_are_recognised_and_keep_their_extension(name: str) -> None:
    assert is_data_file(name) and is_data_file(f"day=2026-11-25/{name}")
    extension = name[name.index(".", name.index("-c000") if "-c000" in name else 0) :]
    published = final_name(f"day=2026-11-25/hour=10/{name}", STEM, 7)
    assert published == f"day=2026-11-25/hour=10/part-{STEM}-00007{extension}"
    assert is_data_file(published)


@pytest.mark.parametrize(
    "name",
    [
        "_SUCCESS",
        ".part-00000-3f2c1a9e.c000.snappy.parquet.crc",  # the local file system's checksums
        "._SUCCESS.crc",
        "_committed_123",
        "part-00000",  # no extension: not a file Spark's writers leave
        "day=1/_temporary",
    ],
)
def test_what_spark_leaves_beside_its_data_is_not_published(name: str) -> None:
    assert not is_data_file(name)


def test_a_file_without_partition_folders_stays_at_the_top() -> None:
    assert final_name(SPARK_NAMES[0], STEM, 0) == f"part-{STEM}-00000.snappy.parquet"


folders = st.lists(
    st.sampled_from(["day=2026-11-25", "day=2026-11-26", "site=a b", "kind=__HIVE_DEFAULT_PARTITION__"]),
    max_size=3,
).map("/".join)
extensions = st.lists(st.sampled_from(["c000", "snappy", "parquet", "json", "gz", "zstd"]), min_size=1).map(
    lambda parts: "." + ".".join(parts)
)
stems = st.builds(
    batch_stem,
    st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    st.just("0f1e2d3c"),
    st.integers(0, 10**9),
)


@given(folders, st.uuids(), extensions, stems, st.integers(0, 99_999), st.integers(0, 99_999))
def test_published_names_keep_the_folder_and_differ_per_file_and_batch(
    folder: str, uuid: Any, extension: str, stem: str, number: int, other: int
) -> None:
    staged = f"{folder + '/' if folder else ''}part-{number:05d}-{uuid}{extension}"
    published = final_name(staged, stem, number)
    assert is_data_file(staged) and is_data_file(published)
    assert published.rpartition("/")[0] == folder  # the partition folders Spark chose
    assert published.endswith(extension) and f"part-{stem}-" in published
    assert final_name(staged, stem, number) == published  # a replayed manifest moves to the same name
    if other != number:
        assert final_name(staged, stem, other) != published
    assert final_name(staged, stem + "x", number) != published  # another batch never overwrites it


# --- why a path cannot be written, as a person reads it ----------------------------------------------

PY4J = (
    "An error occurred while calling o82.create.\n: java.nio.file.AccessDeniedException: Operation failed: "
    '"Server failed to authenticate the request.", 403, HEAD, https://lake.dfs.core.windows.net/t/homes\n'
    "\tat org.apache.hadoop.fs.azurebfs.services.AbfsRestOperation.execute(AbfsRestOperation.java:270)\n"
    "\tat org.apache.hadoop.fs.azurebfs.AzureBlobFileSystem.create(AzureBlobFileSystem.java:400)\n"
)


def test_a_java_failure_reads_as_its_exception_and_message() -> None:
    assert java_reason(RuntimeError(PY4J)) == (
        'AccessDeniedException: Operation failed: "Server failed to authenticate the request.", 403, HEAD, '
        "https://lake.dfs.core.windows.net/t/homes"
    )
    local = (
        "An error occurred while calling o66.create.\n: org.apache.hadoop.fs.ParentNotDirectoryException: "
    )
    assert java_reason(RuntimeError(local + "Parent path is not a directory: /data/a-file")) == (
        "ParentNotDirectoryException: Parent path is not a directory: /data/a-file"
    )
    assert java_reason(OSError("disk full")) == "disk full"  # not Java's: as it is
    assert len(java_reason(RuntimeError("x " * 500))) <= 300


def test_a_delta_commit_that_lost_a_race_is_tried_again_and_nothing_else_is() -> None:
    from hubshift.sinks.delta import lost_a_race

    relayed = "An error occurred while calling o410.commit.\n: io.delta.exceptions.{}: ... concurrent update"
    for name in ("ConcurrentTransactionException", "ProtocolChangedException", "MetadataChangedException"):
        assert lost_a_race(RuntimeError(relayed.format(name)))  # two consumers creating the table at once
    assert not lost_a_race(RuntimeError(relayed.format("DeltaAnalysisException")))
    assert not lost_a_race(PermissionError("denied"))
