"""Names vulture reports as unused that are used where it cannot see (tools/run-tests' lint tier runs it
over hubshift/ with this file). Never run; each group says who uses its names."""

import logging

import kopf
from azure.eventhub._consumer import EventHubConsumer
from azure.eventhub._pyamqp._transport import SSLTransport

from bench.partitions import Run
from bench.rebalance import Outcome
from hubshift.apps.produce import send_load
from hubshift.consumer.spark.telemetry import ProgressListener
from hubshift.emulator.connection import AmqpConnection
from hubshift.emulator.messages import MessageProperties
from hubshift.emulator.performatives import (
    Attach,
    Begin,
    Disposition,
    Flow,
    Open,
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    SourceTerminus,
    TargetTerminus,
    Transfer,
)
from hubshift.manifest import PartitionedConsumer
from hubshift.operator.kubernetes.api import KubeAdapter
from hubshift.operator.loop import CycleReport
from hubshift.operator.status import (
    Condition,
    LagTargetStatus,
    PartitionedConsumerStatus,
    PendingHandoff,
    RolloutStatus,
)
from hubshift.ownership.store import BlobEntry, LeaseState
from hubshift.podtemplate import (
    ContainerSecuritySpec,
    ContainerSpec,
    ProjectedVolumeSpec,
    TolerationSpec,
    VolumeProjectionSpec,
    VolumeSpec,
)
from hubshift.spec.pods import ResourceListSpec

# Pydantic fields read by serialisation or validation: the status goes to the CR by model_dump, the
# manifest's apiVersion is checked when it is parsed, the resource sizes are rendered into the pod.
PartitionedConsumerStatus.assignment_generation
PartitionedConsumerStatus.last_active_time
PartitionedConsumerStatus.incoming_events_per_second
PartitionedConsumerStatus.consumer_capacity_events_per_second
PartitionedConsumerStatus.lag_target
PartitionedConsumerStatus.expired_events
LagTargetStatus.demand_events_per_second
Condition.last_transition_time
PendingHandoff.from_owner
PendingHandoff.to_owner
PartitionedConsumer.api_version
# The pod template's fields that go to the pod as they are (by model_dump into the StatefulSet).
TolerationSpec.effect
TolerationSpec.toleration_seconds
VolumeSpec.persistent_volume_claim
VolumeSpec.empty_dir
VolumeSpec.csi
VolumeSpec.ephemeral
VolumeSpec.projected
VolumeSpec.downward_api
ProjectedVolumeSpec.sources
VolumeProjectionSpec.cluster_trust_bundle
ContainerSecuritySpec.run_as_user
ContainerSecuritySpec.run_as_group
ContainerSecuritySpec.read_only_root_filesystem
ContainerSpec.security_context
ResourceListSpec.cpu

# kopf's settings, set by operator/kubernetes/settings.py for kopf to read.
settings = kopf.OperatorSettings()
settings.peering.mandatory
settings.posting.enabled
settings.watching.server_timeout
settings.watching.client_timeout
settings.watching.connect_timeout
settings.watching.reconnect_backoff
settings.networking.connect_timeout
settings.background.instant_exit_timeout
settings.persistence.finalizer
settings.persistence.progress_storage
settings.persistence.diffbase_storage

# The standard library reads these: a log record rewritten by consumer/http.py's filter (the handlers
# format it).
logging.LogRecord.msg
logging.LogRecord.levelname
logging.LogRecord.levelno
logging.LogRecord.exc_text

# Set on the Event Hubs SDK's consumer (eventhubs/sdk_internals.py): the SDK resumes from it after a
# retried link failure.
EventHubConsumer._last_received_event
# Set on the SDK connection's transport (eventhubs/sdk_internals.py): pyamqp's frame reader calls it.
SSLTransport._read

# What the store reports: Azure's lease state while a break runs (parsed by LeaseState(value)), and
# whether a lease is infinite (both backends fill it in; the store contract tests hold them to it).
LeaseState.BREAKING
BlobEntry.lease_infinite

# A control-loop cycle's report, read by bench/control_loop.py (outside hubshift/).
CycleReport.store_requests

# Public in-process APIs that only tests and benchmarks call today: the load generator's one-call API
# (bench/rebalance.py, the runtime tests; documented in apps/produce.py) and the adapter for an API server
# without authentication (kmock in the operator's unit tests), beside from_environment.
send_load
KubeAdapter.from_server

# The emulator's AMQP protocol object: asyncio's event loop calls these.
AmqpConnection.connection_lost
AmqpConnection.pause_writing
AmqpConnection.resume_writing
AmqpConnection.data_received
AmqpConnection.eof_received

# AMQP 1.0 fields decoded by position: each performative, source, target and message-properties section
# names every field of the specification, so a decoded frame reads as the specification does, even where
# the emulator never looks at one.
MessageProperties.user_id
MessageProperties.reply_to
MessageProperties.content_encoding
MessageProperties.absolute_expiry_time
MessageProperties.creation_time
MessageProperties.group_id
MessageProperties.group_sequence
MessageProperties.reply_to_group_id
Open.outgoing_locales
Open.incoming_locales
Open.offered_capabilities
Begin.incoming_window
Begin.outgoing_window
Begin.offered_capabilities
Attach.unsettled
Attach.incomplete_unsettled
Attach.offered_capabilities
Flow.incoming_window
Flow.outgoing_window
Transfer.delivery_tag
Transfer.batchable
Disposition.batchable
SaslMechanisms.sasl_server_mechanisms
SaslInit.mechanism
SaslInit.initial_response
SaslChallenge.challenge
SaslOutcome.outcome_code
SaslOutcome.additional_data
SourceTerminus.durable
SourceTerminus.expiry_policy
SourceTerminus.dynamic
SourceTerminus.dynamic_node_properties
SourceTerminus.distribution_mode
SourceTerminus.default_outcome
SourceTerminus.outcomes
SourceTerminus.capabilities
TargetTerminus.durable
TargetTerminus.expiry_policy
TargetTerminus.dynamic
TargetTerminus.dynamic_node_properties
TargetTerminus.capabilities

# Benchmark results written whole to JSON (dataclasses.asdict): every field is read by whoever reads the
# results file.
Outcome.processed
Outcome.planned_moves
Run.storage_kinds_idle
Run.storage_kinds_load

# Spark calls its Python listener interface's methods through py4j, which reads the interface it
# implements from `Java.implements` (consumer/spark/telemetry.py's ProgressListener).
ProgressListener.onQueryStarted
ProgressListener.onQueryProgress
ProgressListener.onQueryIdle
ProgressListener.onQueryTerminated
ProgressListener.Java
ProgressListener.Java.implements

# Status fields, read from the resource's status by people and dashboards.
RolloutStatus.updated_replicas
