"""The `jdbc` sink without a database: its block's refusals, the SQL it sends (the upsert by the event's
coordinates, each consumer's staging table) and that its URL, which holds the password, stays out of every
message."""

from __future__ import annotations

import copy
import re
import traceback
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hubshift.errors import UserError
from hubshift.manifest import parse_manifest
from hubshift.sinks import SinkSpec, build_sink
from hubshift.sinks.base import Output, PipelineResult, WriterBatch
from hubshift.sinks.jdbc import (
    DEFAULT_JDBC_ENV,
    NO_SECRET_OPTIONS,
    SQL_NAME,
    JdbcSink,
    merge_statement,
    passwords_in,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "homes.yaml"
PASSWORD = "hunter2-s3cret"
URL = f"jdbc:postgresql://db.internal:5432/orders?user=writer&password={PASSWORD}"


def jdbc(block: dict[str, Any], environ: dict[str, str] | None = None) -> JdbcSink:
    spec = SinkSpec.model_validate({"type": "jdbc", "jdbc": block})
    built = build_sink(spec, {DEFAULT_JDBC_ENV: URL} if environ is None else environ, scope="s")
    assert isinstance(built, JdbcSink)
    return built


def refusal(block: dict[str, Any]) -> str:
    document: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    document["spec"]["consumer"]["pipeline"] = {"type": "events"}
    document["spec"]["consumer"]["sink"] = {"type": "jdbc", "jdbc": block}
    with pytest.raises(UserError) as refused:
        parse_manifest(document)
    return str(refused.value)


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"table": "orders", "options": {"url": URL}}, f"spec.consumer.sink.jdbc: {NO_SECRET_OPTIONS}"),
        ({"table": "orders", "options": {"PASSWORD": PASSWORD}}, NO_SECRET_OPTIONS),
        ({"table": "orders", "options": {"User": "writer"}}, NO_SECRET_OPTIONS),
        ({"table": "orders", "options": {"dbtable": "other"}}, NO_SECRET_OPTIONS),
        ({"table": "orders", "options": {"query": "select 1"}}, NO_SECRET_OPTIONS),
        (
            {"table": "orders", "keyColumns": ["id; drop table x"]},
            "spec.consumer.sink.jdbc.keyColumns.0: String",
        ),
        (
            {"table": "orders", "keyColumns": []},
            "spec.consumer.sink.jdbc.keyColumns: List should have at least",
        ),
        ({"table": "a.b.c"}, "spec.consumer.sink.jdbc.table: String should match pattern"),
        ({"table": "orders; drop table x"}, "spec.consumer.sink.jdbc.table"),
        ({"keyColumns": ["id"]}, "spec.consumer.sink.jdbc.table: required field is missing"),
        (
            {"table": "orders", "credential": {"type": "default"}},
            "spec.consumer.sink.jdbc.credential: unknown",
        ),
    ],
)
def test_a_bad_jdbc_block_is_one_line_without_the_secret(block: dict[str, Any], expected: str) -> None:
    message = refusal(block)
    assert expected in message
    assert PASSWORD not in message and "\n" not in message


def test_the_url_comes_from_the_environment_the_block_names() -> None:
    sink = jdbc({"table": "sales.orders", "connectionStringEnv": "ORDERS_DB"}, {"ORDERS_DB": URL})
    assert sink.url == URL and sink.driver == "org.postgresql.Driver"
    assert sink.describe() == "table sales.orders (JDBC)" and sink.spark_conf() == {}
    assert PASSWORD not in repr(sink.block) and PASSWORD not in sink.describe()
    with pytest.raises(UserError) as missing:
        jdbc({"table": "orders"}, {})
    assert str(missing.value) == (
        f"environment variable {DEFAULT_JDBC_ENV} is not set: it must hold the JDBC connection string of "
        "spec.consumer.sink.jdbc (in a cluster, set spec.consumer.sink.jdbc.connectionStringSecretRef)"
    )


def test_a_database_without_a_known_driver_is_told_to_name_one() -> None:
    mysql = {DEFAULT_JDBC_ENV: f"jdbc:mysql://db/orders?password={PASSWORD}"}
    with pytest.raises(UserError) as refused:
        jdbc({"table": "orders"}, mysql)
    assert str(refused.value) == (
        "sink jdbc: no driver known for this URL; set options.driver (and add its jar to the image)"
    )
    named = jdbc({"table": "orders", "options": {"driver": "com.mysql.cj.jdbc.Driver"}}, mysql)
    assert named.driver == "com.mysql.cj.jdbc.Driver"


def test_the_upsert_by_the_events_coordinates() -> None:
    statement = merge_statement(
        "sales.orders",
        "sales.orders_hubshift_orders_0",
        ["partition", "sequence_number", "site", "amount"],
        ["partition", "sequence_number"],
    )
    assert statement == (
        'MERGE INTO sales.orders t USING sales.orders_hubshift_orders_0 s ON t."partition" = s."partition" '
        'AND t."sequence_number" = s."sequence_number" WHEN MATCHED THEN UPDATE SET "site" = s."site", '
        '"amount" = s."amount" WHEN NOT MATCHED THEN INSERT ("partition", "sequence_number", "site", '
        '"amount") VALUES (s."partition", s."sequence_number", s."site", s."amount")'
    )


def test_rows_of_keys_alone_are_only_inserted() -> None:
    statement = merge_statement("t", "s_t", ["id"], ["id"])
    assert "WHEN MATCHED" not in statement
    assert statement.endswith('WHEN NOT MATCHED THEN INSERT ("id") VALUES (s."id")')


def test_column_names_are_quoted_as_spark_quotes_them() -> None:
    statement = merge_statement("t", "s", ["id", 'odd "name"'], ["id"])
    assert 'SET "odd ""name""" = s."odd ""name"""' in statement


def test_the_staging_table_is_the_consumers_own_beside_the_table() -> None:
    sink = jdbc({"table": "sales.Orders"})
    assert sink.staging_table("orders-0").startswith("sales.orders_hubshift_orders_0_")
    assert sink.staging_table("orders-1") != sink.staging_table("orders-0")
    assert jdbc({"table": "orders"}).staging_table("c.1").startswith("orders_hubshift_c_1_")


CONSUMER_IDS = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,60}[a-z0-9])?", fullmatch=True)
TABLES = st.from_regex(r"([a-z_][a-z0-9_]{0,20}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}", fullmatch=True)


@given(TABLES, CONSUMER_IDS, CONSUMER_IDS)
def test_two_consumers_never_share_a_staging_table(table: str, one: str, other: str) -> None:
    # Each consumer truncates and fills its own staging table before its MERGE: a shared one would let a
    # consumer merge another's rows, or lose its own. PostgreSQL cuts identifiers at 63 characters.
    sink = jdbc({"table": table})
    schema, _, _ = table.rpartition(".")
    name = sink.staging_table(one)
    assert name.startswith(f"{schema}.") if schema else "." not in name
    assert re.fullmatch(SQL_NAME, name.rpartition(".")[2]) and name == name.lower()
    assert sink.staging_table(one) == name  # the same consumer, after a restart, finds its own
    if one != other:
        assert sink.staging_table(other) != name


def test_long_consumer_ids_that_differ_at_the_end_get_their_own_staging_tables() -> None:
    sink = jdbc({"table": "telemetry_readings_enriched"})
    names = {sink.staging_table(f"home-security-telemetry-consumer-{n}") for n in range(12)}
    assert len(names) == 12
    assert len({sink.staging_table(i) for i in ("c-1", "c.1", "c_1")}) == 3


class Refusing:
    """Stands in for Spark's JDBC writer and the JVM: every call fails with a message holding `text`."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __getattr__(self, name: str) -> Any:
        if name in ("format", "option", "mode"):
            return lambda *args: self
        raise RuntimeError(self.text)


class Rows:
    """A transform's frame as far as the jdbc sink reads it before writing: its columns and writer."""

    columns = ["partition", "sequence_number", "site"]

    def __init__(self, text: str) -> None:
        self.write = Refusing(text)


def failure(text: str, *, writing: bool) -> UserError:
    """The error the sink raises when writing a batch (or, `writing` false, checking its database) fails
    with `text`."""
    sink = jdbc({"table": "orders"})
    batch = WriterBatch(1, "orders-0", "orders-0-run-000000001", datetime(2026, 11, 25, tzinfo=UTC), {})
    with pytest.raises(UserError) as refused:
        if writing:
            sink.write_batch(
                cast(Any, None), lambda _: PipelineResult({"r": Output(cast(Any, Rows(text)))}), batch
            )
        else:
            sink.check(cast(Any, SimpleNamespace(_jvm=Refusing(text))))
    return refused.value


def shown(error: BaseException) -> str:
    """Everything a log line with this error's traceback would print (the chained causes too)."""
    return "".join(traceback.format_exception(error))


@pytest.mark.parametrize("writing", [False, True])
def test_errors_never_carry_the_url(writing: bool) -> None:
    error = failure(f"Connection to {URL} refused", writing=writing)
    assert "<the JDBC URL>" in str(error)
    assert PASSWORD not in shown(error)


@pytest.mark.parametrize("writing", [False, True])
@given(padding=st.integers(0, 400))
def test_a_message_cut_short_never_keeps_part_of_the_url(writing: bool, padding: int) -> None:
    # Cutting the line before taking the URL out left the URL's start, up to part of the password.
    error = failure("x" * padding + f" while connecting to {URL} as requested", writing=writing)
    assert f"password={PASSWORD[:4]}" not in shown(error) and "\n" not in str(error)


@pytest.mark.parametrize("writing", [False, True])
def test_a_password_the_driver_repeats_alone_is_taken_out_too(writing: bool) -> None:
    error = failure(f'FATAL: password "{PASSWORD}" does not match for user "writer"', writing=writing)
    assert PASSWORD not in shown(error)
    assert "<the password>" in str(error)


@pytest.mark.parametrize(
    ("url", "passwords"),
    [
        (URL, [PASSWORD]),
        ("jdbc:sqlserver://db:1433;databaseName=orders;user=writer;password=p4ss;encrypt=true", ["p4ss"]),
        ("jdbc:postgresql://db/orders?PWD=p4ss&user=writer", ["p4ss"]),
        ("jdbc:mysql://writer:p4ss@db:3306/orders", ["p4ss"]),
        ("jdbc:oracle:thin:writer/p4ss@//db:1521/orders", ["p4ss"]),
        ("jdbc:postgresql://db/orders?user=writer&password=long-one&options=x;pwd=p", ["long-one", "p"]),
        ("jdbc:postgresql://db/orders?user=writer", []),
    ],
)
def test_the_passwords_a_url_holds(url: str, passwords: list[str]) -> None:
    assert passwords_in(url) == passwords
