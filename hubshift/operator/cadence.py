"""When the control loop looks again, and how long a phase may last before something is wrong (the
metric the alert rules compare the phase's duration with)."""

from __future__ import annotations

from hubshift.operator.rebalance import RebalanceState, holddown_seconds
from hubshift.ownership.model import Phase
from hubshift.spec import RebalanceSpec

# While a holddown runs or handoffs are pending, cycles come this often (the state machine's clock).
BUSY_CYCLE_SECONDS = 1.0


def next_cycle_in(state: RebalanceState, now: float, polling_interval: float) -> float:
    """Seconds until the next cycle: the polling interval, sooner while a holddown or handoff runs, and at the
    end of the wait for planned consumers. (A planned consumer getting ready wakes the loop at once.)"""
    wait = polling_interval
    if state.phase is not Phase.READY:
        wait = min(wait, BUSY_CYCLE_SECONDS)
    for deadline in (state.holddown_until, state.planned_until):
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - now))
    return wait


def phase_bound(phase: Phase, rebalance_spec: RebalanceSpec) -> float:
    """How long a phase may last before something is wrong: a holddown its length, a rebalance the handoff
    deadline plus a membership lease (a forced move waits for the old owner's membership at most that
    long); Ready has no bound."""
    if phase is Phase.HOLDDOWN:
        return holddown_seconds(rebalance_spec)
    if phase is Phase.REBALANCING:
        return rebalance_spec.max_handoff_seconds + rebalance_spec.lease_duration_seconds
    return float("inf")
