"""What a person gets wrong starting their own Spark job (`hubshift consume`): a module that does not
import, a function of the wrong shape, an unknown sink option, a path the consumer cannot write. Each is
one line naming what to fix, a non-zero exit, no traceback and no secret, before any partition is
claimed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hubshift.emulator.launch import RunningEmulator
from hubshift.sinks.spark_writer import RESERVED
from tests.fixtures.consumer import consume_to_exit, consumer_environ, consumer_manifest, error_line
from tests.harness.azurite import Azurite

pytestmark = pytest.mark.timeout(300)

JOBS = """
def enrich(frame):
    return frame

def write(frame):
    pass

def batch_of(events):
    return events.sparkSession.range(3)

def counts_without_a_watermark(events):
    return events.groupBy("partition").count()
"""


def job(tmp_path: Path, pipeline: dict[str, Any], sink: dict[str, Any], **consumer: Any) -> Path:
    """A manifest for one consumer of hub `hub`: its code from `tmp_path/job` (jobs.py), `pipeline` into
    `sink`, the ownership in a SQLite file."""
    code = tmp_path / "job"
    code.mkdir(exist_ok=True)
    (code / "jobs.py").write_text(JOBS)
    (code / "broken_jobs.py").write_text(
        "import jobs_missing_dependency\n\ndef enrich(frame):\n    return frame\n"
    )
    return consumer_manifest(
        tmp_path / "consumer.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        consumer={"pipeline": pipeline, "sink": sink, "code": {"path": str(code)}, **consumer},
    )


def nothing_claimed(tmp_path: Path) -> bool:
    """No partition's lease was taken (the SQLite store's `blobs`; the file may not even exist)."""
    store = tmp_path / "store.db"
    if not store.exists():
        return True
    with sqlite3.connect(store) as connection:
        leased = connection.execute(
            "SELECT name FROM blobs WHERE name LIKE '%/checkpoint/%' AND lease_state != 'available'"
        ).fetchall()
    return leased == []


def test_an_unknown_sink_option_and_an_option_hubshift_sets(tmp_path: Path) -> None:
    sink = {"type": "delta", "delta": {"path": str(tmp_path / "table"), "partitonBy": ["day"]}}
    manifest = job(tmp_path, {"type": "events"}, sink)
    code, stderr = consume_to_exit(manifest, {}, tmp_path)
    assert code != 0
    assert error_line(stderr).endswith(
        "spec.consumer.sink.delta.partitonBy: unknown field (did you mean partitionBy?)"
    )
    sink = {"type": "parquet", "parquet": {"path": str(tmp_path / "table"), "options": {"mode": "overwrite"}}}
    code, stderr = consume_to_exit(job(tmp_path, {"type": "events"}, sink), {}, tmp_path)
    assert code != 0 and error_line(stderr).endswith(f"spec.consumer.sink.parquet: {RESERVED}")


def test_a_code_folder_that_is_not_there(tmp_path: Path) -> None:
    manifest = job(tmp_path, {"type": "function", "function": "jobs:enrich"}, {"type": "folder"})
    text = manifest.read_text().replace(str(tmp_path / "job"), str(tmp_path / "nowhere"))
    manifest.write_text(text)
    code, stderr = consume_to_exit(manifest, {}, tmp_path)
    assert code != 0
    assert (
        error_line(stderr)
        == f"hubshift: error: spec.consumer.code.path: {tmp_path / 'nowhere'} is not a folder"
    )


def test_a_foreach_batch_function_of_the_wrong_shape(emulator_factory: Any, tmp_path: Path) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])
    sink = {"type": "foreachBatch", "foreachBatch": {"function": "jobs:write"}}
    manifest = job(tmp_path, {"type": "events"}, sink)
    code, stderr = consume_to_exit(manifest, consumer_environ(emulator.connection_string), tmp_path)
    assert code != 0
    assert error_line(stderr) == (
        "hubshift: error: foreachBatch jobs:write: the function must take two arguments (DataFrame, batch)"
    )
    assert nothing_claimed(tmp_path)


def test_a_streaming_job_that_returns_a_batch_or_cannot_run_in_its_output_mode(
    emulator_factory: Any, spark_jars: str, tmp_path: Path
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])
    environ = {**consumer_environ(emulator.connection_string), "HUBSHIFT_SPARK_JARS": spark_jars}
    sink = {"type": "delta", "delta": {"path": str(tmp_path / "table")}}
    manifest = job(tmp_path, {"type": "stream", "stream": {"function": "jobs:batch_of"}}, sink)
    code, stderr = consume_to_exit(manifest, environ, tmp_path)
    assert code != 0
    assert error_line(stderr) == (
        "hubshift: error: stream function jobs:batch_of returned a batch DataFrame: return the events' "
        "streaming DataFrame, transformed (a join with a table is fine: the stream's side stays streaming)"
    )
    manifest = job(
        tmp_path, {"type": "stream", "stream": {"function": "jobs:counts_without_a_watermark"}}, sink
    )
    code, stderr = consume_to_exit(manifest, environ, tmp_path)
    assert code != 0
    line = error_line(stderr)
    assert line.startswith(
        "hubshift: error: stream jobs:counts_without_a_watermark: Spark cannot run it in outputMode append: "
    ), line
    assert "watermark" in line and "\n" not in line
    assert nothing_claimed(tmp_path)


def test_a_pipeline_module_that_does_not_import_and_a_path_that_cannot_be_written(
    emulator_factory: Any, spark_jars: str, tmp_path: Path
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])
    environ = {**consumer_environ(emulator.connection_string), "HUBSHIFT_SPARK_JARS": spark_jars}
    blocked = tmp_path / "a-file"
    blocked.write_text("a file where the table's folder would go")
    table = blocked / "homes"
    function = {"type": "function", "function": "broken_jobs:enrich"}
    manifest = job(tmp_path, function, {"type": "parquet", "parquet": {"path": str(tmp_path / "out")}})
    code, stderr = consume_to_exit(manifest, environ, tmp_path)
    assert code != 0
    assert error_line(stderr) == (
        "hubshift: error: pipeline function 'broken_jobs:enrich': importing broken_jobs failed: no module "
        "named 'jobs_missing_dependency'"
    )
    manifest = job(tmp_path, {"type": "events"}, {"type": "delta", "delta": {"path": str(table)}})
    code, stderr = consume_to_exit(manifest, environ, tmp_path)
    assert code != 0
    line = error_line(stderr)
    assert line == (
        f"hubshift: error: sink delta: cannot write {table}: ParentNotDirectoryException: Parent path is not "
        f"a directory: {blocked}"
    )
    assert nothing_claimed(tmp_path)


def test_an_azure_path_whose_key_is_refused_never_shows_the_key(
    emulator_factory: Any, azurite: Azurite, blob_container: str, spark_jars: str, tmp_path: Path
) -> None:
    emulator: RunningEmulator = emulator_factory(["hub:2"])
    key = azurite.connection_string.split("AccountKey=")[1].split(";")[0]
    wrong = "d3Jvbmcta2V5LWZvci10aGUtdGVzdA=="
    lake = azurite.connection_string.replace(key, wrong)
    environ = {
        **consumer_environ(emulator.connection_string),
        "HUBSHIFT_SPARK_JARS": spark_jars,
        "LAKE": lake,
    }
    path = f"abfs://{blob_container}@devstoreaccount1.dfs.core.windows.net/homes"
    sink = {"type": "delta", "delta": {"path": path, "connectionStringEnv": "LAKE"}}
    code, stderr = consume_to_exit(job(tmp_path, {"type": "events"}, sink), environ, tmp_path)
    assert code != 0
    assert error_line(stderr).startswith(
        f"hubshift: error: sink delta: cannot write {path}: AccessDeniedException: Operation failed: "
        '"Server failed to authenticate the request.'
    )
    assert wrong not in stderr and wrong[:12] not in stderr and key not in stderr
    assert nothing_claimed(tmp_path)
