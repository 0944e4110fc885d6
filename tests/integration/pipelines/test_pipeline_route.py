"""The route pipeline on real PySpark against the emulator: the pattern's own example (even sequence numbers
to one hub, odd to another), rules on the partition key, a property, a JSON field and a SQL expression Spark
evaluates, `match: all` sending one event to several hubs, a default target or dropping, and a SQL
expression that fails on one event isolating that event only."""

from __future__ import annotations

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
from tests.fixtures.hubs import read_hub
from tests.fixtures.spark import event_row

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def hubs(emulator_factory: Callable[..., RunningEmulator]) -> RunningEmulator:
    return emulator_factory(["dest1:2", "dest2:2", "other:2"])


def route(emulator: RunningEmulator, **route: Any) -> Any:
    spec = PipelineSpec.model_validate(
        {
            "type": "route",
            "route": {
                "targets": [{"name": n, "hub": n} for n in ("dest1", "dest2", "other")],
                **route,
            },
        }
    )
    return build_pipeline(spec, {DEFAULT_REPLICATE_ENV: emulator.connection_string})


def dead_letters(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((folder / "dead-letter").rglob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def sink(folder: Path) -> FileSink:
    return FileSink(FolderStore(folder), FolderStore(folder / "dead-letter"))


def test_even_and_odd_sequence_numbers_go_to_two_hubs(
    event_frame: Callable[..., Any], hubs: RunningEmulator, tmp_path: Path
) -> None:
    # The routing pattern's example: SequenceNumber % 2 == 0 to dest1, the others to dest2.
    pipeline = route(
        hubs,
        rules=[
            {"sequenceNumber": {"modulo": 2, "remainder": 0}, "to": ["dest1"]},
            {"sequenceNumber": {"modulo": 2, "remainder": 1}, "to": ["dest2"]},
        ],
    )
    assert isinstance(pipeline, TaskPipeline) and not isinstance(pipeline, EditingPipeline)
    rows = [event_row("0", n, f"e{n}".encode(), partition_key=f"k{n % 3}") for n in range(40)]
    rows += [event_row("1", n, f"f{n}".encode()) for n in range(10)]
    summary = process_batch(event_frame(rows), 0, "router", pipeline, sink(tmp_path))

    assert summary.events == 50 and summary.dead_letters == 0
    even, odd = read_hub(hubs, "dest1", 25), read_hub(hubs, "dest2", 25)
    assert sorted(int(e["properties"]["repl-sequence"]) for e in even if e["body"][:1] == b"e") == list(
        range(0, 40, 2)
    )
    assert sorted(int(e["properties"]["repl-sequence"]) for e in odd if e["body"][:1] == b"e") == list(
        range(1, 40, 2)
    )
    assert len(even) == len(odd) == 25
    # Each stream stays together and in order at its target.
    for events in (even, odd):
        for key in ("k0", "k1", "k2"):
            stream = [e for e in events if e["key"] == key]
            assert len({e["partition"] for e in stream}) == 1
            sequences = [int(e["properties"]["repl-sequence"]) for e in stream]
            assert sequences == sorted(sequences)


def test_rules_on_key_property_json_and_sql_with_all_matches_and_a_default(
    event_frame: Callable[..., Any], hubs: RunningEmulator, tmp_path: Path
) -> None:
    pipeline = route(
        hubs,
        match="all",
        defaultTarget="other",
        rules=[
            {"partitionKey": {"prefix": "vip-"}, "to": ["dest1"]},
            {"property": {"name": "kind", "oneOf": ["alarm", "panic"]}, "to": ["dest2"]},
            {"json": {"path": "reading.level", "regex": "^(high|critical)$"}, "to": ["dest1", "dest2"]},
            {"sql": "get_json_object(cast(body as string), '$.temperature') > 30", "to": ["dest2"]},
        ],
    )
    assert isinstance(pipeline, EditingPipeline)  # a SQL condition: Spark evaluates it before the task
    rows = [
        event_row("0", 1, b'{"n": 1}', partition_key="vip-1"),  # dest1
        event_row("0", 2, b'{"n": 2}', properties={"kind": "alarm"}),  # dest2
        event_row("0", 3, b'{"n": 3, "reading": {"level": "high"}}'),  # dest1 and dest2
        event_row("0", 4, b'{"n": 4, "temperature": 31}'),  # dest2
        event_row("0", 5, b'{"n": 5}', partition_key="vip-2", properties={"kind": "panic"}),  # both
        event_row("0", 6, b'{"n": 6, "temperature": 20}'),  # none: the default
        event_row("0", 7, b"not json"),  # none: the default
    ]
    summary = process_batch(event_frame(rows), 0, "router", pipeline, sink(tmp_path))

    assert summary.events == 7 and summary.partitions["0"].last_sequence_number == 7
    bodies = {
        hub: sorted(
            json.loads(e["body"])["n"] if e["body"] != b"not json" else 7 for e in read_hub(hubs, hub, n)
        )
        for hub, n in (("dest1", 3), ("dest2", 4), ("other", 2))
    }
    assert bodies == {"dest1": [1, 3, 5], "dest2": [2, 3, 4, 5], "other": [6, 7]}


def test_first_match_and_events_matching_nothing_are_dropped(
    event_frame: Callable[..., Any], hubs: RunningEmulator, tmp_path: Path
) -> None:
    pipeline = route(
        hubs,
        rules=[
            {"property": {"name": "kind", "equals": "alarm"}, "to": ["dest1"]},
            {"property": {"name": "kind", "exists": True}, "to": ["dest2"]},
        ],
    )
    rows = [
        event_row("1", 1, b"a", properties={"kind": "alarm"}),
        event_row("1", 2, b"b", properties={"kind": "motion"}),
        event_row("1", 3, b"c"),
    ]
    summary = process_batch(event_frame(rows), 0, "router", pipeline, sink(tmp_path))

    assert summary.partitions["1"].last_sequence_number == 3  # the dropped event counts as processed
    assert [e["body"] for e in read_hub(hubs, "dest1", 1)] == [b"a"]
    assert [e["body"] for e in read_hub(hubs, "dest2", 1)] == [b"b"]
    assert read_hub(hubs, "other", 0, timeout=2) == []


def test_a_sql_condition_that_fails_on_one_event_makes_it_a_dead_letter(
    event_frame: Callable[..., Any], hubs: RunningEmulator, tmp_path: Path
) -> None:
    # Spark's ANSI mode: casting text that is not a number fails the query.
    pipeline = route(hubs, rules=[{"sql": "cast(properties['level'] as int) > 2", "to": ["dest1"]}])
    rows = [
        event_row("0", 1, b"low", properties={"level": "1"}),
        event_row("0", 2, b"bad", properties={"level": "three"}),
        event_row("0", 3, b"high", properties={"level": "5"}),
    ]
    summary = process_batch(event_frame(rows), 0, "router", pipeline, sink(tmp_path))

    assert summary.events == 3 and summary.dead_letters == 1
    assert [e["body"] for e in read_hub(hubs, "dest1", 1)] == [b"high"]
    (dead,) = dead_letters(tmp_path)
    assert dead["sequenceNumber"] == 2 and dead["body"] == "bad"
    assert dead["reason"].startswith("the pipeline fails on this event:")
