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
from typing import TYPE_CHECKING, Any

from hubshift.pipelines.base import TaskResult
from hubshift.pipelines.edits import Event, NotJson, json_path, json_text, json_value
from hubshift.pipelines.replicate import (
    REASON_TOO_LARGE,
    plan_sends,
    producer_for,
    replicate_target,
    send_group,
    was_replicated,
)
from hubshift.spec import RouteRuleSpec, RouteSpec, TextMatchSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from hubshift.eventhubs.target import EventHubsTarget

# The column of Spark's results for the SQL conditions (one boolean per SQL rule, in rule order).
ROUTE_SQL = "route_sql"


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
            Target(
                target.name,
                replicate_target(
                    target,
                    environ,
                    f"spec.consumer.pipeline.route.targets[{index}].connectionStringSecretRef",
                ),
                target.keep_partition,
            )
            for index, target in enumerate(spec.targets)
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
        from hubshift.sinks.base import dead_letter_text

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
