"""A manifest's errors as a person reads them: a YAML error names its line, column and the parser's reason;
a manifest with several problems lists every one, one line each, with the line it is on; no secret and no
traceback reaches the terminal, and the command exits non-zero."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hubshift.errors import UserError
from hubshift.manifest import load_manifest, parse_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "homes.yaml"

# Three problems, on lines 8, 17 and 23; the connection string on line 9 must never be echoed.
THREE_PROBLEMS = """\
apiVersion: hubshift.dev/v1alpha1
kind: PartitionedConsumer
metadata:
  name: homes
spec:
  eventHubs:
    hub: telemetry
    bogus: 1
    connectionStringEnv: SharedAccessKey=s3cr3t-value
  checkpointStore:
    blob:
      container: homes-checkpoints
      connectionStringEnv: STORE
  consumer:
    pipeline:
      type: aggregate
      aggregate: {windowSeconds: -1, eventTypes: [alarm]}
    sink:
      type: folder
      folder: {path: /tmp/out}
  scaling:
    maxReplicas: 16
    minReplicas: many
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    manifest = tmp_path / "pcon.yaml"
    manifest.write_text(text)
    with pytest.raises(UserError) as error:
        load_manifest(manifest)
    return str(error.value).splitlines()


def test_every_validation_problem_is_listed_with_its_line(tmp_path: Path) -> None:
    lines = problems(tmp_path, THREE_PROBLEMS)
    file = tmp_path / "pcon.yaml"
    assert lines[0] == f"{file}:8: spec.eventHubs.bogus: unknown field"
    assert lines[1].startswith(f"{file}:17: spec.consumer.pipeline.aggregate.windowSeconds: ")
    assert lines[2].startswith(f"{file}:23: spec.scaling.minReplicas: ")
    assert len(lines) == 3
    assert not any("more problem" in line for line in lines)


def test_a_missing_field_names_the_line_of_the_block_it_belongs_in(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("    hub: telemetry\n", "")
    [line] = problems(tmp_path, text)
    block = next(n for n, row in enumerate(text.splitlines(), 1) if row.startswith("  eventHubs:"))
    assert line == f"{tmp_path / 'pcon.yaml'}:{block}: spec.eventHubs.hub: required field is missing"


def test_a_document_without_lines_lists_every_problem_without_them() -> None:
    document = {"apiVersion": "hubshift.dev/v1alpha1", "kind": "PartitionedConsumer", "metadata": {}}
    with pytest.raises(UserError) as error:
        parse_manifest(document)
    assert str(error.value).splitlines() == [
        "manifest: metadata.name: required field is missing",
        "manifest: spec: required field is missing",
    ]


@pytest.mark.parametrize(
    ("text", "where", "reason"),
    [
        ("spec:\n  a: 1\n b: 2\n", ":3:2:", "expected <block end>"),
        ("spec: [unclosed\n", ":2:1:", "expected ',' or ']'"),
        ("a: b: c\n", ":1:5:", "mapping values are not allowed here"),
        ('kind: x\nkey: "SharedAccessKey=s3cr3t-value\n', ":3:1:", "found unexpected end of stream"),
    ],
)
def test_a_yaml_error_names_its_line_and_reason(tmp_path: Path, text: str, where: str, reason: str) -> None:
    [line] = problems(tmp_path, text)
    assert line.startswith(f"{tmp_path / 'pcon.yaml'}{where} not valid YAML: ")
    assert reason in line
    assert "s3cr3t" not in line  # the parser's snippet of the file is never shown


def test_the_command_line_prints_one_line_per_problem_and_no_traceback(tmp_path: Path) -> None:
    manifest = tmp_path / "pcon.yaml"
    manifest.write_text(THREE_PROBLEMS)
    done = subprocess.run(
        [sys.executable, "-c", "from hubshift.cli import main; main()", "run", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"hubshift: error: {manifest}:") for line in lines), lines
    assert "Traceback" not in done.stderr and "s3cr3t" not in done.stderr


def test_an_unknown_field_says_what_it_probably_meant() -> None:
    """A Spark team's Kafka-source option names hubshift's field for it; a misspelt field names the block's
    field spelt most like it, also inside a sink's block; a name like nothing gets no guess."""
    written = THREE_PROBLEMS.replace("    bogus: 1\n", "    consumerGroupp: readers\n").replace(
        "    minReplicas: many\n", "    minReplica: 2\n"
    )
    written = written.replace("      folder: {path: /tmp/out}\n", "      folder: {pathh: /tmp/out}\n")
    written = written.replace(
        "  consumer:\n",
        "  consumer:\n    spark:\n      maxOffsetsPerTrigger: 5000\n      includeHeaders: true\n"
        "    startingOffsets: latest\n",
    )
    with pytest.raises(UserError) as error:
        load_manifest_text(written)
    lines = [line.split(": ", 1)[1] for line in str(error.value).splitlines()]
    assert "spec.eventHubs.consumerGroupp: unknown field (did you mean consumerGroup?)" in lines
    assert "spec.scaling.minReplica: unknown field (did you mean minReplicas?)" in lines
    assert "spec.consumer.sink.folder.pathh: unknown field (did you mean path?)" in lines
    assert (
        "spec.consumer.spark.maxOffsetsPerTrigger: unknown field (Spark's Kafka source option; here: "
        "spec.consumer.spark.maxEventsPerTrigger (events per batch, all partitions))"
    ) in lines
    assert any(
        line.startswith("spec.consumer.startingOffsets: unknown field (Spark's Kafka") for line in lines
    )
    assert any(
        line.startswith("spec.consumer.spark.includeHeaders: unknown field (Spark's Kafka")
        and "includeSystemProperties" in line
        for line in lines
    )
    assert "s3cr3t" not in str(error.value)

    written = THREE_PROBLEMS.replace("    bogus: 1\n", "    zzzqqq: 1\n")
    with pytest.raises(UserError) as error:
        load_manifest_text(written)
    assert "spec.eventHubs.zzzqqq: unknown field\n" in str(error.value) + "\n"


def load_manifest_text(text: str) -> None:
    parse_manifest(yaml.safe_load(text))
