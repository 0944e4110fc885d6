"""The `route` pipeline: the routing pattern of the replication tasks. Ordered rules on an event's
metadata and payload pick one or more target hubs; each target gets its events as `replicate` sends them
(streams together and in order, the `repl-*` metadata added, too large ones as dead letters).

A rule holds when every condition it sets holds: the partition key, an application property, the
sequence number (`modulo`/`remainder`, `min`/`max`: even and odd sequence numbers to two hubs), a field of
the JSON body, a SQL expression Spark evaluates. With `match: first` the first rule that holds picks the
targets; with `all`, every rule that holds adds its own. An event no rule picks goes to `defaultTarget`,
or is dropped (it still counts as processed: its partition's checkpoint moves past it).

The SQL conditions are evaluated by Spark before the task (one boolean per SQL rule, in `ROUTE_SQL`), after
any editor steps, and an event a SQL expression fails on is isolated like a poison event; the other
conditions are evaluated here, in the task, in Python.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from hubshift.eventhubs.sender import producer_for
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.pipelines.base import BuildContext, Location, Pipeline, PipelineKind, TaskResult
from hubshift.pipelines.editor import build_editor
from hubshift.pipelines.edits import Event, NotJson, json_path, json_text, json_value
from hubshift.pipelines.replicate import (
    REASON_TOO_LARGE,
    TargetHubSpec,
    plan_sends,
    probe_targets,
    send_group,
    target_of,
    was_replicated,
)
from hubshift.pipelines.steps import JSON_PATH
from hubshift.sinks.base import dead_letter_text
from hubshift.spec import Model, NamedConnection, cel

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# The column of Spark's results for the SQL conditions (one boolean per SQL rule, in rule order).
ROUTE_SQL = "route_sql"
# Bounds that keep the API server's CEL cost estimates small.
MAX_TARGETS = 16
MAX_RULES = 64
NAME_LENGTH = 63

MODULO_WITH_REMAINDER = "set modulo and remainder together"
REMAINDER_BELOW_MODULO = "remainder must be below modulo"
UNIQUE_TARGETS = "target names must be unique"
DECLARED_TARGETS = "rules and defaultTarget must name declared targets"


class TextMatchSpec(Model):
    """Tests on a text value; every test set must hold. None set: the value is present."""

    equals: str | None = Field(default=None, description="Exactly this text.")
    one_of: list[str] | None = Field(default=None, max_length=256, description="Any of these texts.")
    prefix: str | None = Field(default=None, description="Starts with this text.")
    regex: str | None = Field(
        default=None, min_length=1, description="A Python regular expression found in the text (re.search)."
    )
    exists: bool | None = Field(default=None, description="false: the value is absent (no other test).")


class PropertyMatchSpec(TextMatchSpec):
    name: str = Field(min_length=1, description="The application property.")


class JsonMatchSpec(TextMatchSpec):
    """A field of the JSON body; numbers and booleans compare as their JSON text (5, 2.5, true)."""

    path: str = Field(pattern=JSON_PATH, description="The field: names separated by dots (a.b.c).")


class SequenceMatchSpec(Model):
    """The event's sequence number in its source partition."""

    modulo: int | None = Field(default=None, ge=1, description="With remainder: sequence % modulo.")
    remainder: int | None = Field(default=None, ge=0, description="sequence % modulo == remainder.")
    min: int | None = Field(default=None, ge=0, description="At least this.")
    max: int | None = Field(default=None, ge=0, description="At most this.")

    CEL = (
        cel("has(self.modulo) == has(self.remainder)", MODULO_WITH_REMAINDER),
        cel(
            "!has(self.modulo) || !has(self.remainder) || self.remainder < self.modulo",
            REMAINDER_BELOW_MODULO,
            ".remainder",
        ),
    )

    @model_validator(mode="after")
    def _remainder_below_modulo(self) -> SequenceMatchSpec:
        if (self.modulo is None) != (self.remainder is None):
            raise ValueError(MODULO_WITH_REMAINDER)
        if self.modulo is not None and self.remainder is not None and self.remainder >= self.modulo:
            raise ValueError(REMAINDER_BELOW_MODULO)
        return self


class RouteRuleSpec(Model):
    """Every condition set must hold (none: every event); `to` names the targets of a matching event."""

    partition_key: TextMatchSpec | None = Field(default=None, description="The event's partition key.")
    property: PropertyMatchSpec | None = Field(default=None, description="An application property.")
    sequence_number: SequenceMatchSpec | None = Field(default=None, description="The source sequence number.")
    json_field: JsonMatchSpec | None = Field(
        default=None, alias="json", description="A field of the JSON body."
    )
    sql: str | None = Field(
        default=None,
        min_length=1,
        description="A Spark SQL boolean expression over the event columns (partition, sequence_number, "
        "offset, enqueued_time, partition_key, body, properties).",
    )
    to: list[str] = Field(
        min_length=1,
        max_length=MAX_TARGETS,
        description="Names of the targets an event matching this rule goes to.",
    )


class RouteTargetSpec(TargetHubSpec):
    """A target hub with the name rules use for it."""

    name: str = Field(min_length=1, max_length=NAME_LENGTH, description="The name rules use for this target.")


class RouteSpec(Model):
    """Events forwarded (like replicate, with the repl-* metadata) to the targets their rules pick."""

    targets: list[RouteTargetSpec] = Field(
        min_length=1, max_length=MAX_TARGETS, description="The target hubs."
    )
    rules: list[RouteRuleSpec] = Field(
        min_length=1, max_length=MAX_RULES, description="Rules in order (see match)."
    )
    match: Literal["first", "all"] = Field(
        default="first",
        description="first: the first matching rule picks the targets; all: every matching rule adds its "
        "own.",
    )
    default_target: str | None = Field(
        default=None,
        max_length=NAME_LENGTH,
        description="Where events that match no rule go (absent: they are dropped).",
    )
    skip_replicated: bool = Field(
        default=False, description="Do not forward events that carry repl-sequence (as replicate)."
    )

    CEL = (
        cel(
            "self.targets.all(t, self.targets.exists_one(u, u.name == t.name))",
            UNIQUE_TARGETS,
            ".targets",
        ),
        cel(
            "self.rules.all(r, r.to.all(n, self.targets.exists(t, t.name == n))) && "
            "(!has(self.defaultTarget) || self.targets.exists(t, t.name == self.defaultTarget))",
            DECLARED_TARGETS,
        ),
    )

    @model_validator(mode="after")
    def _targets_named(self) -> RouteSpec:
        names = [target.name for target in self.targets]
        if len(set(names)) != len(names):
            raise ValueError(UNIQUE_TARGETS)
        known = set(names)
        if any(name not in known for rule in self.rules for name in rule.to) or (
            self.default_target is not None and self.default_target not in known
        ):
            raise ValueError(DECLARED_TARGETS)
        return self


class TextTest:
    """A `TextMatch`, compiled: every test it sets must hold; none set: the value is present."""

    def __init__(self, spec: TextMatchSpec) -> None:
        self.equals = spec.equals
        self.one_of = None if spec.one_of is None else frozenset(spec.one_of)
        self.prefix = spec.prefix
        self.regex = None if spec.regex is None else re.compile(spec.regex)
        self.absent = spec.exists is False

    def __call__(self, value: str | None) -> bool:
        if self.absent:
            return value is None
        if value is None:
            return False
        return (
            (self.equals is None or value == self.equals)
            and (self.one_of is None or value in self.one_of)
            and (self.prefix is None or value.startswith(self.prefix))
            and (self.regex is None or self.regex.search(value) is not None)
        )


class Rule:
    """One route rule, compiled; `sql_index`: where its SQL condition's result is in `ROUTE_SQL`."""

    def __init__(self, spec: RouteRuleSpec, sql_index: int | None = None) -> None:
        self.to = tuple(spec.to)
        self.partition_key = None if spec.partition_key is None else TextTest(spec.partition_key)
        self.property = None
        if spec.property is not None:
            self.property = (spec.property.name, TextTest(spec.property))
        self.json = None
        if spec.json_field is not None:
            self.json = (json_path(spec.json_field.path), TextTest(spec.json_field))
        sequence = spec.sequence_number
        self.modulo = None if sequence is None else sequence.modulo
        self.remainder = None if sequence is None else sequence.remainder
        self.min = None if sequence is None else sequence.min
        self.max = None if sequence is None else sequence.max
        self.sql_index = sql_index

    def holds(self, event: Event) -> bool:
        row = event.row
        if self.partition_key is not None and not self.partition_key(row.get("partition_key")):
            return False
        if self.property is not None:
            name, test = self.property
            if not test(event.properties().get(name)):
                return False
        if self.modulo is not None or self.min is not None or self.max is not None:
            sequence = row.get("sequence_number")
            if sequence is None:
                return False
            if self.modulo is not None and sequence % self.modulo != self.remainder:
                return False
            if (self.min is not None and sequence < self.min) or (
                self.max is not None and sequence > self.max
            ):
                return False
        if self.json is not None:
            path, test = self.json
            try:
                value = json_text(json_value(event.document(), path))
            except NotJson:
                value = None
            if not test(value):
                return False
        if self.sql_index is not None:
            results = row.get(ROUTE_SQL) or ()
            if self.sql_index >= len(results) or results[self.sql_index] is not True:
                return False
        return True


def pick_targets(rules: Sequence[Rule], event: Event, *, first: bool, default: str | None) -> list[str]:
    """The targets of one event, each once, in the order the rules name them."""
    chosen: list[str] = []
    for rule in rules:
        if rule.holds(event):
            chosen.extend(name for name in rule.to if name not in chosen)
            if first:
                break
    if not chosen and default is not None:
        chosen.append(default)
    return chosen


@dataclass(frozen=True)
class Target:
    name: str
    hub: EventHubsTarget
    keep_partition: bool = False


class RoutePipeline:
    name = "route"

    def __init__(
        self,
        targets: Sequence[Target],
        rules: Sequence[RouteRuleSpec],
        *,
        match: str = "first",
        default_target: str | None = None,
        skip_replicated: bool = False,
    ) -> None:
        self.targets = {target.name: target for target in targets}
        self.sql = [rule.sql for rule in rules if rule.sql is not None]
        compiled: list[Rule] = []
        for rule in rules:
            index = None if rule.sql is None else sum(1 for r in compiled if r.sql_index is not None)
            compiled.append(Rule(rule, index))
        self.rules = compiled
        self.first = match == "first"
        self.default_target = default_target
        self.skip_replicated = skip_replicated

    @classmethod
    def from_spec(cls, spec: RouteSpec, environ: Mapping[str, str]) -> RoutePipeline:
        targets = [
            Target(block.name, target_of(target, environ), block.keep_partition)
            for block, target in zip(spec.targets, _connections(spec, LOCATION), strict=True)
        ]
        return cls(
            targets,
            spec.rules,
            match=spec.match,
            default_target=spec.default_target,
            skip_replicated=spec.skip_replicated,
        )

    def prepare(self, events: DataFrame) -> DataFrame:
        return events

    def with_sql(self, frame: DataFrame) -> DataFrame:
        """`frame` with `ROUTE_SQL`: each SQL condition's result (Spark evaluates them)."""
        from pyspark.sql import functions as F

        return frame.withColumn(ROUTE_SQL, F.array(*(F.expr(f"({sql})").cast("boolean") for sql in self.sql)))

    def process_task(self, rows: pa.Table) -> TaskResult:
        return TaskResult(dead_letters=self.forward(rows.to_pylist()))

    def forward(self, events: Sequence[Mapping[str, Any]]) -> list[str]:
        """Route and send the events (rows in the event row schema, in order); the dead letters."""
        chosen: dict[str, list[Mapping[str, Any]]] = {name: [] for name in self.targets}
        for row in events:
            if self.skip_replicated and was_replicated(row):
                continue
            for name in pick_targets(
                self.rules, Event(dict(row)), first=self.first, default=self.default_target
            ):
                chosen[name].append(row)
        dead: list[str] = []
        for name, rows in chosen.items():
            target = self.targets[name]
            groups = plan_sends(rows, keep_partition=target.keep_partition, skip_replicated=False)
            if not groups:
                continue
            producer = producer_for(target.hub)
            for group in groups:
                for index in send_group(producer, group):
                    dead.append(dead_letter_text(rows[index], f"{REASON_TOO_LARGE} ({name})"))
        return dead


LOCATION: Location = ("spec", "consumer", "pipeline", "route")


def _connections(block: RouteSpec, location: Location) -> list[NamedConnection]:
    return [
        NamedConnection((*location, "targets", i), target, "pipeline")
        for i, target in enumerate(block.targets)
    ]


def _check(block: RouteSpec, environ: Mapping[str, str], location: Location) -> None:
    probe_targets(_connections(block, location), environ)


def _build(block: RouteSpec, context: BuildContext) -> Pipeline:
    route = RoutePipeline.from_spec(block, context.environ)
    return build_editor(route, context.editor, context.state, finish=route.with_sql if route.sql else None)


PIPELINE = PipelineKind[RouteSpec](
    name="route",
    annotation=RouteSpec | None,
    field=Field(default=None, description="Targets and rules (type route)."),
    required="route (targets and rules)",
    build=_build,
    connections=_connections,
    check=_check,
    takes_editor=True,
)
