"""Security issue 35, the model's part: every Secret and ConfigMap name a resource gives is a Kubernetes
object name (the operator's API client joins it into a request's path as it is), and every address the SDKs
dial is a plain host (their URL parsers end the host at `#`, `/`, `?`, `\\` or `@`). `hubshift run` refuses
the rest with one line naming the field, and so does the CRD's schema at `kubectl apply` (the cluster tier's
`test_operator_cluster.py` shows the real API server refusing them)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from hubshift.errors import UserError
from hubshift.manifest import parse_manifest
from tests.fixtures.operator import root_schema

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "homes.yaml"
KEYLESS = Path(__file__).resolve().parents[2] / "examples" / "homes-keyless.yaml"

Mutation = Callable[[dict[str, Any]], None]


def document(path: Path = EXAMPLE) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return copy.deepcopy(loaded)


def at(path: str, value: Any) -> Mutation:
    """Set the field at the dotted `path` under spec."""

    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = d["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return mutate


def refused(d: dict[str, Any], mutate: Mutation, field: str) -> None:
    """The model refuses the mutated document naming `field`, in one line; so does the CRD's schema."""
    mutate(d)
    with pytest.raises(UserError) as error:
        parse_manifest(d)
    message = str(error.value)
    assert message.startswith(f"manifest: {field}: "), message
    assert "\n" not in message
    errors = list(jsonschema.Draft4Validator(root_schema()).iter_errors(d))
    paths = {".".join(str(part) for part in error.absolute_path) for error in errors}
    assert f"spec.{field.removeprefix('spec.')}".replace("[", ".").replace("]", "") in paths, paths


TRAVERSALS = [
    "../../team-b/secrets/eh",
    "eh/../../team-b/secrets/eh",
    "eh?x=1",
    "eh#x",
    "EH",
    "eh%2F..",
    ".",
    "..",
    "eh..x",
    "a" * 254,
]


@pytest.mark.parametrize("name", TRAVERSALS)
def test_a_secret_name_is_a_kubernetes_object_name(name: str) -> None:
    """`connectionStringSecretRef.name: ../../team-b/secrets/eh` in team-a had the operator read
    /api/v1/namespaces/team-b/secrets/eh."""
    ref = {"name": name, "key": "connectionString"}
    refused(
        document(),
        at("eventHubs.connectionStringSecretRef", ref),
        "spec.eventHubs.connectionStringSecretRef.name",
    )


@pytest.mark.parametrize(
    ("where", "field"),
    [
        (
            "checkpointStore.blob.connectionStringSecretRef",
            "spec.checkpointStore.blob.connectionStringSecretRef",
        ),
        ("consumer.sink.blob.connectionStringSecretRef", "spec.consumer.sink.blob.connectionStringSecretRef"),
        ("eventHubs.proxy", "spec.eventHubs.proxy.credentialsSecretRef"),
    ],
)
def test_every_secret_reference_takes_only_object_names(where: str, field: str) -> None:
    ref = {"name": "../../team-b/secrets/proxy", "key": "credentials"}
    value: Any = (
        {"url": "http://proxy.corp:3128", "credentialsSecretRef": ref} if where.endswith("proxy") else ref
    )
    refused(document(), at(where, value), f"{field}.name")


def test_a_secret_key_is_a_data_key() -> None:
    ref = {"name": "eh", "key": "../connectionString"}
    refused(
        document(),
        at("eventHubs.connectionStringSecretRef", ref),
        "spec.eventHubs.connectionStringSecretRef.key",
    )


def test_a_code_config_map_is_an_object_name() -> None:
    refused(
        document(),
        at("consumer.code", {"configMap": "../../kube-system/configmaps/x"}),
        "spec.consumer.code.configMap",
    )


def test_object_names_as_kubernetes_writes_them_pass() -> None:
    d = document()
    d["spec"]["eventHubs"]["connectionStringSecretRef"] = {"name": "team.eh-1", "key": "connection_string.v2"}
    assert parse_manifest(d).spec.event_hubs.connection_string_secret_ref is not None
    assert not list(jsonschema.Draft4Validator(root_schema()).iter_errors(d))


NAMESPACE_TRICKS = [
    "evil.example#.servicebus.windows.net",
    "evil.example/.servicebus.windows.net",
    "evil.example?.servicebus.windows.net",
    "evil.example\\.servicebus.windows.net",
    "u@evil.example.servicebus.windows.net",
    "evil.example:443#.servicebus.windows.net",
    "sb://myns.servicebus.windows.net",
    "myns.servicebus.windows.net.",
    "MyNs.servicebus.windows.net",
]


@pytest.mark.parametrize("namespace", NAMESPACE_TRICKS)
def test_a_namespace_is_a_host_name(namespace: str) -> None:
    refused(document(KEYLESS), at("eventHubs.namespace", namespace), "spec.eventHubs.namespace")


ACCOUNT_URL_TRICKS = [
    "https://evil.example\\.blob.core.windows.net",
    "https://evil.example#.blob.core.windows.net",
    "https://evil.example?.blob.core.windows.net",
    "https://acct.blob.core.windows.net@evil.example",
    "https://user:password@acct.blob.core.windows.net",
    "https://evil.example%2F.blob.core.windows.net",
    "https://acct.blob.core.windows.net/a/b",
    "https://acct.blob.core.windows.net/?sv=x",
]


@pytest.mark.parametrize("url", ACCOUNT_URL_TRICKS)
def test_an_account_url_is_https_a_host_and_at_most_one_path_segment(url: str) -> None:
    refused(
        document(KEYLESS), at("checkpointStore.blob.accountUrl", url), "spec.checkpointStore.blob.accountUrl"
    )


def test_hosts_as_the_services_and_emulators_name_them_pass() -> None:
    for namespace, url in [
        ("myns.servicebus.windows.net", "https://acct.blob.core.windows.net"),
        ("myns.servicebus.chinacloudapi.cn:5671", "https://acct.blob.core.windows.net/"),
        ("127.0.0.1:5671", "https://127.0.0.1:10000/devstoreaccount1"),
    ]:
        d = document(KEYLESS)
        d["spec"]["eventHubs"]["namespace"] = namespace
        d["spec"]["checkpointStore"]["blob"]["accountUrl"] = url
        consumer = parse_manifest(d)
        assert consumer.spec.event_hubs.namespace == namespace
        assert not list(jsonschema.Draft4Validator(root_schema()).iter_errors(d))
