"""Rollouts and evictions: which consumer pods stop, which one is replaced next, and when it may go.

Pure: `decide(observation, now, rollout_spec)` returns what the rebalance machine is told this cycle (the
replica count with the rollout's surge, the consumers `stopping` and `retiring`) and the pods to delete,
over plain data: the pods with their StatefulSet revision, the published assignment and the lease owners.
Nothing is kept between cycles but `RolloutState` (the status' `rollout` block), and every decision is
derived again from what is observed, so an operator restarted midway carries on where the pods and the
record stand.

Evictions (any strategy): a pod being deleted (`kubectl drain`, a node-pool upgrade, `kubectl delete`, the
StatefulSet's RollingUpdate) is *stopping*: its partitions are planned over the others at once and its
consumer hands them off on SIGTERM; its replacement gets its share planned when it is ready
(`rebalance.RebalanceState.returning`).

A rollout (strategy `Operator`, the StatefulSet `OnDelete`): a pod whose revision is not the StatefulSet's
update revision is outdated. One at a time, lowest ordinal first:
1. *retire* it: it leaves the plan and each of its partitions goes to the consumer planned for it: the
   surge pod (one extra replica, when `maxReplicas` allows, asked in that very cycle) for the first, the
   pod replaced just before for each next one, so each step moves one pod's share once and as many pods
   read as before; without a surge the first pod's share goes to the others and one pod fewer reads until
   the end. A retiring consumer keeps every partition until the consumer planned for it is ready (read
   all along);
2. once it holds nothing (no partition assigned, planned or leased), *delete* it (an eviction: the
   PodDisruptionBudget counts it); the StatefulSet recreates it at the new revision and it is planned again
   as soon as its old pod is gone, taking the next retiree's share;
3. the surge pod, last, the same way, then the pool shrinks back.
A pod is retired only while nothing else is in the way: no holddown, no pod stopping, no assignee absent,
and at most one pod not ready, itself planned for. Paused (`rollout.hubshift.dev/paused: "true"`), no pod
is retired or deleted (nor the surge pod asked before the first retirement); handoffs already published
finish.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hubshift.operator.rebalance import RebalanceState, consumer_name
from hubshift.operator.runtime import ConsumerInstance
from hubshift.ownership.model import Phase
from hubshift.ownership.timing import epoch_seconds
from hubshift.spec import ROLLOUT_PAUSED_ANNOTATION, RolloutSpec

__all__ = [
    "RolloutDecision",
    "RolloutEvent",
    "RolloutObservation",
    "RolloutState",
    "decide",
    "parse_paused",
]

RolloutPhase = Literal["Idle", "RollingOut", "Paused", "Done"]


def parse_paused(annotations: Mapping[str, str]) -> bool:
    """The rollout is paused while the resource's annotation says "true" (any case)."""
    return annotations.get(ROLLOUT_PAUSED_ANNOTATION, "").strip().lower() == "true"


@dataclass(frozen=True)
class RolloutState:
    """What a cycle remembers of the rollout (the status' `rollout` block): the revision it rolls to, since
    when, whether the extra replica is the rollout's, and when it finished."""

    revision: str
    started_at: float
    surge: bool = False
    paused: bool = False
    finished_at: float | None = None

    @property
    def active(self) -> bool:
        return self.finished_at is None

    @classmethod
    def from_status(cls, block: Mapping[str, Any] | None) -> RolloutState | None:
        """The state a previous cycle wrote into the status' `rollout` block; None when there is none."""
        if not block or not isinstance(block.get("revision"), str):
            return None
        started, finished = epoch_seconds(block.get("startedAt")), epoch_seconds(block.get("finishedAt"))
        if started is None:
            return None
        return cls(
            revision=block["revision"],
            started_at=started,
            surge=bool(block.get("surge")),
            paused=bool(block.get("paused")),
            finished_at=finished,
        )


@dataclass(frozen=True)
class RolloutObservation:
    """What the operator saw this cycle, for the rollout."""

    pool: str  # replica i is `<pool>-<i>`
    pods: tuple[ConsumerInstance, ...]  # every consumer pod, terminating ones too
    revision: str | None  # the StatefulSet's update revision (None: not known yet)
    desired_replicas: int  # the autoscaler's
    current_replicas: int  # the StatefulSet's spec.replicas
    max_replicas: int
    state: RebalanceState  # the published assignment this cycle starts from
    owners: Mapping[str, str | None]  # each partition's lease owner now
    paused: bool = False
    previous: RolloutState | None = None


@dataclass(frozen=True)
class RolloutEvent:
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class RolloutDecision:
    """For the rebalance machine: `desired_replicas` (the autoscaler's plus the surge), `stopping` and
    `retiring`; for the runtime: the pods to delete now; for the status: `state`, `phase`, `updated`
    (pods ready at the revision), `current` (the pod being replaced) and `message`."""

    desired_replicas: int
    stopping: frozenset[str] = frozenset()
    retiring: frozenset[str] = frozenset()
    delete: tuple[str, ...] = ()
    state: RolloutState | None = None
    phase: RolloutPhase = "Idle"
    updated: int = 0
    current: str | None = None
    message: str = ""
    events: tuple[RolloutEvent, ...] = field(default_factory=tuple)


def decide(observation: RolloutObservation, now: float, rollout_spec: RolloutSpec) -> RolloutDecision:
    """One cycle of rollout decisions (module docstring)."""
    view = _Pods.of(observation)
    stopping = view.stopping()
    base = RolloutDecision(observation.desired_replicas, stopping=stopping, updated=view.updated())
    if observation.revision is None:
        return base
    outdated = view.outdated()
    if rollout_spec.strategy != "Operator":
        return _progress(base, observation, now, bool(outdated), surge=False)
    surge = _surge(observation, rollout_spec, view, bool(outdated))
    # The surge pod comes with the first retirement, for the retiree's share: asked any earlier (paused, or
    # held up), the plan would have nothing for it (a standby when each pod reads one partition), and once
    # ready it would be a consumer the plan never named, whose arrival starts a holddown.
    room = not surge and bool(outdated) and _surge_allowed(observation, rollout_spec)
    desired = observation.desired_replicas + (1 if surge else 0)
    plan = set(observation.state.consumers)
    if not observation.state.generation:  # no plan published yet: nothing to replace against
        return _progress(base, observation, now, bool(outdated), surge=False)
    retired = [p for p in outdated if p.name not in plan]  # out of the plan, not deleted yet
    queue = [p for p in outdated if p.ready and p.name in plan]
    if surge and not outdated and view.ready(view.surge_name):
        # Last, the surge pod: its share goes to the pod replaced last; it is never deleted, the pool
        # shrinks back once it holds nothing.
        surge_pod = view.pod(view.surge_name)
        queue = [surge_pod] if surge_pod.name in plan else []
        retired = [] if surge_pod.name in plan else [surge_pod]
    delete = tuple(
        p.name
        for p in retired
        if p.name != view.surge_name and not observation.paused and not _holds(p.name, observation)
    )
    retiring = {p.name for p in retired if p.ready and p.name not in delete}
    waiting = ""
    if not retired and queue and not observation.paused:
        asked = desired + (1 if room else 0)
        waiting = _blocked(observation, view, asked)
        if not waiting:
            retiring.add(queue[0].name)
            surge, desired = surge or room, asked
    decision = replace(
        base,
        desired_replicas=desired,
        stopping=stopping | set(delete),
        retiring=frozenset(retiring),
        delete=delete,
        current=_current(retiring, delete),
    )
    return _progress(decision, observation, now, bool(outdated) or surge, surge=surge, waiting=waiting)


# --- what the pods say ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pods:
    observation: RolloutObservation
    live: tuple[ConsumerInstance, ...]  # not terminating
    terminating: frozenset[str]

    @classmethod
    def of(cls, observation: RolloutObservation) -> _Pods:
        pods = observation.pods
        return cls(
            observation,
            tuple(sorted((p for p in pods if not p.terminating), key=lambda p: (p.ordinal, p.name))),
            frozenset(p.name for p in pods if p.terminating),
        )

    @property
    def surge_name(self) -> str:
        return consumer_name(self.observation.pool, self.observation.desired_replicas)

    def pod(self, name: str) -> ConsumerInstance:
        return next(p for p in self.live if p.name == name)

    def ready(self, name: str) -> bool:
        return any(p.name == name and p.ready for p in self.live)

    def stopping(self) -> frozenset[str]:
        """The pods being deleted; none when no consumer would be left to hand their partitions to (the
        whole pool is going: the resource deleted, the namespace gone)."""
        if not any(p.ready for p in self.live):
            return frozenset()
        return self.terminating

    def outdated(self) -> list[ConsumerInstance]:
        """Pods at another revision than the StatefulSet's, below the replica count asked (above it they
        are leaving anyway), lowest ordinal first."""
        observation = self.observation
        return [
            p
            for p in self.live
            if p.revision is not None
            and p.revision != observation.revision
            and 0 <= p.ordinal < observation.desired_replicas
        ]

    def updated(self) -> int:
        observation = self.observation
        return sum(
            1
            for p in self.live
            if p.ready and p.revision == observation.revision and p.ordinal < observation.desired_replicas
        )


def _holds(consumer: str, observation: RolloutObservation) -> bool:
    """Whether a consumer still has anything: a partition assigned or planned, or a lease."""
    state = observation.state
    return (
        consumer in state.assignment.values()
        or consumer in state.planned.values()
        or consumer in observation.owners.values()
    )


def _surge_allowed(observation: RolloutObservation, rollout_spec: RolloutSpec) -> bool:
    desired = observation.desired_replicas
    return rollout_spec.max_surge > 0 and 1 <= desired < observation.max_replicas


def _surge(observation: RolloutObservation, rollout_spec: RolloutSpec, view: _Pods, outdated: bool) -> bool:
    """Whether the extra replica of a rollout under way is kept: while pods are outdated, once it was asked
    (with the first retirement, `decide`) or while the surge pod holds anything (a restart that lost the
    status); once none is, until the surge pod has handed its share on."""
    if not _surge_allowed(observation, rollout_spec):
        return False
    previous = observation.previous
    surging = previous is not None and previous.surge
    if outdated:
        return surging or _holds(view.surge_name, observation)
    # Kept until the surge pod holds nothing and its last handoff is done (then the pool shrinks back).
    handing_over = observation.state.phase is Phase.REBALANCING
    busy = view.surge_name not in view.terminating and (_holds(view.surge_name, observation) or handing_over)
    return surging and busy


def _blocked(observation: RolloutObservation, view: _Pods, desired: int) -> str:
    """Why the next pod may not be retired now; "" when it may."""
    state = observation.state
    if state.phase is Phase.HOLDDOWN:
        return "waiting for the holddown to end"
    if view.terminating:
        return f"waiting for {_names(view.terminating)} to stop"
    absent = sorted({a for a in state.assignment.values() if a is not None and not view.ready(a)})
    if absent:
        return f"waiting for {_names(absent)}, assigned partitions but not ready"
    down = [consumer_name(observation.pool, i) for i in range(desired)]
    down = [name for name in down if not view.ready(name)]
    expected = set(state.planned.values()) | set(state.returning)
    arriving = {consumer_name(observation.pool, i) for i in range(observation.current_replicas, desired)}
    unplanned = [name for name in down if name not in expected and name not in arriving]
    if unplanned:
        return f"waiting for {_names(unplanned)} to be ready"
    if len(down) > 1:
        return f"waiting for {_names(down)}: one pod at a time"
    return ""


def _current(retiring: Iterable[str], delete: Iterable[str]) -> str | None:
    names = sorted({*retiring, *delete})
    return names[0] if names else None


def _progress(
    decision: RolloutDecision,
    observation: RolloutObservation,
    now: float,
    active: bool,
    *,
    surge: bool,
    waiting: str = "",
) -> RolloutDecision:
    """The rollout's state, phase, message and Events: started when a pod is outdated, done when none is and
    the surge is over."""
    previous = observation.previous
    revision = observation.revision or ""
    paused = observation.paused
    events: list[RolloutEvent] = []
    if not active:
        if previous is None or not previous.active:
            return replace(decision, state=previous, phase="Done" if previous else "Idle")
        took = now - previous.started_at
        events.append(RolloutEvent("RolloutDone", f"every pod at revision {revision} after {took:.1f}s"))
        state = replace(previous, surge=False, paused=False, finished_at=now)
        return replace(decision, state=state, phase="Done", events=tuple(events), message="done")
    if previous is None or not previous.active:
        outdated = len(_Pods.of(observation).outdated())
        events.append(
            RolloutEvent(
                "RolloutStarted",
                f"{outdated} pods to replace for revision {revision}"
                f"{', one extra pod meanwhile' if surge else ''}",
            )
        )
        previous = RolloutState(revision=revision, started_at=now)
    if paused != previous.paused:
        reason = "RolloutPaused" if paused else "RolloutResumed"
        events.append(RolloutEvent(reason, f"{ROLLOUT_PAUSED_ANNOTATION}: {str(paused).lower()}"))
    state = replace(previous, revision=revision, surge=surge, paused=paused)
    message = waiting or (f"replacing {decision.current}" if decision.current else "")
    phase: RolloutPhase = "Paused" if paused else "RollingOut"
    return replace(decision, state=state, phase=phase, events=tuple(events), message=message)


def _names(consumers: Iterable[str]) -> str:
    return ", ".join(sorted(consumers))
