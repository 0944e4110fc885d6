"""The PartitionedConsumer CRD, generated from the typed model (`hubshift.manifest`, `operator.status`).

The committed files `crds/partitionedconsumers.hubshift.dev.yaml` and its copy in the chart
(`charts/hubshift/files/crds/`, which the chart's `templates/crds.yaml` installs and upgrades) are this
module's output, and so is the field reference `docs/reference.md` (every field of the spec with its type,
default and description, read from the CRD); a unit test fails when any of them drifts. Regenerate all
three with:

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
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from hubshift import spec
from hubshift.manifest import ObjectMeta, PartitionedConsumerSpec
from hubshift.operator.status import CONDITION_TYPES, PartitionedConsumerStatus

REPO_ROOT = Path(__file__).resolve().parents[3]
CRD_NAME = f"{spec.PLURAL}.{spec.GROUP}"
CRD_FILE = f"{CRD_NAME}.yaml"
# The chart installs and upgrades its copy from templates/crds.yaml (Helm never upgrades a chart's crds/).
CRD_PATHS = (REPO_ROOT / "crds" / CRD_FILE, REPO_ROOT / "charts" / "hubshift" / "files" / "crds" / CRD_FILE)
REFERENCE_PATH = REPO_ROOT / "docs" / "reference.md"
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
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
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
                    # /scale: `kubectl scale`, an HPA or KEDA set spec.replicas (`decide_replicas`).
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
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


# --- the field reference (docs/reference.md), read from the CRD -----------------------------------------


@dataclass(frozen=True)
class SpecField:
    """One field of the spec as the CRD declares it: `path` as a user writes it (`consumer.sink.type`; a
    list's items as `[]`, a map's values as `{name}`)."""

    path: str
    schema: JSON
    required: bool


def spec_schema(definition: Mapping[str, Any]) -> JSON:
    """The `spec` property's schema in a CRD (the generated one, or the committed file read back)."""
    root: JSON = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec_property: JSON = root["properties"]["spec"]
    return spec_property


def spec_fields(schema: Mapping[str, Any], path: str = "") -> Iterator[SpecField]:
    """Every field under `schema`, parents before their children, in the model's order."""
    required = set(schema.get("required", ()))
    for name, child in schema.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        yield SpecField(child_path, child, name in required)
        yield from _nested_fields(child, child_path)


def _nested_fields(schema: Mapping[str, Any], path: str) -> Iterator[SpecField]:
    yield from spec_fields(schema, path)
    items = schema.get("items")
    if isinstance(items, dict):
        yield from _nested_fields(items, f"{path}[]")
    values = schema.get("additionalProperties")
    if isinstance(values, dict):
        yield from _nested_fields(values, f"{path}{{name}}")


def _bounds(schema: Mapping[str, Any]) -> str:
    parts = []
    if "minimum" in schema:
        parts.append(f"{'>' if schema.get('exclusiveMinimum') is True else '≥'} {schema['minimum']}")
    if "maximum" in schema:
        parts.append(f"{'<' if schema.get('exclusiveMaximum') is True else '≤'} {schema['maximum']}")
    return ", ".join(parts)


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type", "object")
    if "enum" in schema:
        text = "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    elif kind == "array":
        items = schema.get("items")
        text = f"list of {_type_of(items) if isinstance(items, dict) else 'values'}"
        if "minItems" in schema and "maxItems" in schema:
            text += f" ({schema['minItems']} to {schema['maxItems']} items)"
        elif "maxItems" in schema:
            text += f" (≤ {schema['maxItems']} items)"
        elif "minItems" in schema:
            text += f" (≥ {schema['minItems']} items)"
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        text = f"map of name to {_type_of(schema['additionalProperties'])}"
        if "maxProperties" in schema:
            text += f" (≤ {schema['maxProperties']} entries)"
    elif kind == "object" and schema.get("x-kubernetes-preserve-unknown-fields"):
        text = "object, kept as written"
    elif kind == "string":
        text = f"string ({schema['format']})" if "format" in schema else "string"
        if schema.get("maxLength"):
            text += f", ≤ {schema['maxLength']} characters"
    elif kind in ("integer", "number"):
        bounds = _bounds(schema)
        text = f"{kind}, {bounds}" if bounds else kind
    else:
        text = str(kind)
    return text


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, no pipes or tags for the renderer to take."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _field_row(field: SpecField) -> str:
    kind = _type_of(field.schema) + (", **required**" if field.required else "")
    default = field.schema.get("default")
    shown = "" if default is None else f"`{json.dumps(default, separators=(', ', ': '))}`"
    return f"| `{field.path}` | {_cell(kind)} | {shown} | {_cell(field_description(field))} |"


def field_description(field: SpecField) -> str:
    """What the reference says a field is: its own description, and for a list what each item is."""
    own = str(field.schema.get("description", ""))
    items = field.schema.get("items")
    each = str(items.get("description", "")) if isinstance(items, dict) else ""
    if each and each != own:
        return f"{own} Each: {each}" if own else f"Each: {each}"
    return own


def _rules(schema: Mapping[str, Any], path: str) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", ()):
        where = path + rule.get("fieldPath", "")
        yield f"- `{where}`: {_cell(rule['message'])}"
    for field in spec_fields(schema, path):
        for rule in field.schema.get("x-kubernetes-validations", ()):
            where = field.path + rule.get("fieldPath", "")
            yield f"- `{where}`: {_cell(rule['message'])}"


def reference_markdown(definition: Mapping[str, Any]) -> str:
    """docs/reference.md: every field of the spec with its type, default and description, one table per
    top-level block, then the rules across fields the API server checks there."""
    version = definition["spec"]["versions"][0]
    names = definition["spec"]["names"]
    group = definition["spec"]["group"]
    lines = [
        f"# `{names['kind']}` field reference",
        "",
        f"<!-- Generated from {CRD_PATHS[0].relative_to(REPO_ROOT)} by `{REGENERATE}`; do not edit. -->",
        "",
        f"`apiVersion: {group}/{version['name']}`, `kind: {names['kind']}`, short name "
        f"`{names['shortNames'][0]}`. Every field of `spec`,",
        "read from the CRD the chart installs. The CRD is generated from the model that `hubshift run` and",
        "the consumers read, so the API server and `hubshift run` take and refuse the same resources. A",
        "default is what the API server fills in when the field is absent (`{}`: the block, with each of its",
        "own defaults). A type gives the bounds the API server checks; names and hosts also have a pattern",
        "(in the CRD). `examples/homes.yaml` and `examples/homes-keyless.yaml` show the fields in use;",
        "[architecture.md](architecture.md) what the operator makes of them. The status and its conditions",
        "follow the spec.",
        "",
        "`kubectl get pcon` shows: "
        + ", ".join(
            f"{column['name']} (`{column['jsonPath']}`)" for column in version["additionalPrinterColumns"]
        )
        + ".",
    ]
    schema = spec_schema(definition)
    for field in spec_fields(schema):
        if "." in field.path:
            continue
        lines += ["", f"## `spec.{field.path}`", ""]
        if field.schema.get("description"):
            lines += [_cell(field.schema["description"]), ""]
        lines += ["| field | type | default | description |", "|---|---|---|---|", _field_row(field)]
        lines += [_field_row(child) for child in _nested_fields(field.schema, field.path)]
        rules = list(_rules(field.schema, field.path))
        if rules:
            lines += ["", "Refused by the API server, naming the field:", "", *rules]
    return "\n".join(lines + _status_lines(definition)) + "\n"


def status_schema(definition: Mapping[str, Any]) -> JSON:
    """The `status` property's schema in a CRD."""
    root: JSON = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status_property: JSON = root["properties"]["status"]
    return status_property


def _status_lines(definition: Mapping[str, Any]) -> list[str]:
    """The reference's end: the scale subresource, the status' fields and every condition type."""
    version = definition["spec"]["versions"][0]
    scale = version["subresources"].get("scale")
    lines: list[str] = []
    if scale is not None:
        lines += [
            "",
            "## The scale subresource",
            "",
            "`kubectl scale pcon/NAME --replicas=N`, an HPA (`scaleTargetRef` of kind "
            f"`{definition['spec']['names']['kind']}`) or a KEDA ScaledObject set "
            f"`{scale['specReplicasPath']}` through `/scale`; they read `{scale['statusReplicasPath']}` and "
            f"the pods' selector `{scale['labelSelectorPath']}`. Unset `spec.replicas` "
            "(`kubectl patch pcon/NAME --type=json -p "
            """'[{"op": "remove", "path": "/spec/replicas"}]'`) hands the pool back to `spec.scaling`. """
            "The API server answers a read of `/scale` only once `spec.replicas` is set, and an HPA or KEDA "
            "reads it first: set a count once (`kubectl scale`, which patches it) before handing a pool to "
            "one.",
        ]
    schema = status_schema(definition)
    lines += [
        "",
        "## `status`",
        "",
        "Written by the operator after every cycle of the resource's control loop.",
        "",
        "| field | type | description |",
        "|---|---|---|",
    ]
    for field in spec_fields(schema):
        lines.append(
            f"| `{field.path}` | {_cell(_type_of(field.schema))} | {_cell(field_description(field))} |"
        )
    lines += [
        "",
        "## `status.conditions`",
        "",
        "One condition per type (`kubectl wait --for=condition=Ready pcon/NAME`); each has a status (True,",
        "False or Unknown), a reason (one CamelCase word), a message and when its status last changed.",
        "",
        "| type | True means |",
        "|---|---|",
        *(f"| `{kind}` | {_cell(meaning)} |" for kind, meaning in CONDITION_TYPES.items()),
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hubshift.operator.kubernetes.crd",
        description="Print the CRD (or, with --reference, the field reference); --write writes both.",
    )
    parser.add_argument(
        "--write", action="store_true", help="write crds/, the chart's copy and docs/reference.md"
    )
    parser.add_argument("--reference", action="store_true", help="print docs/reference.md instead of the CRD")
    args = parser.parse_args(argv)
    text = render_yaml()
    reference = reference_markdown(custom_resource_definition())
    if not args.write:
        sys.stdout.write(reference if args.reference else text)
        return 0
    for path, content in [*((path, text) for path in CRD_PATHS), (REFERENCE_PATH, reference)]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(f"wrote {path.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
