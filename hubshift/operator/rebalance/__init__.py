"""The rebalance state machine: when to hand partitions over, and when the StatefulSet may shrink.

Pure: `step(state, observation, now, rebalance_spec)` returns the next state and the actions to take, over
the assignment planner. docs/decisions.md ("Rebalance state machine") fixes the exact semantics: a partition
has one owner at a time, an unplanned change of the consumers waits out a holddown before anything moves,
a change the operator decides itself (a scale, a cold start, a rollout) is planned and published at once,
and a move is a graceful handoff (drain, final checkpoint, release) unless the old owner is gone.

As in Kafka's group coordinator, the machine keeps a plan (the *target* assignment: `RebalanceState.plan`)
apart from the assignment the consumers obey now (`RebalanceState.assignment`), and names each consumer's
standing towards it. The modules, each holding one part:

- `state`: the state, which is exactly the assignment record, and the observation of a cycle;
- `actions`: what a step hands back (publish, set the replicas, break leases, record an Event);
- `members`: who is who this cycle (`Roster`: present, leaving, gone, stopping; `Members`: candidates,
  joiners, arriving, coming back, dropped, late, leaving assignees);
- `plans`: the strategy's planner and how a plan splits into the assignment now and `planned`;
- `cycle`: a step's context and the one way it publishes a generation;
- `repack`: load-aware moves for load alone;
- `machine`: the step, one named function per decision.

The phases: `Ready` (the assignment suits the consumers present), `Holddown` (an unplanned change of
the consumers waits until `holddown_until`), `Rebalancing` (a published generation's handoffs run, until
every owner is its assignee or `maxHandoffSeconds` after publication, when the new owners may break the
leases still held).
"""

from hubshift.operator.rebalance.actions import (
    Action,
    BreakLeases,
    EventReason,
    PublishAssignment,
    PublishReason,
    RecordEvent,
    SetReplicas,
    Step,
)
from hubshift.operator.rebalance.machine import step
from hubshift.operator.rebalance.state import (
    Observation,
    RebalanceState,
    consumer_name,
    holddown_seconds,
    joiner_wait_seconds,
    ordinal,
    pending_handoffs,
    starting_point,
)

__all__ = [
    "Action",
    "BreakLeases",
    "EventReason",
    "Observation",
    "PublishAssignment",
    "PublishReason",
    "RebalanceState",
    "RecordEvent",
    "SetReplicas",
    "Step",
    "consumer_name",
    "holddown_seconds",
    "joiner_wait_seconds",
    "ordinal",
    "pending_handoffs",
    "starting_point",
    "step",
]
