"""Each partition's load and the consumers' capacity, from what the control loop samples: pure functions of
the samples and `now` (docs/decisions.md, "Load and capacity").

- Load: at each probe the loop keeps every partition's last enqueued sequence number and offset (the
  hub's own figures, `HubSample`). A partition's rate is the **median** of its rates between consecutive
  samples of the window, so a burst covering fewer than half of those intervals does not change it (the
  hysteresis against a brief spike) -- unless the last two intervals agree that the rate moved: when both
  are above the median (or both below), the rate is the nearer of the two (`settled_rate`). A hot spot
  that lands on a partition is seen after two probes, not after half the window; one interval alone
  still moves nothing. Bytes per second come the same way from the offsets while they are byte positions
  (numbers; a geo-replicated hub's string offsets give none).
- Weight: what the packing and the autoscaler weigh, in events per second: the larger of a partition's
  events per second and its bytes per second divided by the hub's mean event size, so a partition of
  large events weighs more than its count.
- Capacity: at each probe the loop keeps every consumer's events processed and seconds spent processing
  them (its own metrics, `WorkSample`). A consumer's capacity is its events per busy second over the
  window; the pool's is the median over the consumers that were busy at least `MIN_BUSY_SECONDS` in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median
from typing import Protocol, TypeVar

# A consumer's capacity counts only when it worked at least this long in the window.
MIN_BUSY_SECONDS = 1.0


@dataclass(frozen=True)
class HubSample:
    """One probe: partition -> (last enqueued sequence number, last enqueued offset as a number, if it is)."""

    at: float
    positions: Mapping[str, tuple[int, int | None]]


@dataclass(frozen=True)
class PartitionLoad:
    """A partition's incoming rate over the window."""

    partition: str
    events_per_second: float
    bytes_per_second: float | None  # None: the offsets are not byte positions


@dataclass(frozen=True)
class WorkSample:
    """One scrape of the consumers: consumer -> (events processed, seconds spent processing them), both
    counters."""

    at: float
    work: Mapping[str, tuple[float, float]]


class _Timed(Protocol):
    @property
    def at(self) -> float: ...


Sample = TypeVar("Sample", bound=_Timed)


def within(samples: Iterable[Sample], now: float, window: float) -> list[Sample]:
    """The samples of the window, oldest first (the caller drops the rest)."""
    return sorted((s for s in samples if s.at >= now - window), key=lambda s: s.at)


def partition_loads(samples: Sequence[HubSample], now: float, window: float) -> dict[str, PartitionLoad]:
    """Each partition's median rate between consecutive samples of the window; none before two samples."""
    kept = within(samples, now, window)
    events: dict[str, list[float]] = {}
    sizes: dict[str, list[float]] = {}
    for earlier, later in pairwise(kept):
        seconds = later.at - earlier.at
        if seconds <= 0:
            continue
        for partition, (sequence, offset) in later.positions.items():
            before = earlier.positions.get(partition)
            if before is None or sequence < before[0]:  # new, or the hub was created again
                continue
            events.setdefault(partition, []).append((sequence - before[0]) / seconds)
            if offset is not None and before[1] is not None and offset >= before[1]:
                sizes.setdefault(partition, []).append((offset - before[1]) / seconds)
    return {
        p: PartitionLoad(
            p, settled_rate(rates), settled_rate(sizes[p]) if len(sizes.get(p, ())) == len(rates) else None
        )
        for p, rates in events.items()
    }


def settled_rate(rates: Sequence[float]) -> float:
    """The median of `rates` (oldest first), moved to the nearer of the last two when both lie on the same
    side of it: a change two probes have confirmed counts at once, a single interval never does."""
    middle = median(rates)
    if len(rates) < 2:
        return middle
    low, high = sorted(rates[-2:])
    return min(max(middle, low), high)


def load_weights(loads: Mapping[str, PartitionLoad]) -> dict[str, float]:
    """Each partition's weight in events per second: the larger of its events per second and its bytes per
    second over the hub's mean event size (events only where bytes are unknown)."""
    known = [load for load in loads.values() if load.bytes_per_second is not None]
    events = sum(load.events_per_second for load in known)
    data = sum(load.bytes_per_second or 0.0 for load in known)
    mean_size = data / events if events > 0 and data > 0 else None
    weights = {}
    for partition, load in loads.items():
        weight = load.events_per_second
        if mean_size is not None and load.bytes_per_second is not None:
            weight = max(weight, load.bytes_per_second / mean_size)
        weights[partition] = weight
    return weights


def consumer_capacity(samples: Sequence[WorkSample], now: float, window: float) -> float | None:
    """Events one consumer processes per busy second: the median over the consumers busy at least
    `MIN_BUSY_SECONDS` in the window; None when none was."""
    kept = within(samples, now, window)
    totals: dict[str, tuple[float, float]] = {}
    for earlier, later in pairwise(kept):
        for consumer, (events, busy) in later.work.items():
            before = earlier.work.get(consumer)
            if before is None or events < before[0] or busy < before[1]:  # new, or restarted
                continue
            done, spent = totals.get(consumer, (0.0, 0.0))
            totals[consumer] = (done + events - before[0], spent + busy - before[1])
    rates = [done / spent for done, spent in totals.values() if spent >= MIN_BUSY_SECONDS and done > 0]
    return median(rates) if rates else None
