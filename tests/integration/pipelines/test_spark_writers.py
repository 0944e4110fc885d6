"""The sinks Spark writes itself, batch by batch on the tests' Spark session, each against a real store:
what a replay writes (the same batch again, the same events cut into other batches, a writer killed
between its commit and its publication) and what a reader of the table or folder then sees.

- `parquet`/`json`: a reader of the folder (pyarrow's dataset, none of hubshift's code) sees each row once;
- `delta`: every event in one committed row, on a folder and on Azure storage (Azurite through hadoop-azure's
  ABFS driver, with the account's connection string); read back by delta-rs;
- `jdbc`: upserted by the event's coordinates into PostgreSQL;
- `foreachBatch`: your function gets the rows and exactly which ranges they came from, with a stable id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hubshift.errors import UserError
from hubshift.sinks import files
from hubshift.sinks.base import Output, PipelineResult, SinkContext, WriterBatch
from hubshift.sinks.commits import PartitionRange
from hubshift.sinks.delta import DeltaSink, DeltaSinkSpec
from hubshift.sinks.files import FilesSink, FilesSinkSpec
from hubshift.sinks.foreach_batch import ForeachBatchSink, ForeachBatchSinkSpec
from hubshift.sinks.jdbc import JdbcSink, JdbcSinkSpec
from tests.harness.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from tests.harness.postgres import Postgres

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.timeout(600)
SCOPE = "ns.servicebus.windows.net/hub/$default"
CALLS: list[tuple[str, Mapping[str, tuple[int, int]], int]] = []  # what `record_batch` was given


def events(spark: SparkSession, ranges: Mapping[str, tuple[int, int]]) -> DataFrame:
    rows = [
        (p, s, f"2026-11-2{s % 3}", json.dumps({"id": f"{p}-{s}"}))
        for p, (first, last) in sorted(ranges.items())
        for s in range(first, last + 1)
    ]
    return spark.createDataFrame(rows, "partition string, sequence_number long, date string, body string")


def batch(ranges: Mapping[str, tuple[int, int]], number: int) -> WriterBatch:
    return WriterBatch(
        number,
        "c-0",
        f"c-0-run-{number:09d}",
        datetime.now(UTC),
        {p: PartitionRange(p, a, z, str(z), z - a + 1) for p, (a, z) in ranges.items()},
    )


def identity(frame: DataFrame) -> PipelineResult:
    return PipelineResult(outputs={"results": Output(frame)})


def context(environ: Mapping[str, str] | None = None) -> SinkContext:
    return SinkContext(dict(environ or {}), ("spec", "consumer", "sink", "x"), None, SCOPE)


# The same scenario for every sink: a batch, the same batch again, the same events cut into other batches
# (overlapping the first), and one more partition.
SCENARIO = [
    {"0": (0, 99), "1": (0, 49)},
    {"0": (0, 99), "1": (0, 49)},
    {"0": (50, 149), "1": (40, 79), "3": (0, 4)},
]
EXPECTED = 150 + 80 + 5


def run_scenario(spark: SparkSession, write: Callable[[DataFrame, WriterBatch], object]) -> None:
    for number, ranges in enumerate(SCENARIO):
        write(events(spark, ranges), batch(ranges, number))


def pairs(rows: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    return len(rows), len({(r["partition"], r["sequence_number"]) for r in rows})


# --- parquet and json -----------------------------------------------------------------------------------


@pytest.mark.parametrize("format_name", ["parquet", "json"])
def test_a_reader_of_the_folder_never_sees_a_row_twice(
    spark: SparkSession, tmp_path: Path, format_name: str
) -> None:
    import pyarrow.dataset as ds

    folder = tmp_path / format_name
    sink = FilesSink(format_name, FilesSinkSpec(path=str(folder), partition_by=["date"]), context())
    run_scenario(spark, lambda frame, b: sink.write_batch(frame, identity, b))
    dataset = ds.dataset(str(folder), format=format_name, partitioning="hive")  # skips _hubshift/
    assert pairs(dataset.to_table(columns=["partition", "sequence_number"]).to_pylist()) == (
        EXPECTED,
        EXPECTED,
    )
    assert sorted(p.name for p in (folder / "_hubshift" / "progress").iterdir()) == ["0", "1", "3"]


def test_a_writer_killed_after_its_commit_is_finished_by_the_next_batch(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.dataset as ds

    folder = tmp_path / "parquet"
    sink = FilesSink("parquet", FilesSinkSpec(path=str(folder)), context())

    def killed(folder: object, manifest: str) -> None:
        raise SystemExit("killed between the manifest and the renames")

    with monkeypatch.context() as patched:
        patched.setattr(files, "publish", killed)
        with pytest.raises(SystemExit):
            sink.write_batch(events(spark, {"0": (0, 99)}), identity, batch({"0": (0, 99)}, 0))
    assert not list(folder.glob("part-*")), "nothing visible before the publication"
    assert len(list((folder / "_hubshift" / "pending").glob("*.json"))) == 1
    # Its replay (from an older checkpoint, other boundaries) first finishes the pending batch, then writes
    # only what the batch had not.
    sink.write_batch(events(spark, {"0": (0, 149)}), identity, batch({"0": (0, 149)}, 1))
    rows = ds.dataset(str(folder), format="parquet").to_table(columns=["partition", "sequence_number"])
    assert pairs(rows.to_pylist()) == (150, 150)
    assert not list((folder / "_hubshift" / "pending").glob("*.json"))


# --- delta ------------------------------------------------------------------------------------------------


def delta_rows(uri: str, storage_options: Mapping[str, str] | None = None) -> tuple[int, int]:
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=dict(storage_options or {}))
    return pairs(table.to_pyarrow_table(columns=["partition", "sequence_number"]).to_pylist())


def test_two_writers_of_a_partition_at_once_never_publish_a_row_twice(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old owner still finishing its batch after its lease was broken, and the new owner reading the
    same events from an older checkpoint: both build on the same progress. The first to claim publishes; the
    other writes nothing and fails its batch, which, read again, adds only what the first had not (a chaos
    run found 132 rows written twice by such a pair before the claims)."""
    import pyarrow.dataset as ds

    folder = tmp_path / "parquet"
    old, new = (FilesSink("parquet", FilesSinkSpec(path=str(folder)), context()) for _ in range(2))
    publish = files.publish
    outcome: list[str] = []

    def new_owner_meanwhile(at: object, manifest: str) -> None:
        # between the old owner's claims and its publication, the new owner writes its batch
        if not outcome:
            outcome.append("new owner ran")
            with pytest.raises(files.AnotherWriter):
                new.write_batch(events(spark, {"0": (0, 149)}), identity, batch({"0": (0, 149)}, 7))
        publish(at, manifest)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:
        # Each looked for pending manifests before the other wrote its own: neither finishes the other's.
        patched.setattr(files, "finish", lambda at, manifest: None)
        patched.setattr(files, "publish", new_owner_meanwhile)
        old.write_batch(events(spark, {"0": (0, 99)}), identity, batch({"0": (0, 99)}, 3))
    assert outcome == ["new owner ran"]
    new.write_batch(events(spark, {"0": (0, 149)}), identity, batch({"0": (0, 149)}, 8))  # read again
    rows = ds.dataset(str(folder), format="parquet").to_table(columns=["partition", "sequence_number"])
    assert pairs(rows.to_pylist()) == (150, 150)
    assert not list((folder / "_hubshift" / "pending").glob("*.json"))
    assert not list((folder / "_hubshift" / "staging").glob("*/*"))


def test_a_late_batch_never_claims_a_stretch_published_and_pruned_meanwhile(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old owner's batch builds on the progress it read at its start (99). Before it claims, the new
    owner publishes that stretch and the next (100-199, 200-249), and publishing the second prunes the
    first's claim: the old owner then finds no claim on the stretch after 99 and creates one. It must still
    lose, for the partition's progress has moved past 99 (a chaos run wrote 176 rows twice so: an owner
    draining after SIGTERM published a batch 4 s after the new owner had published two over it)."""
    import pyarrow.dataset as ds

    folder = tmp_path / "parquet"
    old, new = (FilesSink("parquet", FilesSinkSpec(path=str(folder)), context()) for _ in range(2))
    new.write_batch(events(spark, {"0": (0, 99)}), identity, batch({"0": (0, 99)}, 1))
    claim = files.claim
    outcome: list[str] = []

    def new_owner_first(at: files.HadoopFolder, document: dict[str, Any]) -> bool:
        if not outcome:  # the old owner's claim: the new owner publishes two batches first
            outcome.append("new owner ran")
            new.write_batch(events(spark, {"0": (100, 199)}), identity, batch({"0": (100, 199)}, 2))
            new.write_batch(events(spark, {"0": (200, 249)}), identity, batch({"0": (200, 249)}, 3))
            assert not (folder / files.claim_name("0", 99)).exists()  # pruned by the second
        return claim(at, document)

    with monkeypatch.context() as patched:
        patched.setattr(files, "finish", lambda at, manifest: None)  # each looked before the other wrote
        patched.setattr(files, "claim", new_owner_first)
        with pytest.raises(files.AnotherWriter):
            old.write_batch(events(spark, {"0": (100, 149)}), identity, batch({"0": (100, 149)}, 5))
    assert outcome == ["new owner ran"]
    rows = ds.dataset(str(folder), format="parquet").to_table(columns=["partition", "sequence_number"])
    assert pairs(rows.to_pylist()) == (250, 250)
    assert not list((folder / "_hubshift" / "pending").glob("*.json"))
    held = [path for path in (folder / files.CLAIMS).rglob("*") if path.is_file()]
    assert all(path.read_text() != "c-0-run-000000005" for path in held)


def test_a_claim_left_by_a_batch_that_gave_up_does_not_block_the_partition(
    spark: SparkSession, tmp_path: Path
) -> None:
    import pyarrow.dataset as ds

    folder = tmp_path / "parquet"
    sink = FilesSink("parquet", FilesSinkSpec(path=str(folder)), context())
    # A claim on the partition's first stretch whose batch has no manifest (it gave up, and a consumer
    # finishing it had claimed on its behalf meanwhile).
    orphan = folder / files.claim_name("0", -1)
    orphan.parent.mkdir(parents=True)
    orphan.write_text("c-9-run-000000001")
    sink.write_batch(events(spark, {"0": (0, 49)}), identity, batch({"0": (0, 49)}, 0))
    rows = ds.dataset(str(folder), format="parquet").to_table(columns=["partition", "sequence_number"])
    assert pairs(rows.to_pylist()) == (50, 50)


def test_two_batches_finding_the_same_orphan_claim_never_both_hold_the_stretch(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Y finds the stretch's claim orphaned; before it acts, Z (a batch with its manifest written) finds the
    same orphan and takes the stretch. Y must then find Z holding it: deleting the orphan to take it would
    have deleted Z's claim, and both would have published."""
    root = tmp_path / "parquet"
    orphan = root / files.claim_name("0", -1)
    orphan.parent.mkdir(parents=True)
    orphan.write_text("gone-batch")
    (root / files.PENDING).mkdir(parents=True)
    (root / files.PENDING / "batch-z.json").write_text("{}")  # Z's manifest, written before it claims
    folder = files.HadoopFolder(spark, str(root))
    moved_on = files.moved_on
    meanwhile: list[str | None] = []

    def z_takes_it_meanwhile(at: files.HadoopFolder, key: str, after: int) -> bool:
        if not meanwhile:
            meanwhile.append(None)  # Z's own look at the orphan goes straight through
            meanwhile[0] = files.take(folder, "0", -1, "batch-z")
        return moved_on(at, key, after)

    monkeypatch.setattr(files, "moved_on", z_takes_it_meanwhile)
    assert files.take(folder, "0", -1, "batch-y") == "batch-z"
    assert meanwhile == ["batch-z"]


def test_delta_on_a_folder_holds_every_event_once(spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaSink(DeltaSinkSpec(path=str(tmp_path / "table"), partition_by=["date"]), context())
    run_scenario(spark, lambda frame, b: sink.write_batch(frame, identity, b))
    assert delta_rows(str(tmp_path / "table")) == (EXPECTED, EXPECTED)


def test_delta_refuses_new_columns_without_merge_schema_and_adds_them_with_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    path = str(tmp_path / "table")
    DeltaSink(DeltaSinkSpec(path=path), context()).write_batch(
        events(spark, {"0": (0, 9)}), identity, batch({"0": (0, 9)}, 0)
    )

    def wider(frame: DataFrame) -> PipelineResult:
        return identity(frame.withColumn("extra", F.lit(1)))

    with pytest.raises(UserError, match=r"columns the table lacks \(extra\); set options.mergeSchema"):
        DeltaSink(DeltaSinkSpec(path=path), context()).write_batch(
            events(spark, {"0": (10, 19)}), wider, batch({"0": (10, 19)}, 1)
        )
    merging = DeltaSink(DeltaSinkSpec(path=path, options={"mergeSchema": "true"}), context())
    merging.write_batch(events(spark, {"0": (10, 19)}), wider, batch({"0": (10, 19)}, 1))
    assert delta_rows(path) == (20, 20)


def test_delta_on_azure_storage_through_hadoop_azure(spark: SparkSession, azurite: Azurite) -> None:
    """ABFS against Azurite's Blob endpoint, with the account's connection string (its key)."""
    from azure.storage.blob import BlobServiceClient

    container = "delta-abfs"
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    if not service.get_container_client(container).exists():
        service.create_container(container)
    path = f"abfs://{container}@devstoreaccount1.dfs.core.windows.net/homes"  # Azurite speaks plain http
    environ = {"HUBSHIFT_SINK_CONNECTION_STRING": azurite.connection_string}
    with pytest.raises(UserError, match="write abfs:// for a plain-http endpoint"):
        DeltaSink(
            DeltaSinkSpec(path=path.replace("abfs://", "abfss://"), partition_by=["date"]), context(environ)
        )
    sink = DeltaSink(DeltaSinkSpec(path=path, partition_by=["date"]), context(environ))
    apply_hadoop_settings(spark, sink.settings)  # what the consumer's session gets from sink.spark_conf()
    sink.check(spark)
    run_scenario(spark, lambda frame, b: sink.write_batch(frame, identity, b))
    options = {
        "account_name": ACCOUNT,
        "account_key": ACCOUNT_KEY,
        "endpoint": azurite.account_url,
        "allow_http": "true",
    }
    assert delta_rows(f"az://{container}/homes", options) == (EXPECTED, EXPECTED)


def apply_hadoop_settings(spark: SparkSession, settings: Mapping[str, str]) -> None:
    """What a consumer's session gets from `spark.hadoop.*` in the sink's spark_conf()."""
    configuration = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in settings.items():
        configuration.set(key, value)


# --- jdbc -------------------------------------------------------------------------------------------------


def test_jdbc_upserts_by_the_events_coordinates(spark: SparkSession, postgres: Postgres) -> None:
    import psycopg

    url = f"jdbc:postgresql://127.0.0.1:{postgres.port}/hubshift?user=hubshift&password={postgres.password}"
    sink = JdbcSink(JdbcSinkSpec(table="public.homes"), context({"HUBSHIFT_JDBC_URL": url}))
    sink.check(spark)
    run_scenario(spark, lambda frame, b: sink.write_batch(frame, identity, b))
    with psycopg.connect(postgres.conninfo) as connection:
        rows = connection.execute("SELECT partition, sequence_number FROM homes").fetchall()
    assert pairs([{"partition": p, "sequence_number": s} for p, s in rows]) == (EXPECTED, EXPECTED)

    def without_keys(frame: DataFrame) -> PipelineResult:
        return identity(frame.drop("sequence_number"))

    with pytest.raises(UserError, match="lack the key columns sequence_number"):
        sink.write_batch(events(spark, {"0": (0, 1)}), without_keys, batch({"0": (0, 1)}, 9))


def test_jdbc_errors_never_carry_the_url(spark: SparkSession, postgres: Postgres) -> None:
    url = f"jdbc:postgresql://127.0.0.1:{postgres.port}/hubshift?user=hubshift&password=wrong-secret-value"
    sink = JdbcSink(JdbcSinkSpec(table="homes"), context({"HUBSHIFT_JDBC_URL": url}))
    with pytest.raises(UserError) as refused:
        sink.check(spark)
    assert "wrong-secret-value" not in str(refused.value)
    assert "cannot connect" in str(refused.value)


# --- foreachBatch -----------------------------------------------------------------------------------------


def record_batch(frame: DataFrame, told: Any) -> None:
    CALLS.append((told.id, dict(told.ranges), frame.count()))


def test_foreach_batch_is_told_the_ranges_and_a_stable_id(spark: SparkSession) -> None:
    CALLS.clear()
    sink = ForeachBatchSink(ForeachBatchSinkSpec(function=f"{__name__}:record_batch"), context())
    run_scenario(spark, lambda frame, b: sink.write_batch(frame, identity, b))
    (first_id, first, first_rows), (again_id, _, _), (other_id, other, other_rows) = CALLS
    assert first == {"0": (0, 99), "1": (0, 49)} and first_rows == 150
    assert again_id == first_id != other_id  # the same events, the same id; at least once across cuts
    assert other == {"0": (50, 149), "1": (40, 79), "3": (0, 4)} and other_rows == 145


def test_foreach_batch_refuses_a_function_of_the_wrong_shape() -> None:
    with pytest.raises(UserError, match="must take two arguments \\(DataFrame, batch\\)"):
        ForeachBatchSink(ForeachBatchSinkSpec(function="json:dumps"), context())
