"""From a manifest and an environment to the services it names: the one place where a spec's checkpoint
store is opened and its Event Hub resolved, for the consumer, both operator runtimes and the applications.

Credentials always come from environment variables whose names the spec gives (`...ConnectionStringEnv`);
in a cluster the operator (for itself) and the pods (through their Secrets) put them there. Errors are one
line (`UserError`) that names the variable or field to fix, never its value.
"""

from __future__ import annotations

from collections.abc import Mapping

from hubshift.errors import UserError
from hubshift.eventhubs.target import EventHubsTarget, resolve_target
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseStore
from hubshift.ownership.stores.connect import open_store, sqlite_url
from hubshift.ownership.timing import DEFAULT_TIMING, Timing
from hubshift.spec import CheckpointStoreSpec, PartitionedConsumerSpec


def event_hubs_target(spec: PartitionedConsumerSpec, environ: Mapping[str, str]) -> EventHubsTarget:
    """The hub the spec reads, with its connection string (checked for shape, not yet connected)."""
    return resolve_target(spec.event_hubs, environ)


def ownership_scope(target: EventHubsTarget) -> Scope:
    """Where the pool's leases, checkpoints and assignment live in its store."""
    return Scope(target.fqns, target.hub, target.consumer_group)


def open_checkpoint_store(
    spec: CheckpointStoreSpec,
    environ: Mapping[str, str],
    *,
    timing: Timing = DEFAULT_TIMING,
    create: bool = True,
) -> LeaseStore:
    """The checkpoint store the spec names, reachable and with its container (or file) in place (`create`
    makes them)."""
    if spec.sqlite is not None:
        return open_store(sqlite_url(spec.sqlite.path), create=create, timing=timing)
    if spec.blob is None:  # the model requires exactly one of them
        raise UserError("spec.checkpointStore: set exactly one of blob or sqlite")
    variable = spec.blob.connection_string_env
    connection_string = environ.get(variable, "").strip()
    if not connection_string:
        raise UserError(
            f"environment variable {variable} is not set: it must hold the Azure Storage connection string "
            "of the checkpoint store (in a cluster, set spec.checkpointStore.blob.connectionStringSecretRef)"
        )
    return open_store(connection_string, spec.blob.container, create=create, timing=timing)
