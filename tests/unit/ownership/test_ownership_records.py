"""Pure record codecs: checkpoint metadata, the assignment JSON, the listing-to-table step, timings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubshift.ownership.model import Assignment, ChangeKind, Checkpoint, Driver, Phase, partition_sort_key
from hubshift.ownership.records import (
    checkpoint_metadata,
    decode_assignment,
    encode_assignment,
    parse_checkpoint,
    parse_owner_level,
)
from hubshift.ownership.scope import Scope
from hubshift.ownership.snapshot import snapshot_from_entries
from hubshift.ownership.store import BlobEntry, LeaseState
from hubshift.ownership.timing import DEFAULT_TIMING, Timing
from tests.harness.ownership import failover_seconds, owned_by

T0 = datetime(2026, 11, 21, 8, 0, tzinfo=UTC)
aware_times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@given(
    st.text(alphabet="0123456789-", min_size=1, max_size=20),
    st.integers(min_value=-1, max_value=2**63 - 1),
    st.none() | aware_times,
    st.integers(min_value=0, max_value=10**9),
)
def test_checkpoint_metadata_round_trips(
    offset: str, sequence: int, start: datetime | None, level: int
) -> None:
    checkpoint = Checkpoint(offset, sequence, start)
    metadata = checkpoint_metadata(checkpoint, owner="c-0", owner_level=level)
    assert all(isinstance(v, str) for v in metadata.values())
    assert {"offset", "sequencenumber"} <= set(metadata)  # what the SDK reads unconditionally
    assert parse_checkpoint(metadata) == checkpoint
    assert parse_owner_level(metadata) == level


@pytest.mark.parametrize(
    "metadata",
    [{}, {"offset": "1"}, {"sequencenumber": "1"}, {"offset": "1", "sequencenumber": "x"}],
)
def test_metadata_without_a_position_has_no_checkpoint(metadata: dict[str, str]) -> None:
    assert parse_checkpoint(metadata) is None


def test_owner_levels_default_to_zero() -> None:
    assert parse_owner_level({}) == parse_owner_level({"ownerlevel": "junk"}) == 0


assignments = st.builds(
    Assignment,
    generation=st.integers(min_value=0, max_value=10**9),
    partitions=st.dictionaries(st.integers(0, 1023).map(str), st.sampled_from(["c-0", "c-1", "pod-12"])),
    phase=st.sampled_from(list(Phase)),
    replicas=st.integers(min_value=0, max_value=100),
    updated_at=aware_times,
    holddown_until=st.none() | aware_times,
    max_handoff_seconds=st.none() | st.floats(min_value=0, max_value=3600),
    partition_ids=st.lists(st.integers(0, 1023).map(str), max_size=5).map(tuple),
    consumers=st.lists(st.sampled_from(["c-0", "c-1", "pod-12"]), max_size=3).map(tuple),
    forced=st.frozensets(st.integers(0, 1023).map(str), max_size=3),
    planned=st.dictionaries(st.integers(0, 1023).map(str), st.sampled_from(["c-2", "pod-13"]), max_size=3),
    planned_until=st.none() | aware_times,
    change=st.none() | st.sampled_from(list(ChangeKind)),
    driver=st.none() | st.builds(Driver, uid=st.uuids().map(str), resource=st.text(min_size=1, max_size=20)),
    extra=st.dictionaries(
        st.sampled_from(["observedGeneration", "note"]), st.integers() | st.text(max_size=5)
    ),
)


@given(assignments)
def test_assignment_records_round_trip(assignment: Assignment) -> None:
    assert decode_assignment(encode_assignment(assignment)) == assignment


@pytest.mark.parametrize(
    "data",
    [b"[]", b"{}", b'{"generation": 1}', b"not json", b'{"generation": 1, "partitions": [], "phase": "R"}'],
)
def test_bad_assignment_records_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_assignment(data)


def test_an_older_record_reads_with_nothing_planned_and_a_newer_kind_reads_as_none() -> None:
    older = b'{"generation": 3, "partitions": {"0": "c-0"}, "phase": "Ready", "replicas": 1, '
    older += b'"updatedAt": "2026-11-21T08:00:00+00:00"}'
    record = decode_assignment(older)
    assert record.planned == {} and record.planned_until is None and record.change is None
    newer = older.replace(b'"replicas"', b'"change": "telepathic", "replicas"')
    assert decode_assignment(newer).change is None


def test_partitions_sort_numerically() -> None:
    assert sorted(["10", "2", "b", "0", "a"], key=partition_sort_key) == ["0", "2", "10", "a", "b"]


def entry(name: str, state: LeaseState = LeaseState.AVAILABLE, **metadata: str) -> BlobEntry:
    return BlobEntry(name=name, metadata=metadata, etag=f'"{name}"', last_modified=T0, lease_state=state)


def test_a_listing_becomes_the_ownership_table() -> None:
    scope = Scope("ns", "hub", "cg")
    p = scope.prefix
    leased = LeaseState.LEASED
    snapshot = snapshot_from_entries(
        scope,
        [
            entry(p + "checkpoint/10", leased, offset="5", sequencenumber="1", ownerid="c-1", ownerlevel="3"),
            entry(p + "checkpoint/2", leased, offset="9", sequencenumber="2", ownerid="c-0", ownerlevel="1"),
            entry(p + "checkpoint/3", LeaseState.BROKEN, offset="1", sequencenumber="0", ownerid="c-0"),
            entry(p + "checkpoint/4", leased),  # mid-claim: no owner written yet
            entry(p + "hubshift/consumers/c-0", leased),
            entry(p + "hubshift/consumers/c-1", LeaseState.EXPIRED),
            entry(p + "hubshift/assignment"),
            entry(p + "ownership/0", ownerid="sdk"),  # the SDK's own records are not ours
        ],
    )
    rows = {row.partition: row for row in snapshot.partitions}
    assert list(rows) == ["2", "3", "4", "10"]
    assert (rows["2"].owner, rows["2"].owner_alive, rows["2"].orphaned) == ("c-0", True, False)
    assert (rows["10"].owner, rows["10"].orphaned, rows["10"].owner_level) == ("c-1", True, 3)
    assert rows["3"].free and rows["3"].owner is None and rows["3"].last_owner == "c-0"
    assert rows["4"].owner == "?" and rows["4"].checkpoint == Checkpoint("-1", -1)
    assert snapshot.live_members == ["c-0"]
    assert snapshot.owners == {"2": "c-0", "4": "?", "10": "c-1"}
    assert owned_by(snapshot, "c-0") == ["2"]
    assert snapshot.assignment_etag == f'"{p}hubshift/assignment"' and snapshot.assignment is None


def test_the_default_timings_hold_their_promises() -> None:
    t = DEFAULT_TIMING
    assert 15 <= t.membership_lease_seconds <= 60
    assert t.renew_interval_seconds <= t.membership_lease_seconds / 2
    assert failover_seconds(t) * 4 <= 180 + 36  # the SDK's worst case: 180 s expiry + a 36 s cycle
    assert failover_seconds(Timing(membership_lease_seconds=15, renew_interval_seconds=5)) == 35


@pytest.mark.parametrize(
    "kwargs",
    [
        {"membership_lease_seconds": 10},
        {"membership_lease_seconds": 61},
        {"renew_interval_seconds": 20},
        {"safety_margin_seconds": 15},
        {"list_interval_seconds": 0},
    ],
)
def test_bad_timings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Timing(**kwargs)  # type: ignore[arg-type]


def test_holddown_is_kept_to_the_second() -> None:
    a = Assignment(1, {}, Phase.HOLDDOWN, 0, T0, holddown_until=T0 + timedelta(seconds=5.5))
    assert decode_assignment(encode_assignment(a)).holddown_until == T0 + timedelta(seconds=5.5)
