"""What the kopf handlers do, by concern: children, consumer pods, the control-loop daemon, deletion.

`handlers.py` only registers these. Shared state lives in kopf's memo: the operator-wide
`OperatorContext` (put in the global memo at startup, so every per-object memo shares it) and a
`ConsumerState` per PartitionedConsumer (in that object's memo).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from hubshift.errors import UserError
from hubshift.operator.kubernetes.api import KubeAdapter, KubernetesRuntime, consumer_instance
from hubshift.operator.kubernetes.render import (
    CONSUMER_LABEL,
    ChildNames,
    Owner,
    consumer_from_body,
    initial_replicas,
    render_children,
)
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.runtime import ConsumerInstance, first_of
from hubshift.operator.status import READY, Condition, PartitionedConsumerStatus, carry_transition_time

ConsumerKey = tuple[str, str]  # (namespace, PartitionedConsumer name)
Logger = logging.Logger | logging.LoggerAdapter[Any]  # what kopf passes handlers

# The control loop: one cycle for one PartitionedConsumer. It receives the CR as the API server has it
# now (a plain dict), the runtime for its pods (with the parsed spec as `runtime.consumer`) and the CR's
# kopf memo, where it may keep state between cycles (the memo is lost on operator restart: anything that
# must survive one goes into the status or the store).
ControlLoop = Callable[[Mapping[str, Any], KubernetesRuntime, kopf.Memo], Awaitable[None]]

CONTEXT_KEY = "hubshift_operator"
STATE_KEY = "hubshift_consumer"


@dataclass
class OperatorContext:
    """Operator-wide: the API client, the metrics, the control loop, and which consumers to wake."""

    kube: KubeAdapter
    metrics: OperatorMetrics
    control_loop: ControlLoop
    #: Nudged cycles start at least this long after the previous one started (a cycle may nudge itself
    #: while a holddown or handoff is pending, to run again soon without spinning).
    min_cycle_seconds: float = 1.0
    wakeups: dict[ConsumerKey, asyncio.Event] = field(default_factory=dict)
    pod_views: dict[tuple[str, str], ConsumerInstance] = field(default_factory=dict)

    def wakeup(self, key: ConsumerKey) -> asyncio.Event:
        return self.wakeups.setdefault(key, asyncio.Event())

    def nudge(self, key: ConsumerKey) -> None:
        """Run the next cycle of this consumer as soon as `min_cycle_seconds` allow."""
        self.wakeup(key).set()


@dataclass
class ConsumerState:
    """Per PartitionedConsumer: cycles and child reconciliation never overlap, and no cycle runs before the
    children handler has seen the StatefulSet (kopf starts the control-loop daemon together with it)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    statefulset_seen: bool = False


def operator_context(memo: kopf.Memo) -> OperatorContext:
    context = memo.get(CONTEXT_KEY)
    if not isinstance(context, OperatorContext):
        raise RuntimeError("the hubshift startup handler has not run (no OperatorContext in memo)")
    return context


def consumer_state(memo: kopf.Memo) -> ConsumerState:
    state = memo.get(STATE_KEY)
    if not isinstance(state, ConsumerState):
        state = memo[STATE_KEY] = ConsumerState()
    return state


def consumer_key(body: Mapping[str, Any]) -> ConsumerKey:
    metadata = body["metadata"]
    return (metadata.get("namespace") or "default", metadata["name"])


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


# --- children (create / update / resume) -------------------------------------------------------------


async def reconcile_children(body: Mapping[str, Any], memo: kopf.Memo, logger: Logger) -> None:
    """Apply every child as the spec says now (idempotent). The replica count is left as it is: it is
    the control loop's; a new StatefulSet starts at `scaling.minReplicas`."""
    context = operator_context(memo)
    owner = Owner.from_body(body)
    try:
        consumer = consumer_from_body(body)
    except UserError as error:
        await report_invalid(context, owner, body, str(error))
        raise kopf.PermanentError(str(error)) from None
    names = ChildNames.of(owner.name)
    state = consumer_state(memo)
    async with state.lock:
        current = await context.kube.statefulset_replicas(owner.namespace, names.statefulset)
        replicas = current if current is not None else initial_replicas(consumer)
        if current is not None:
            state.statefulset_seen = True  # cycles may scale it even if applying fails below
        await context.kube.apply_all(render_children(consumer, owner, replicas))
        state.statefulset_seen = True
    if current is None:
        logger.info("created the consumer StatefulSet %s with %d replicas", names.statefulset, replicas)
        await context.kube.post_event(
            owner,
            "ChildrenCreated",
            f"StatefulSet {names.statefulset} with {replicas} replicas, its Services, "
            f"PodDisruptionBudget and manifest ConfigMap",
        )
    else:
        logger.info("children of %s are up to date", owner.name)
    context.nudge(consumer_key(body))


async def report_invalid(
    context: OperatorContext, owner: Owner, body: Mapping[str, Any], message: str
) -> None:
    generation = body.get("metadata", {}).get("generation")
    status = PartitionedConsumerStatus(
        phase="Invalid",
        message=message,
        observed_generation=generation,
        conditions=[
            carry_transition_time(
                body.get("status", {}).get("conditions"),
                Condition(type=READY, status="False", reason="InvalidSpec", message=message),
                _utcnow(),
                generation,
            )
        ],
    )
    await context.kube.apply_status(owner, status.to_body())
    await context.kube.post_event(owner, "InvalidSpec", message, warning=True)
    context.metrics.set_phase(owner.namespace, owner.name, "Invalid")


# --- consumer pods -------------------------------------------------------------------------------------


def index_consumer_pod(body: Mapping[str, Any]) -> dict[ConsumerKey, ConsumerInstance]:
    """The kopf index of consumer pods: (namespace, PartitionedConsumer) -> the pods as consumers."""
    metadata = body.get("metadata") or {}
    owner = (metadata.get("labels") or {}).get(CONSUMER_LABEL)
    if not owner:
        return {}
    return {(metadata.get("namespace") or "default", owner): consumer_instance(body)}


def observe_pod(context: OperatorContext, body: Mapping[str, Any], event_type: str | None) -> None:
    """Wake the owner's control loop when a consumer pod appears, goes, or changes readiness."""
    metadata = body.get("metadata") or {}
    owner = (metadata.get("labels") or {}).get(CONSUMER_LABEL)
    if not owner:
        return
    namespace = metadata.get("namespace") or "default"
    pod_key = (namespace, metadata.get("name", ""))
    previous = context.pod_views.get(pod_key)
    if event_type == "DELETED":
        context.pod_views.pop(pod_key, None)
        context.nudge((namespace, owner))
        return
    view = consumer_instance(body)
    context.pod_views[pod_key] = view
    if view != previous:
        context.nudge((namespace, owner))


PodIndex = Mapping[ConsumerKey, Iterable[ConsumerInstance]]  # kopf's index: key -> a store of values


def pods_of(index: PodIndex, key: ConsumerKey) -> list[ConsumerInstance]:
    store = index.get(key)
    return list(store) if store is not None else []


# --- the control-loop daemon ----------------------------------------------------------------------------


async def run_control_loop(
    body: Mapping[str, Any],
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    pods: PodIndex,
    logger: Logger,
) -> None:
    """One PartitionedConsumer's control loop: a cycle every polling interval, and at once when nudged
    (a consumer pod appeared, went or changed readiness; the spec changed). `body` is kopf's live view."""
    context = operator_context(memo)
    key = consumer_key(body)
    wakeup = context.wakeup(key)
    state = consumer_state(memo)
    while not stopped:
        wakeup.clear()  # a nudge that arrives during the cycle runs the next one at once
        cycle_started = time.monotonic()
        try:
            consumer = consumer_from_body(body)
        except UserError:
            consumer = None  # reported as phase Invalid by the children handler; nothing to control
        # Until the children handler has seen the StatefulSet there is nothing to scale (its /scale answers
        # 404: a failed cycle on every new CR); that handler nudges this loop when it is done.
        if consumer is not None and state.statefulset_seen:
            owner = Owner.from_body(body)
            runtime = KubernetesRuntime(context.kube, owner, consumer, pods=lambda: pods_of(pods, key))
            async with state.lock:
                started = time.perf_counter()
                try:
                    await context.control_loop(dict(body), runtime, memo)
                except Exception as error:  # the loop outlives a failed cycle; the next one retries
                    context.metrics.cycle_errors.labels(*key).inc()
                    logger.error("control-loop cycle failed: %s: %s", type(error).__name__, error)
                    logger.debug("control-loop cycle failed", exc_info=True)
                finally:
                    context.metrics.cycle_duration.labels(*key).observe(time.perf_counter() - started)
        interval = consumer.spec.scaling.polling_interval_seconds if consumer is not None else 60.0
        await first_of(wakeup, stopped, timeout=interval)  # a nudge, the daemon's stop, or the interval
        too_soon = context.min_cycle_seconds - (time.monotonic() - cycle_started)
        if too_soon > 0 and not stopped:
            await asyncio.sleep(too_soon)


async def report_only(body: Mapping[str, Any], runtime: KubernetesRuntime, memo: kopf.Memo) -> None:
    """The control loop until the real one is plugged in: replicas stay as they are; phase Ready."""
    metrics = operator_context(memo).metrics
    namespace, name = runtime.owner.namespace, runtime.owner.name
    current = await runtime.replicas()
    consumers = await runtime.consumers()
    ready = sum(1 for consumer in consumers if consumer.ready)
    generation = body.get("metadata", {}).get("generation")
    condition = Condition(
        type=READY,
        status="True",
        reason="ChildrenReconciled",
        message="children reconciled; no control loop installed: replicas and assignment stay as they are",
    )
    status = PartitionedConsumerStatus(
        phase="Ready",
        observed_generation=generation,
        desired_replicas=current,
        current_replicas=current,
        ready_replicas=ready,
        conditions=[
            carry_transition_time(body.get("status", {}).get("conditions"), condition, _utcnow(), generation)
        ],
    )
    await runtime.publish_status(status.to_body())
    metrics.desired_replicas.labels(namespace, name).set(current)
    metrics.current_replicas.labels(namespace, name).set(current)
    metrics.ready_replicas.labels(namespace, name).set(ready)
    metrics.set_phase(namespace, name, "Ready")


# --- deletion --------------------------------------------------------------------------------------------


def forget(body: Mapping[str, Any], memo: kopf.Memo, logger: Logger) -> None:
    """The children go by garbage collection (owner references); only in-memory traces remain to drop."""
    context = operator_context(memo)
    namespace, name = consumer_key(body)
    context.wakeups.pop((namespace, name), None)
    context.metrics.forget(namespace, name)
    logger.info("%s deleted; Kubernetes garbage-collects its children", name)
