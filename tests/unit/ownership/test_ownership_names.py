"""Scope names, identities and lease ids: the SDK's layout, lower case, stable across restarts."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubshift.ownership.scope import Scope, consumer_id, partition_id

SCOPE = Scope("MyNS.ServiceBus.Windows.Net", "Orders", "$Default")


def test_names_follow_the_sdk_layout_in_lower_case() -> None:
    assert SCOPE.prefix == "myns.servicebus.windows.net/orders/$default/"
    assert SCOPE.checkpoint_blob("7") == "myns.servicebus.windows.net/orders/$default/checkpoint/7"
    assert SCOPE.member_blob("Orders-3") == SCOPE.prefix + "hubshift/consumers/orders-3"
    assert SCOPE.assignment_blob == "myns.servicebus.windows.net/orders/$default/hubshift/assignment"
    assert str(SCOPE) == "myns.servicebus.windows.net/orders/$default"
    assert Scope("myns.servicebus.windows.net", "orders", "$default") == SCOPE


def test_lease_ids_are_stable_per_identity_and_scope() -> None:
    lease = SCOPE.lease_id("orders-0")
    assert uuid.UUID(lease).version == 5
    assert lease == Scope("myns.servicebus.windows.net", "ORDERS", "$default").lease_id("Orders-0")
    assert lease != SCOPE.lease_id("orders-1")
    assert lease != Scope("myns.servicebus.windows.net", "orders", "other").lease_id("orders-0")


@given(st.text(min_size=1, max_size=30))
def test_any_identity_is_either_normalised_or_refused(raw: str) -> None:
    try:
        value = consumer_id(raw)
    except ValueError:
        return
    assert value == value.lower() and "/" not in value and value == consumer_id(value)


@pytest.mark.parametrize("bad", ["", "-a", "a-", "a/b", "a b", "ä"])
def test_bad_identities(bad: str) -> None:
    with pytest.raises(ValueError):
        consumer_id(bad)


@pytest.mark.parametrize("bad", [("", "h", "c"), ("n", "a/b", "c"), ("n", "h", " ")])
def test_bad_scopes(bad: tuple[str, str, str]) -> None:
    with pytest.raises(ValueError):
        Scope(*bad)


def test_partition_ids() -> None:
    assert partition_id(3) == "3"
    with pytest.raises(ValueError):
        partition_id("a/b")
