"""The editor's steps as a manifest declares them (`spec.consumer.pipeline.editor`), each with its rules for
the API server; `editor.py` runs them (Spark's steps) and `edits.py` (Python's)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from hubshift.spec import Model, cel
from hubshift.usercode import FUNCTION_REFERENCE

# A field of a JSON body: names separated by dots (`a.b.c`), optionally after `$.`.
JSON_PATH = r"^(\$\.)?[^.\s]+(\.[^.\s]+)*$"
# Bounds that keep the API server's CEL cost estimates small.
MAX_STEPS = 32
STEP_NAMES = ("function", "filter", "select", "flatten", "validate", "dedupe", "enrich", "gzip", "gunzip")

ONE_EVENT_FIELD = "set exactly one of partitionKey (true), property or json"
ONE_TABLE = "set exactly one of table or path"
ONE_STEP = "set exactly one step per editor entry"


class EventFieldSpec(Model):
    """One value of an event: its partition key, an application property, or a field of its JSON body."""

    partition_key: bool | None = Field(default=None, description="true: the partition key.")
    property: str | None = Field(default=None, min_length=1, description="An application property.")
    json_field: str | None = Field(
        default=None, alias="json", pattern=JSON_PATH, description="A field of the JSON body (a.b.c)."
    )

    CEL = (
        cel(
            "(has(self.partitionKey) && self.partitionKey ? 1 : 0) + (has(self.property) ? 1 : 0) "
            "+ (has(self.json) ? 1 : 0) == 1",
            ONE_EVENT_FIELD,
        ),
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EventFieldSpec:
        if sum((bool(self.partition_key), self.property is not None, self.json_field is not None)) != 1:
            raise ValueError(ONE_EVENT_FIELD)
        return self


class FlattenStepSpec(Model):
    separator: str = Field(default=".", min_length=1, description="Joins nested names (a.b).")


class ValidateStepSpec(Model):
    json_schema: dict[str, Any] = Field(
        description="A JSON Schema (draft 2020-12) the JSON body must satisfy; other events are dead "
        "letters with the reason."
    )


class DedupeStepSpec(Model):
    key: EventFieldSpec = Field(description="Events with the same key...")
    window_seconds: float = Field(
        gt=0, le=7 * 86400, description="...enqueued within this many seconds of the first are dropped."
    )


class EnrichStepSpec(Model):
    key: EventFieldSpec = Field(description="Looked up in the table.")
    table: dict[str, dict[str, str]] | None = Field(
        default=None, description="Key -> fields added to the JSON body."
    )
    path: str | None = Field(
        default=None, min_length=1, description="A JSON file holding the table instead (read at start-up)."
    )
    into: str | None = Field(
        default=None, min_length=1, description="Add the fields under this name (absent: at the top)."
    )
    on_missing: Literal["keep", "drop", "deadLetter"] = Field(
        default="keep",
        description="An event whose key is not in the table: kept as it is, dropped, or a dead letter.",
    )

    CEL = (cel("has(self.table) != has(self.path)", ONE_TABLE),)

    @model_validator(mode="after")
    def _one_table(self) -> EnrichStepSpec:
        if (self.table is None) == (self.path is None):
            raise ValueError(ONE_TABLE)
        return self


class GzipStepSpec(Model):
    level: int = Field(default=6, ge=1, le=9, description="Compression level.")


class GunzipStepSpec(Model):
    max_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1,
        description="A body that decompresses to more than this is a dead letter (a decompression bomb).",
    )


class EditorStepSpec(Model):
    """One step of an editor; set exactly one field."""

    function: str | None = Field(
        default=None,
        pattern=FUNCTION_REFERENCE,
        description="Your module:function taking and returning a DataFrame (Spark runs it).",
    )
    filter: str | None = Field(
        default=None, min_length=1, description="Keep the events for which this Spark SQL expression is true."
    )
    select: dict[str, str] | None = Field(
        default=None, description="A new JSON body of these fields: output name -> path in the body (a.b)."
    )
    flatten: FlattenStepSpec | None = Field(default=None, description="Nested JSON objects to dotted names.")
    validate_: ValidateStepSpec | None = Field(
        default=None, alias="validate", description="Check the JSON body against a JSON Schema."
    )
    dedupe: DedupeStepSpec | None = Field(default=None, description="Drop repeats of a key within a window.")
    enrich: EnrichStepSpec | None = Field(default=None, description="Add fields from a static lookup table.")
    gzip: GzipStepSpec | None = Field(default=None, description="Compress the body.")
    gunzip: GunzipStepSpec | None = Field(default=None, description="Decompress the body.")

    CEL = (cel(" + ".join(f"(has(self.{name}) ? 1 : 0)" for name in STEP_NAMES) + " == 1", ONE_STEP),)

    @model_validator(mode="after")
    def _exactly_one(self) -> EditorStepSpec:
        if sum(getattr(self, name) is not None for name in type(self).model_fields) != 1:
            raise ValueError(ONE_STEP)
        return self
