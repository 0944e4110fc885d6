"""The control loop in the Kubernetes operator: `cycle(cr_body, runtime, memo)`, plugged into the kopf
control-loop daemon with `install()` (`handlers.set_control_loop`) before the operator starts.

Per PartitionedConsumer a `ControlLoop` lives in the CR's kopf memo with its Event Hubs client and store;
it is rebuilt when the spec changes. Connection strings come from the Secrets the spec names (read
through the runtime, masked until the client is built) or, without a Secret reference, from the
operator's own environment variable of the same name. While a holddown or handoffs are pending the loop
nudges itself (the next cycle starts as soon as `OperatorContext.min_cycle_seconds` allow) instead of
waiting a polling interval.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import kopf

from hubshift.eventhubs.management import EventHubsProbe
from hubshift.eventhubs.target import resolve_target
from hubshift.operator.kubernetes import handlers
from hubshift.operator.kubernetes.api import KubernetesRuntime
from hubshift.operator.kubernetes.reconcile import consumer_key, operator_context
from hubshift.operator.loop import ControlLoop, CycleInputs
from hubshift.ownership.scope import Scope
from hubshift.ownership.stores.connect import open_store, sqlite_url
from hubshift.spec import PartitionedConsumer

MEMO_KEY = "hubshift_control_loop"


def install() -> None:
    """Make the kopf control-loop daemon run this control loop (call before `kopf.run`)."""
    handlers.set_control_loop(cycle)


async def cycle(cr_body: Mapping[str, Any], runtime: KubernetesRuntime, memo: kopf.Memo) -> None:
    context = operator_context(memo)
    loop = memo.get(MEMO_KEY)
    if not isinstance(loop, ControlLoop) or loop.consumer.spec != runtime.consumer.spec:
        if isinstance(loop, ControlLoop):
            await loop.close()
        loop = await open_loop(runtime, context.metrics)
        memo[MEMO_KEY] = loop
    loop.runtime = runtime  # a fresh view of the pods each cycle
    report = await loop.cycle(CycleInputs.from_body(cr_body))
    if report.next_cycle_in < runtime.consumer.spec.scaling.polling_interval_seconds:
        context.nudge(consumer_key(cr_body))


async def open_loop(runtime: KubernetesRuntime, metrics: Any) -> ControlLoop:
    consumer = runtime.consumer
    environment = await connection_environment(runtime, consumer)
    target = resolve_target(consumer.spec.event_hubs, environment)
    store_spec = consumer.spec.checkpoint_store
    if store_spec.sqlite is not None:
        store = await asyncio.to_thread(open_store, sqlite_url(store_spec.sqlite.path), create=True)
    else:
        assert store_spec.blob is not None
        connection = environment.get(store_spec.blob.connection_string_env, "")
        store = await asyncio.to_thread(open_store, connection, store_spec.blob.container, create=True)
    scope = Scope(target.fqns, target.hub, target.consumer_group)
    return ControlLoop(consumer, scope, store, EventHubsProbe(target), runtime, metrics=metrics)


async def connection_environment(runtime: KubernetesRuntime, consumer: PartitionedConsumer) -> dict[str, str]:
    """The connection strings under the variable names the spec gives, as the consumer pods get them."""
    environment = dict(os.environ)
    hubs = await runtime.event_hubs_connection_string()
    if hubs is not None:
        environment[consumer.spec.event_hubs.connection_string_env] = hubs.get_secret_value()
    blob = consumer.spec.checkpoint_store.blob
    storage = await runtime.storage_connection_string()
    if blob is not None and storage is not None:
        environment[blob.connection_string_env] = storage.get_secret_value()
    return environment
