"""The replication task patterns' pure parts: route rules, the editor's Python steps and its stages, dedupe's
state under replays, the projection's "newer only" rule, the failover's skip, and the manifest's refusals."""

from __future__ import annotations

import gzip
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubshift.errors import UserError
from hubshift.pipelines import PipelineSpec
from hubshift.pipelines.editor import SparkStep, plan_stages
from hubshift.pipelines.edits import (
    DedupeStep,
    EnrichStep,
    Event,
    FlattenStep,
    GunzipStep,
    GzipStep,
    SelectStep,
    ValidateStep,
    check_json_schema,
    gunzip_body,
    load_table,
    run_steps,
)
from hubshift.pipelines.failover import already_handled, replicated_from
from hubshift.pipelines.projection import Record, latest_per_key, newer, payload_of, to_records
from hubshift.pipelines.replicate import replicated_properties
from hubshift.pipelines.route import RouteRuleSpec, Rule, pick_targets
from hubshift.pipelines.steps import EventFieldSpec
from hubshift.sinks import FolderStore

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def row(
    sequence: int,
    body: bytes | str = b"{}",
    *,
    partition: str = "0",
    key: str | None = None,
    properties: dict[str, str] | None = None,
    seconds: float = 0,
) -> dict[str, Any]:
    return {
        "partition": partition,
        "sequence_number": sequence,
        "offset": str(sequence * 10),
        "enqueued_time": T0 + timedelta(seconds=seconds),
        "partition_key": key,
        "body": body.encode() if isinstance(body, str) else body,
        "properties": list((properties or {}).items()),
    }


def events(*rows: dict[str, Any]) -> list[Event]:
    return [Event.of(r) for r in rows]


# --- route --------------------------------------------------------------------------------------------------


def rules(*specs: dict[str, Any]) -> list[Rule]:
    compiled = []
    sql = 0
    for spec in specs:
        rule = RouteRuleSpec.model_validate(spec)
        compiled.append(Rule(rule, sql if rule.sql is not None else None))
        sql += rule.sql is not None
    return compiled


def test_even_and_odd_sequence_numbers_pick_two_targets() -> None:
    even_odd = rules(
        {"sequenceNumber": {"modulo": 2, "remainder": 0}, "to": ["dest1"]},
        {"sequenceNumber": {"modulo": 2, "remainder": 1}, "to": ["dest2"]},
    )
    picked = [pick_targets(even_odd, Event.of(row(n)), first=True, default=None) for n in range(6)]
    assert picked == [["dest1"], ["dest2"]] * 3


def test_every_condition_of_a_rule_must_hold() -> None:
    (rule,) = rules(
        {
            "partitionKey": {"prefix": "h"},
            "property": {"name": "kind", "oneOf": ["alarm", "panic"]},
            "json": {"path": "$.reading.level", "equals": "3"},
            "sequenceNumber": {"min": 10, "max": 20},
            "to": ["a"],
        }
    )
    good = row(15, '{"reading": {"level": 3}}', key="h1", properties={"kind": "alarm"})
    assert rule.holds(Event.of(good))
    for change in (
        {"partition_key": "x1"},
        {"partition_key": None},
        {"properties": [("kind", "motion")]},
        {"body": b'{"reading": {"level": 4}}'},
        {"body": b"not json"},
        {"sequence_number": 21},
    ):
        assert not rule.holds(Event.of({**good, **change})), change


def test_match_all_adds_each_rules_targets_once_and_the_default_takes_the_rest() -> None:
    compiled = rules(
        {"partitionKey": {"regex": "^vip-"}, "to": ["a", "b"]},
        {"property": {"name": "kind"}, "to": ["b", "c"]},
        {"property": {"name": "kind", "exists": False}, "json": {"path": "n", "oneOf": ["1"]}, "to": ["d"]},
    )
    both = Event.of(row(1, key="vip-1", properties={"kind": "x"}))
    assert pick_targets(compiled, both, first=False, default=None) == ["a", "b", "c"]
    assert pick_targets(compiled, both, first=True, default=None) == ["a", "b"]
    assert pick_targets(compiled, Event.of(row(2, '{"n": 1}')), first=False, default="z") == ["d"]
    assert pick_targets(compiled, Event.of(row(3, '{"n": 2}')), first=False, default="z") == ["z"]
    assert pick_targets(compiled, Event.of(row(3, '{"n": 2}')), first=False, default=None) == []


def test_a_sql_condition_reads_sparks_result_for_it() -> None:
    first, second = rules({"sql": "true", "to": ["a"]}, {"sql": "false", "to": ["b"]})
    assert first.sql_index == 0 and second.sql_index == 1
    event = Event.of({**row(1), "route_sql": [True, None]})
    assert first.holds(event) and not second.holds(event)


# --- the editor's Python steps ------------------------------------------------------------------------------


def test_gunzip_validate_select_enrich_flatten_gzip_in_order() -> None:
    schema = {"type": "object", "required": ["home", "reading"], "properties": {"home": {"type": "string"}}}
    steps = [
        GunzipStep(),
        ValidateStep(schema),
        SelectStep({"home": "home", "value": "reading.value", "unit": "reading.unit", "gone": "nowhere"}),
        EnrichStep(
            EventFieldSpec(json="home"), {"h1": {"city": "Oslo"}}, into="site", on_missing="deadLetter"
        ),
        FlattenStep("_"),
        GzipStep(),
    ]
    good = json.dumps({"home": "h1", "reading": {"value": 3, "unit": "C"}, "noise": 1}).encode()
    rows = [
        row(1, gzip.compress(good)),
        row(2, b"plain, not gzip"),
        row(3, gzip.compress(b'{"home": 5, "reading": {}}')),
        row(4, gzip.compress(b'{"home": "h9", "reading": {}}')),
    ]
    arrived = [r["body"] for r in rows]
    kept, dead = run_steps(steps, events(*rows))

    assert [e.row["sequence_number"] for e in kept] == [1]
    assert json.loads(gzip.decompress(kept[0].body)) == {
        "home": "h1",
        "value": 3,
        "unit": "C",
        "site_city": "Oslo",
    }
    reasons = {e.row["sequence_number"]: reason for e, reason in dead}
    assert reasons[2] == "gunzip: the body is not gzip data"
    assert reasons[3].startswith("validate: the body does not match the JSON Schema at home:")
    assert reasons[4] == "enrich: field home 'h9' is not in the table"
    # A dead letter carries the body the event arrived with.
    refused = next(e for e, _ in dead if e.row["sequence_number"] == 3)
    assert refused.dead_letter_row()["body"] == arrived[2]


def test_gzip_is_the_same_bytes_every_time_and_gunzip_refuses_a_bomb() -> None:
    body = b"x" * 100_000
    once, twice = events(row(1, body)), events(row(1, body))
    GzipStep().apply(once, [])
    GzipStep().apply(twice, [])
    assert once[0].body == twice[0].body and len(once[0].body) < 1000
    assert gunzip_body(once[0].body, 100_000) == body
    with pytest.raises(ValueError, match="more than 99999 bytes"):
        gunzip_body(once[0].body, 99_999)
    with pytest.raises(ValueError, match="not gzip"):
        gunzip_body(once[0].body[:20], 100_000)
    assert gunzip_body(gzip.compress(b"a") + gzip.compress(b"b"), 10) == b"ab"  # two members


def test_enrich_keeps_or_drops_what_the_table_lacks_and_a_table_comes_from_a_file(tmp_path: Path) -> None:
    table = tmp_path / "sites.json"
    table.write_text(json.dumps({"h1": {"city": "Oslo", "floors": 3}}))
    loaded = load_table(str(table))
    keep = EnrichStep(EventFieldSpec(property="home"), loaded)
    drop = EnrichStep(EventFieldSpec(property="home"), loaded, on_missing="drop")
    rows = [row(1, "{}", properties={"home": "h1"}), row(2, "{}", properties={"home": "h2"}), row(3, "{}")]
    kept, _ = run_steps([keep], events(*rows))
    assert [json.loads(e.body) for e in kept] == [{"city": "Oslo", "floors": 3}, {}, {}]
    kept, _ = run_steps([drop], events(*rows))
    assert [e.row["sequence_number"] for e in kept] == [1]
    table.write_text("[1, 2]")
    with pytest.raises(UserError, match="expected a JSON object"):
        load_table(str(table))


def test_a_bad_json_schema_is_refused_at_start_up() -> None:
    with pytest.raises(UserError, match="not a valid JSON Schema"):
        check_json_schema({"type": "no such type"}, "editor step 1 (validate)")


# --- dedupe across batches and replays ----------------------------------------------------------------------


def dedupe(tmp_path: Path, window: float = 60) -> DedupeStep:
    return DedupeStep(EventFieldSpec(json="id"), window, FolderStore(tmp_path), "_state/dedupe-1")


def test_repeats_within_the_window_are_dropped_across_batches(tmp_path: Path) -> None:
    first = [row(1, '{"id": "a"}'), row(2, '{"id": "b"}'), row(3, '{"id": "a"}', seconds=5)]
    second = [row(4, '{"id": "b"}', seconds=30), row(5, '{"id": "a"}', seconds=120), row(6, "{}")]
    kept, _ = run_steps([dedupe(tmp_path)], events(*first))
    assert [e.row["sequence_number"] for e in kept] == [1, 2]
    # A new step object (another batch, another worker, a new owner) reads the state from the store.
    kept, _ = run_steps([dedupe(tmp_path)], events(*second))
    assert [e.row["sequence_number"] for e in kept] == [5, 6]  # a: 115 s after its first; no id: kept
    assert (tmp_path / "_state" / "dedupe-1" / "0.json").exists()


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.sampled_from("abcd"), min_size=1, max_size=30),
    cut=st.integers(min_value=0, max_value=30),
    replay_from=st.integers(min_value=0, max_value=30),
)
def test_a_replay_forwards_every_event_the_first_run_forwarded(
    tmp_path_factory: pytest.TempPathFactory, ids: list[str], cut: int, replay_from: int
) -> None:
    # Two batches, then a crash: everything from `replay_from` is read again by a new owner.
    folder = tmp_path_factory.mktemp("state")
    rows = [row(n, json.dumps({"id": i}), seconds=n) for n, i in enumerate(ids)]
    forwarded: set[int] = set()
    for part in (rows[:cut], rows[cut:]):
        kept, _ = run_steps([dedupe(folder, window=10)], events(*part))
        forwarded |= {e.row["sequence_number"] for e in kept}
    kept, _ = run_steps([dedupe(folder, window=10)], events(*rows[replay_from:]))
    replayed = {e.row["sequence_number"] for e in kept}
    if replay_from >= cut:
        # A replay from within the last batch meets the records its first run met (older ones are pruned:
        # a replay from further back may forward another event of a key within the window, never none).
        assert {n for n in forwarded if n >= replay_from} <= replayed
    # Every id reaches the target within any window of 10 s.
    for n, i in enumerate(ids):
        assert any(ids[m] == i and n - 10 <= m <= n for m in forwarded | replayed)


# --- the editor's stages ------------------------------------------------------------------------------------


def test_python_steps_after_the_last_spark_step_run_in_the_forwarding_task() -> None:
    spark = SparkStep("filter", lambda frame: frame)
    gz, gunz, flat = GzipStep(), GunzipStep(), FlattenStep()
    stages, tail = plan_stages([gunz, spark, flat, gz])
    assert stages == [[gunz], spark] and tail == [flat, gz]
    stages, tail = plan_stages([gunz, flat])
    assert stages == [] and tail == [gunz, flat]
    stages, tail = plan_stages([spark])
    assert stages == [spark] and tail == []


# --- log projection -----------------------------------------------------------------------------------------


def record(key: str, partition: str, sequence: int, seconds: float) -> Record:
    return Record(key, "{}", partition, sequence, str(sequence), T0 + timedelta(seconds=seconds))


def test_newer_compares_sequence_numbers_in_a_partition_and_times_across() -> None:
    assert newer(record("k", "0", 5, 0), record("k", "0", 4, 99))
    assert not newer(record("k", "0", 4, 99), record("k", "0", 5, 0))
    assert not newer(record("k", "0", 5, 0), record("k", "0", 5, 0))  # the same event again
    assert newer(record("k", "1", 1, 10), record("k", "0", 9, 5))
    assert not newer(record("k", "1", 1, 5), record("k", "0", 9, 5))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["0", "1"])), min_size=1, max_size=40
    ),
    st.randoms(use_true_random=False),
)
def test_the_latest_per_key_is_the_same_whatever_the_order_and_the_replays(
    keyed: list[tuple[str, str]], shuffle: Any
) -> None:
    # Times rise with the sequence numbers, as the service assigns them.
    stream = [record(key, partition, n, n) for n, (key, partition) in enumerate(keyed)]
    expected = {key: max((r for r in stream if r.key == key), key=lambda r: r.sequence) for key, _ in keyed}
    replayed = stream + stream[len(stream) // 2 :]
    shuffle.shuffle(replayed)
    assert latest_per_key(replayed) == expected


def test_payloads_the_column_cannot_hold_are_refused_and_keyless_events_skipped() -> None:
    assert payload_of(b'{"a": 1}', "json") == '{"a": 1}'
    assert payload_of(b"\xff", "binary") == b"\xff"
    for body, kind, reason in (
        (b"not json", "json", "not JSON"),
        (b'{"a": "\\u0000"}', "json", "\\u0000"),
        (b"\xff", "text", "not UTF-8"),
        (b"a\x00b", "text", "NUL"),
    ):
        with pytest.raises(ValueError, match=re.escape(reason)):
            payload_of(body, kind)
    from hubshift.pipelines.edits import FieldReader

    records, refused = to_records(
        [row(1, '{"v": 1}', key="h1"), row(2, '{"v": 2}'), row(3, "oops", key="h1")],
        FieldReader(EventFieldSpec(partition_key=True)),
        "json",
    )
    assert [(r.key, r.sequence) for r in records] == [("h1", 1)]
    assert [(r["sequence_number"], reason) for r, reason in refused] == [(3, "the body is not JSON")]


# --- failover -----------------------------------------------------------------------------------------------


def test_events_replicated_at_or_before_the_old_checkpoint_of_their_source_partition_were_handled() -> None:
    assert replicated_from([("repl-sequence", "17;42"), ("repl-partition", "3;1")]) == ("1", 42)
    assert replicated_from({"repl-sequence": "42"}) is None  # no source partition: never skipped
    assert replicated_from({"other": "1"}) is None
    handled = {"0": 100, "1": 5}
    source = {"repl-sequence": "100", "repl-partition": "0"}
    assert already_handled(row(5, properties=source), handled)
    assert not already_handled(row(6, properties={"repl-sequence": "101", "repl-partition": "0"}), handled)
    assert not already_handled(row(7), handled)  # produced into the replica itself
    assert not already_handled(row(8, properties={"repl-sequence": "3"}), handled)  # source partition unknown


def test_an_event_of_another_old_partition_landing_in_a_replica_partition_is_compared_with_its_own() -> None:
    """The review's reproduction: old checkpoints {0: 100, 1: 5}; an event from old partition 1 with sequence
    50 lands in replica partition 0 (keyless events are spread). Partition 1 handled only up to 5: keep it."""
    handled = {"0": 100, "1": 5}
    landed = row(9, partition="0", properties={"repl-sequence": "50", "repl-partition": "1"})
    assert not already_handled(landed, handled)
    handled_there = row(10, partition="3", properties={"repl-sequence": "4", "repl-partition": "1"})
    assert already_handled(handled_there, handled)


def test_replicated_properties_carry_the_source_partition_at_every_hop() -> None:
    first = replicated_properties([], None, 7, "70", "2")
    assert first["repl-partition"] == "2"
    again = replicated_properties(list(first.items()), None, 3, "30", "0")
    assert (again["repl-sequence"], again["repl-partition"]) == ("7;3", "2;0")
    assert replicated_from(again) == ("0", 3)


# --- the manifest -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ({"type": "route"}, "route (targets and rules) is required"),
        ({"type": "function", "function": "m:f", "editor": [{"gzip": {}}]}, "editor goes with type"),
        (
            {"type": "route", "route": {"targets": [{"name": "a", "hub": "x"}], "rules": [{"to": ["b"]}]}},
            "rules and defaultTarget must name declared targets",
        ),
        (
            {"type": "projection", "projection": {"table": "t", "database": "postgres"}},
            "postgres is required when database is postgres",
        ),
        ({"type": "replicate", "replicate": {"hub": "x"}, "editor": [{}]}, "set exactly one step"),
        (
            {"type": "projection", "projection": {"table": "t", "key": {"partitionKey": False}}},
            "set exactly one of partitionKey",
        ),
        ({"type": "projection", "projection": {"table": "drop table;"}}, "String should match pattern"),
    ],
)
def test_the_model_refuses_what_cannot_run(pipeline: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        PipelineSpec.model_validate(pipeline)


def test_an_editor_before_replicate_reads_as_written() -> None:
    spec = PipelineSpec.model_validate(
        {
            "type": "replicate",
            "replicate": {"hub": "target"},
            "editor": [
                {"gunzip": {}},
                {"validate": {"jsonSchema": {"type": "object"}}},
                {"filter": "partition_key is not null"},
                {"dedupe": {"key": {"json": "id"}, "windowSeconds": 600}},
            ],
        }
    )
    assert [
        next(k for k, v in s.model_dump(exclude_none=True).items() if v is not None) for s in spec.editor
    ] == [
        "gunzip",
        "validate_",
        "filter",
        "dedupe",
    ]
    assert spec.editor[1].validate_ is not None and spec.editor[1].validate_.json_schema == {"type": "object"}
