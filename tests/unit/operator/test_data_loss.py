"""Data loss: events that expired from the hub before they were read, found from each checkpoint and the
first event the hub retains; the condition, and the pool stopped when failOnDataLoss says so."""

from __future__ import annotations

from pathlib import Path

from hubshift.eventhubs.model import PartitionInfo
from hubshift.operator.autoscaler import ScalingDecision, ScalingState
from hubshift.operator.data_loss import ExpiredStretch, expired_unread, stop_the_pool
from hubshift.operator.status import data_loss_condition
from hubshift.ownership.stores.sqlite import SqliteLeaseStore
from tests.unit.operator.test_control_loop import snapshot_with


def decision(replicas: int) -> ScalingDecision:
    return ScalingDecision(replicas, "backlog 10 -> 2", True, False, False, replicas, ScalingState(replicas))


def test_a_checkpoint_behind_the_first_retained_event_lost_the_events_between(tmp_path: Path) -> None:
    store = SqliteLeaseStore(tmp_path / "store.db")
    snapshot = snapshot_with(store, {"0": 9, "1": 49, "2": -1, "10": 5, "3": 7})
    partitions = {
        "0": PartitionInfo("0", 50, 99, False),  # checkpoint 9, first retained 50: 10-49 lost
        "1": PartitionInfo("1", 50, 99, False),  # checkpoint 49: the next event is retained
        "2": PartitionInfo("2", 50, 99, False),  # nothing consumed yet: starts where it starts
        "10": PartitionInfo("10", 7, 99, False),  # checkpoint 5, first retained 7: 6 lost
        "3": PartitionInfo("3", 20, 19, True),  # empty: left out
        "4": PartitionInfo("4", 50, 99, False),  # no checkpoint blob
    }
    found = expired_unread(partitions, snapshot)
    assert found == (ExpiredStretch("0", 10, 49), ExpiredStretch("10", 6, 6))
    assert [stretch.events for stretch in found] == [40, 1]


def test_failing_on_data_loss_stops_the_pool_and_going_on_does_not() -> None:
    lost = (ExpiredStretch("3", 100, 199),)
    stopped = stop_the_pool(decision(4), lost, fail=True)
    assert stopped.replicas == 0
    assert "partition 3: 100 events (100-199)" in stopped.reason and "failOnDataLoss" in stopped.reason
    assert stopped.state == decision(4).state  # the autoscaler's count comes back once the switch is off
    assert stop_the_pool(decision(4), lost, fail=False) == decision(4)
    assert stop_the_pool(decision(4), (), fail=True) == decision(4)


def test_the_condition_names_the_partitions_and_what_the_pool_does() -> None:
    lost = (ExpiredStretch("3", 100, 199), ExpiredStretch("7", 5, 5))
    stopped = data_loss_condition(lost, fail=True)
    assert (stopped.type, stopped.status, stopped.reason) == ("DataLoss", "True", "PoolStopped")
    assert "101 events expired" in stopped.message and "partition 7: 1 events (5-5)" in stopped.message
    going_on = data_loss_condition(lost, fail=False)
    assert (going_on.status, going_on.reason) == ("True", "EventsExpired")
    fine = data_loss_condition((), fail=True)
    assert (fine.status, fine.reason) == ("False", "NoExpiredEvents")
