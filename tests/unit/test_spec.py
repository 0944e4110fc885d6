"""The manifest model: defaults, validation, and one-line errors that name the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hubshift.errors import UserError
from hubshift.manifest import load_manifest, parse_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "homes.yaml"


def example() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return copy.deepcopy(document)


def test_example_manifest_loads_with_defaults() -> None:
    consumer = load_manifest(EXAMPLE)
    assert consumer.metadata.name == "homes"
    assert consumer.spec.event_hubs.hub == "telemetry"
    assert consumer.spec.checkpoint_store.blob is not None
    assert consumer.spec.scaling.behavior.scale_down.stabilization_window_seconds == 300
    assert consumer.spec.rebalance.lease_duration_seconds == 30


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["spec"]["scaling"].update(maxReplcas=3), "spec.scaling.maxReplcas: unknown field"),
        (lambda d: d["spec"]["scaling"].update(minReplicas=40), "maxReplicas must be at least minReplicas"),
        (lambda d: d["spec"].update(checkpointStore={}), "spec.checkpointStore: set exactly one"),
        (lambda d: d["spec"]["eventHubs"].pop("hub"), "spec.eventHubs.hub: required field is missing"),
        (
            lambda d: d["spec"]["rebalance"].update(leaseDurationSeconds=90),
            "spec.rebalance.leaseDurationSeconds",
        ),
        (
            lambda d: d["spec"]["consumer"]["startPosition"].update(type="enqueuedTime"),
            "enqueuedTime is required",
        ),
        (lambda d: d["metadata"].update(name="Bad_Name"), "metadata.name"),
        (
            lambda d: d["spec"]["consumer"]["startPosition"].update(
                partitions={"1": {"type": "sequenceNumber"}}
            ),
            "startPosition.partitions.1: sequenceNumber is required when type is sequenceNumber",
        ),
        (
            lambda d: d["spec"]["consumer"]["startPosition"].update(partitions={"one": {"type": "latest"}}),
            "spec.consumer.startPosition: partitions: keys are partition ids",
        ),
        (
            lambda d: d["spec"]["consumer"]["startPosition"].update(
                partitions={"2": {"type": "sequenceNumber", "sequenceNumber": -3}}
            ),
            "spec.consumer.startPosition.partitions.2.sequenceNumber",
        ),
    ],
)
def test_bad_manifest_gives_one_line_naming_the_field(mutate: Any, expected: str) -> None:
    document = example()
    mutate(document)
    with pytest.raises(UserError) as error:
        parse_manifest(document)
    message = str(error.value)
    assert expected in message
    assert "\n" not in message


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read manifest"):
        load_manifest(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_manifest(broken)
    other = tmp_path / "other.yaml"
    other.write_text("kind: ConfigMap\n")
    with pytest.raises(UserError, match="expected exactly one PartitionedConsumer"):
        load_manifest(other)


@pytest.mark.parametrize("name", ["route.yaml", "projection.yaml"])
def test_the_pattern_examples_load(name: str) -> None:
    consumer = load_manifest(EXAMPLE.parent / name)
    pipeline = consumer.spec.consumer.pipeline
    assert pipeline.type in ("route", "projection")
    if pipeline.route is not None:
        assert pipeline.editor[0].gunzip is not None
        assert pipeline.route.default_target == "archive"
    if pipeline.projection is not None:
        assert pipeline.projection.history_table == "homes_history"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLE.parent.glob("*.yaml")))
def test_every_example_loads(name: str) -> None:
    """An example a person copies is a resource hubshift takes as it is."""
    assert load_manifest(EXAMPLE.parent / name).metadata.name


def test_a_partition_starts_at_its_own_position_or_the_pools() -> None:
    document = example()
    document["spec"]["consumer"]["startPosition"] = {
        "type": "enqueuedTime",
        "enqueuedTime": "2026-11-28T10:00:00Z",
        "partitions": {"3": {"type": "sequenceNumber", "sequenceNumber": 1200}, "5": {"type": "latest"}},
    }
    start = parse_manifest(document).spec.consumer.start_position
    assert (start.of("3").type, start.of("3").sequence_number) == ("sequenceNumber", 1200)
    assert start.of("5").type == "latest"
    assert (start.of("0").type, start.of("0").enqueued_time) == ("enqueuedTime", start.enqueued_time)
