"""The PartitionedConsumer CRD, generated from the typed model (`hubshift.manifest`, `operator.status`).

The committed files `crds/partitionedconsumers.hubshift.dev.yaml` and its copy in the chart
(`charts/hubshift/files/crds/`, which the chart's `templates/crds.yaml` installs and upgrades) are this
module's output; a unit test fails when either drifts. Regenerate both with:

    python -m hubshift.operator.kubernetes.crd --write

Pydantic's JSON schema is turned into a Kubernetes *structural* schema: references inlined, titles and
`additionalProperties: false` dropped (the API server prunes or, with strict field validation, refuses
unknown fields by itself), `Optional[...] = None` collapsed to the plain type (the server prunes a null on
a non-nullable field, which the model reads as "absent"), defaults filled in from the model (also for
`default_factory`), and each model's cross-field validators restated as CEL rules (`Model.cel_rules()`,
declared beside the validators) so the API server refuses the same resources `hubshift run` does, naming the
same field.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from hubshift import spec
from hubshift.manifest import ObjectMeta, PartitionedConsumerSpec
from hubshift.operator.status import PartitionedConsumerStatus

REPO_ROOT = Path(__file__).resolve().parents[3]
CRD_NAME = f"{spec.PLURAL}.{spec.GROUP}"
CRD_FILE = f"{CRD_NAME}.yaml"
# The chart installs and upgrades its copy from templates/crds.yaml (Helm never upgrades a chart's crds/).
CRD_PATHS = (REPO_ROOT / "crds" / CRD_FILE, REPO_ROOT / "charts" / "hubshift" / "files" / "crds" / CRD_FILE)
REGENERATE = "python -m hubshift.operator.kubernetes.crd --write"

JSON = dict[str, Any]

_DROPPED_KEYWORDS = {"title", "additionalProperties", "$defs"}


def models_reachable_from(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model class used by `root`, by the name pydantic gives its `$defs` entry."""
    found: dict[str, type[BaseModel]] = {}

    def visit(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation.__name__ in found:
                return
            found[annotation.__name__] = annotation
            for field in annotation.model_fields.values():
                visit(field.annotation)
        for argument in getattr(annotation, "__args__", ()):
            visit(argument)

    visit(root)
    return found


def _field_by_alias(model: type[BaseModel], alias: str) -> FieldInfo | None:
    for name, field in model.model_fields.items():
        if (field.alias or name) == alias:
            return field
    return None


def _default_of(field: FieldInfo) -> Any:
    """The field's default as the API server should store it; PydanticUndefined when there is none."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is not PydanticUndefined:
        value = field.default
    else:
        return PydanticUndefined
    if value is None:
        return PydanticUndefined
    if isinstance(value, BaseModel):
        # `{}` when the server's own nested defaulting gives the same object: shorter, one source of truth.
        try:
            if type(value).model_validate({}) == value:
                return {}
        except ValueError:
            pass
        return value.model_dump(by_alias=True, mode="json", exclude_none=True)
    if isinstance(value, list | dict):
        return value
    return value


class _Converter:
    def __init__(self, root: type[BaseModel]) -> None:
        self.models = models_reachable_from(root)
        self.definitions: JSON = root.model_json_schema(by_alias=True, mode="validation").get("$defs", {})

    def model(self, model: type[BaseModel], schema: Mapping[str, Any]) -> JSON:
        out: JSON = {"type": "object"}
        description = schema.get("description") or (model.__doc__ or "").strip()
        if description and model.__doc__ is not BaseModel.__doc__:
            out["description"] = " ".join(description.split())
        properties: JSON = {}
        for alias, prop in schema.get("properties", {}).items():
            field = _field_by_alias(model, alias)
            converted = self.node(prop)
            if field is not None:
                default = _default_of(field)
                if default is not PydanticUndefined:
                    converted["default"] = default
                if field.description and "description" not in converted:
                    converted["description"] = field.description
            properties[alias] = converted
        if properties:
            out["properties"] = properties
        required = schema.get("required")
        if required:
            out["required"] = list(required)
        if model.model_config.get("extra") == "allow":  # a Kubernetes object passed on as written
            out["x-kubernetes-preserve-unknown-fields"] = True
        rules = model.cel_rules() if issubclass(model, spec.Model) else []
        if rules:
            out["x-kubernetes-validations"] = [dict(rule) for rule in rules]
        return out

    def node(self, schema: Mapping[str, Any]) -> JSON:
        schema = dict(schema)
        # Optional[X]: X, null -> X (null is pruned by the server: absent, i.e. None, for the model).
        for combinator in ("anyOf", "oneOf"):
            options = schema.get(combinator)
            if options is not None:
                concrete = [option for option in options if option.get("type") != "null"]
                if len(concrete) != 1:
                    raise ValueError(f"cannot express a union in a structural schema: {options}")
                del schema[combinator]
                schema = {**concrete[0], **schema}
        if "allOf" in schema and len(schema["allOf"]) == 1:
            schema = {**schema.pop("allOf")[0], **schema}
        ref = schema.pop("$ref", None)
        if ref is not None:
            name = ref.rsplit("/", 1)[-1]
            extra = {key: value for key, value in schema.items() if key not in _DROPPED_KEYWORDS}
            converted = self.model(self.models[name], self.definitions[name])
            if "description" in extra:
                converted["description"] = extra.pop("description")
            extra.pop("default", None)  # filled from the model by the caller
            converted.update(extra)
            return converted
        out: JSON = {}
        for key, value in schema.items():
            if key in _DROPPED_KEYWORDS or key == "default":
                continue
            if key == "const":
                out["enum"] = [value]
            elif key == "exclusiveMinimum":
                out["minimum"] = value
                out["exclusiveMinimum"] = True
            elif key == "exclusiveMaximum":
                out["maximum"] = value
                out["exclusiveMaximum"] = True
            elif key == "items":
                out["items"] = self.node(value)
            elif key == "properties":
                raise ValueError("inline object schemas are not expected; use a model")
            else:
                out[key] = value
        if out.get("type") == "object" and "additionalProperties" in schema:
            extra_values = schema["additionalProperties"]
            if isinstance(extra_values, dict) and extra_values:  # dict[str, X]
                out["additionalProperties"] = self.node(extra_values)
            elif extra_values is True or extra_values == {}:  # dict[str, Any]: kept as it is (a JSON Schema)
                out["x-kubernetes-preserve-unknown-fields"] = True
        return out


_KEY_ORDER = [
    "type",
    "format",
    "description",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "items",
    "properties",
    "additionalProperties",
    "required",
    "default",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
]


def _ordered(schema: Any) -> Any:
    """Keys in a fixed, readable order (type first); property order stays the model's."""
    if not isinstance(schema, dict):
        return schema
    rank = {key: index for index, key in enumerate(_KEY_ORDER)}
    out: JSON = {}
    for key in sorted(schema, key=lambda k: rank.get(k, len(rank))):
        value = schema[key]
        if key == "properties":
            out[key] = {name: _ordered(prop) for name, prop in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _ordered(value)
        else:
            out[key] = value
    return out


def structural_schema(model: type[BaseModel]) -> JSON:
    """The Kubernetes structural OpenAPI v3 schema of a pydantic model."""
    converter = _Converter(model)
    schema = converter.model(model, model.model_json_schema(by_alias=True, mode="validation"))
    return dict(_ordered(schema))


def _metadata_name_rule() -> JSON:
    name = ObjectMeta.model_json_schema()["properties"]["name"]
    pattern, max_length = name["pattern"], name["maxLength"]
    return {
        "rule": f"self.metadata.name.size() <= {max_length} && self.metadata.name.matches('{pattern}')",
        "message": f"metadata.name must be a DNS label: lower-case letters, digits and '-', "
        f"at most {max_length} characters",
    }


def printer_columns() -> list[JSON]:
    return [
        {"name": "Hub", "type": "string", "jsonPath": ".spec.eventHubs.hub"},
        {"name": "Consumer Group", "type": "string", "jsonPath": ".spec.eventHubs.consumerGroup"},
        {"name": "Partitions", "type": "integer", "jsonPath": ".status.partitionCount"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".status.currentReplicas"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas", "priority": 1},
        {"name": "Backlog", "type": "integer", "jsonPath": ".status.totalBacklog"},
        {"name": "Lag (s)", "type": "number", "jsonPath": ".status.lagSeconds"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def custom_resource_definition() -> JSON:
    """The CRD as a dict, ready to dump or apply."""
    root: JSON = {
        "type": "object",
        "description": "A pool of PySpark consumers over the partitions of an Event Hub, scaled from the "
        "backlog, with partitions rebalanced between them by the hubshift operator.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": structural_schema(PartitionedConsumerSpec),
            "status": structural_schema(PartitionedConsumerStatus),
        },
        "x-kubernetes-validations": [_metadata_name_rule()],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "hubshift", "app.kubernetes.io/part-of": "hubshift"},
        },
        "spec": {
            "group": spec.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": spec.KIND,
                "listKind": f"{spec.KIND}List",
                "plural": spec.PLURAL,
                "singular": spec.KIND.lower(),
                "shortNames": [spec.SHORT_NAME],
                "categories": ["hubshift"],
            },
            "versions": [
                {
                    "name": spec.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style, long descriptions kept on one line, no aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_yaml() -> str:
    header = (
        "# Generated from hubshift/manifest.py (with the blocks of hubshift/spec.py, hubshift/pipelines/ "
        "and\n# hubshift/sinks/) and hubshift/operator/status.py; do not edit.\n"
        f"# Regenerate: {REGENERATE}\n"
    )
    body = yaml.dump(custom_resource_definition(), Dumper=_Dumper, sort_keys=False, width=4096)
    return header + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hubshift.operator.kubernetes.crd", description="Write the CRD."
    )
    parser.add_argument("--write", action="store_true", help="write crds/ and the chart's copy")
    args = parser.parse_args(argv)
    text = render_yaml()
    if not args.write:
        sys.stdout.write(text)
        return 0
    for path in CRD_PATHS:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
