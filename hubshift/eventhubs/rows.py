"""The rows the Event Hubs streaming source produces: one per event, in this column order."""

from __future__ import annotations

EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("partition", "string"),
    ("sequence_number", "bigint"),
    ("offset", "string"),
    ("enqueued_time", "timestamp"),
    ("partition_key", "string"),
    ("body", "binary"),
    ("properties", "map<string,string>"),
)

# DDL string accepted by `DataSource.schema()` and `spark.createDataFrame(..., schema=...)`.
EVENT_SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in EVENT_COLUMNS)
