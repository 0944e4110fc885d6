"""The manifest of your own Spark job: `consumer.code` (its files without rebuilding the image), the rule
that a sink Spark writes takes a DataFrame pipeline, `spark.conf` passed through and `spark.ui`; each
refusal one line naming the field, the same in the model and in the CRD."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.errors import UserError
from hubshift.manifest import (
    CODE_DIR,
    FRAMES_ONLY,
    STREAM_SINKS,
    UI_PORT_TAKEN,
    UPDATE_MODE,
    CodeSpec,
    ConsumerSpec,
    parse_manifest,
)
from hubshift.operator.kubernetes import crd
from hubshift.pipelines import PIPELINES
from hubshift.sinks import SINKS
from hubshift.spec import OWN_SPARK_CONF, SparkSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "homes.yaml"
WRITER_SINKS = {
    "delta": {"path": "/data/t"},
    "parquet": {"path": "/data/p"},
    "json": {"path": "/data/j"},
    "jdbc": {"table": "orders"},
    "foreachBatch": {"function": "jobs:write"},
}
FRAME_PIPELINES = {"function": {"type": "function", "function": "jobs:enrich"}, "events": {"type": "events"}}
LINE_PIPELINES = {
    "aggregate": {"type": "aggregate"},
    "replicate": {"type": "replicate", "replicate": {"hub": "copy"}},
    "projection": {"type": "projection", "projection": {"table": "t"}},
}


def document(consumer: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    loaded["spec"]["consumer"].update(consumer)
    return loaded


def refusal(consumer: dict[str, Any]) -> str:
    with pytest.raises(UserError) as refused:
        parse_manifest(document(consumer))
    message = str(refused.value)
    assert "\n" not in message
    return message


# --- consumer.code ------------------------------------------------------------------------------------


def test_the_code_folder_is_the_configmaps_mount_or_a_path() -> None:
    assert CodeSpec().folder() is None
    assert CodeSpec(config_map="orders-job").folder() == CODE_DIR == "/opt/hubshift/code"
    assert CodeSpec(path="/home/me/job").folder() == "/home/me/job"
    consumer = parse_manifest(document({"code": {"configMap": "orders-job"}}))
    assert consumer.spec.consumer.code.config_map == "orders-job"


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            {"configMap": "orders-job", "path": "/x"},
            "manifest: spec.consumer.code: set configMap or path, not both",
        ),
        ({"configMap": "Orders_Job"}, "spec.consumer.code.configMap: String should match pattern"),
        ({"configMap": "a" * 254}, "spec.consumer.code.configMap: String should have at most 253 characters"),
        ({"path": ""}, "spec.consumer.code.path: String should have at least 1 character"),
        ({"zip": "job.zip"}, "spec.consumer.code.zip: unknown field"),
    ],
)
def test_a_bad_code_block_is_one_line(code: dict[str, Any], expected: str) -> None:
    assert expected in refusal({"code": code})


# --- a sink Spark writes takes a DataFrame pipeline ---------------------------------------------------


@pytest.mark.parametrize("sink", sorted(WRITER_SINKS))
@pytest.mark.parametrize("pipeline", sorted(FRAME_PIPELINES))
def test_a_spark_sink_takes_function_or_events(sink: str, pipeline: str) -> None:
    consumer = parse_manifest(
        document({"pipeline": FRAME_PIPELINES[pipeline], "sink": {"type": sink, sink: WRITER_SINKS[sink]}})
    )
    assert not consumer.spec.consumer.sink.kind.writes_lines


@pytest.mark.parametrize("sink", sorted(WRITER_SINKS))
@pytest.mark.parametrize("pipeline", sorted(LINE_PIPELINES))
def test_a_spark_sink_refuses_a_pipeline_of_lines(sink: str, pipeline: str) -> None:
    message = refusal(
        {"pipeline": LINE_PIPELINES[pipeline], "sink": {"type": sink, sink: WRITER_SINKS[sink]}}
    )
    assert message == f"manifest: spec.consumer: {FRAMES_ONLY}"


def test_the_default_pipeline_and_sink_keep_working_together() -> None:
    consumer = parse_manifest(document({"sink": {"type": "folder", "folder": {"path": "/data/out"}}}))
    assert consumer.spec.consumer.pipeline.type == "aggregate"
    for pipeline in FRAME_PIPELINES.values():  # a DataFrame pipeline writes JSON lines into a folder too
        parse_manifest(document({"pipeline": pipeline, "sink": {"type": "folder"}}))


def test_the_crds_rule_names_the_same_sinks_and_pipelines_as_the_model() -> None:
    (rule,) = [r for r in ConsumerSpec.cel_rules() if r["message"] == FRAMES_ONLY]
    writers = {kind.name for kind in SINKS if not kind.writes_lines}
    frames = {kind.name for kind in PIPELINES if kind.shape == "frames"}
    assert writers == set(WRITER_SINKS) and frames == set(FRAME_PIPELINES)
    for name in writers | frames:
        assert f"'{name}'" in rule["rule"]
    for kind in SINKS:
        if kind.writes_lines:
            assert f"'{kind.name}'" not in rule["rule"]
    consumer_schema = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = consumer_schema["properties"]["spec"]["properties"]["consumer"]["x-kubernetes-validations"]
    assert rule in rules


# --- a streaming job goes into a sink Spark writes, update mode by key ----------------------------------

STREAM = {"type": "stream", "stream": {"function": "jobs:windows"}}


@pytest.mark.parametrize("sink", sorted(WRITER_SINKS))
def test_a_streaming_job_goes_into_any_sink_spark_writes(sink: str) -> None:
    consumer = parse_manifest(
        document({"pipeline": STREAM, "sink": {"type": sink, sink: WRITER_SINKS[sink]}})
    )
    job = consumer.spec.consumer.pipeline
    assert job.kind.shape == "stream" and job.block.output_mode == "append" and job.block.name == "stream"


def test_a_streaming_job_into_a_sink_hubshift_writes_is_refused_at_apply_and_at_start() -> None:
    assert (
        refusal({"pipeline": STREAM, "sink": {"type": "folder"}})
        == f"manifest: spec.consumer: {STREAM_SINKS}"
    )
    (rule,) = [r for r in ConsumerSpec.cel_rules() if r["message"] == STREAM_SINKS]
    assert "'folder'" not in rule["rule"] and "'delta'" in rule["rule"]


@pytest.mark.parametrize(
    ("sink", "keys", "accepted"),
    [
        ("delta", ["home_id", "window_start"], True),
        ("delta", [], False),
        ("jdbc", ["home_id"], True),
        ("parquet", ["home_id"], False),
        ("json", [], False),
        ("foreachBatch", [], True),
    ],
)
def test_update_mode_goes_where_rows_can_be_upserted(sink: str, keys: list[str], accepted: bool) -> None:
    job = {**STREAM, "stream": {**STREAM["stream"], "outputMode": "update", "keyColumns": keys}}  # type: ignore[dict-item]
    consumer = {"pipeline": job, "sink": {"type": sink, sink: WRITER_SINKS[sink]}}
    if accepted:
        parse_manifest(document(consumer))
    else:
        assert refusal(consumer) == f"manifest: spec.consumer: {UPDATE_MODE}"
    (rule,) = [r for r in ConsumerSpec.cel_rules() if r["message"] == UPDATE_MODE]
    assert rule["fieldPath"] == ".pipeline.stream.outputMode"


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        ({"function": "no reference"}, "spec.consumer.pipeline.stream.function: String should match pattern"),
        ({"function": "jobs:w", "outputMode": "complete"}, "spec.consumer.pipeline.stream.outputMode"),
        ({"function": "jobs:w", "name": "Bad Name"}, "spec.consumer.pipeline.stream.name"),
        ({"function": "jobs:w", "state": {"path": "/s", "credential": {"type": "default"}}}, "abfss://"),
    ],
)
def test_a_bad_stream_block_is_one_line(stream: dict[str, Any], expected: str) -> None:
    consumer = {
        "pipeline": {"type": "stream", "stream": stream},
        "sink": {"type": "delta", "delta": {"path": "/t"}},
    }
    assert expected in refusal(consumer)


# --- spark.conf and spark.ui --------------------------------------------------------------------------


def test_spark_conf_passes_other_settings_through() -> None:
    conf = {"spark.sql.session.timeZone.x": "1", "spark.executor.memory": "2g", "spark.delta.logStore.x": "y"}
    consumer = parse_manifest(document({"spark": {"conf": conf}}))
    assert consumer.spec.consumer.spark.conf == conf


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        (
            {"hadoop.fs.x": "y"},
            "spec.consumer.spark: conf: 'hadoop.fs.x' is not a Spark setting (they start with",
        ),
        (
            {"spark.app.name": "mine"},
            "spec.consumer.spark: conf: spark.app.name cannot be set here: hubshift sets it",
        ),
        ({"spark.local.dir": "/x"}, "conf: spark.local.dir cannot be set here: hubshift sets it"),
        ({"spark.driver.extraClassPath": "/x"}, "conf: spark.driver.extraClassPath cannot be set here"),
        (
            {"spark.executor.memory": 2},
            "spec.consumer.spark.conf.spark.executor.memory: Input should be a valid",
        ),
    ],
)
def test_spark_conf_refusals_are_one_line(conf: dict[str, Any], expected: str) -> None:
    assert expected in refusal({"spark": {"conf": conf}})


@pytest.mark.parametrize("key", sorted(OWN_SPARK_CONF))
def test_every_setting_hubshift_owns_is_refused_in_conf(key: str) -> None:
    message = refusal({"spark": {"conf": {key: "x"}}})
    assert f"conf: {key} cannot be set here" in message
    rule = SparkSpec.cel_rules()[0]["rule"]
    assert f"'{key}'" in rule  # ...and by the API server


def test_the_spark_ui_is_off_unless_asked_for() -> None:
    ui = parse_manifest(document({})).spec.consumer.spark.ui
    assert (ui.enabled, ui.port) == (False, 4040)
    ui = parse_manifest(document({"spark": {"ui": {"enabled": True, "port": 4050}}})).spec.consumer.spark.ui
    assert (ui.enabled, ui.port) == (True, 4050)
    assert "spec.consumer.spark.ui.port: Input should be greater than or equal to 1024" in refusal(
        {"spark": {"ui": {"enabled": True, "port": 80}}}
    )
    assert "spec.consumer.spark.ui.enabled: Input should be a valid boolean" in refusal(
        {"spark": {"ui": {"enabled": "sometimes"}}}
    )


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("spark.master", "spec.consumer.spark.master"),
        ("spark.driver.memory", "spec.consumer.spark.driverMemory"),
        ("spark.sql.shuffle.partitions", "spec.consumer.spark.shufflePartitions"),
        ("spark.ui.enabled", "spec.consumer.spark.ui.enabled"),
        ("spark.ui.port", "spec.consumer.spark.ui.port"),
    ],
)
def test_a_setting_with_a_field_of_its_own_names_the_field(key: str, field: str) -> None:
    # "set spark.master instead" would send a person back to the key they just wrote
    message = refusal({"spark": {"conf": {key: "x"}}})
    assert message.endswith(f"conf: {key} cannot be set here: set {field} instead")


def test_the_spark_ui_and_the_metrics_need_ports_of_their_own() -> None:
    # On one port, the consumer's HTTP server (started first) keeps it, Spark's UI moves to the next one
    # unannounced, and `kubectl port-forward` to the UI's port reaches the metrics instead.
    message = refusal({"metricsPort": 4040, "spark": {"ui": {"enabled": True}}})
    assert message == f"manifest: spec.consumer: {UI_PORT_TAKEN}"
    assert "spec.consumer" in refusal({"spark": {"ui": {"enabled": True, "port": 9090}}})
    parse_manifest(document({"metricsPort": 4040}))  # the UI is off: its port is nobody's
    parse_manifest(document({"metricsPort": 4040, "spark": {"ui": {"enabled": True, "port": 4041}}}))
