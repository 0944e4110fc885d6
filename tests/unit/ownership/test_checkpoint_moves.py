"""The decisions behind `hubshift checkpoints reset` and `hubshift release`, without a server: where the
next read starts for each kind of reset, when the checkpoint must name an event read from the hub, what a
moved checkpoint's metadata keeps, and which partitions a live consumer owns."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubshift.apps.checkpoints import ResetTo, needs_offset, next_sequence, parse_time
from hubshift.errors import UserError
from hubshift.eventhubs.model import PartitionInfo
from hubshift.ownership.model import Checkpoint, OwnershipSnapshot, PartitionOwnership
from hubshift.ownership.override import live_owners
from hubshift.ownership.records import checkpoint_metadata, moved_metadata, parse_checkpoint
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import LeaseState

NOW = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)


@st.composite
def partitions(draw: st.DrawFn) -> PartitionInfo:
    beginning = draw(st.integers(0, 1000))
    count = draw(st.integers(0, 1000))
    return PartitionInfo("0", beginning, beginning + count - 1, count == 0)


@given(
    partitions(), st.sampled_from(["start", "end", "time", "sequence"]), st.integers(-5, 3000), st.booleans()
)
def test_the_next_read_is_retained_or_the_next_event(
    info: PartitionInfo, kind: str, wanted: int, found: bool
) -> None:
    to = ResetTo(kind, time=NOW, sequence=max(0, wanted))  # type: ignore[arg-type]
    first_at_time = max(0, wanted) if found else None
    asked = {"time": first_at_time, "sequence": to.sequence}.get(kind)
    if asked is not None and asked > info.last_enqueued + 1:
        with pytest.raises(UserError, match="is past its end"):
            next_sequence(to, info, first_at_time)
        return
    position, note = next_sequence(to, info, first_at_time)
    assert info.beginning <= position <= info.last_enqueued + 1
    if kind == "start":
        assert position == info.beginning
    if kind == "end" or (kind == "time" and not found):
        assert position == info.last_enqueued + 1
    if note.startswith("events before"):
        assert position == info.beginning
    # "nothing consumed" exactly when the next read is the first retained event (or there is none)
    assert needs_offset(position, info) == (not info.empty and position > info.beginning)


def test_a_sequence_past_the_end_names_the_next_one() -> None:
    info = PartitionInfo("3", 0, 19, False)
    with pytest.raises(UserError) as refused:
        next_sequence(ResetTo("sequence", sequence=21), info, None)
    assert str(refused.value) == "partition 3: sequence number 21 is past its end (the next event will be 20)"
    assert next_sequence(ResetTo("sequence", sequence=20), info, None) == (20, "")
    assert next_sequence(ResetTo("sequence", sequence=3), PartitionInfo("3", 10, 19, False), None) == (
        10,
        "events before 10 are no longer retained",
    )


def test_times_are_iso_and_utc_without_a_zone() -> None:
    assert parse_time("2026-05-01T08:00:00Z") == NOW
    assert parse_time("2026-05-01T08:00:00") == NOW
    assert parse_time("2026-05-01T10:00:00+02:00") == NOW
    with pytest.raises(UserError, match="expected an ISO 8601 time"):
        parse_time("yesterday")


@given(st.text(min_size=1, max_size=20).filter(lambda t: t.strip() != ""), st.integers(-1, 10**12))
def test_a_moved_checkpoint_keeps_the_owner_and_level_and_drops_what_belonged_to_the_old_one(
    offset: str, sequence: int
) -> None:
    old = checkpoint_metadata(Checkpoint("1:8192", 80, NOW), owner="c-0", owner_level=7, next_enqueued=NOW)
    moved = moved_metadata(old, Checkpoint(offset, sequence))
    assert parse_checkpoint(moved) == Checkpoint(offset, sequence)  # any string: offsets are opaque
    assert (moved["ownerid"], moved["ownerlevel"]) == ("c-0", "7")
    assert "hubshiftstart" not in moved and "hubshiftnextenqueued" not in moved


def test_only_a_live_owner_blocks_a_partition() -> None:
    def row(partition: str, owner: str | None, alive: bool) -> PartitionOwnership:
        state = LeaseState.LEASED if owner else LeaseState.AVAILABLE
        return PartitionOwnership(partition, owner, alive, state, 1, NOW, Checkpoint("-1", -1))

    snapshot = OwnershipSnapshot(
        Scope("ns", "hub", "$Default"),
        (row("0", "c-0", True), row("1", "c-1", False), row("2", None, False)),
        (),
        None,
        None,
    )
    assert live_owners(snapshot, ["0", "1", "2", "3"]) == {"0": "c-0"}
    assert live_owners(snapshot, ["1", "2"]) == {}
