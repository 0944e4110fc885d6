"""Which resource consumes which hub and consumer group (a scope), and which one publishes its assignment.

Two PartitionedConsumers on one hub and consumer group undo each other: each pool's consumers open epoch
receivers on every partition, so the two pools steal partitions from each other for as long as both run,
and each replays what the other read. The assignment record names the resource whose loop publishes it
(its driver) and refuses a second one (`driving_refusal`), but only within one checkpoint store: a
resource that names another store finds no record there. The operator sees every resource it watches, so
it also refuses the younger one itself, whatever store it names (`ScopeReservations`: the oldest by
creation time, then by name, keeps the scope). Pure bookkeeping: the control loops add their reservation
when they open and drop it when they close.
"""

from __future__ import annotations

from dataclasses import dataclass

from hubshift.ownership.model import Driver
from hubshift.ownership.scope import Scope


@dataclass(frozen=True)
class Reservation:
    """A resource consuming a scope: its driver (uid and name) and its creation time (RFC 3339, as the
    API server writes it; "" when not known, which counts as oldest)."""

    driver: Driver
    created: str = ""

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.created, self.driver.resource, self.driver.uid)


class ScopeReservations:
    """The reservations of one operator process, by scope (the Event Hubs namespace, hub and consumer group:
    the checkpoint store is not part of it)."""

    def __init__(self) -> None:
        self._reservations: dict[Scope, dict[str, Reservation]] = {}

    def add(self, scope: Scope, reservation: Reservation) -> None:
        self._reservations.setdefault(scope, {})[reservation.driver.uid] = reservation

    def drop(self, scope: Scope, reservation: Reservation) -> None:
        held = self._reservations.get(scope, {})
        if held.get(reservation.driver.uid) == reservation:
            del held[reservation.driver.uid]
        if not held:
            self._reservations.pop(scope, None)

    def refusal(self, scope: Scope, reservation: Reservation) -> str | None:
        """Why `reservation`'s resource may not consume `scope`: an older resource of this operator consumes
        it (whichever checkpoint store each names). None when it may."""
        held = self._reservations.get(scope, {}).values()
        others = [r for r in held if r.driver.uid != reservation.driver.uid]
        older = min(others, key=lambda r: r.order, default=None)
        if older is None or older.order > reservation.order:
            return None
        return (
            f"{older.driver.resource} already consumes hub {scope.hub!r}, consumer group "
            f"{scope.consumer_group!r} of {scope.fqns}: two resources on one consumer group steal partitions "
            "from each other (even with different checkpoint stores); give this one its own consumer group, "
            f"or delete {older.driver.resource}"
        )

    def outranks(self, scope: Scope, reservation: Reservation, driver: Driver) -> bool:
        """Whether `reservation`'s resource may take `scope`'s record over from `driver`: a younger resource
        of this operator on the same scope (refused here, so it publishes no more)."""
        other = self._reservations.get(scope, {}).get(driver.uid)
        mine = reservation.driver.uid
        return other is not None and other.driver.uid != mine and other.order > reservation.order


def driving_refusal(current: Driver | None, me: Driver, scope: str) -> str | None:
    """Why the resource `me` may not publish the assignment of `scope`, whose record names `current` as its
    driver: another resource's control loop publishes it (two would undo each other's moves). None when it
    may: nobody drives the scope (a new or released record, or one written before records named drivers),
    it is `me`, or a resource of the same name created again (its uid changed)."""
    if current is None or current.uid == me.uid or current.resource == me.resource:
        return None
    return (
        f"the assignment of {scope} is published by {current.resource}: two resources must not drive one hub "
        "and consumer group; give this one its own consumer group, or delete "
        f"{current.resource} (its record is released when it is deleted)"
    )
