"""What the operator reads with its own identity: only what an administrator listed per namespace, and only
in the Azure clouds' domains (or those the policy adds)."""

from __future__ import annotations

import pytest

from hubshift.operator.access import AccessPolicy, NamespaceAccess, policy_from
from hubshift.operator.kubernetes.settings import unserved_namespace

TEAM = NamespaceAccess(
    frozenset({"team.servicebus.windows.net"}), frozenset({"https://teamstore.blob.core.windows.net"})
)


def test_nothing_is_allowed_by_default() -> None:
    reason = AccessPolicy().refusal("default", "eventHubs", "team.servicebus.windows.net", "spec.eventHubs")
    assert reason is not None
    assert "spec.eventHubs" in reason and "operator.access.namespaces.default.eventHubsNamespaces" in reason


def test_a_listed_namespace_and_account_are_allowed_in_their_kubernetes_namespace_only() -> None:
    policy = AccessPolicy({"team": TEAM})
    assert policy.refusal("team", "eventHubs", "Team.servicebus.windows.net", "p") is None
    assert policy.refusal("team", "storage", "https://teamstore.blob.core.windows.net/", "p") is None
    assert policy.refusal("other", "eventHubs", "team.servicebus.windows.net", "p") is not None
    assert policy.refusal("team", "eventHubs", "victim.servicebus.windows.net", "p") is not None
    assert policy.refusal("team", "storage", "https://victimstore.blob.core.windows.net", "p") is not None


def test_any_host_outside_the_azure_domains_is_refused_even_where_everything_is_allowed() -> None:
    everything = NamespaceAccess(frozenset({"*"}), frozenset({"*"}))
    policy = AccessPolicy({"*": everything})
    assert policy.refusal("x", "storage", "https://attacker.example.com", "spec.checkpointStore.blob") == (
        "spec.checkpointStore.blob: attacker.example.com is not an Azure storage accounts endpoint (hosts "
        "ending in .blob.core.windows.net, .dfs.core.windows.net, .blob.core.chinacloudapi.cn, "
        ".dfs.core.chinacloudapi.cn, .blob.core.usgovcloudapi.net, .dfs.core.usgovcloudapi.net); an "
        "administrator may allow others in the chart's operator.access.extraDomains"
    )
    # A suffix trick: the Azure domain inside the host name, not at its end.
    assert policy.refusal("x", "eventHubs", "ns.servicebus.windows.net.attacker.example.com", "p") is not None
    assert policy.refusal("x", "eventHubs", "ns.servicebus.windows.net:443", "p") is None
    assert policy.refusal("x", "eventHubs", "ns.servicebus.chinacloudapi.cn", "p") is None


def test_extra_domains_admit_private_hosts_and_test_servers() -> None:
    policy = AccessPolicy(
        {"*": NamespaceAccess(frozenset({"*"}), frozenset({"*"}))},
        frozenset({"127.0.0.1:5671", ".corp", "store.internal"}),
    )
    assert policy.refusal("x", "eventHubs", "127.0.0.1:5671", "p") is None
    assert policy.refusal("x", "eventHubs", "127.0.0.1:5672", "p") is not None
    assert policy.refusal("x", "storage", "https://store.corp", "p") is None
    # An entry without a leading dot is one host, not a suffix.
    assert policy.refusal("x", "storage", "https://store.internal:8443", "p") is None
    assert policy.refusal("x", "storage", "https://evilstore.internal", "p") is not None


EVERYTHING = AccessPolicy({"*": NamespaceAccess(frozenset({"*"}), frozenset({"*"}))})


@pytest.mark.parametrize(
    "address",
    [
        "evil.example#.servicebus.windows.net",  # azure-eventhub dials evil.example
        "evil.example/.servicebus.windows.net",
        "evil.example?.servicebus.windows.net",
        "evil.example\\.servicebus.windows.net",
        "u@evil.example.servicebus.windows.net",
        "evil.example:443#.servicebus.windows.net",
        "ns.servicebus.windows.net.",
        "ns.servicebus.windows.net:",
        "",
    ],
)
def test_a_namespace_that_is_not_a_plain_host_is_refused_where_every_namespace_is_allowed(
    address: str,
) -> None:
    """Security issue 35: a suffix test passed an Azure domain after a URL delimiter; the SDK dials the host
    before it (tests/integration/identity/test_operator_access.py shows what it dials)."""
    reason = EVERYTHING.refusal("team", "eventHubs", address, "spec.eventHubs")
    assert reason is not None and reason.startswith("spec.eventHubs: ")


@pytest.mark.parametrize(
    "address",
    [
        "https://evil.example\\.blob.core.windows.net",  # azure-storage dials evil.example
        "https://evil.example#.blob.core.windows.net",
        "https://evil.example?.blob.core.windows.net",
        "https://evil.example/.blob.core.windows.net",
        "https://acct.blob.core.windows.net@evil.example",
        "https://user:password@acct.blob.core.windows.net",
        "https://evil.example%2f.blob.core.windows.net",
        "https://acct.blob.core.windows.net/a/b",
        "http://acct.blob.core.windows.net",
        "acct.blob.core.windows.net",
    ],
)
def test_an_account_url_an_sdk_might_read_another_way_is_refused_where_every_account_is_allowed(
    address: str,
) -> None:
    reason = EVERYTHING.refusal("team", "storage", address, "spec.checkpointStore.blob")
    assert reason is not None and reason.startswith("spec.checkpointStore.blob: ")
    assert "password" not in reason  # a URL's user and password are never shown


def test_plain_hosts_and_account_urls_pass_where_every_one_is_allowed() -> None:
    for address in ("ns.servicebus.windows.net", "NS.servicebus.windows.net:5671"):
        assert EVERYTHING.refusal("team", "eventHubs", address, "p") is None
    for address in (
        "https://acct.blob.core.windows.net",
        "https://acct.blob.core.windows.net/",
        "https://acct.dfs.core.windows.net:443/account",
    ):
        assert EVERYTHING.refusal("team", "storage", address, "p") is None


def test_the_chart_document_becomes_a_policy_and_bad_ones_name_the_field() -> None:
    policy = policy_from(
        {
            "namespaces": {"team": {"eventHubsNamespaces": ["TEAM.servicebus.windows.net"]}},
            "extraDomains": [".Corp"],
        }
    )
    assert policy.namespaces["team"].event_hubs_namespaces == {"team.servicebus.windows.net"}
    assert policy.extra_domains == {".corp"}
    assert policy_from({}) == AccessPolicy()
    with pytest.raises(ValueError, match=r"operator.access.namespaces.team.storageAccounts must be a list"):
        policy_from({"namespaces": {"team": {"storageAccounts": "https://x.blob.core.windows.net"}}})


def test_existing_service_accounts_an_administrator_allowed_per_namespace() -> None:
    policy = policy_from(
        {"allowedServiceAccounts": {"team-a": ["spark-jobs"], "*": ["mesh"], "team-b": None}}
    )
    assert policy.allows_service_account("team-a", "spark-jobs")
    assert policy.allows_service_account("team-b", "mesh")
    assert not policy.allows_service_account("team-b", "spark-jobs")
    assert not AccessPolicy().allows_service_account("team-a", "default")
    for bad in ({"team-a": "spark-jobs"}, {"team-a": ["Spark Jobs"]}, ["team-a"]):
        with pytest.raises(ValueError, match=r"^operator.allowedServiceAccounts"):
            policy_from({"allowedServiceAccounts": bad})


def test_the_operator_serves_its_own_namespace_only_when_given_it_by_name() -> None:
    assert unserved_namespace("hubshift", ()) == "hubshift"  # every namespace: all but its own
    assert unserved_namespace("hubshift", ("team-*", "hub*")) == "hubshift"  # a glob is not its name
    assert unserved_namespace("team-a", ("team-a",)) is None  # watchReleaseNamespace, watchNamespaces
    assert unserved_namespace(None, ()) is None  # not in a pod
