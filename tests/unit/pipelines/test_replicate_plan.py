"""The replicate pipeline's pure parts: the `repl-*` properties, and which events go out in which group
(streams kept together and in order, keyless events spread or pinned, replicated events skipped)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from hubshift.manifest import PartitionedConsumer
from hubshift.operator.kubernetes.render import secret_env
from hubshift.pipelines import PipelineSpec
from hubshift.pipelines.replicate import plan_sends, replicated_properties

T = datetime(2026, 11, 21, 10, 0, 1, 234567, tzinfo=UTC)


def row(partition: str, sequence: int, key: str | None, properties: Any = None) -> dict[str, Any]:
    return {
        "partition": partition,
        "sequence_number": sequence,
        "offset": str(sequence * 10),
        "enqueued_time": T,
        "partition_key": key,
        "body": f"{partition}/{sequence}".encode(),
        "properties": properties,
    }


def test_the_source_metadata_is_added_and_appended_after_a_semicolon() -> None:
    first = replicated_properties([("a", "1")], T, 7, "70", "4")
    assert first == {
        "a": "1",
        "repl-enqueue-time": "2026-11-21T10:00:01.234567Z",
        "repl-sequence": "7",
        "repl-offset": "70",
        "repl-partition": "4",
    }
    again = replicated_properties(list(first.items()), T, 3, "30", "1")
    assert again["repl-sequence"] == "7;3" and again["repl-offset"] == "70;30"
    assert again["repl-enqueue-time"] == "2026-11-21T10:00:01.234567Z;2026-11-21T10:00:01.234567Z"
    assert again["repl-partition"] == "4;1"
    assert again["a"] == "1"


def test_streams_stay_together_and_in_order_per_source_partition() -> None:
    rows = [row("0", 1, "h1"), row("0", 2, "h2"), row("0", 3, "h1"), row("1", 4, "h1"), row("0", 5, None)]
    groups = plan_sends(rows, keep_partition=False, skip_replicated=False)
    assert [(g.partition_key, g.partition_id, [e.row for e in g.events]) for g in groups] == [
        ("h1", None, [0, 2]),
        ("h2", None, [1]),
        ("h1", None, [3]),
        (None, None, [4]),
    ]
    assert groups[0].events[1].body == b"0/3"
    assert groups[0].events[1].properties["repl-sequence"] == "3"


def test_keyless_events_keep_their_partition_when_asked() -> None:
    groups = plan_sends([row("2", 1, None), row("3", 2, None)], keep_partition=True, skip_replicated=False)
    assert [(g.partition_id, [e.row for e in g.events]) for g in groups] == [("2", [0]), ("3", [1])]


def test_replicated_events_are_skipped_in_the_merge_pattern() -> None:
    rows = [row("0", 1, "h1", [("repl-sequence", "9")]), row("0", 2, "h1", [("other", "x")])]
    groups = plan_sends(rows, keep_partition=False, skip_replicated=True)
    assert [[e.row for e in g.events] for g in groups] == [[1]]
    assert len(plan_sends(rows, keep_partition=False, skip_replicated=False)[0].events) == 2


def test_type_replicate_needs_a_target_and_its_secret_reaches_the_pods() -> None:
    with pytest.raises(ValidationError, match="replicate \\(the target hub\\) is required"):
        PipelineSpec(type="replicate")
    consumer = PartitionedConsumer.model_validate(
        {
            "apiVersion": "hubshift.dev/v1alpha1",
            "kind": "PartitionedConsumer",
            "metadata": {"name": "mirror"},
            "spec": {
                "eventHubs": {"hub": "source"},
                "checkpointStore": {"sqlite": {"path": "/tmp/x.db"}},
                "consumer": {
                    "pipeline": {
                        "type": "replicate",
                        "replicate": {
                            "hub": "target",
                            "connectionStringSecretRef": {"name": "target-hub", "key": "cs"},
                        },
                    }
                },
            },
        }
    )
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in secret_env(consumer)}
    assert env["HUBSHIFT_REPLICATE_CONNECTION_STRING"] == {"name": "target-hub", "key": "cs"}
