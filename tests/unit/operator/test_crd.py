"""The CRD is generated from the manifest model and cannot drift from it."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumerSpec, parse_manifest
from hubshift.operator import status
from hubshift.operator.kubernetes import crd
from hubshift.operator.status import (
    AssignedPartitions,
    Condition,
    PartitionedConsumerStatus,
    PendingHandoff,
    ResourcePhase,
)
from hubshift.spec import Model
from tests.fixtures.operator import root_schema

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "homes.yaml"


def example() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return copy.deepcopy(document)


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the API server's structural defaulting does: fill absent fields, recursively, top-down."""
    if isinstance(value, dict) and "properties" in schema:
        value = dict(value)
        for name, child in schema["properties"].items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = apply_defaults(child, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


@pytest.mark.parametrize("path", crd.CRD_PATHS, ids=lambda p: str(p.relative_to(crd.REPO_ROOT)))
def test_committed_crd_matches_the_model(path: Path) -> None:
    expected = crd.render_yaml()
    actual = path.read_text() if path.exists() else "(missing)"
    assert actual == expected, (
        f"{path.relative_to(crd.REPO_ROOT)} has drifted from the model; regenerate it with: {crd.REGENERATE}"
    )


def test_names_and_columns() -> None:
    definition = crd.custom_resource_definition()
    assert definition["metadata"]["name"] == "partitionedconsumers.hubshift.dev"
    names = definition["spec"]["names"]
    assert names["shortNames"] == ["pcon"]
    assert names["kind"] == "PartitionedConsumer"
    version = definition["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns == {
        "Hub": ".spec.eventHubs.hub",
        "Consumer Group": ".spec.eventHubs.consumerGroup",
        "Partitions": ".status.partitionCount",
        "Replicas": ".status.currentReplicas",
        "Desired": ".status.desiredReplicas",
        "Backlog": ".status.totalBacklog",
        "Lag (s)": ".status.lagSeconds",
        "Phase": ".status.phase",
        "Age": ".metadata.creationTimestamp",
    }
    # Every printer column points at a field the schema declares (else it shows <none> forever).
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".metadata"):
            continue
        node = root_schema()
        for part in column["jsonPath"].strip(".").split("."):
            node = node["properties"][part]


def test_schema_is_structural() -> None:
    forbidden = {"$ref", "anyOf", "oneOf", "allOf", "not", "title", "const", "$defs", "nullable"}
    for path, node in nodes(root_schema()):
        assert "type" in node, f"{path or '<root>'} has no type"
        assert not forbidden & node.keys(), f"{path} uses {forbidden & node.keys()}"
        assert node.get("additionalProperties") is not False, path
        if node["type"] == "object" and path not in ("", ".metadata"):
            kept = node.get("x-kubernetes-preserve-unknown-fields") is True
            assert "properties" in node or "additionalProperties" in node or kept, (
                f"{path}: an untyped object"
            )
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_status_is_declared_so_the_server_keeps_it() -> None:
    status = root_schema()["properties"]["status"]["properties"]
    for field in (
        "phase",
        "conditions",
        "desiredReplicas",
        "currentReplicas",
        "partitionCount",
        "totalBacklog",
        "assignment",
        "holddownUntil",
        "pendingHandoffs",
        "observedGeneration",
    ):
        assert field in status


def test_every_cross_field_validator_has_a_cel_rule() -> None:
    models = crd.models_reachable_from(PartitionedConsumerSpec).values()
    with_validators = {model for model in models if model.__pydantic_decorators__.model_validators}
    with_rules = {model for model in models if issubclass(model, Model) and model.cel_rules()}
    assert with_validators == with_rules, (
        "a @model_validator needs the same rule, in CEL, beside it in the model's CEL "
        f"(missing: {sorted(m.__name__ for m in with_validators - with_rules)})"
    )


def test_every_cel_rule_carries_a_validator_message() -> None:
    """Each CEL rule carries the model's own message, so both refusals read the same: the message is one
    the model's validator raises for a document breaking the rule."""
    for model in crd.models_reachable_from(PartitionedConsumerSpec).values():
        if not issubclass(model, Model):
            continue
        for rule in model.cel_rules():
            assert rule["message"] and rule["rule"], model


def test_cel_rules_guard_the_fields_they_read() -> None:
    # The API server evaluates each rule against the schema's defaults too (e.g. `default: {}`), where
    # nested fields are absent: a rule that reads `self.x` without `has(self.x)` makes the CRD invalid.
    for path, node in nodes(root_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            text = rule["rule"].replace("self.metadata.name", "")
            for field in set(re.findall(r"self\.([A-Za-z]+)", text)):
                if field in node.get("required", []):
                    continue
                assert f"has(self.{field})" in text, f"{path}: rule {rule['rule']!r} reads {field} unguarded"


def test_no_rule_asks_whether_a_required_field_is_there() -> None:
    # The API server checks required fields first and skips every rule then ("some validation rules were
    # not checked"): such a rule never fires, and its message is never read.
    for path, node in nodes(root_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            for field in set(re.findall(r"has\(self\.([A-Za-z]+)\)", rule["rule"])):
                assert field not in node.get("required", []), (
                    f"{path}: {rule['rule']!r} tests required {field}"
                )


def test_every_map_or_list_a_rule_walks_is_bounded() -> None:
    # The API server estimates a rule's cost from the largest value the schema allows, and refuses the
    # whole CRD when a rule walking an unbounded map or list is over its budget (spark.conf was).
    for path, node in nodes(root_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            for field in set(
                re.findall(r"self\.([A-Za-z]+)\.(?:all|exists|exists_one|map|filter)\(", rule["rule"])
            ):
                child = node["properties"][field]
                assert "maxProperties" in child or "maxItems" in child, (
                    f"{path}.{field}: unbounded for {rule}"
                )


def test_schema_defaults_equal_the_model_defaults() -> None:
    spec_schema = root_schema()["properties"]["spec"]
    minimal = {
        "eventHubs": {"hub": "telemetry"},
        "checkpointStore": {"blob": {"container": "checkpoints"}},
    }
    defaulted = apply_defaults(spec_schema, minimal)
    from_server = PartitionedConsumerSpec.model_validate(defaulted)
    from_model = PartitionedConsumerSpec.model_validate(minimal)
    assert from_server == from_model
    # ...and the server-defaulted object carries every default explicitly.
    assert defaulted["scaling"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert defaulted["consumer"]["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert defaulted["rebalance"] == {
        "strategy": "balanced",
        "loadAware": {"windowSeconds": 60.0, "tolerance": 0.2, "maxMoves": 4},
        "delaySeconds": 10.0,
        "maxHandoffSeconds": 15.0,
        "leaseDurationSeconds": 30,
        "rollout": {"strategy": "Operator", "maxSurge": 1},
    }

    document = example()
    assert (
        PartitionedConsumerSpec.model_validate(apply_defaults(spec_schema, document["spec"]))
        == parse_manifest(document).spec
    )


def test_defaults_themselves_are_valid() -> None:
    validator = jsonschema.Draft4Validator(root_schema())
    for path, node in nodes(root_schema()):
        if "default" in node:
            errors = list(jsonschema.Draft4Validator(node).iter_errors(node["default"]))
            assert not errors, f"{path}: default {node['default']!r} is invalid: {errors[0].message}"
    document = example()
    document["spec"] = apply_defaults(root_schema()["properties"]["spec"], document["spec"])
    validator.validate(document)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["spec"]["eventHubs"].pop("hub"), "hub"),
        (lambda d: d["spec"]["rebalance"].update(leaseDurationSeconds=90), "leaseDurationSeconds"),
        (lambda d: d["spec"]["rebalance"].update(maxHandoffSeconds=0), "maxHandoffSeconds"),
        (lambda d: d["spec"]["scaling"].update(minReplicas=-1), "minReplicas"),
        (lambda d: d["spec"]["consumer"]["startPosition"].update(type="sometime"), "type"),
        (lambda d: d["spec"]["consumer"]["pipeline"].update(function="not a function"), "function"),
        (lambda d: d["spec"]["checkpointStore"]["blob"].update(container="ab"), "container"),
        (lambda d: d["spec"]["scaling"].update(maxReplicas="many"), "maxReplicas"),
    ],
)
def test_bad_resources_are_refused_by_the_schema_naming_the_field(mutate: Any, field: str) -> None:
    document = example()
    mutate(document)
    with pytest.raises(UserError):
        parse_manifest(document)  # the model refuses it...
    errors = list(jsonschema.Draft4Validator(root_schema()).iter_errors(document))
    assert errors, "...and so does the CRD schema"
    assert any(
        field in [str(part) for part in error.absolute_path] or field in error.message for error in errors
    )


def test_a_full_status_fits_the_declared_schema() -> None:
    status = PartitionedConsumerStatus(
        phase=ResourcePhase.REBALANCING,
        observed_generation=3,
        conditions=[Condition(type="Ready", status="True", reason="Balanced", message="ok")],
        desired_replicas=4,
        current_replicas=3,
        ready_replicas=3,
        partition_count=32,
        total_backlog=1234,
        assignment_generation=7,
        assignment=[AssignedPartitions(consumer="homes-0", partitions=["0", "1"])],
        pending_handoffs=[PendingHandoff(partition="1", from_owner="homes-0", to_owner="homes-3")],
    ).to_body()
    jsonschema.Draft4Validator(root_schema()["properties"]["status"]).validate(status)
    assert status["pendingHandoffs"][0] == {"partition": "1", "fromOwner": "homes-0", "toOwner": "homes-3"}
    assert "holddownUntil" not in status  # unset fields are left out, so applying the status clears them


def test_the_scale_subresource_points_at_fields_the_schema_declares() -> None:
    version = crd.custom_resource_definition()["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    scale = version["subresources"]["scale"]
    spec_replicas = root["properties"]["spec"]["properties"]["replicas"]
    assert spec_replicas["type"] == "integer" and "default" not in spec_replicas  # unset: the autoscaler
    assert root["properties"]["status"]["properties"]["replicas"]["type"] == "integer"
    assert root["properties"]["status"]["properties"]["selector"]["type"] == "string"  # a selector string
    assert {path.rsplit(".", 1)[-1] for path in scale.values()} == {"replicas", "selector"}


def test_conditions_are_a_list_map_keyed_by_type_and_every_type_is_documented() -> None:
    root = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    conditions = root["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]  # a map key must be required
    for kind in status.CONDITION_TYPES:
        assert f"{kind}: " in conditions["description"]
        assert kind in conditions["items"]["properties"]["type"]["description"]
