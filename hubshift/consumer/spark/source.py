"""The PySpark 4 streaming data source that reads the partitions this consumer owns.

Where each method runs (docs/architecture.md, "Spark facts the consumer relies on"):
- `initialOffset`, `latestOffset`, `partitions`, `commit`: Spark's long-lived source runner, a Python
  process of its own. It cannot see the agent's memory: it reads the ownership file (`ownership_file`) and
  lists the spool (`spool`), both in the consumer's scratch folder.
- `read`: executor Python workers, a fresh unpickled copy per task, given one pickled `EventRange`.
So `__init__` keeps plain options only (the reader is pickled and built more than once) and has no side
effects; `stop()` is never relied on (Spark does not reliably call it).

The Event Hubs receivers (with the owner level of each ownership) run in the consumer's main process and
fill the spool; `read()` slices segments of it as Arrow batches. docs/consumer.md says why.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from hubshift.consumer.spark import spool
from hubshift.consumer.spark.offsets import (
    ReadRange,
    SourceOffset,
    SpoolExtent,
    partition_range,
    plan_latest,
    plan_partition,
    plan_ranges,
)
from hubshift.consumer.spark.ownership_file import read_ownership, write_planned
from hubshift.eventhubs.rows import event_schema_ddl, without_system_properties

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from hubshift.spec import SparkSpec

FORMAT = "hubshift_eventhubs"
OPTION_SCRATCH = "scratch"
OPTION_SPOOL = "spool"
OPTION_MAX_EVENTS = "maxEventsPerTrigger"
# A streaming job's query reads one partition (its position in the query's own checkpoint).
OPTION_PARTITION = "partition"
# "true": the events' system properties as a column of their own (spark.includeSystemProperties).
OPTION_SYSTEM_PROPERTIES = "includeSystemProperties"


def _system_properties(options: Mapping[str, str]) -> bool:
    return str(options.get(OPTION_SYSTEM_PROPERTIES, "false")).lower() == "true"


def read_events(
    spark: SparkSession, scratch: Path, spool_root: Path, settings: SparkSpec, partition: str | None = None
) -> DataFrame:
    """The streaming DataFrame of the owned partitions' events (of one partition, for a streaming job's
    query), as the consumer's Spark settings ask for them."""
    reader = (
        spark.readStream.format(FORMAT)
        .option(OPTION_SCRATCH, str(scratch))
        .option(OPTION_SPOOL, str(spool_root))
        .option(OPTION_MAX_EVENTS, str(settings.max_events_per_trigger))
        .option(OPTION_SYSTEM_PROPERTIES, str(settings.include_system_properties).lower())
    )
    if partition is not None:
        reader = reader.option(OPTION_PARTITION, partition)
    return reader.load()


class EventRange(InputPartition):
    """One Spark task: read `[start, end)` of one partition epoch from the spool (pickled to a worker)."""

    def __init__(
        self,
        spool_root: str,
        partition: str,
        owner_level: int,
        start: int,
        end: int,
        system_properties: bool = False,
    ) -> None:
        super().__init__((partition, owner_level, start, end))
        self.spool_root = spool_root
        self.partition = partition
        self.owner_level = owner_level
        self.start = start
        self.end = end
        self.system_properties = system_properties


class EventHubsStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.scratch = str(options[OPTION_SCRATCH])
        self.spool_root = str(options.get(OPTION_SPOOL) or f"{self.scratch}/spool")
        limit = int(options.get(OPTION_MAX_EVENTS) or 0)
        self.max_events = limit if limit > 0 else None
        self.partition = options.get(OPTION_PARTITION) or None
        self.system_properties = _system_properties(options)
        self.planned_version: int | None = None  # the source runner's own: what it last told the engine

    # --- source runner (driver side) ---------------------------------------------------------------

    def _plan(self, start: SourceOffset | None, max_rows: int | None) -> SourceOffset:
        view = read_ownership(self.scratch)
        if self.partition is not None:
            entry = view.partitions.get(self.partition)
            held = None if entry is None else spool.extent(self.spool_root, self.partition, entry.owner_level)
            return plan_partition(start, self.partition, entry, held, max_rows)
        spooled: dict[str, SpoolExtent] = {}
        for partition, entry in view.partitions.items():
            if not entry.draining:
                found = spool.extent(self.spool_root, partition, entry.owner_level)
                if found is not None:
                    spooled[partition] = found
        if view.ownership_version != self.planned_version:
            write_planned(self.scratch, view.ownership_version)
            self.planned_version = view.ownership_version
        return plan_latest(start, view.ownership_version, view.partitions, spooled, max_rows)

    def initialOffset(self) -> dict[str, Any]:
        # Where reading begins: Spark never reads what lies before the initial offset, so nothing advances.
        return self._plan(None, 0).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_events) if self.max_events else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Obey the limit Spark passes: ReadAllAvailable (Trigger.AvailableNow) overrides our own option.
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return self._plan(SourceOffset.from_json(start), max_rows).to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if self.partition is not None:
            entry = read_ownership(self.scratch).partitions.get(self.partition)
            level = SourceOffset.from_json(end).ownership_version if entry is None else entry.owner_level
            read = partition_range(
                SourceOffset.from_json(start), SourceOffset.from_json(end), self.partition, level
            )
            return [] if read is None else [self._input(read)]
        ranges = plan_ranges(SourceOffset.from_json(start), SourceOffset.from_json(end))
        return [self._input(r) for r in ranges]

    def _input(self, r: ReadRange) -> EventRange:
        return EventRange(self.spool_root, r.partition, r.owner_level, r.start, r.end, self.system_properties)

    def commit(self, end: dict[str, Any]) -> None:
        # Checkpoints go to the store from the consumer's main process once the batch is written
        # (foreachBatch returned): commit() lags one trigger and is repeated on restart.
        return None

    # --- executor workers --------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, EventRange)
        batches = spool.read_range(
            partition.spool_root, partition.partition, partition.owner_level, partition.start, partition.end
        )
        if partition.system_properties:
            yield from batches
        else:
            yield from (without_system_properties(batch) for batch in batches)


class EventHubsDataSource(DataSource):
    """`spark.readStream.format("hubshift_eventhubs").option("scratch", DIR)`: the owned partitions."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return event_schema_ddl(_system_properties(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return EventHubsStreamReader(self.options)
