"""docs/reference.md, the field reference, is generated from the CRD: it is up to date with the committed
CRD, it has a row for every field of the spec, and every field (of the spec and the status) says what it is;
it documents every condition type."""

from __future__ import annotations

from typing import Any

import yaml

from hubshift.operator import status
from hubshift.operator.kubernetes import crd


def committed_crd() -> dict[str, Any]:
    definition: dict[str, Any] = yaml.safe_load(crd.CRD_PATHS[0].read_text())
    return definition


def spec_fields() -> list[crd.SpecField]:
    return list(crd.spec_fields(crd.spec_schema(committed_crd())))


def test_the_reference_page_is_up_to_date_with_the_crd() -> None:
    expected = crd.reference_markdown(committed_crd())
    actual = crd.REFERENCE_PATH.read_text() if crd.REFERENCE_PATH.exists() else "(missing)"
    assert actual == expected, (
        f"docs/reference.md has drifted from the CRD; regenerate it with: {crd.REGENERATE}"
    )


def test_the_reference_has_a_row_for_every_field() -> None:
    page = crd.REFERENCE_PATH.read_text()
    fields = spec_fields()
    assert len(fields) > 300
    assert [field.path for field in fields if f"| `{field.path}` |" not in page] == []


def test_every_spec_field_has_a_description() -> None:
    undescribed = [field.path for field in spec_fields() if not crd.field_description(field).strip()]
    assert undescribed == [], (
        "give these fields a description in the model (Field(description=...), or a docstring on the "
        f"block's model), then {crd.REGENERATE}"
    )


def test_every_status_field_has_a_description() -> None:
    status = crd.status_schema(committed_crd())
    assert [field.path for field in crd.spec_fields(status) if not crd.field_description(field).strip()] == []


def test_the_reference_names_every_condition_type_and_the_scale_subresource() -> None:
    page = crd.REFERENCE_PATH.read_text()
    assert "## The scale subresource" in page and "`.spec.replicas`" in page
    for kind in status.CONDITION_TYPES:
        assert f"| `{kind}` |" in page
