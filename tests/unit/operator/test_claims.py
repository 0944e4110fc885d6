"""The operator's claims on hubs and consumer groups (pure): the oldest resource keeps a scope, whatever
checkpoint store each names; the younger is refused until the older one's loop closes."""

from __future__ import annotations

from hubshift.operator.claims import Claim, ScopeClaims
from hubshift.ownership.model import Driver
from hubshift.ownership.scope import Scope

SCOPE = Scope("ns.servicebus.windows.net", "telemetry", "$Default")


def claim(name: str, created: str) -> Claim:
    return Claim(Driver(uid=f"uid-{name}", resource=f"PartitionedConsumer default/{name}"), created)


def test_the_oldest_resource_keeps_the_scope_whichever_loop_opened_first() -> None:
    claims = ScopeClaims()
    young, old = claim("young", "2026-02-01T00:00:00Z"), claim("old", "2026-01-01T00:00:00Z")
    claims.add(SCOPE, young)
    assert claims.refusal(SCOPE, young) is None  # alone
    claims.add(SCOPE, old)
    assert claims.refusal(SCOPE, old) is None
    refusal = claims.refusal(SCOPE, young)
    assert refusal is not None and refusal.startswith("PartitionedConsumer default/old already consumes")
    assert "'telemetry'" in refusal and "'$default'" in refusal  # names are case-insensitive: lower case
    # the same hub and group written in other case is the same scope; another group is not
    assert claims.refusal(Scope("NS.servicebus.windows.net", "Telemetry", "$DEFAULT"), young) is not None
    assert claims.refusal(Scope("ns.servicebus.windows.net", "telemetry", "audit"), young) is None
    claims.drop(SCOPE, old)
    assert claims.refusal(SCOPE, young) is None


def test_a_tie_goes_by_name_a_reopened_loop_keeps_its_claim_and_a_stale_drop_changes_nothing() -> None:
    claims = ScopeClaims()
    a, b = claim("a", "2026-01-01T00:00:00Z"), claim("b", "2026-01-01T00:00:00Z")
    claims.add(SCOPE, b)
    claims.add(SCOPE, a)
    assert claims.refusal(SCOPE, a) is None and claims.refusal(SCOPE, b) is not None
    # a resource's loop reopened (a new store): the same uid, one claim
    claims.add(SCOPE, a)
    claims.drop(SCOPE, a)
    assert claims.refusal(SCOPE, b) is None
    # a resource deleted and created again under the same name has a new uid and a new creation time
    again = Claim(Driver(uid="uid-a2", resource=a.driver.resource), "2026-03-01T00:00:00Z")
    claims.add(SCOPE, again)
    assert claims.refusal(SCOPE, again) is not None and claims.refusal(SCOPE, b) is None


def test_the_older_resource_takes_the_record_over_from_a_younger_one_of_this_operator() -> None:
    claims = ScopeClaims()
    old, young = claim("old", "2026-01-01T00:00:00Z"), claim("young", "2026-02-01T00:00:00Z")
    stranger = Driver(uid="uid-elsewhere", resource="PartitionedConsumer other/elsewhere")
    claims.add(SCOPE, old)
    assert not claims.outranks(SCOPE, old, young.driver)  # not a claim here (yet)
    claims.add(SCOPE, young)
    assert claims.outranks(SCOPE, old, young.driver)  # the younger published first: the older takes over
    assert not claims.outranks(SCOPE, young, old.driver)
    assert not claims.outranks(SCOPE, old, old.driver)
    assert not claims.outranks(SCOPE, old, stranger)  # a resource this operator does not know keeps it
