"""What the operator may reach with its own identity, for a resource in a given Kubernetes namespace: pure.

In a cluster the control loop reads each pool's backlog and checkpoint store. Where a resource's connection
names a token credential, the loop reads with the operator's own Microsoft Entra ID identity (a resource
must never make the operator act as an identity it chose), so whoever may create a PartitionedConsumer could
otherwise point the operator's token at any host (collecting it) or at another tenant's hub and store. An
administrator therefore lists, per Kubernetes namespace, the Event Hubs namespaces and storage accounts the
operator reads there (`AccessPolicy`, the chart's `operator.access`); anything else is refused before a
connection is opened. Hosts must also lie in the Azure clouds' domains, unless the policy adds others
(private DNS, a test server). Connection strings are the resource's own Secrets and need no listing.

Every check is on the host the SDKs dial, never on a string's suffix: an address must be a plain host
(`HOST[:PORT]`, `hubshift.spec.HOST`) or `https://HOST[:PORT][/ACCOUNT]`, or it is refused. Before, an
allowed suffix after a delimiter passed (`evil.example#.servicebus.windows.net`, also with `/` or `?`, which
azure-eventhub dials as evil.example; `https://evil.example\\.blob.core.windows.net`, which azure-storage
dials as evil.example).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from hubshift.spec import DNS_SUBDOMAIN, HOST

Service = Literal["eventHubs", "storage"]

# The public, China and US Government clouds' endpoints (private links are subdomains of these).
AZURE_DOMAINS: Mapping[Service, tuple[str, ...]] = {
    "eventHubs": (".servicebus.windows.net", ".servicebus.chinacloudapi.cn", ".servicebus.usgovcloudapi.net"),
    "storage": (
        ".blob.core.windows.net",
        ".dfs.core.windows.net",
        ".blob.core.chinacloudapi.cn",
        ".dfs.core.chinacloudapi.cn",
        ".blob.core.usgovcloudapi.net",
        ".dfs.core.usgovcloudapi.net",
    ),
}
ANY_NAMESPACE = "*"
ANYWHERE = "*"  # an allowed entry that stands for every host in the allowed domains
CHART_VALUE = "operator.access"
SERVICE_ACCOUNTS_VALUE = "operator.allowedServiceAccounts"
# The key of the access document (the chart's access.yaml) that holds `operator.allowedServiceAccounts`.
SERVICE_ACCOUNTS_KEY = "allowedServiceAccounts"


@dataclass(frozen=True)
class NamespaceAccess:
    """What resources in one Kubernetes namespace may have the operator read with its identity: Event Hubs
    namespaces (`myns.servicebus.windows.net`) and storage accounts (`https://acct.blob.core.windows.net`),
    or `*` for any in the allowed domains."""

    event_hubs_namespaces: frozenset[str] = frozenset()
    storage_accounts: frozenset[str] = frozenset()

    def allows(self, service: Service, address: str) -> bool:
        listed = self.event_hubs_namespaces if service == "eventHubs" else self.storage_accounts
        return ANYWHERE in listed or address in listed


@dataclass(frozen=True)
class AccessPolicy:
    """Per Kubernetes namespace (`*`: every namespace), what the operator reads with its own identity; the
    host suffixes allowed besides the Azure clouds' (`extra_domains`, e.g. `.internal.example.com`, or an
    exact host such as `127.0.0.1:10000`); and the existing ServiceAccounts the consumer pods of a resource
    there may run as (`service_accounts`, the chart's `operator.allowedServiceAccounts`): without a listing,
    only the one the operator creates for the resource."""

    namespaces: Mapping[str, NamespaceAccess] = field(default_factory=dict)
    extra_domains: frozenset[str] = frozenset()
    service_accounts: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def allows_service_account(self, namespace: str, name: str) -> bool:
        """Whether an administrator allowed the pods of resources in `namespace` to run as the existing
        ServiceAccount `name` (listed for that namespace or for `*`)."""
        return any(name in self.service_accounts.get(key, ()) for key in (namespace, ANY_NAMESPACE))

    def refusal(self, namespace: str, service: Service, address: str, path: str) -> str | None:
        """Why the operator may not read `address` (a namespace host, a storage account URL) for a resource
        in `namespace` (`path`: the block, for the message); None when it may."""
        address = normalize(service, address)
        host = host_of(service, address)
        if host is None:
            return (
                f"{path}: {_shown(address)} is not {_SHAPES[service]}: the operator reads with its own "
                "identity only an address whose host it can tell"
            )
        if not self._in_allowed_domains(service, host):
            return (
                f"{path}: {host} is not an Azure {_NAMES[service]} endpoint (hosts ending in "
                f"{', '.join(AZURE_DOMAINS[service])}); an administrator may allow others in the chart's "
                f"{CHART_VALUE}.extraDomains"
            )
        for key in (namespace, ANY_NAMESPACE):
            allowed = self.namespaces.get(key)
            if allowed is not None and allowed.allows(service, address):
                return None
        return (
            f"{path}: the operator reads {_NAMES[service]} with its own identity only where an administrator "
            f"allowed it, and {address} is not allowed for namespace {namespace} (the chart's "
            f"{CHART_VALUE}.namespaces.{namespace}.{_FIELDS[service]})"
        )

    def _in_allowed_domains(self, service: Service, host: str) -> bool:
        """`host` (a checked `HOST[:PORT]`) in the Azure domains of `service` or in `extra_domains`: a suffix
        there starts with a dot; anything else is one host, with or without its port."""
        name = host.partition(":")[0]
        return any(
            name.endswith(extra) if extra.startswith(".") else extra in (host, name)
            for extra in self.extra_domains
        ) or any(name.endswith(domain) for domain in AZURE_DOMAINS[service])

    def refusals(self, namespace: str, wanted: Iterable[tuple[Service, str, str]]) -> list[str]:
        """The refusals of every (service, address, path) the operator would read with its identity."""
        return [
            reason
            for service, address, path in wanted
            if (reason := self.refusal(namespace, service, address, path)) is not None
        ]


_NAMES: Mapping[Service, str] = {"eventHubs": "Event Hubs namespaces", "storage": "storage accounts"}
_FIELDS: Mapping[Service, str] = {"eventHubs": "eventHubsNamespaces", "storage": "storageAccounts"}
_SHAPES: Mapping[Service, str] = {
    "eventHubs": "a host name (NAMESPACE.servicebus.windows.net, optionally :PORT)",
    "storage": "an account URL (https://ACCOUNT.blob.core.windows.net, optionally :PORT and one path "
    "segment; no user, query or fragment)",
}
_HOST = re.compile(HOST)
_OBJECT_NAME = re.compile(DNS_SUBDOMAIN)
_USERINFO = re.compile(r"://[^/]*@")
_ACCOUNT_PATH = re.compile(r"(/[a-z0-9]{1,63})?/?")


def normalize(service: Service, address: str) -> str:
    """A namespace host in lower case; an account URL in lower case without a trailing slash."""
    address = address.strip().lower()
    return address.rstrip("/") if service == "storage" else address


def host_of(service: Service, address: str) -> str | None:
    """The host (`HOST[:PORT]`) the SDK dials for a normalized `address`; None for an address that is not a
    plain host or `https://HOST[:PORT][/ACCOUNT]`: one with a user (`@`), a backslash, a query, a fragment or
    anything else an SDK's URL parser might read another way than this one."""
    if service == "eventHubs":
        return address if _HOST.fullmatch(address) else None
    if any(character in address for character in "\\@#?%") or any(c.isspace() for c in address):
        return None
    parts = urlsplit(address)
    if parts.scheme != "https" or not _HOST.fullmatch(parts.netloc):
        return None
    if not _ACCOUNT_PATH.fullmatch(parts.path):
        return None
    return parts.netloc


def _shown(text: str) -> str:
    """An address a resource gave, for a message: quoted, at most 100 characters, without a URL's user and
    password."""
    text = _USERINFO.sub("://", text)
    return repr(text if len(text) <= 100 else text[:100] + "...")


def policy_from(document: Mapping[str, object]) -> AccessPolicy:
    """The policy as the chart writes it (`operator.access`): `namespaces` (name -> `eventHubsNamespaces`,
    `storageAccounts`) and `extraDomains`. `ValueError` naming the field for a bad document."""
    namespaces: dict[str, NamespaceAccess] = {}
    raw = document.get("namespaces") or {}
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"{CHART_VALUE}.namespaces must be a map of Kubernetes namespace to what it may read"
        )
    for name, entry in raw.items():
        entry = entry or {}
        if not isinstance(entry, Mapping):
            raise ValueError(f"{CHART_VALUE}.namespaces.{name} must be a map")
        namespaces[str(name)] = NamespaceAccess(
            frozenset(normalize("eventHubs", str(a)) for a in _list(entry, "eventHubsNamespaces", name)),
            frozenset(normalize("storage", str(a)) for a in _list(entry, "storageAccounts", name)),
        )
    extra = document.get("extraDomains") or []
    if not isinstance(extra, list):
        raise ValueError(f"{CHART_VALUE}.extraDomains must be a list of host suffixes")
    domains = frozenset(str(domain).strip().lower() for domain in extra)
    return AccessPolicy(namespaces, domains, service_accounts_from(document.get(SERVICE_ACCOUNTS_KEY)))


def service_accounts_from(raw: object) -> dict[str, frozenset[str]]:
    """The chart's `operator.allowedServiceAccounts` (Kubernetes namespace, or `*`, -> ServiceAccount names);
    `ValueError` naming the field for a bad one."""
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"{SERVICE_ACCOUNTS_VALUE} must be a map of Kubernetes namespace to ServiceAccount names"
        )
    allowed: dict[str, frozenset[str]] = {}
    for namespace, names in raw.items():
        names = names or []
        if not isinstance(names, list) or not all(
            isinstance(name, str) and _OBJECT_NAME.fullmatch(name) for name in names
        ):
            raise ValueError(f"{SERVICE_ACCOUNTS_VALUE}.{namespace} must be a list of ServiceAccount names")
        allowed[str(namespace)] = frozenset(names)
    return allowed


def _list(entry: Mapping[str, object], key: str, namespace: object) -> list[object]:
    value = entry.get(key) or []
    if not isinstance(value, list):
        raise ValueError(f"{CHART_VALUE}.namespaces.{namespace}.{key} must be a list")
    return value
