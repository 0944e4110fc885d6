"""What both Spark engines share: the partitions a consumer reads, each under one ownership epoch (its
owner level), received by the pool's receivers into the spool, and told to the streaming source through the
ownership file (docs/consumer.md, "Processes and what crosses between them").

An epoch's spool is contiguous (`spool.py`): a receiver delivers without a hole (`eventhubs/receiver.py`),
and events that expired from the hub before they were read are recorded as such. A stopped or replaced
epoch's folder stays until no batch can read it (`retire`, then `remove_retired` when the engine knows);
an epoch whose spool lost events is received again from its first uncommitted event (`respool`).
"""

from __future__ import annotations

import errno
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from hubshift.consumer.engine import EngineFailed, Notify, Stolen, not_started
from hubshift.consumer.lag import ReadProgress
from hubshift.consumer.spark import spool
from hubshift.consumer.spark.offsets import SourcePartition
from hubshift.consumer.spark.ownership_file import OwnershipView, write_ownership
from hubshift.eventhubs.receiver import PartitionReceiver, ReceiverPool, StartAt
from hubshift.eventhubs.target import EventHubsTarget
from hubshift.manifest import ConsumerSpec
from hubshift.ownership.model import Checkpoint

if TYPE_CHECKING:
    from hubshift.consumer.metrics import ConsumerMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Retired:
    """An epoch no longer read whose spool folder waits for the batches planned before `version` to end."""

    partition: str
    owner_level: int
    version: int


@dataclass
class _Partition:
    owner_level: int
    next_sequence: int | None
    receiver: PartitionReceiver | None
    draining_since: int | None = None  # the ownership file's version that stopped planning it
    committed: Checkpoint | None = None
    committed_next: int | None = None  # first sequence number not yet committed (spool trimming)
    spooled_next: int | None = None  # one past the last sequence number spooled
    start: StartAt = field(default_factory=StartAt)  # where the epoch's receiving began


@dataclass(frozen=True)
class Reading:
    """What a Spark engine reads with: the hub, this consumer's id and spec, its scratch folder (the spool,
    Spark's own files), its metrics, and the receivers (None: a pool of its own)."""

    target: EventHubsTarget
    consumer_id: str
    spec: ConsumerSpec
    scratch: Path
    metrics: ConsumerMetrics | None = None
    pool: ReceiverPool | None = None


class SpooledPartitions:
    """The partitions an engine reads: their receivers, their spool folders and the ownership file."""

    def __init__(self, reading: Reading) -> None:
        self.target = target = reading.target
        self.notify: Notify = not_started
        self.consumer_id = reading.consumer_id
        self.spec = spec = reading.spec
        self.scratch = reading.scratch
        self.spool_root = reading.scratch / "spool"
        self.metrics = reading.metrics
        self._pool = reading.pool or ReceiverPool(
            target, system_properties=spec.spark.include_system_properties
        )
        # The hub and consumer group the events come from: what names the sink's writes.
        self.scope = f"{target.fqns}/{target.hub}/{target.consumer_group}".lower()
        self._lock = threading.RLock()
        self._partitions: dict[str, _Partition] = {}
        if self.metrics is not None:
            self.metrics.spool_depth(self._spool_depth)
        self._ownership_version = 0
        self._scratch_full_reported = False
        self._retired: list[_Retired] = []
        # Receivers stay at most this far ahead of what was committed (per partition).
        self.max_ahead = max(2 * spec.spark.max_events_per_trigger, 20_000)

    def open_spool(self, notify: Notify) -> None:
        """At the engine's start: whom to tell, the scratch folder and the spool, the ownership file."""
        self.notify = notify
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.spool_root.mkdir(parents=True, exist_ok=True)
        self._write_ownership()

    def start_partition(
        self, partition: str, owner_level: int, start: StartAt, next_sequence: int | None
    ) -> None:
        with self._lock:
            previous = self._partitions.get(partition)
            self._partitions[partition] = _Partition(owner_level, next_sequence, None, start=start)
            # No new version for a claim: the partition changes the offsets once its first events are
            # spooled. One for an epoch it replaces, whose folder then waits for the batches before it.
            if previous is not None:
                self._ownership_version += 1
            self._write_ownership()
        if previous is not None:
            self._forget(partition, previous)
        self._receive(partition, owner_level, start)

    def _receive(self, partition: str, owner_level: int, start: StartAt) -> None:
        """Open the epoch's receiver, spooling what it delivers; it stays with the epoch's state."""

        def deliver(batch: pa.RecordBatch) -> None:
            with self._lock:
                state = self._partitions.get(partition)
                if state is None or state.owner_level != owner_level or state.draining_since is not None:
                    return
                after = state.spooled_next
            first = int(batch.column("sequence_number")[0].as_py())
            if after is not None and first < after:
                # delivered again after a failure that came once it was spooled: only what is new
                batch = batch.slice(min(batch.num_rows, after - first))
                if batch.num_rows == 0:
                    return
            try:
                spool.write_segment(self.spool_root, partition, owner_level, batch, after=after)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    self._scratch_full(exc)
                raise  # the receiver delivers the same events again once it may
            with self._lock:
                state.spooled_next = int(batch.column("sequence_number")[-1].as_py()) + 1

        def expired(first: int, last: int) -> None:
            with self._lock:
                state = self._partitions.get(partition)
                if state is None or state.owner_level != owner_level:
                    return
                after = state.spooled_next if state.spooled_next is not None else state.next_sequence
                if after is not None and last < after:
                    return  # recorded already (the delivery after it failed and came again)
            spool.write_expired(self.spool_root, partition, owner_level, first, last)
            with self._lock:
                state.spooled_next = last + 1
            log.warning(
                "partition %s: %d events (sequence numbers %d-%d) expired from the hub before they were "
                "read: its retention passed the checkpoint",
                partition,
                last - first + 1,
                first,
                last,
            )
            if self.metrics is not None:
                self.metrics.events_expired(partition, last - first + 1)

        def stolen(partition_id: str, level: int) -> None:
            self.notify(Stolen(partition_id, level))

        receiver = self._pool.open(
            partition,
            owner_level,
            start,
            deliver,
            stolen,
            lambda: self._has_room(partition, owner_level),
            on_expired=expired,
        )
        with self._lock:
            state = self._partitions.get(partition)
            if state is not None and state.owner_level == owner_level and state.draining_since is None:
                state.receiver = receiver
                return
        receiver.close(wait=None)  # stopped or drained meanwhile

    def _respool(self, partition: str, state: _Partition) -> None:
        """Receive an epoch again from its first uncommitted event into an empty spool folder: what it had
        spooled cannot give its ranges whole (a segment lost). Its old link is closed first, so the new one
        at the same owner level is not taken for another owner's."""
        receiver, state.receiver = state.receiver, None
        if receiver is not None:
            receiver.close(wait=10)
            receiver.closed.wait(10)
        spool.remove_epoch(self.spool_root, partition, state.owner_level)
        with self._lock:
            state.spooled_next = None
            begin = state.committed_next if state.committed_next is not None else state.next_sequence
            state.next_sequence = begin
        start = state.start if begin is None else StartAt(sequence_number=begin - 1)
        log.warning("partition %s: its spool lost events; receiving it again from %s", partition, begin)
        self._receive(partition, state.owner_level, start)

    def _spool_whole(self, partition: str, state: _Partition) -> bool:
        """Whether the epoch's spool holds, without a hole, everything from its first uncommitted event to
        the last one spooled."""
        if state.spooled_next is None:
            return True
        held = spool.extent(self.spool_root, partition, state.owner_level)
        begin = state.committed_next if state.committed_next is not None else state.next_sequence
        return held is not None and held.next == state.spooled_next and (begin is None or held.first <= begin)

    def drain_partition(self, partition: str) -> None:
        with self._lock:
            state = self._partitions.get(partition)
            if state is None or state.draining_since is not None:
                return
            self._ownership_version += 1
            state.draining_since = self._ownership_version
            self._write_ownership()
            receiver, state.receiver = state.receiver, None
        # What is spooled stays for the batch in flight; nothing more needs receiving.
        if receiver is not None:
            receiver.close(wait=None)

    def _scratch_full(self, error: OSError) -> None:
        """The spool cannot grow: stop the consumer (in bounded time, each partition released at what was
        committed, nothing lost) with one line that says what to do, rather than retry forever."""
        with self._lock:
            if self._scratch_full_reported:
                return
            self._scratch_full_reported = True
        self.notify(
            EngineFailed(
                f"the scratch folder {self.scratch} is full ({error.strerror}): events are read again from "
                "the last checkpoint once there is room; give the consumer more scratch space (in a pod: "
                "the /tmp emptyDir's node disk or sizeLimit)"
            )
        )

    def stop_partition(self, partition: str) -> None:
        with self._lock:
            state = self._partitions.pop(partition, None)
            if state is None:
                return
            self._ownership_version += 1
            self._write_ownership()
        self._forget(partition, state)

    def _forget(self, partition: str, state: _Partition) -> None:
        """Stop receiving an epoch at once; its spool folder stays until no batch can read it (a batch
        planned before the ownership file's current version may be reading it now)."""
        if state.receiver is not None:
            state.receiver.close(wait=None)
        with self._lock:
            self._retired.append(_Retired(partition, state.owner_level, self._ownership_version))

    def _remove_retired(self, planned_at: int | None, partition: str | None = None) -> None:
        """Remove the retired epochs that no batch reads any more: those retired at or before the version
        `planned_at` a finished batch was planned with (None: every one, no query runs), of `partition`
        only when it is given (its own query is stopped)."""
        with self._lock:
            done = [
                r
                for r in self._retired
                if (planned_at is None or r.version <= planned_at)
                and (partition is None or r.partition == partition)
            ]
            self._retired = [r for r in self._retired if r not in done]
            current = {(p, s.owner_level) for p, s in self._partitions.items()}
        for retired in done:
            if (retired.partition, retired.owner_level) not in current:
                spool.remove_epoch(self.spool_root, retired.partition, retired.owner_level)

    def progress(self) -> dict[str, ReadProgress]:
        with self._lock:
            states = dict(self._partitions)
        progress = {}
        for partition, state in states.items():
            receiver = state.receiver
            if receiver is None or receiver.last_enqueued_sequence is None:
                continue
            done = state.committed.sequence_number if state.committed else (state.next_sequence or 0) - 1
            progress[partition] = ReadProgress(
                done, receiver.last_enqueued_sequence, receiver.last_enqueued_time
            )
        return progress

    def enqueued_time(self, partition: str, sequence_number: int) -> datetime | None:
        with self._lock:
            state = self._partitions.get(partition)
            receiver = None if state is None else state.receiver
        return None if receiver is None else receiver.enqueued_time(sequence_number)

    def _write_ownership(self) -> None:
        view = OwnershipView(
            self._ownership_version,
            {
                p: SourcePartition(s.owner_level, s.next_sequence, draining=s.draining_since is not None)
                for p, s in self._partitions.items()
            },
        )
        write_ownership(self.scratch, view)

    def _spool_depth(self) -> int:
        """The spool's depth: events received, not yet committed, over the partitions owned (asked when the
        metrics are read)."""
        depth = 0
        with self._lock:
            for state in self._partitions.values():
                base = state.committed_next if state.committed_next is not None else state.next_sequence
                if base is not None and state.spooled_next is not None:
                    depth += max(0, state.spooled_next - base)
        return depth

    def _has_room(self, partition: str, owner_level: int) -> bool:
        """Back-pressure: a partition is not read while its spool is `max_ahead` beyond what was committed
        (asked by the receiving thread before every turn: from memory, not the spool folder)."""
        with self._lock:
            state = self._partitions.get(partition)
            if state is None or state.owner_level != owner_level:
                return True
            base = state.committed_next if state.committed_next is not None else state.next_sequence
            spooled = state.spooled_next
        return base is None or spooled is None or spooled - base < self.max_ahead
