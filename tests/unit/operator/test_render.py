"""The children of a PartitionedConsumer, rendered as plain dicts without any server."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import codecs

from hubshift.errors import UserError
from hubshift.manifest import CODE_DIR, CodeSpec, PartitionedConsumer, parse_manifest
from hubshift.operator.kubernetes import render

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "homes.yaml"
OWNER = render.Owner(name="homes", namespace="sensors", uid="0b6f3c2e-uid")


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    loaded["metadata"]["namespace"] = "sensors"
    return copy.deepcopy(loaded)


def consumer(mutate: Any = None) -> PartitionedConsumer:
    doc = document()
    if mutate is not None:
        mutate(doc)
    return parse_manifest(doc)


def children(replicas: int = 3, mutate: Any = None) -> dict[str, dict[str, Any]]:
    return {
        f"{child['kind']}/{child['metadata']['name']}": child
        for child in render.render_children(consumer(mutate), OWNER, replicas)
    }


def statefulset(mutate: Any = None) -> dict[str, Any]:
    return children(mutate=mutate)["StatefulSet/homes"]


def container(mutate: Any = None) -> dict[str, Any]:
    result: dict[str, Any] = statefulset(mutate)["spec"]["template"]["spec"]["containers"][0]
    return result


def test_the_six_children_and_their_names() -> None:
    assert sorted(children()) == [
        "ConfigMap/homes-manifest",
        "PodDisruptionBudget/homes",
        "Service/homes",
        "Service/homes-metrics",
        "ServiceAccount/homes",
        "StatefulSet/homes",
    ]
    # The ServiceAccount and the manifest are applied before the pods that use them.
    kinds = [child["kind"] for child in render.render_children(consumer(), OWNER, 1)]
    assert kinds[:2] == ["ServiceAccount", "ConfigMap"] and kinds[-1] == "StatefulSet"


def test_every_child_is_owned_by_the_cr_and_labelled() -> None:
    for key, child in children().items():
        metadata = child["metadata"]
        assert metadata["namespace"] == "sensors", key
        assert metadata["ownerReferences"] == [
            {
                "apiVersion": "hubshift.dev/v1alpha1",
                "kind": "PartitionedConsumer",
                "name": "homes",
                "uid": "0b6f3c2e-uid",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], key
        labels = metadata["labels"]
        for label in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/component",
            "app.kubernetes.io/part-of",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/version",
        ):
            assert labels.get(label), f"{key} lacks {label}"
        assert labels["app.kubernetes.io/instance"] == "homes"
        assert labels[render.CONSUMER_LABEL] == "homes"


def test_rendered_objects_use_only_real_kubernetes_fields() -> None:
    # lightkube's generated models drop unknown fields: a round trip that loses nothing has no typo.
    for key, child in children().items():
        assert codecs.from_dict(child).to_dict() == child, key


def test_statefulset_runs_consumers_with_stable_identities() -> None:
    sts = statefulset()
    spec = sts["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == "homes"
    selector = spec["selector"]["matchLabels"]
    template_labels = spec["template"]["metadata"]["labels"]
    assert selector.items() <= template_labels.items()
    assert "app.kubernetes.io/version" not in template_labels  # an operator upgrade restarts nothing
    assert "app.kubernetes.io/version" not in selector
    assert container()["command"] == [
        "hubshift",
        "consume",
        "-f",
        "/etc/hubshift/manifest.yaml",
        "--id",
        "$(POD_NAME)",
        "--stop-follow-seconds",  # an evicted pod reads on while the operator moves its partitions
        "5",
    ]
    env = {item["name"]: item for item in container()["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PYSPARK_PYTHON"]["value"] == "python3"


def test_the_operator_replaces_the_pods_itself_unless_the_spec_asks_for_a_rolling_update() -> None:
    assert statefulset()["spec"]["updateStrategy"] == {"type": "OnDelete"}  # hubshift/operator/rollout.py

    def rolling(doc: dict[str, Any]) -> None:
        doc["spec"].setdefault("rebalance", {})["rollout"] = {"strategy": "RollingUpdate"}

    assert statefulset(rolling)["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    # How pods are replaced is the operator's business: changing it makes no new revision of the pods.
    before = statefulset()["spec"]["template"]
    assert statefulset(rolling)["spec"]["template"] == before
    assert "rollout" not in render.manifest_text(consumer(rolling))


def test_secret_refs_become_the_env_vars_the_spec_names() -> None:
    env = {item["name"]: item for item in container()["env"]}
    assert env["HUBSHIFT_EVENTHUBS_CONNECTION_STRING"]["valueFrom"] == {
        "secretKeyRef": {"name": "telemetry-eventhubs", "key": "connectionString"}
    }
    assert env["HUBSHIFT_STORAGE_CONNECTION_STRING"]["valueFrom"] == {
        "secretKeyRef": {"name": "telemetry-storage", "key": "connectionString"}
    }

    def custom(doc: dict[str, Any]) -> None:
        doc["spec"]["eventHubs"]["connectionStringEnv"] = "EH_CONN"
        doc["spec"]["consumer"]["sink"] = {
            "type": "blob",
            "blob": {"container": "out", "connectionStringSecretRef": {"name": "sink", "key": "conn"}},
        }

    env = {item["name"]: item for item in container(custom)["env"]}
    assert env["EH_CONN"]["valueFrom"]["secretKeyRef"]["name"] == "telemetry-eventhubs"
    assert "HUBSHIFT_EVENTHUBS_CONNECTION_STRING" not in env
    assert env["HUBSHIFT_SINK_CONNECTION_STRING"]["valueFrom"]["secretKeyRef"] == {
        "name": "sink",
        "key": "conn",
    }

    def no_refs(doc: dict[str, Any]) -> None:
        del doc["spec"]["eventHubs"]["connectionStringSecretRef"]
        del doc["spec"]["checkpointStore"]["blob"]["connectionStringSecretRef"]
        del doc["spec"]["consumer"]["sink"]["blob"]["connectionStringSecretRef"]

    assert not [item for item in container(no_refs)["env"] if "secretKeyRef" in item.get("valueFrom", {})]


def test_probes_resources_and_grace_period() -> None:
    main = container()
    assert main["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert main["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "3Gi"}}

    def slow_handoff(doc: dict[str, Any]) -> None:
        doc["spec"]["rebalance"]["maxHandoffSeconds"] = 42.5
        doc["spec"]["consumer"]["metricsPort"] = 9400

    pod = statefulset(slow_handoff)["spec"]["template"]["spec"]
    # The pod outlives the consumer's own stop budget (a handoff and the batch in flight) by the exit margin.
    assert pod["terminationGracePeriodSeconds"] == 73  # ceil(42.5 + 10 + 20)
    assert pod["containers"][0]["ports"][0]["containerPort"] == 9400
    metrics = children(mutate=slow_handoff)["Service/homes-metrics"]
    assert metrics["spec"]["ports"][0]["port"] == 9400


def test_pods_run_as_non_root_without_a_service_account_token() -> None:
    pod = statefulset()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    security = pod["containers"][0]["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    # A read-only root file system needs every place Spark writes to be a volume.
    mounts = {mount["mountPath"] for mount in pod["containers"][0]["volumeMounts"]}
    assert {"/tmp", render.WORK_DIR, render.MANIFEST_DIR} <= mounts


def test_services_and_disruption_budget() -> None:
    everything = children()
    headless = everything["Service/homes"]["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    assert headless["selector"] == statefulset()["spec"]["selector"]["matchLabels"]
    metrics = everything["Service/homes-metrics"]
    assert metrics["metadata"]["labels"]["app.kubernetes.io/component"] == render.METRICS_COMPONENT
    pdb = everything["PodDisruptionBudget/homes"]["spec"]
    assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": headless["selector"]}}


def test_the_manifest_in_the_config_map_is_what_the_pods_parse() -> None:
    text = children()["ConfigMap/homes-manifest"]["data"]["manifest.yaml"]
    parsed = parse_manifest(yaml.safe_load(text))
    original = consumer()
    assert parsed.spec.event_hubs == original.spec.event_hubs
    assert parsed.spec.consumer == original.spec.consumer
    assert parsed.spec.rebalance == original.spec.rebalance
    assert parsed.metadata.namespace == "sensors"
    assert "scaling" not in yaml.safe_load(text)["spec"]


def test_a_changed_manifest_rolls_the_pods_but_a_scaling_change_does_not() -> None:
    def annotation(mutate: Any = None) -> str:
        value: str = statefulset(mutate)["spec"]["template"]["metadata"]["annotations"][
            render.MANIFEST_HASH_ANNOTATION
        ]
        return value

    base = annotation()
    assert annotation(lambda d: d["spec"]["scaling"].update(maxReplicas=4)) == base
    assert annotation(lambda d: d["spec"]["consumer"].update(spark={"shufflePartitions": 8})) != base


def test_consumer_from_body_reads_what_the_api_server_returns() -> None:
    body = document()
    body["metadata"].update(
        uid="0b6f3c2e-uid",
        resourceVersion="42",
        generation=3,
        annotations={"kopf.zalando.org/last-handled-configuration": "{...}"},
        managedFields=[{"manager": "kubectl"}],
    )
    body["status"] = {"phase": "Ready"}
    parsed = render.consumer_from_body(body)
    assert parsed.metadata.name == "homes"
    assert parsed.metadata.namespace == "sensors"
    assert render.Owner.from_body(body) == OWNER

    body["spec"]["scaling"]["maxReplicas"] = 0
    with pytest.raises(UserError, match=r"PartitionedConsumer sensors/homes: spec\.scaling\.maxReplicas"):
        render.consumer_from_body(body)


def test_rendering_is_pure() -> None:
    assert render.render_children(consumer(), OWNER, 2) == render.render_children(consumer(), OWNER, 2)
    assert render.initial_replicas(consumer()) == 1


def test_a_new_statefulset_starts_at_the_count_spec_replicas_fixes() -> None:
    def replicas(count: int) -> Any:
        def mutate(doc: dict[str, Any]) -> None:
            doc["spec"]["replicas"] = count
            doc["spec"]["scaling"]["minReplicas"] = 1

        return mutate

    assert render.initial_replicas(consumer(replicas(3))) == 3
    assert render.initial_replicas(consumer(replicas(0))) == 0
    assert render.initial_replicas(consumer()) == 1


def folder_sink(path: str, **volume: Any) -> Any:
    def mutate(doc: dict[str, Any]) -> None:
        doc["spec"]["consumer"]["sink"] = {"type": "folder", "folder": {"path": path, "volume": volume}}

    return mutate


def mounts_and_volumes(mutate: Any) -> tuple[dict[str, str], dict[str, Any], list[Any]]:
    sts = statefulset(mutate)
    pod = sts["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    return mounts, volumes, sts["spec"].get("volumeClaimTemplates", [])


def test_a_folder_sink_gets_a_writable_volume_on_the_read_only_root() -> None:
    mounts, volumes, claims = mounts_and_volumes(folder_sink("/data/aggregates"))
    assert mounts["sink"] == "/data/aggregates" and "emptyDir" in volumes["sink"] and claims == []
    mounts, _, _ = mounts_and_volumes(folder_sink("out"))
    assert mounts["sink"] == f"{render.WORK_DIR}/out"  # relative: under the working directory
    _, volumes, _ = mounts_and_volumes(folder_sink("/data/aggregates", claimName="shared-aggregates"))
    assert volumes["sink"]["persistentVolumeClaim"] == {"claimName": "shared-aggregates"}
    mounts, volumes, claims = mounts_and_volumes(
        folder_sink("/data/aggregates", size="2Gi", storageClassName="fast")
    )
    assert "sink" not in volumes and mounts["sink"] == "/data/aggregates"
    assert claims == [
        {
            "metadata": {"name": "sink"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "2Gi"}},
                "storageClassName": "fast",
            },
        }
    ]


def test_a_blob_sink_needs_no_volume() -> None:
    mounts, volumes, claims = mounts_and_volumes(None)  # the example writes to Blob storage
    assert "sink" not in mounts and "sink" not in volumes and claims == []


def test_dead_letters_outside_the_folder_sink_are_refused_in_a_cluster() -> None:
    def outside(doc: dict[str, Any]) -> None:
        folder_sink("/data/aggregates")(doc)
        doc["spec"]["consumer"]["sink"]["deadLetterPath"] = "/data/dead"

    body = document()
    outside(body)
    body["metadata"]["uid"] = "u"
    with pytest.raises(UserError, match="deadLetterPath: in a cluster it must lie under"):
        render.consumer_from_body(body)


# --- token credentials: what Azure Workload Identity on AKS needs, and no Secret ------------------------

KEYLESS = EXAMPLE.parent / "homes-keyless.yaml"


def keyless(mutate: Any = None) -> PartitionedConsumer:
    doc: dict[str, Any] = yaml.safe_load(KEYLESS.read_text())
    doc["metadata"]["namespace"] = "sensors"
    if mutate is not None:
        mutate(doc)
    return parse_manifest(doc)


def keyless_children(mutate: Any = None) -> list[dict[str, Any]]:
    return render.render_children(keyless(mutate), OWNER, 2)


def test_a_keyless_spec_gets_a_service_account_the_workload_identity_label_and_no_secret() -> None:
    rendered = keyless_children()
    account = rendered[0]
    assert (account["kind"], account["metadata"]["name"]) == ("ServiceAccount", "homes")
    assert account["metadata"]["annotations"] == {
        "azure.workload.identity/client-id": "00000000-0000-0000-0000-000000000001"
    }
    assert account["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    pod = next(c for c in rendered if c["kind"] == "StatefulSet")["spec"]["template"]
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert pod["spec"]["serviceAccountName"] == "homes"
    env = pod["spec"]["containers"][0]["env"]
    assert not [e for e in env if "secretKeyRef" in e.get("valueFrom", {})]
    assert "Secret" not in str(rendered) and "connectionString" not in render.manifest_text(keyless())


def test_a_named_service_account_and_a_managed_identity() -> None:
    def managed(doc: dict[str, Any]) -> None:
        doc["spec"]["consumer"]["serviceAccountName"] = "consumers"
        for block in (
            doc["spec"]["eventHubs"],
            doc["spec"]["checkpointStore"]["blob"],
            doc["spec"]["consumer"]["sink"]["blob"],
        ):
            block["credential"] = {"type": "managedIdentity"}

    rendered = keyless_children(managed)
    assert rendered[0]["metadata"]["name"] == "consumers"
    assert "annotations" not in rendered[0]["metadata"]  # no workload identity to name
    pod = next(c for c in rendered if c["kind"] == "StatefulSet")["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "consumers"
    assert "azure.workload.identity/use" not in pod["metadata"]["labels"]


def test_connection_strings_get_a_service_account_of_their_own_too() -> None:
    """Never the namespace's `default` (whatever an administrator bound to it, a mesh's identity...): the
    pods of every pool run as the ServiceAccount the operator creates for it, with no workload identity
    where the spec names no credential."""
    (account,) = [c for c in render.render_children(consumer(), OWNER, 1) if c["kind"] == "ServiceAccount"]
    assert account["metadata"]["name"] == "homes" and "annotations" not in account["metadata"]
    assert account["automountServiceAccountToken"] is False
    pod = statefulset()["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "homes"
    assert "azure.workload.identity/use" not in pod["metadata"]["labels"]


def test_only_its_own_or_an_allowed_service_account() -> None:
    """Security issue 35, item 3: any existing ServiceAccount a resource named was used (the operator's own
    in its namespace, with cluster-wide Secret reads and its Azure identity). Now: the one the operator
    creates for the resource, or one an administrator allowed for the namespace, used as it is."""
    import asyncio

    from hubshift.operator.access import AccessPolicy
    from hubshift.operator.kubernetes import reconcile

    class Kube:
        def __init__(self, keeper: str | None) -> None:
            self.keeper = keeper

        async def service_account_owner(self, namespace: str, name: str) -> str | None:
            assert (namespace, name) == ("sensors", "homes")
            return self.keeper

    def kinds(keeper: str | None, allowed: dict[str, frozenset[str]] | None = None) -> list[str]:
        access = AccessPolicy(service_accounts=allowed or {})
        context: Any = type("Context", (), {"kube": Kube(keeper), "access": access})()
        kept = asyncio.run(reconcile._with_own_account(context, keyless(), OWNER, keyless_children()))
        return [child["kind"] for child in kept]

    assert kinds(None)[0] == "ServiceAccount"  # none yet: the operator creates it
    assert kinds("homes")[0] == "ServiceAccount"  # its own: kept up to date
    for keeper in ("", "other-consumer"):  # someone else's, another resource's
        with pytest.raises(UserError) as refused:
            kinds(keeper)
        assert str(refused.value) == (
            "spec.consumer.serviceAccountName: the ServiceAccount homes (the default: the resource's "
            "name) exists and the operator did not create it for this PartitionedConsumer; its pods run only "
            "as one the operator creates, or one an administrator allowed for namespace sensors (the "
            "chart's operator.allowedServiceAccounts)"
        )
        # Allowed for the namespace (or every one): used, never changed or owned.
        assert "ServiceAccount" not in kinds(keeper, {"sensors": frozenset({"homes"})})
        assert "ServiceAccount" not in kinds(keeper, {"*": frozenset({"homes"})})
        with pytest.raises(UserError):
            kinds(keeper, {"other": frozenset({"homes"}), "sensors": frozenset({"theirs"})})


# --- examples/delta.yaml: a Spark team's job from a ConfigMap into Delta on ADLS, keyless ----------------


def test_the_delta_example_mounts_its_code_and_writes_with_the_pods_identity() -> None:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLE.parent / "delta.yaml").read_text())
    doc["metadata"]["namespace"] = "sensors"
    example = parse_manifest(doc)
    assert example.spec.consumer.sink.delta is not None
    rendered = render.render_children(example, OWNER, 1)
    pod = next(c for c in rendered if c["kind"] == "StatefulSet")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    code = next(v for v in pod["spec"]["volumes"] if v["name"] == render.CODE_VOLUME)
    assert code["configMap"] == {"name": "homes-job"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == render.CODE_VOLUME)
    assert (mount["mountPath"], mount["readOnly"]) == (CODE_DIR, True)
    # One identity for the hub, the checkpoints and the table: the pods' ServiceAccount, no Secret.
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert pod["spec"]["serviceAccountName"] == "homes-delta"
    assert not [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert not [p for p in container["ports"] if p["name"] == "spark-ui"]  # the UI is off unless asked for


# --- your own Spark job: its code from a ConfigMap, the Spark UI, the sinks Spark writes ----------------


def spark_job(sink: dict[str, Any], **consumer_fields: Any) -> Any:
    """The example as a Spark job: the events pipeline into `sink` (type and block), `consumer_fields` set."""

    def mutate(doc: dict[str, Any]) -> None:
        doc["spec"]["consumer"]["pipeline"] = {"type": "events"}
        doc["spec"]["consumer"]["sink"] = sink
        doc["spec"]["consumer"].update(consumer_fields)

    return mutate


DELTA_ON_AZURE = {
    "type": "delta",
    "delta": {
        "path": "abfss://tables@lake.dfs.core.windows.net/homes",
        "connectionStringSecretRef": {"name": "lake", "key": "connectionString"},
    },
}


def test_the_jobs_configmap_is_mounted_where_the_consumer_puts_it_on_its_pythonpath() -> None:
    job = spark_job(DELTA_ON_AZURE, code={"configMap": "homes-job"})
    mounts, volumes, _ = mounts_and_volumes(job)
    assert volumes["code"] == {"name": "code", "configMap": {"name": "homes-job"}}
    # `use_code` puts CodeSpec.folder() on sys.path and PYTHONPATH: the mount must be that folder.
    assert mounts["code"] == CodeSpec(config_map="homes-job").folder() == "/opt/hubshift/code"
    (mount,) = [m for m in container(job)["volumeMounts"] if m["name"] == "code"]
    assert mount["readOnly"] is True
    mounts, volumes, _ = mounts_and_volumes(spark_job(DELTA_ON_AZURE))
    assert "code" not in mounts and "code" not in volumes


def test_a_code_folder_of_this_machine_is_refused_in_a_cluster() -> None:
    body = document()
    spark_job(DELTA_ON_AZURE, code={"path": "/home/me/job"})(body)
    body["metadata"]["uid"] = "u"
    with pytest.raises(UserError) as refused:
        render.consumer_from_body(body)
    assert str(refused.value) == (
        "PartitionedConsumer sensors/homes: spec.consumer.code.path: a folder of this machine; in a cluster "
        "use code.configMap"
    )


def test_the_spark_ui_gets_a_container_port_only_when_enabled() -> None:
    ports = container(spark_job(DELTA_ON_AZURE))["ports"]
    assert [p["name"] for p in ports] == ["metrics"]
    enabled = spark_job(DELTA_ON_AZURE, spark={"ui": {"enabled": True, "port": 4041}})
    ports = container(enabled)["ports"]
    assert {"name": "spark-ui", "containerPort": 4041, "protocol": "TCP"} in ports
    assert {"name": "spark-ui", "containerPort": 4040, "protocol": "TCP"} in container(
        spark_job(DELTA_ON_AZURE, spark={"ui": {"enabled": True}})
    )["ports"]
    # ...and no Service publishes it: `kubectl port-forward pod/NAME 4041` reaches it, nothing else
    for key, child in children(mutate=enabled).items():
        if child["kind"] == "Service":
            assert 4041 not in [p.get("port") for p in child["spec"]["ports"]], key


@pytest.mark.parametrize(
    ("sink", "variable", "secret"),
    [
        (DELTA_ON_AZURE, "HUBSHIFT_SINK_CONNECTION_STRING", {"name": "lake", "key": "connectionString"}),
        (
            {
                "type": "jdbc",
                "jdbc": {"table": "homes", "connectionStringSecretRef": {"name": "db", "key": "url"}},
            },
            "HUBSHIFT_JDBC_URL",
            {"name": "db", "key": "url"},
        ),
        (
            {
                "type": "parquet",
                "parquet": {
                    "path": "abfss://t@lake.dfs.core.windows.net/homes",
                    "connectionStringEnv": "LAKE",
                    "connectionStringSecretRef": {"name": "lake", "key": "conn"},
                },
            },
            "LAKE",
            {"name": "lake", "key": "conn"},
        ),
    ],
)
def test_a_spark_sinks_secret_reaches_the_pod_only_as_a_secret_reference(
    sink: dict[str, Any], variable: str, secret: dict[str, str]
) -> None:
    env = {item["name"]: item for item in container(spark_job(sink))["env"]}
    assert env[variable] == {"name": variable, "valueFrom": {"secretKeyRef": secret}}
    rendered = str(children(mutate=spark_job(sink)))
    for fragment in ("AccountKey", "password", "jdbc:postgresql", "SharedAccessSignature"):
        assert fragment not in rendered


def test_a_delta_table_read_with_workload_identity_gets_the_label_and_service_account() -> None:
    sink = {
        "type": "delta",
        "delta": {
            "path": "abfss://tables@lake.dfs.core.windows.net/homes",
            "credential": {"type": "workloadIdentity", "clientId": "00000000-0000-0000-0000-0000000000d1"},
        },
    }
    rendered = keyless_children(spark_job(sink))
    account = rendered[0]
    assert account["kind"] == "ServiceAccount"
    pod = next(c for c in rendered if c["kind"] == "StatefulSet")["spec"]["template"]
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    env = pod["spec"]["containers"][0]["env"]
    assert not [e for e in env if "secretKeyRef" in e.get("valueFrom", {})]
