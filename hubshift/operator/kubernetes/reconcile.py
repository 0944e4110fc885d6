"""What the kopf handlers do, by concern: children, consumer pods, the control-loop daemon, deletion.

`handlers.py` only registers these. Shared state lives in kopf's memo: the operator-wide
`OperatorContext` (put in the global memo at startup, so every per-object memo shares it) and a
`ConsumerState` per PartitionedConsumer (in that object's memo). The daemon runs the `LoopDriver`
(`hubshift.operator.driver`), the same driver `hubshift run` uses.
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
from hubshift.manifest import PartitionedConsumer, connections_of
from hubshift.operator.access import SERVICE_ACCOUNTS_VALUE, AccessPolicy, Service
from hubshift.operator.driver import MIN_CYCLE_SECONDS, CycleRunner, Desired, LoopDriver
from hubshift.operator.kubernetes.api import KubeAdapter, consumer_instance
from hubshift.operator.kubernetes.render import (
    CONSUMER_LABEL,
    DEFAULT_IMAGE,
    JSON,
    ChildNames,
    Owner,
    applied_condition,
    consumer_from_body,
    initial_replicas,
    output_condition,
    render_children,
    service_account_name,
)
from hubshift.operator.kubernetes.runtime import OPERATOR_ROLES, KubernetesRuntime
from hubshift.operator.loop import CycleInputs, open_control_loop
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.reservations import ScopeReservations
from hubshift.operator.runtime import ConsumerInstance
from hubshift.operator.status import (
    READY,
    Condition,
    PartitionedConsumerStatus,
    ResourcePhase,
    carry_transition_time,
    failed_cycle_status,
)
from hubshift.ownership.model import Driver
from hubshift.spec import ConnectionSpec, HubConnectionSpec, TokenCredentialSpec

ConsumerKey = tuple[str, str]  # (namespace, PartitionedConsumer name)
Logger = logging.Logger | logging.LoggerAdapter[Any]  # what kopf passes handlers

# How the daemon gets a control loop for a spec: its hub and store clients, the pods' runtime, the
# operator's metrics. `open_cluster_loop` in production; tests plug in their own.
ClusterLoopOpener = Callable[
    [PartitionedConsumer, KubernetesRuntime, OperatorMetrics], Awaitable[CycleRunner]
]

# The operator's own identity, for the specs that name a token credential: azure-identity's chain, which
# finds the workload identity the chart gives the operator's pod (`hubshift operator --credential`).
OPERATOR_IDENTITY = TokenCredentialSpec(type="default")

CONTEXT_KEY = "hubshift_operator"
STATE_KEY = "hubshift_consumer"


@dataclass
class OperatorContext:
    """Operator-wide: the API client, the metrics, how to open a control loop, and which loops to wake."""

    kube: KubeAdapter
    metrics: OperatorMetrics
    open_loop: ClusterLoopOpener
    #: Cycles start at least this long after the previous one started (the driver's rule).
    min_cycle_seconds: float = MIN_CYCLE_SECONDS
    wakeups: dict[ConsumerKey, asyncio.Event] = field(default_factory=dict)
    pod_views: dict[tuple[str, str], ConsumerInstance] = field(default_factory=dict)
    #: The consumer pods' image when a resource names none: the operator's own (`--consumer-image`).
    consumer_image: str = DEFAULT_IMAGE
    #: What resources may have the operator do, per namespace (`--access`): here, the existing
    #: ServiceAccounts their pods may run as.
    access: AccessPolicy = field(default_factory=AccessPolicy)
    #: The operator's own namespace, where it serves no resource (None: it serves every one it watches).
    unserved_namespace: str | None = None

    def wakeup(self, key: ConsumerKey) -> asyncio.Event:
        return self.wakeups.setdefault(key, asyncio.Event())

    def wake(self, key: ConsumerKey) -> None:
        """Run the next cycle of this consumer's loop as soon as the driver's rule allows."""
        self.wakeup(key).set()


@dataclass
class ConsumerState:
    """Per PartitionedConsumer: cycles and child reconciliation never overlap, and the control loop runs
    only the spec whose children the API server accepted (kopf starts the control-loop daemon together with
    the children handler; no cycle runs before that handler applied them)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The spec whose children the API server last accepted in this process: the only one the control loop
    #: runs, so an edit it refuses (a pod template it finds invalid) changes neither the pods nor what the
    #: loop reads (its hub, its store, the Secrets it names). None until the children are applied.
    accepted: PartitionedConsumer | None = None
    #: The API server's refusal of the children the spec renders now, while the pool runs on the last ones
    #: it accepted (the status' ChildrenApplied condition says so); None once they are applied.
    refused: str | None = None
    #: The resource's spec as it is now is invalid (the children handler reported it): no cycle runs.
    invalid: bool = False


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
    state = consumer_state(memo)
    try:
        consumer = consumer_from_body(body)
    except UserError as error:
        state.invalid = True  # the cycles stop until an edit makes it valid again
        await report_invalid(context, owner, body, str(error))
        raise kopf.PermanentError(str(error)) from None
    state.invalid = False
    refusal = namespace_refusal(context, owner.namespace)
    if refusal is not None:  # nothing is rendered, applied or read for it
        await report_invalid(context, owner, body, refusal)
        raise kopf.PermanentError(refusal)
    names = ChildNames.of(owner.name)
    async with state.lock:
        current = await context.kube.statefulset_replicas(owner.namespace, names.statefulset)
        replicas = current if current is not None else initial_replicas(consumer)
        rendered = render_children(consumer, owner, replicas, context.consumer_image)
        try:
            children = await _with_own_account(context, consumer, owner, rendered)
            await context.kube.apply_all(children)
        except UserError as error:  # a child the API server refuses as rendered: the spec must change
            await _report_refused(context, state, owner, body, str(error), running=current is not None)
            raise kopf.PermanentError(str(error)) from None
        state.accepted = consumer
        state.refused = None
    output = output_condition(consumer)
    if output.status == "False":  # said once per change of the spec; the status says it every cycle
        await context.kube.post_event(owner, "OutputNotDurable", output.message, warning=True)
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
    context.wake(consumer_key(body))


async def _report_refused(
    context: OperatorContext,
    state: ConsumerState,
    owner: Owner,
    body: Mapping[str, Any],
    message: str,
    *,
    running: bool,
) -> None:
    """A new resource whose children are refused is Invalid; a running pool keeps its last accepted children
    and its control loop on the last accepted spec, and its status says the spec was not applied (and an
    Event, once). When this process never saw a spec accepted (the operator restarted since), no control
    loop runs until one is, and the status says so."""
    if not running:
        await report_invalid(context, owner, body, message)
        return
    state.refused = message
    await context.kube.post_event(owner, "SpecRefused", message, warning=True)
    if state.accepted is None:
        await _report_waiting(context, owner, body, message)
    context.wake(consumer_key(body))


async def _report_waiting(
    context: OperatorContext, owner: Owner, body: Mapping[str, Any], message: str
) -> None:
    """The status of a running pool whose spec the API server refuses, with no accepted spec to run: its pods
    run as the last accepted spec made them, and no control loop runs."""
    generation = body.get("metadata", {}).get("generation")
    previous = body.get("status", {}).get("conditions")
    waiting = f"{message}; no control loop runs until the API server accepts the spec"
    now = _utcnow()
    status = PartitionedConsumerStatus(
        phase=ResourcePhase.PENDING,
        message=waiting,
        observed_generation=generation,
        conditions=[
            carry_transition_time(
                previous,
                Condition(type=READY, status="False", reason="SpecRefused", message=waiting),
                now,
                generation,
            ),
            carry_transition_time(previous, applied_condition(message), now, generation),
        ],
    )
    await context.kube.apply_status(owner, status.to_body())


async def _with_own_account(
    context: OperatorContext, consumer: PartitionedConsumer, owner: Owner, children: list[JSON]
) -> list[JSON]:
    """The children with the pods' ServiceAccount: one the operator creates for this resource (or created
    before), or an existing one an administrator allowed for the namespace, used as it is (left out of the
    children: never changed or owned, so deleting the resource does not delete it). Any other existing one
    (the namespace's `default`, the operator's own, another workload's) is refused, `UserError` naming the
    field: a resource must not run its pods, and their token and Azure identity, as a ServiceAccount it
    chose."""
    name = service_account_name(consumer)
    keeper = await context.kube.service_account_owner(owner.namespace, name)
    if keeper is None or keeper == owner.name:
        return children
    if context.access.allows_service_account(owner.namespace, name):
        return [child for child in children if child.get("kind") != "ServiceAccount"]
    default = "" if consumer.spec.consumer.service_account_name else " (the default: the resource's name)"
    raise UserError(
        f"spec.consumer.serviceAccountName: the ServiceAccount {name}{default} exists and the operator did "
        "not create it for this PartitionedConsumer; its pods run only as one the operator creates, or one "
        f"an administrator allowed for namespace {owner.namespace} (the chart's {SERVICE_ACCOUNTS_VALUE})"
    )


def namespace_refusal(context: OperatorContext, namespace: str) -> str | None:
    """Why the operator serves no resource in `namespace`: its own namespace, unless the operator was given
    it by name (its ServiceAccount, its Secrets and its Azure identity live there)."""
    if context.unserved_namespace is None or namespace != context.unserved_namespace:
        return None
    return (
        f"metadata.namespace: {namespace} is the operator's own namespace; it serves no PartitionedConsumer "
        "there unless it watches that namespace by name (the chart's operator.watchReleaseNamespace or "
        "operator.watchNamespaces)"
    )


async def report_invalid(
    context: OperatorContext, owner: Owner, body: Mapping[str, Any], message: str
) -> None:
    generation = body.get("metadata", {}).get("generation")
    status = PartitionedConsumerStatus(
        phase=ResourcePhase.INVALID,
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
    context.metrics.set_phase(owner.namespace, owner.name, ResourcePhase.INVALID)


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
        context.wake((namespace, owner))
        return
    view = consumer_instance(body)
    context.pod_views[pod_key] = view
    if view != previous:
        context.wake((namespace, owner))


PodIndex = Mapping[ConsumerKey, Iterable[ConsumerInstance]]  # kopf's index: key -> a store of values


def pods_of(index: PodIndex, key: ConsumerKey) -> list[ConsumerInstance]:
    store = index.get(key)
    return list(store) if store is not None else []


# --- the control-loop daemon ----------------------------------------------------------------------------


async def open_cluster_loop(
    consumer: PartitionedConsumer,
    runtime: KubernetesRuntime,
    metrics: OperatorMetrics,
    *,
    identity: TokenCredentialSpec = OPERATOR_IDENTITY,
    access: AccessPolicy | None = None,
    reservations: ScopeReservations | None = None,
) -> CycleRunner:
    """The control loop of a PartitionedConsumer in the cluster: connection strings from its Secrets; where
    the spec names a token credential, the operator's own `identity` instead (never the spec's: a resource
    must not make the operator act as an identity it chose), and only for what `access` allows the
    resource's namespace (`UserError` naming the block otherwise, before anything is opened). With the
    operator's `reservations`, a resource younger than another on the same hub and consumer group is
    refused."""
    refusals = (access or AccessPolicy()).refusals(consumer.metadata.namespace, identity_reads(consumer))
    if refusals:  # every one, one line each: an administrator fixes them in one edit of operator.access
        raise UserError("\n".join(refusals))
    environment = await runtime.connection_environment(consumer)
    owner = runtime.owner
    driver = Driver(uid=owner.uid, resource=f"PartitionedConsumer {owner.namespace}/{owner.name}")
    return await open_control_loop(
        consumer,
        environment,
        runtime,
        metrics=metrics,
        identity=identity,
        driver=driver,
        reservations=reservations,
        created=owner.created,
    )


def identity_reads(consumer: PartitionedConsumer) -> list[tuple[Service, str, str]]:
    """What the control loop would read with the operator's identity: each connection it opens (the source,
    the checkpoint store) that names a token credential, as (service, address, block)."""
    reads: list[tuple[Service, str, str]] = []
    for named in connections_of(consumer.spec):
        connection = named.connection
        if named.role not in OPERATOR_ROLES or not isinstance(connection, ConnectionSpec):
            continue
        if connection.credential is None or connection.address is None:
            continue
        service: Service = "eventHubs" if isinstance(connection, HubConnectionSpec) else "storage"
        reads.append((service, connection.address, named.path))
    return reads


async def run_control_loop(
    body: Mapping[str, Any],
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    pods: PodIndex,
    logger: Logger,
) -> None:
    """One PartitionedConsumer's control loop until kopf stops the daemon: the `LoopDriver` over its pods,
    woken by pod events and spec changes. `body` is kopf's live view of the resource."""
    context = operator_context(memo)
    key = consumer_key(body)
    state = consumer_state(memo)
    runtime = KubernetesRuntime(context.kube, Owner.from_body(body), pods=lambda: pods_of(pods, key))

    async def open_loop(consumer: PartitionedConsumer) -> CycleRunner:
        return await context.open_loop(consumer, runtime, context.metrics)

    def desired() -> Desired | None:
        # The spec whose children the API server accepted, never the resource's newer one: until the children
        # handler applied them there is nothing to run (that handler wakes the loop when it is done), and a
        # refused edit leaves the loop on the last accepted spec. An invalid spec (that handler found it so
        # and reported it) stops the cycles.
        accepted = state.accepted
        if accepted is None or state.invalid:
            return None
        conditions = [applied_condition(state.refused), output_condition(accepted)]
        return Desired(accepted, CycleInputs.from_body(body, conditions))

    async def report_failure(message: str) -> None:
        last = driver.report.status if driver.report is not None else None
        previous = (body.get("status") or {}).get("conditions")
        status = failed_cycle_status(last, previous, message, time.time())
        await runtime.publish_status(status.to_body())

    driver = LoopDriver(
        open_loop,
        labels=key,
        metrics=context.metrics,
        wakeup=context.wakeup(key),
        lock=state.lock,
        min_cycle_seconds=context.min_cycle_seconds,
        on_failure=report_failure,
        logger=logger,
    )
    try:
        await driver.run(stopped, desired)
    finally:
        if stopped.reason is not None and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
            await driver.release()  # the scope's record no longer names this resource as its driver
        else:
            await driver.close()


# --- deletion --------------------------------------------------------------------------------------------


def forget(body: Mapping[str, Any], memo: kopf.Memo, logger: Logger) -> None:
    """The children go by garbage collection (owner references); only in-memory traces remain to drop."""
    context = operator_context(memo)
    namespace, name = consumer_key(body)
    context.wakeups.pop((namespace, name), None)
    context.metrics.forget(namespace, name)
    logger.info("%s deleted; Kubernetes garbage-collects its children", name)
