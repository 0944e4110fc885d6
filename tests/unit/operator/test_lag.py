"""Lag in seconds, as the control loop decides it (pure): where each partition's oldest unprocessed event's
enqueued time comes from, which events the loop reads itself, the worst partition, the metadata round
trip, and the metrics."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hubshift.eventhubs.model import PartitionInfo
from hubshift.operator.metrics import OperatorMetrics
from hubshift.operator.partition_lag import (
    LAG_READS_PER_CYCLE,
    PartitionLag,
    first_unprocessed,
    lag_per_partition,
    lag_reads,
    remember_probes,
    worst_lag,
)
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition, release_partition
from hubshift.ownership.membership import join_pool
from hubshift.ownership.model import Checkpoint, OwnershipSnapshot
from hubshift.ownership.records import checkpoint_metadata, parse_next_enqueued
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import take_snapshot
from hubshift.ownership.stores.sqlite import SqliteLeaseStore

SCOPE = Scope("ns.example.net", "hub", "$default")
NOW = 1_800_000_000.0


def at(seconds_ago: float) -> datetime:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC)


def snapshot(tmp_path: Path, rows: dict[str, tuple[int, datetime | None]]) -> OwnershipSnapshot:
    """Checkpoints written by homes-0: partition -> (sequence number, the next event's enqueued time)."""
    store = SqliteLeaseStore(tmp_path / "s.db")
    join_pool(store, SCOPE, "homes-0", clock=lambda: 0.0)
    for partition, (sequence, moment) in rows.items():
        lease = claim_partition(store, SCOPE, partition, "homes-0")
        write_checkpoint(store, lease, Checkpoint(str(sequence), sequence), next_enqueued=moment)
    return take_snapshot(store, SCOPE)


def test_the_enqueued_time_round_trips_through_the_checkpoint_metadata() -> None:
    moment = at(3)
    metadata = checkpoint_metadata(Checkpoint("10", 1), next_enqueued=moment)
    assert parse_next_enqueued(metadata) == moment
    assert parse_next_enqueued(checkpoint_metadata(Checkpoint("10", 1))) is None
    assert parse_next_enqueued({"hubshiftnextenqueued": "not a time"}) is None
    assert parse_next_enqueued({"hubshiftnextenqueued": "2026-01-01T00:00:00"}) is None  # no zone


def test_a_claim_keeps_the_time_and_a_release_writes_it(tmp_path: Path) -> None:
    store = SqliteLeaseStore(tmp_path / "s.db")
    lease = claim_partition(store, SCOPE, "0", "homes-0")
    lease = write_checkpoint(store, lease, Checkpoint("5", 5), next_enqueued=at(7))
    assert take_snapshot(store, SCOPE).partitions[0].next_enqueued == at(7)
    claim_partition(store, SCOPE, "0", "homes-1", force=True)  # the position is unchanged, so is the time
    assert take_snapshot(store, SCOPE).partitions[0].next_enqueued == at(7)
    lease = claim_partition(store, SCOPE, "1", "homes-0")
    assert release_partition(store, lease, final=Checkpoint("9", 9), next_enqueued=at(1))
    row = take_snapshot(store, SCOPE).partition("1")
    assert row is not None and row.checkpoint.sequence_number == 9 and row.next_enqueued == at(1)


def test_first_unprocessed_follows_the_backlog() -> None:
    info = PartitionInfo("0", 0, 99, False)
    assert first_unprocessed(info, 0) is None
    assert first_unprocessed(info, 1) == 99
    assert first_unprocessed(info, 60) == 40
    assert first_unprocessed(PartitionInfo("0", 0, -1, True), 5) is None


def test_lag_comes_from_what_is_known_without_reading_events(tmp_path: Path) -> None:
    snap = snapshot(
        tmp_path,
        {
            "0": (39, at(30)),  # the owner wrote when event 40 was enqueued
            "1": (39, None),  # the owner did not know yet
            "2": (98, None),  # only the last event is unprocessed: the probe's time is its time
            "3": (99, None),  # caught up
            "4": (30, at(50)),  # a time for event 31, but the backlog says 40 is the first unprocessed
        },
    )
    infos = {p: PartitionInfo(p, 0, 99, False, NOW - 2) for p in "01234"}
    backlog = {"0": 60, "1": 60, "2": 1, "3": 0, "4": 60}
    lags = lag_per_partition(infos, snap, backlog, {}, NOW)
    assert lags["0"] == PartitionLag("0", 30.0, "checkpoint", 40)
    assert lags["1"] == PartitionLag("1", None, "unknown", 40)
    assert lags["2"] == PartitionLag("2", 2.0, "last-enqueued", 99)
    assert lags["3"] == PartitionLag("3", 0.0, "caught-up")
    assert lags["4"].seconds is None
    # an event the loop read itself counts for that sequence number only
    read = {"1": (40, NOW - 12.5), "4": (31, NOW - 99)}
    again = lag_per_partition(infos, snap, backlog, read, NOW)
    assert again["1"] == PartitionLag("1", 12.5, "read", 40)
    assert again["4"].seconds is None
    assert worst_lag(again) == again["0"]
    assert worst_lag({"9": PartitionLag("9", None, "unknown", 3)}) is None


def test_a_stalled_owner_shows_a_lag_bounded_by_the_first_probe_that_saw_the_event(tmp_path: Path) -> None:
    # The owner checkpointed caught up at 39 (no neighbour's time), then stalled with its leases held:
    # nobody writes the time and the loop may not read the event, but the probes saw 40 enqueued.
    snap = snapshot(tmp_path, {"0": (39, None)})
    probes: dict[str, tuple[tuple[int, float], ...]] = {}
    history = [(39, NOW - 40), (41, NOW - 30), (44, NOW - 20), (44, NOW - 10)]
    for last, when in history:
        info = {"0": PartitionInfo("0", 0, last, False)}
        probes = remember_probes(probes, info, {"0": last - 39}, when)
    # caught up at the first probe: nothing kept; the same position twice: the earliest kept
    assert probes == {"0": ((41, NOW - 30), (44, NOW - 20))}
    infos = {"0": PartitionInfo("0", 0, 44, False)}
    lags = lag_per_partition(infos, snap, {"0": 5}, {}, NOW, probes)
    assert lags["0"] == PartitionLag("0", 30.0, "probe", 40)
    # a lower bound only: the loop still reads the event when nobody owns the partition
    assert lag_reads(lags, {"0": 5}, {"0": None}, [], {}, NOW) == [("0", 40)]
    # the time the owner writes wins over the bound
    (tmp_path / "written").mkdir()
    written = snapshot(tmp_path / "written", {"0": (39, at(33))})
    assert lag_per_partition(infos, written, {"0": 5}, {}, NOW, probes)["0"] == PartitionLag(
        "0", 33.0, "checkpoint", 40
    )
    # the owner read on (42 is first now): the probe that saw only 41 bounds nothing, even before pruning
    assert lag_per_partition(infos, snap, {"0": 3}, {}, NOW, probes)["0"] == PartitionLag(
        "0", 20.0, "probe", 42
    )
    moved = remember_probes(probes, infos, {"0": 1}, NOW)
    assert moved == {"0": ((44, NOW - 20),)}
    # caught up again: nothing kept
    assert remember_probes(moved, infos, {"0": 0}, NOW) == {}


def test_remembered_probes_are_capped_keeping_the_oldest() -> None:
    probes: dict[str, tuple[tuple[int, float], ...]] = {}
    for last in range(1, 11):
        probes = remember_probes(
            probes, {"0": PartitionInfo("0", 0, last, False)}, {"0": last}, float(last), keep=3
        )
    assert probes == {"0": ((1, 1.0), (9, 9.0), (10, 10.0))}


def test_a_clock_behind_the_service_never_makes_lag_negative(tmp_path: Path) -> None:
    snap = snapshot(tmp_path, {"0": (0, at(-5))})
    lags = lag_per_partition({"0": PartitionInfo("0", 0, 9, False)}, snap, {"0": 9}, {}, NOW)
    assert lags["0"].seconds == 0.0


def test_the_loop_reads_only_events_nobody_reads_a_few_at_a_time() -> None:
    unknown = {str(p): PartitionLag(str(p), None, "unknown", 100 + p) for p in range(10)}
    lags = {**unknown, "known": PartitionLag("known", 3.0, "checkpoint", 7)}
    backlog = {str(p): p for p in range(10)}
    owners: dict[str, str | None] = {"0": "homes-0", "1": "homes-9", "2": None}
    alive = ["homes-0"]
    reads = lag_reads(lags, backlog, owners, alive, {}, NOW)
    # homes-0 reads partition 0 (it will write the time); the largest backlogs first; a few per cycle
    assert reads == [("9", 109), ("8", 108), ("7", 107), ("6", 106)]
    assert len(reads) == LAG_READS_PER_CYCLE
    tried = {p: (seq, NOW - 10) for p, seq in reads}
    assert lag_reads(lags, backlog, owners, alive, tried, NOW)[:2] == [("5", 105), ("4", 104)]
    # the same event is tried again only after the retry interval; a new first event at once
    tried = {"9": (109, NOW - 61), "8": (107, NOW - 1)}
    assert lag_reads(lags, backlog, owners, alive, tried, NOW, limit=2) == [("9", 109), ("8", 108)]


def samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_lag_metrics_export_the_known_and_count_the_unknown() -> None:
    metrics = OperatorMetrics()
    metrics.set_hub("ns", "homes", "telemetry", "$Default")
    metrics.set_lag("ns", "homes", {"0": 4.0, "1": None, "2": 0.0})
    got = samples(metrics)
    labels = (
        ("consumer", "homes"),
        ("consumer_group", "$Default"),
        ("hub", "telemetry"),
        ("namespace", "ns"),
    )
    assert got[("hubshift_partition_lag_seconds", (*labels[:3], *labels[3:], ("partition", "0")))] == 4.0
    assert not any(k[0] == "hubshift_partition_lag_seconds" and ("partition", "1") in k[1] for k in got)
    assert got[("hubshift_lag_seconds", labels)] == 4.0
    assert got[("hubshift_lag_unknown_partitions", labels)] == 1
    metrics.set_lag("ns", "homes", {"1": 2.0})
    got = samples(metrics)
    assert [k for k in got if k[0] == "hubshift_partition_lag_seconds"] == [
        ("hubshift_partition_lag_seconds", (*labels[:3], *labels[3:], ("partition", "1")))
    ]
    metrics.forget("ns", "homes")
    assert not any(k[0].startswith("hubshift_") and "lag" in k[0] for k in samples(metrics))


def test_a_changed_hub_replaces_the_series_about_the_old_ones_partitions() -> None:
    """`hub` and `consumer_group` label the series about the hub's partitions; after `kubectl apply` of
    another hub, none of the old hub's series is left behind beside the new one's."""
    metrics = OperatorMetrics()
    metrics.set_hub("ns", "homes", "telemetry", "$Default")
    metrics.set_partitions("ns", "homes", 4)
    metrics.set_backlog("ns", "homes", {"0": 3, "1": 5})
    metrics.set_lag("ns", "homes", {"0": 1.0, "1": 2.0})
    metrics.set_hub("ns", "homes", "telemetry-2", "audit")
    metrics.set_partitions("ns", "homes", 2)
    metrics.set_backlog("ns", "homes", {"0": 7})
    metrics.set_lag("ns", "homes", {"0": 9.0})
    hubs = {
        (dict(k[1])["hub"], dict(k[1])["consumer_group"])
        for k in samples(metrics)
        if k[0].startswith("hubshift_") and "hub" in dict(k[1])
    }
    assert hubs == {("telemetry-2", "audit")}
    assert samples(metrics)[("hubshift_backlog_events", (
        ("consumer", "homes"), ("consumer_group", "audit"), ("hub", "telemetry-2"), ("namespace", "ns")
    ))] == 7  # fmt: skip


def test_counters_that_matter_before_the_first_failure_exist_from_the_start() -> None:
    metrics = OperatorMetrics()
    metrics.initialise("ns", "homes")
    got = samples(metrics)
    labels = (("consumer", "homes"), ("namespace", "ns"))
    assert got[("hubshift_cycle_errors_total", labels)] == 0
    assert got[("hubshift_partition_moves_total", labels)] == 0
    assert got[("hubshift_handoff_duration_seconds_count", labels)] == 0
    assert got[("hubshift_rebalances_total", (*labels, ("reason", "orphans")))] == 0
    assert (
        got[
            ("hubshift_scale_events_total", (("consumer", "homes"), ("direction", "up"), ("namespace", "ns")))
        ]
        == 0
    )


def test_hubshift_status_shows_backlog_and_lag_in_seconds(tmp_path: Path) -> None:
    from hubshift.apps.status import hub_lag, status_document
    from hubshift.spec import StartPositionSpec

    snap = snapshot(tmp_path, {"0": (39, at(30)), "1": (99, None)})
    infos = {p: PartitionInfo(p, 0, 99, False, NOW - 1) for p in "01"}
    lag = hub_lag(snap, infos, StartPositionSpec(), NOW)
    document = status_document(snap, lag)
    rows = {r["partition"]: r for r in document["partitions"]}
    assert (rows["0"]["backlog"], rows["0"]["lagSeconds"]) == (60, 30.0)
    assert (rows["1"]["backlog"], rows["1"]["lagSeconds"]) == (0, 0.0)
    assert rows["0"]["nextEnqueued"] == at(30).isoformat()
    assert (document["lagSeconds"], document["laggingPartition"]) == (30.0, "0")
    assert "backlog" not in status_document(snap)["partitions"][0]
