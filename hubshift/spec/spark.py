"""Each consumer's Spark: its local-mode driver's settings (`SparkSpec`), the settings hubshift sets itself,
and its web UI."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from hubshift.spec.base import MAX_SETTINGS, Model, cel

# A JVM memory size as Spark takes it (512m, 1g).
JVM_SIZE = r"^[0-9]+[kKmMgGtT]?$"

# Spark settings the spec's own fields (their place under spec.consumer; None: hubshift) set: `spark.conf`
# may not set them again.
OWN_SPARK_CONF = {
    "spark.master": "spark.master",
    "spark.app.name": None,
    "spark.driver.memory": "spark.driverMemory",
    "spark.sql.shuffle.partitions": "spark.shufflePartitions",
    "spark.ui.enabled": "spark.ui.enabled",
    "spark.ui.port": "spark.ui.port",
    "spark.local.dir": None,
    "spark.sql.warehouse.dir": None,
    "spark.driver.extraJavaOptions": None,
    "spark.driver.extraClassPath": None,
    "spark.sql.session.timeZone": None,
    # a local-mode driver's RPC and block manager listen on 127.0.0.1 only (they have no authentication
    # and deserialize what they are sent), and the UI has no kill buttons
    "spark.driver.bindAddress": None,
    "spark.driver.host": None,
    "spark.ui.killEnabled": None,
}


class SparkUiSpec(Model):
    """Spark's web UI of each consumer's driver: off unless asked for (`kubectl port-forward pod/NAME
    4040`)."""

    enabled: bool = Field(default=False, description="Serve Spark's UI.")
    port: int = Field(default=4040, ge=1024, le=65535, description="Its port in the pod.")


class SparkSpec(Model):
    """The Spark session of each consumer (engine spark): its master, triggers and settings."""

    master: str = Field(default="local[*]", description="Spark master; consumers run a local-mode driver.")
    trigger_interval_seconds: float = Field(default=1.0, gt=0, description="Micro-batch trigger interval.")
    max_events_per_trigger: int = Field(
        default=100_000, ge=1, description="Admission control: events per micro-batch, over all partitions."
    )
    include_system_properties: bool = Field(
        default=False,
        description="Give the events a system_properties column (map<string,string>): the AMQP properties "
        "section's fields that are set (message-id, correlation-id, content-type, ...) and the service's "
        "annotations (x-opt-sequence-number, x-opt-enqueued-time, ...), keyed as the SDK's "
        "EventData.system_properties keys them.",
    )
    shuffle_partitions: int = Field(default=2, ge=1, description="spark.sql.shuffle.partitions.")
    driver_memory: str = Field(default="1g", pattern=JVM_SIZE, description="spark.driver.memory (512m, 1g).")
    conf: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=MAX_SETTINGS,
        description="More of Spark's settings (spark.*), passed to each consumer's Spark session as they "
        "are; those the fields above (or hubshift) set are refused.",
    )
    ui: SparkUiSpec = Field(default_factory=SparkUiSpec)

    CEL = (
        cel(
            "!has(self.conf) || self.conf.all(k, k.startsWith('spark.') && !(k in ["
            + ", ".join(f"'{key}'" for key in OWN_SPARK_CONF)
            + "]))",
            "conf: Spark settings start with spark., and those hubshift sets (spark.master, "
            "spark.driver.memory, ...) have fields of their own",
            ".conf",
        ),
    )

    @model_validator(mode="after")
    def _own_settings_stay_own(self) -> SparkSpec:
        for key in self.conf:
            if not key.startswith("spark."):
                raise ValueError(f"conf: {key!r} is not a Spark setting (they start with spark.)")
            if key in OWN_SPARK_CONF:
                field = OWN_SPARK_CONF[key]
                where = f"set spec.consumer.{field} instead" if field else "hubshift sets it"
                raise ValueError(f"conf: {key} cannot be set here: {where}")
        return self


# Option names of Spark's Kafka source (and of the azure-event-hubs-spark connector) a Spark team types out of
# habit, and where hubshift says the same thing: named in the error for an unknown field of that name.
_NO_MINIMUM = (
    "no minimum per batch here: spec.consumer.spark.triggerIntervalSeconds sets how often one starts"
)
_START = (
    "spec.consumer.startPosition (type earliest, latest or enqueuedTime; per partition, partitions: "
    "{ID: {type: sequenceNumber, sequenceNumber: N}}; a checkpoint wins)"
)
_START_AT = "spec.consumer.startPosition (type enqueuedTime, with enqueuedTime)"
_HUB = "spec.eventHubs.hub (hubshift assigns its partitions to the consumers)"
SOURCE_OPTION_HINTS: dict[str, str] = {
    "maxOffsetsPerTrigger": "spec.consumer.spark.maxEventsPerTrigger (events per batch, all partitions)",
    "minOffsetsPerTrigger": _NO_MINIMUM,
    "maxTriggerDelay": _NO_MINIMUM,
    "startingOffsets": _START,
    "startingPosition": _START,
    "startingTimestamp": _START_AT,
    "startingOffsetsByTimestamp": _START_AT,
    "failOnDataLoss": "spec.consumer.failOnDataLoss",
    "checkpointLocation": "none to give: each partition's offsets live in spec.checkpointStore, a streaming "
    "job's state beside them or in spec.consumer.pipeline.stream.state",
    "groupIdPrefix": "spec.eventHubs.consumerGroup",
    "consumerGroup": "spec.eventHubs.consumerGroup",
    "subscribe": _HUB,
    "assign": _HUB,
    "includeHeaders": "none to give: an event's application properties are always its properties column; "
    "spec.consumer.spark.includeSystemProperties adds its system properties",
}
