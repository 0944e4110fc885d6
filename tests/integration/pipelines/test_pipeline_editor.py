"""The editor pattern on real PySpark against the emulator: Python's steps before replicate in the forwarding
task itself (one Spark job), dedupe across batches, invalid events as dead letters with the reason; Spark's
steps (a user's function, a SQL filter) before a route, with an event the function fails on isolated; and
one `hubshift consume` that gunzips, validates, filters and routes (no second consumer)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hubshift.consumer.spark.batch import process_batch
from hubshift.emulator.launch import RunningEmulator
from hubshift.pipelines import PipelineSpec, build_pipeline
from hubshift.pipelines.base import EditingPipeline, TaskPipeline
from hubshift.pipelines.replicate import DEFAULT_REPLICATE_ENV
from hubshift.sinks import FileSink, FolderStore
from tests.fixtures.consumer import ConsumerPool, consumer_environ, consumer_manifest
from tests.fixtures.hubs import read_hub, send_events
from tests.fixtures.spark import event_row

pytestmark = pytest.mark.timeout(600)

SCHEMA = {
    "type": "object",
    "required": ["id", "temperature"],
    "properties": {"id": {"type": "string"}, "temperature": {"type": "number"}},
}


def dead_letters(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((folder / "dead-letter").rglob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def test_python_steps_run_in_the_forwarding_task_and_dedupe_spans_batches(
    event_frame: Callable[..., Any], emulator_factory: Callable[..., RunningEmulator], tmp_path: Path
) -> None:
    emulator = emulator_factory(["target:2"])
    spec = PipelineSpec.model_validate(
        {
            "type": "replicate",
            "replicate": {"hub": "target"},
            "editor": [
                {"gunzip": {}},
                {"validate": {"jsonSchema": SCHEMA}},
                {"dedupe": {"key": {"json": "id"}, "windowSeconds": 600}},
                {
                    "enrich": {
                        "key": {"partitionKey": True},
                        "table": {"h1": {"city": "Oslo"}},
                        "into": "site",
                    }
                },
                {"select": {"id": "id", "celsius": "temperature", "city": "site.city"}},
            ],
        }
    )
    store = FolderStore(tmp_path)
    pipeline = build_pipeline(spec, {DEFAULT_REPLICATE_ENV: emulator.connection_string}, state=store)
    assert isinstance(pipeline, TaskPipeline) and not isinstance(pipeline, EditingPipeline)
    sink = FileSink(store, FolderStore(tmp_path / "dead-letter"))
    first = [
        event_row("0", 1, gzip.compress(body(id="a", temperature=20)), partition_key="h1"),
        event_row("0", 2, gzip.compress(body(id="a", temperature=21)), partition_key="h1"),  # a repeat
        event_row("0", 3, gzip.compress(body(id="b", temperature="hot")), partition_key="h1"),
        event_row("0", 4, b"not gzip", partition_key="h1"),
    ]
    summary = process_batch(event_frame(first), 0, "editor", pipeline, sink)
    assert summary.events == 4 and summary.dead_letters == 2
    second = [
        event_row("0", 5, gzip.compress(body(id="a", temperature=22)), partition_key="h1"),  # a repeat
        event_row("0", 6, gzip.compress(body(id="c", temperature=23)), partition_key="h2"),
    ]
    process_batch(event_frame(second), 1, "editor", pipeline, sink)

    received = read_hub(emulator, "target", 2)
    assert [json.loads(e["body"]) for e in received if e["key"] == "h1"] == [
        {"id": "a", "celsius": 20, "city": "Oslo"}
    ]
    assert [json.loads(e["body"]) for e in received if e["key"] == "h2"] == [{"id": "c", "celsius": 23}]
    assert len(received) == 2
    reasons = {d["sequenceNumber"]: d["reason"] for d in dead_letters(tmp_path)}
    assert reasons[3].startswith("validate: the body does not match the JSON Schema at temperature")
    assert reasons[4] == "gunzip: the body is not gzip data"


def test_spark_steps_before_a_route_isolate_the_event_a_function_fails_on(
    event_frame: Callable[..., Any], emulator_factory: Callable[..., RunningEmulator], tmp_path: Path
) -> None:
    emulator = emulator_factory(["hot:2", "cold:2"])
    spec = PipelineSpec.model_validate(
        {
            "type": "route",
            "route": {
                "targets": [{"name": "hot", "hub": "hot"}, {"name": "cold", "hub": "cold"}],
                "rules": [{"json": {"path": "temperature", "regex": "^[3-9][0-9]"}, "to": ["hot"]}],
                "defaultTarget": "cold",
            },
            "editor": [
                {"function": "tests.fixtures.editing:checked"},
                {"filter": "partition_key <> 'skip'"},
                {"select": {"id": "id", "temperature": "temperature", "checked": "checked"}},
            ],
        }
    )
    pipeline = build_pipeline(spec, {DEFAULT_REPLICATE_ENV: emulator.connection_string})
    assert isinstance(pipeline, EditingPipeline)
    sink = FileSink(FolderStore(tmp_path), FolderStore(tmp_path / "dead-letter"))
    rows = [
        event_row("0", 1, body(id="a", temperature=35, noise=1), partition_key="k"),
        event_row("0", 2, body(id="b", temperature=10), partition_key="k"),
        event_row("0", 3, body(id="c", temperature=50, poison=True), partition_key="k"),
        event_row("0", 4, body(id="d", temperature=40), partition_key="skip"),
        event_row("1", 9, body(id="e", temperature=12), partition_key="bad"),
        event_row("1", 10, body(id="f", temperature=31), partition_key="k2"),
    ]
    summary = process_batch(event_frame(rows), 0, "editor", pipeline, sink)

    # Every event read counts, whatever the steps did with it.
    assert (
        summary.partitions["0"].last_sequence_number == 4
        and summary.partitions["1"].last_sequence_number == 10
    )
    hot = [json.loads(e["body"]) for e in read_hub(emulator, "hot", 2)]
    cold = [json.loads(e["body"]) for e in read_hub(emulator, "cold", 1)]
    assert sorted(e["id"] for e in hot) == ["a", "f"] and [e["id"] for e in cold] == ["b"]
    assert all(e["checked"] is True and set(e) == {"id", "temperature", "checked"} for e in hot + cold)
    reasons = {d["sequenceNumber"]: d["reason"] for d in dead_letters(tmp_path)}
    assert reasons[9] == "the key is bad"
    assert reasons[3].startswith("the pipeline fails on this event:") and "cannot check event c" in reasons[3]
    assert set(reasons) == {3, 9}


def test_one_consumer_gunzips_validates_filters_and_routes(
    emulator_factory: Callable[..., RunningEmulator], consumer_pool: ConsumerPool, tmp_path: Path
) -> None:
    emulator = emulator_factory(["hub:2", "alarms:2", "rest:2"])
    consumer_pool.environ = {
        **consumer_environ(emulator.connection_string),
        DEFAULT_REPLICATE_ENV: emulator.connection_string,
    }
    manifest = consumer_manifest(
        tmp_path / "editor.yaml",
        store={"sqlite": {"path": str(tmp_path / "store.db")}},
        sink=tmp_path / "sink",
        consumer={
            "pipeline": {
                "type": "route",
                "editor": [
                    {"gunzip": {}},
                    {"validate": {"jsonSchema": SCHEMA}},
                    {"filter": "get_json_object(cast(body as string), '$.id') not like 'test-%'"},
                ],
                "route": {
                    "targets": [{"name": "alarms", "hub": "alarms"}, {"name": "rest", "hub": "rest"}],
                    "rules": [{"property": {"name": "kind", "equals": "alarm"}, "to": ["alarms"]}],
                    "defaultTarget": "rest",
                },
            }
        },
    )
    consumer = consumer_pool.start(manifest, "editor-0")
    events = []
    for n in range(60):
        kind = "alarm" if n % 3 == 0 else "motion"
        document = body(id=f"test-{n}" if n % 10 == 9 else f"e{n}", temperature=n)
        events.append((f"h{n % 4}", gzip.compress(document), {"kind": kind}))
    events.append(("h0", gzip.compress(body(id="x")), {"kind": "alarm"}))  # no temperature: a dead letter
    send_events(emulator, "hub", events)

    kept = [n for n in range(60) if n % 10 != 9]
    alarms = read_hub(emulator, "alarms", sum(1 for n in kept if n % 3 == 0), timeout=180)
    rest = read_hub(emulator, "rest", sum(1 for n in kept if n % 3 != 0), timeout=60)
    assert sorted(json.loads(e["body"])["temperature"] for e in alarms) == [n for n in kept if n % 3 == 0]
    assert sorted(json.loads(e["body"])["temperature"] for e in rest) == [n for n in kept if n % 3 != 0], (
        consumer.log()[-3000:]
    )
    for key in ("h0", "h1", "h2", "h3"):  # each stream in its order at each target
        for hub in (alarms, rest):
            temperatures = [json.loads(e["body"])["temperature"] for e in hub if e["key"] == key]
            assert temperatures == sorted(temperatures)
    (dead,) = dead_letters(tmp_path / "sink")
    assert dead["reason"].startswith("validate:") and dead["partitionKey"] == "h0"
