"""`spec.consumer.podTemplate` and `podDisruptionBudget`: what the model refuses (the CRD's CEL says the same,
tests/cluster), how the pods get the rest, the consumer image when the spec names none, and whether the
output outlives a pod (the status' OutputDurable)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from lightkube import codecs

from hubshift import podtemplate as pod
from hubshift.errors import UserError
from hubshift.manifest import PartitionedConsumer, parse_manifest
from hubshift.operator.cli import operator as operator_command
from hubshift.operator.kubernetes import render
from hubshift.operator.status import Condition, PartitionedConsumerStatus

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "homes.yaml"
OWNER = render.Owner(name="homes", namespace="sensors", uid="0b6f3c2e-uid")

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "homes"}, "annotations": {"example.com/scrape": "false"}},
    "nodeSelector": {"agentpool": "spark"},
    "tolerations": [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "priorityClassName": "batch-high",
    "imagePullSecrets": [{"name": "acr"}],
    "env": [
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
        {"name": "WHO", "value": "$(POD_NAME)"},
    ],
    "envFrom": [{"configMapRef": {"name": "settings"}}],
    "volumes": [
        {"name": "sites", "configMap": {"name": "sites"}},
        {"name": "ca", "secret": {"secretName": "corporate-ca"}},
    ],
    "volumeMounts": [
        {"name": "sites", "mountPath": "/config", "readOnly": True},
        {"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True},
    ],
    "initContainers": [{"name": "wait", "image": "busybox:1.36", "command": ["true"]}],
    "sidecars": [
        {
            "name": "shipper",
            "image": "fluent-bit:3",
            "ports": [{"name": "http", "containerPort": 2020}],
            "securityContext": {"runAsUser": 2000, "readOnlyRootFilesystem": True},
            "volumeMounts": [{"name": "work", "mountPath": "/work", "readOnly": True}],
        }
    ],
}


def document(template: dict[str, Any] | None = None, **consumer: Any) -> dict[str, Any]:
    loaded: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    loaded["metadata"]["namespace"] = "sensors"
    if template is not None:
        loaded["spec"]["consumer"]["podTemplate"] = copy.deepcopy(template)
    loaded["spec"]["consumer"].update(consumer)
    return loaded


def consumer(template: dict[str, Any] | None = None, **fields: Any) -> PartitionedConsumer:
    return parse_manifest(document(template, **fields))


def pod_template(resource: PartitionedConsumer, image: str = render.DEFAULT_IMAGE) -> dict[str, Any]:
    return render.render_pod_template(resource, OWNER, image)


def test_a_pod_template_reaches_the_pods_under_hubshifts_own() -> None:
    rendered = pod_template(consumer(TEMPLATE))
    metadata, spec = rendered["metadata"], rendered["spec"]
    assert metadata["labels"]["team"] == "homes"
    assert metadata["labels"].items() >= render.pod_labels("homes").items()
    assert metadata["annotations"]["example.com/scrape"] == "false"
    assert render.MANIFEST_HASH_ANNOTATION in metadata["annotations"]
    assert spec["nodeSelector"] == {"agentpool": "spark"}
    assert spec["tolerations"] == TEMPLATE["tolerations"]
    assert spec["affinity"] == TEMPLATE["affinity"]
    assert spec["priorityClassName"] == "batch-high"
    assert spec["imagePullSecrets"] == [{"name": "acr"}]
    assert spec["securityContext"]["runAsNonRoot"] is True  # the pod's own is never the template's

    own, shipper = spec["containers"]
    names = [variable["name"] for variable in own["env"]]
    # hubshift's variables first (the template's may refer to them), the template's last.
    assert names[-2:] == ["API_TOKEN", "WHO"] and names.index("POD_NAME") < names.index("WHO")
    assert own["envFrom"] == [{"configMapRef": {"name": "settings"}}]
    mounts = {mount["mountPath"]: mount["name"] for mount in own["volumeMounts"]}
    assert mounts["/config"] == "sites" and mounts["/etc/hubshift"] == "manifest"
    volumes = [volume["name"] for volume in spec["volumes"]]
    assert volumes[:3] == ["manifest", "work", "tmp"] and volumes[-2:] == ["sites", "ca"]
    assert shipper["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsUser": 2000,
        "readOnlyRootFilesystem": True,
    }
    assert shipper["ports"] == [{"name": "http", "containerPort": 2020}]
    assert shipper["volumeMounts"] == [{"name": "work", "mountPath": "/work", "readOnly": True}]
    (init,) = spec["initContainers"]
    assert init["command"] == ["true"] and init["securityContext"]["allowPrivilegeEscalation"] is False
    # Every field is a real Kubernetes field of a StatefulSet.
    statefulset = render.render_statefulset(consumer(TEMPLATE), OWNER, 2)
    assert codecs.from_dict(statefulset).to_dict() == statefulset


def test_hubshifts_spread_stays_unless_replaced() -> None:
    default = pod_template(consumer())["spec"]["topologySpreadConstraints"]
    assert default == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": render.selector_labels("homes")},
        }
    ]
    zones = [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
    ]
    replaced = pod_template(consumer({"topologySpreadConstraints": zones}))["spec"]
    assert replaced["topologySpreadConstraints"] == zones
    assert (
        "topologySpreadConstraints" not in pod_template(consumer({"topologySpreadConstraints": []}))["spec"]
    )
    # Nothing else appears for an empty template.
    assert not {"nodeSelector", "tolerations", "affinity", "initContainers", "imagePullSecrets"} & set(
        pod_template(consumer())["spec"]
    )


def test_the_consumer_image_is_the_operators_unless_the_spec_pins_one() -> None:
    assert "image" not in document()["spec"]["consumer"]
    assert pod_template(consumer(), "ghcr.io/acme/hubshift:0.2.0")["spec"]["containers"][0]["image"] == (
        "ghcr.io/acme/hubshift:0.2.0"
    )
    assert pod_template(consumer())["spec"]["containers"][0]["image"] == render.DEFAULT_IMAGE
    pinned = consumer(image="hubshift:0.1.0")
    assert pod_template(pinned, "ghcr.io/acme/hubshift:0.2.0")["spec"]["containers"][0]["image"] == (
        "hubshift:0.1.0"
    )
    children = render.render_children(consumer(), OWNER, 1, "registry.example/hubshift@sha256:" + "a" * 64)
    statefulset = next(child for child in children if child["kind"] == "StatefulSet")
    assert statefulset["spec"]["template"]["spec"]["containers"][0]["image"].endswith("a" * 64)


def test_the_operator_refuses_an_image_with_spaces_in_one_line() -> None:
    result = CliRunner().invoke(operator_command, ["--consumer-image", "hubshift 0.1.0"])
    assert isinstance(result.exception, UserError)
    assert "--consumer-image" in str(result.exception)


def test_the_disruption_budget() -> None:
    def budget(resource: PartitionedConsumer) -> Any:
        return render.render_pod_disruption_budget(resource, OWNER)["spec"]["maxUnavailable"]

    assert budget(consumer()) == 1
    assert budget(consumer(podDisruptionBudget={"maxUnavailable": 4})) == 4
    assert budget(consumer(podDisruptionBudget={"maxUnavailable": 0})) == 0


def test_the_pods_manifest_leaves_the_template_out() -> None:
    text = render.manifest_text(consumer(TEMPLATE, podDisruptionBudget={"maxUnavailable": 2}))
    spec = yaml.safe_load(text)["spec"]["consumer"]
    assert "podTemplate" not in spec and "podDisruptionBudget" not in spec
    assert "API_TOKEN" not in text


def _with(**template: Any) -> dict[str, Any]:
    return template


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        (_with(metadata={"labels": {"app.kubernetes.io/instance": "other"}}), pod.OWN_LABEL_MESSAGE),
        (_with(metadata={"labels": {"team": "a b"}}), "podTemplate.metadata.labels.team"),
        (_with(metadata={"annotations": {"hubshift.dev/manifest-sha256": "0"}}), pod.OWN_ANNOTATION_MESSAGE),
        (_with(env=[{"name": "POD_NAME", "value": "x"}]), pod.OWN_ENV_MESSAGE),
        (_with(env=[{"name": "1X", "value": "x"}]), "podTemplate.env.0.name"),
        (_with(volumes=[{"name": "tmp", "emptyDir": {}}]), pod.OWN_VOLUME_MESSAGE),
        (_with(volumes=[{"name": "host", "hostPath": {"path": "/"}}]), "volumes.0.hostPath: unknown field"),
        (_with(volumes=[{"name": "none"}]), pod.ONE_SOURCE_MESSAGE),
        (
            _with(volumes=[{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}]),
            pod.ONE_SOURCE_MESSAGE,
        ),
        (_with(volumeMounts=[{"name": "x", "mountPath": "/var/lib/hubshift"}]), pod.OWN_MOUNT_MESSAGE),
        (_with(volumeMounts=[{"name": "x", "mountPath": "/var"}]), pod.OWN_MOUNT_MESSAGE),
        (_with(volumeMounts=[{"name": "x", "mountPath": "/opt/hubshift/code/lib"}]), pod.OWN_MOUNT_MESSAGE),
        (_with(volumeMounts=[{"name": "x", "mountPath": "/data/../etc"}]), "volumeMounts.0.mountPath"),
        (_with(sidecars=[{"name": "consumer", "image": "busybox"}]), pod.OWN_CONTAINER_MESSAGE),
        (_with(sidecars=[{"name": "s"}]), "sidecars.0.image: required field is missing"),
        (
            _with(sidecars=[{"name": "s", "image": "b", "securityContext": {"privileged": True}}]),
            "securityContext.privileged: unknown field",
        ),
        (
            _with(initContainers=[{"name": "i", "image": "b", "securityContext": {"runAsUser": 0}}]),
            "runAsUser",
        ),
        (
            _with(sidecars=[{"name": "s", "image": "b", "ports": [{"name": "metrics", "containerPort": 1}]}]),
            "'metrics'",
        ),
        (_with(sidecars=[{"name": "s", "image": "b", "ports": [{"containerPort": 9090}]}]), pod.PORT_TAKEN),
        (_with(tolerations=[{"operator": "Maybe"}]), "tolerations.0.operator"),
    ],
)
def test_what_would_break_the_pod_is_refused_naming_the_field(
    template: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(UserError) as refused:
        consumer(template)
    assert fragment in str(refused.value)
    assert "spec.consumer.podTemplate" in str(refused.value) or fragment == pod.PORT_TAKEN


TOKEN = {"serviceAccountToken": {"path": "token", "audience": "api://AzureADTokenExchange"}}


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        (
            _with(volumes=[{"name": "token", "projected": {"sources": [TOKEN]}}]),
            "spec.consumer.podTemplate.volumes.0.projected.sources.0: " + pod.NO_TOKEN_MESSAGE,
        ),
        (
            _with(volumes=[{"name": "mixed", "projected": {"sources": [{"secret": {"name": "s"}}, TOKEN]}}]),
            "projected.sources.1: " + pod.NO_TOKEN_MESSAGE,
        ),
        (
            _with(volumes=[{"name": "cert", "projected": {"sources": [{"podCertificate": {}}]}}]),
            "projected.sources.0.podCertificate: unknown field",
        ),
        (
            _with(sidecars=[{"name": "s", "image": "b", "ports": [{"containerPort": 80, "hostPort": 80}]}]),
            "spec.consumer.podTemplate.sidecars.0.ports.0: " + pod.NO_HOST_PORT_MESSAGE,
        ),
        (
            _with(
                initContainers=[
                    {"name": "i", "image": "b", "ports": [{"containerPort": 80, "hostIP": "0.0.0.0"}]}
                ]
            ),
            "spec.consumer.podTemplate.initContainers.0.ports.0: " + pod.NO_HOST_IP_MESSAGE,
        ),
    ],
)
def test_a_pods_credentials_and_the_nodes_ports_are_refused(template: dict[str, Any], fragment: str) -> None:
    """Security issue 35, item 3: a projected ServiceAccount token (the pods' identity towards Kubernetes and
    Azure) and a node's port or address (`hostPort`, forbidden even by the baseline Pod Security Standard)
    passed as a Kubernetes object kept as written."""
    with pytest.raises(UserError) as refused:
        consumer(template)
    assert fragment in str(refused.value)


def test_projected_volumes_of_secrets_config_maps_and_the_pods_fields_pass() -> None:
    sources = [
        {"secret": {"name": "ca"}},
        {"configMap": {"name": "sites"}},
        {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {"clusterTrustBundle": {"name": "corp-ca", "path": "ca.pem"}},
    ]
    resource = consumer(
        {"volumes": [{"name": "bundle", "projected": {"sources": sources, "defaultMode": 288}}]}
    )
    (volume,) = [v for v in pod_template(resource)["spec"]["volumes"] if v["name"] == "bundle"]
    assert volume == {"name": "bundle", "projected": {"sources": sources, "defaultMode": 288}}
    ports = [{"name": "http", "containerPort": 2020, "protocol": "UDP"}]
    resource = consumer({"sidecars": [{"name": "s", "image": "b", "ports": ports}]})
    assert pod_template(resource)["spec"]["containers"][1]["ports"] == ports


def test_mounts_beside_hubshifts_own_are_fine() -> None:
    for path in ("/config", "/var/lib/hubshift/extra", "/tmp/x", "/etc/ssl/certs", "/opt/hubshift/other"):
        assert not pod.takes_own_path(path), path
    consumer({"volumeMounts": [{"name": "x", "mountPath": "/var/lib/hubshift/extra"}]})
    # A sidecar may use the metrics port when the consumer's is another.
    sidecar = [{"name": "s", "image": "b", "ports": [{"containerPort": 9090}]}]
    consumer({"sidecars": sidecar}, metricsPort=9400)


def test_a_template_variable_may_not_replace_a_connection_string_from_a_secret() -> None:
    shadowing = consumer(
        {"env": [{"name": "HUBSHIFT_STORAGE_CONNECTION_STRING", "value": "UseDevelopmentStorage"}]}
    )
    with pytest.raises(UserError) as refused:
        render.check_for_cluster(shadowing)
    assert "spec.consumer.podTemplate.env[0].name" in str(refused.value)
    assert "UseDevelopmentStorage" not in str(refused.value)
    # A variable the spec names without a Secret is the template's to fill (e.g. from a Secret of its own).
    own = document({"env": [{"name": "EH", "valueFrom": {"secretKeyRef": {"name": "eh", "key": "c"}}}]})
    del own["spec"]["eventHubs"]["connectionStringSecretRef"]
    own["spec"]["eventHubs"]["connectionStringEnv"] = "EH"
    render.check_for_cluster(parse_manifest(own))


def test_the_output_says_whether_it_outlives_a_pod() -> None:
    def output(sink: dict[str, Any]) -> Condition:
        return render.output_condition(consumer(sink=sink))

    scratch = output({"type": "folder", "folder": {"path": "/data/out"}})
    assert (scratch.type, scratch.status, scratch.reason) == ("OutputDurable", "False", "EmptyDir")
    assert "/data/out" in scratch.message and "claimName or size" in scratch.message
    assert output({"type": "folder", "folder": {"path": "out", "volume": {"size": "5Gi"}}}).status == "True"
    assert (
        output({"type": "folder", "folder": {"volume": {"claimName": "shared"}}}).reason == "PersistentVolume"
    )
    blob = render.output_condition(consumer())
    assert (blob.status, blob.reason) == ("True", "StorageService") and "Azure Storage" in blob.message
    delta = consumer(
        pipeline={"type": "function", "function": "job:run"}, sink={"type": "delta", "delta": {"path": "/d"}}
    )
    assert render.output_condition(delta).status == "Unknown"


def test_a_refused_spec_is_a_condition_while_the_pool_runs_on() -> None:
    applied = render.applied_condition(None)
    assert (applied.type, applied.status, applied.reason) == ("ChildrenApplied", "True", "Applied")
    refused = render.applied_condition("the API server refused the StatefulSet homes: affinity is bad")
    assert (refused.status, refused.reason) == ("False", "Refused")
    assert refused.message.startswith("the API server refused the StatefulSet homes")


def test_the_runtimes_conditions_join_the_status() -> None:
    from hubshift.operator.autoscaler import Pause
    from hubshift.operator.rebalance import RebalanceState
    from hubshift.operator.status import build_status

    extra = Condition(type="OutputDurable", status="False", reason="EmptyDir", message="gone with the pod")
    status: PartitionedConsumerStatus = build_status(
        state=RebalanceState(),
        decision=None,
        pause=Pause(),
        owners={},
        instances=[],
        current_replicas=1,
        partition_count=4,
        total_backlog=0,
        previous_conditions=[],
        observed_generation=3,
        now=1_700_000_000.0,
        last_scale_time=None,
        probe_error=None,
        more_conditions=[extra],
    )
    (output,) = [c for c in status.conditions if c.type == "OutputDurable"]
    assert output.status == "False" and output.observed_generation == 3
    assert output.last_transition_time is not None
