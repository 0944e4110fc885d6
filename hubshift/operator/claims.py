"""Which resource of this operator consumes which hub and consumer group.

Two PartitionedConsumers on one hub and consumer group undo each other: each pool's consumers open epoch
receivers on every partition, so the two pools steal partitions from each other for as long as both run,
and each replays what the other read. The assignment record refuses a second resource on the same scope
(`observe.driving_refusal`), but only within one checkpoint store: a resource that names another store
finds no record there. The operator sees every resource it watches, so it refuses the younger one here,
whatever store it names (the oldest by creation time, then by name, keeps the scope). Pure bookkeeping:
the control loops add their claim when they open and drop it when they close.
"""

from __future__ import annotations

from dataclasses import dataclass

from hubshift.ownership.model import Driver
from hubshift.ownership.scope import Scope


@dataclass(frozen=True)
class Claim:
    """A resource consuming a scope: its driver (uid and name) and its creation time (RFC 3339, as the
    API server writes it; "" when not known, which counts as oldest)."""

    driver: Driver
    created: str = ""

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.created, self.driver.resource, self.driver.uid)


class ScopeClaims:
    """The claims of one operator process, by scope (the Event Hubs namespace, hub and consumer group: the
    checkpoint store is not part of it)."""

    def __init__(self) -> None:
        self._claims: dict[Scope, dict[str, Claim]] = {}

    def add(self, scope: Scope, claim: Claim) -> None:
        self._claims.setdefault(scope, {})[claim.driver.uid] = claim

    def drop(self, scope: Scope, claim: Claim) -> None:
        held = self._claims.get(scope, {})
        if held.get(claim.driver.uid) == claim:
            del held[claim.driver.uid]
        if not held:
            self._claims.pop(scope, None)

    def refusal(self, scope: Scope, claim: Claim) -> str | None:
        """Why `claim`'s resource may not consume `scope`: an older resource of this operator consumes it
        (whichever checkpoint store each names). None when it may."""
        others = [c for c in self._claims.get(scope, {}).values() if c.driver.uid != claim.driver.uid]
        older = min(others, key=lambda c: c.order, default=None)
        if older is None or older.order > claim.order:
            return None
        return (
            f"{older.driver.resource} already consumes hub {scope.hub!r}, consumer group "
            f"{scope.consumer_group!r} of {scope.fqns}: two resources on one consumer group steal partitions "
            "from each other (even with different checkpoint stores); give this one its own consumer group, "
            f"or delete {older.driver.resource}"
        )

    def outranks(self, scope: Scope, claim: Claim, driver: Driver) -> bool:
        """Whether `claim`'s resource may take `scope`'s record over from `driver`: a younger resource of
        this operator on the same scope (refused here, so it publishes no more)."""
        other = self._claims.get(scope, {}).get(driver.uid)
        return other is not None and other.driver.uid != claim.driver.uid and other.order > claim.order
