"""The control loop: one cycle per PartitionedConsumer, the same for pods and local processes.

One cycle (docs/architecture.md, "The control loop"):
1. observe (`observer.Observer`): the hub's partitions and last enqueued sequence numbers (the probe, once
   per polling interval), the ownership table (one store listing: checkpoints, lease owners, members, the
   assignment record's ETag), the consumers, their work and the replica count (the `ConsumerRuntime`);
2-4. decide (`decider.Decider`): the replica count (`autoscaler.decide_replicas`, on fresh backlog only), the
   rollout's decisions (`rollout.decide`) and the rebalance state machine over them (`rebalance.step`),
   whose state is written to the assignment record when it changed (compare-and-swap; a lost swap re-reads
   and decides again), before anything else;
5. act (`actor.Actor`): set the replicas, end the membership of owners that are gone so their forced
   partitions move at once, nudge the consumers (`POST /assignment`), delete (evict) the pods a rollout
   replaces once they hold nothing, record the Events;
6. report (`report.Reporter`): the status (`runtime.publish_status`) and the operator's metrics, with each
   partition's lag in seconds (`partition_lag`).

`control.ControlLoop` runs them in that order; `open_control_loop` opens one with its clients.
"""

from hubshift.operator.loop.control import ControlLoop, open_control_loop
from hubshift.operator.loop.inputs import CycleInputs
from hubshift.operator.loop.report import CycleReport

__all__ = ["ControlLoop", "CycleInputs", "CycleReport", "open_control_loop"]
