"""The operator's reservations of hubs and consumer groups (pure): the oldest resource keeps a scope,
whatever checkpoint store each names; the younger is refused until the older one's loop closes."""

from __future__ import annotations

from hubshift.operator.reservations import Reservation, ScopeReservations
from hubshift.ownership.model import Driver
from hubshift.ownership.scope import Scope

SCOPE = Scope("ns.servicebus.windows.net", "telemetry", "$Default")


def reservation(name: str, created: str) -> Reservation:
    return Reservation(Driver(uid=f"uid-{name}", resource=f"PartitionedConsumer default/{name}"), created)


def test_the_oldest_resource_keeps_the_scope_whichever_loop_opened_first() -> None:
    reservations = ScopeReservations()
    young, old = reservation("young", "2026-02-01T00:00:00Z"), reservation("old", "2026-01-01T00:00:00Z")
    reservations.add(SCOPE, young)
    assert reservations.refusal(SCOPE, young) is None  # alone
    reservations.add(SCOPE, old)
    assert reservations.refusal(SCOPE, old) is None
    refusal = reservations.refusal(SCOPE, young)
    assert refusal is not None and refusal.startswith("PartitionedConsumer default/old already consumes")
    assert "'telemetry'" in refusal and "'$default'" in refusal  # names are case-insensitive: lower case
    # the same hub and group written in other case is the same scope; another group is not
    assert (
        reservations.refusal(Scope("NS.servicebus.windows.net", "Telemetry", "$DEFAULT"), young) is not None
    )
    assert reservations.refusal(Scope("ns.servicebus.windows.net", "telemetry", "audit"), young) is None
    reservations.drop(SCOPE, old)
    assert reservations.refusal(SCOPE, young) is None


def test_a_tie_goes_by_name_a_reopened_loop_keeps_its_reservation_and_a_stale_drop_changes_nothing() -> None:
    reservations = ScopeReservations()
    a, b = reservation("a", "2026-01-01T00:00:00Z"), reservation("b", "2026-01-01T00:00:00Z")
    reservations.add(SCOPE, b)
    reservations.add(SCOPE, a)
    assert reservations.refusal(SCOPE, a) is None and reservations.refusal(SCOPE, b) is not None
    # a resource's loop reopened (a new store): the same uid, one reservation
    reservations.add(SCOPE, a)
    reservations.drop(SCOPE, a)
    assert reservations.refusal(SCOPE, b) is None
    # a resource deleted and created again under the same name has a new uid and a new creation time
    again = Reservation(Driver(uid="uid-a2", resource=a.driver.resource), "2026-03-01T00:00:00Z")
    reservations.add(SCOPE, again)
    assert reservations.refusal(SCOPE, again) is not None and reservations.refusal(SCOPE, b) is None


def test_the_older_resource_takes_the_record_over_from_a_younger_one_of_this_operator() -> None:
    reservations = ScopeReservations()
    old, young = reservation("old", "2026-01-01T00:00:00Z"), reservation("young", "2026-02-01T00:00:00Z")
    stranger = Driver(uid="uid-elsewhere", resource="PartitionedConsumer other/elsewhere")
    reservations.add(SCOPE, old)
    assert not reservations.outranks(SCOPE, old, young.driver)  # not a reservation here (yet)
    reservations.add(SCOPE, young)
    assert reservations.outranks(
        SCOPE, old, young.driver
    )  # the younger published first: the older takes over
    assert not reservations.outranks(SCOPE, young, old.driver)
    assert not reservations.outranks(SCOPE, old, old.driver)
    assert not reservations.outranks(SCOPE, old, stranger)  # a resource this operator does not know keeps it
