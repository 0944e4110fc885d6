"""The node tier's cluster: one real node with real pods, started by `tools/node up` and stopped by
`tools/node down` (see tools/kube/README.md).

`tools/node` runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet and
kube-proxy inside a network namespace it creates (`hubshift-<name>`), with the hubshift image built by
`tools/image` imported into containerd. This side of the namespace reaches the API server through a veth
at `https://172.31.N.2:6443`; pods reach it through the `kubernetes` Service's ClusterIP. Nothing else is
reachable from either side.

    reason = node_unavailable()          # None, or why the tier cannot run here (pytest.skip it)
    with running_node_cluster("pytest-123") as node:
        node.apply({"apiVersion": "v1", "kind": "Pod", ...})
        pod = node.wait_for_pod("ns", "name", phases={"Succeeded"})
        print(node.logs("ns", "name"))

Only the standard library: the harness drives `tools/node` and the cached kubectl (`tools/control-plane`),
so it stays importable wherever the tests move.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_SCRIPT = REPO_ROOT / "tools" / "node"
CONTROL_PLANE_SCRIPT = REPO_ROOT / "tools" / "control-plane"
IMAGE_SCRIPT = REPO_ROOT / "tools" / "image"

JSON = dict[str, Any]


class NodeClusterError(RuntimeError):
    """`tools/node` failed, or the cluster did not do what was asked in time."""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def node_unavailable() -> str | None:
    """Why the node tier cannot run on this machine, or None when everything `tools/node up` needs is built
    and installed. Never builds: `tools/node build` (run by tools/run-tests before the tier) does."""
    if not NODE_SCRIPT.exists():
        return f"{NODE_SCRIPT} not found (not running from a source checkout)"
    if os.geteuid() != 0:
        return "needs root (network namespaces, mounts, cgroups, containerd)"
    result = subprocess.run(
        [str(NODE_SCRIPT), "check"], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode == 0:
        return None
    reason = _last_line(result.stderr).removeprefix("node: ") or f"tools/node check: exit {result.returncode}"
    return f"{reason} (exit {result.returncode}; `sudo tools/node build` builds what is missing)"


def image_ref(name: str = "hubshift") -> str:
    """The reference a pod names for an image `tools/image` built (docker.io/library/hubshift:<v>)."""
    result = subprocess.run(
        [str(IMAGE_SCRIPT), "ref", name], capture_output=True, text=True, timeout=30, check=True
    )
    return result.stdout.strip()


def _state(run_dir: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (run_dir / "state").read_text().splitlines():
        key, _, value = line.partition("=")
        values[key] = value
    return values


@dataclass
class NodeCluster:
    """A running one-node cluster (`tools/node up NAME`). `kubeconfig` is the admin's (system:masters)."""

    name: str
    kubeconfig: Path
    run_dir: Path
    kubectl_path: Path
    node_name: str
    node_ip: str
    startup_seconds: float
    state: dict[str, str] = field(default_factory=dict)
    _down: bool = False

    # -- kubectl

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise NodeClusterError(
                f"kubectl {' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def get(self, *args: str) -> JSON:
        answer: JSON = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return answer

    def apply(self, *manifests: Mapping[str, Any], namespace: str | None = None) -> None:
        """`kubectl apply` the objects (a List). Raises NodeClusterError with the server's answer (e.g. a
        Pod Security admission refusal) when it refuses."""
        items = {"apiVersion": "v1", "kind": "List", "items": list(manifests)}
        ns = ["--namespace", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", input=json.dumps(items))

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        """A namespace whose `default` ServiceAccount exists (so pods are admitted at once)."""
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": dict(labels or {})},
            }
        )
        self.wait_for(
            lambda: self.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0,
            timeout=30,
            what=f"the default ServiceAccount of {name}",
        )
        return name

    def delete_namespace(self, name: str) -> None:
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)

    # -- pods

    def wait_for(self, probe: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise NodeClusterError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(interval)

    def wait_for_pod(
        self, namespace: str, name: str, phases: Sequence[str] = ("Succeeded",), timeout: float = 90
    ) -> JSON:
        """The pod once its phase is one of `phases`; NodeClusterError (with its events) if it ends in
        another phase or the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.kubectl("-n", namespace, "get", "pod", name, "-o", "json", check=False)
            if result.returncode == 0:
                pod: JSON = json.loads(result.stdout)
                phase = pod.get("status", {}).get("phase")
                if phase in phases:
                    return pod
                if phase in ("Succeeded", "Failed"):
                    raise NodeClusterError(
                        f"pod {namespace}/{name} ended {phase}:\n{self.describe(namespace, name)}"
                    )
            if time.monotonic() > deadline:
                raise NodeClusterError(
                    f"pod {namespace}/{name} not {'/'.join(phases)} after {timeout} s:\n"
                    f"{self.describe(namespace, name)}"
                )
            time.sleep(0.5)

    def logs(self, namespace: str, name: str, container: str | None = None) -> str:
        args = ["-n", namespace, "logs", name]
        if container:
            args += ["-c", container]
        return self.kubectl(*args).stdout

    def describe(self, namespace: str, name: str) -> str:
        described = self.kubectl("-n", namespace, "describe", "pod", name, check=False)
        logs = self.kubectl("-n", namespace, "logs", name, "--all-containers", check=False)
        return f"{described.stdout[-3000:]}\nlogs:\n{logs.stdout[-2000:]}{logs.stderr[-500:]}"

    # -- the node

    def in_node(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command inside the node's network and mount namespaces (ctr, iptables, ip...)."""
        return subprocess.run(
            [str(NODE_SCRIPT), "exec", self.name, "--", *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def log_tail(self, component: str, lines: int = 40) -> str:
        path = self.run_dir / "logs" / f"{component}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"({path}: {error})"

    def down(self, keep_logs: bool = False, timeout: float = 120) -> None:
        if self._down:
            return
        self._down = True
        args = [str(NODE_SCRIPT), "down", *(["--keep-logs"] if keep_logs else []), self.name]
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise NodeClusterError(f"tools/node down {self.name}: exit {result.returncode}: {result.stderr}")


def start_node_cluster(name: str, *, timeout: float = 300, owner_pid: int | None = None) -> NodeCluster:
    """`tools/node up NAME`: the cluster, once its node is Ready. With `owner_pid` (default: this process)
    the node is taken down when that process exits, even if nobody calls down()."""
    env = dict(os.environ, HUBSHIFT_NODE_OWNER=str(owner_pid if owner_pid is not None else os.getpid()))
    started = time.monotonic()
    result = subprocess.run(
        [str(NODE_SCRIPT), "up", name], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if result.returncode != 0:
        raise NodeClusterError(f"tools/node up {name}: exit {result.returncode}:\n{result.stderr[-4000:]}")
    kubeconfig = Path(_last_line(result.stdout))
    run_dir = kubeconfig.parent
    state = _state(run_dir)
    kubectl = Path(state["cp_bin"]) / "kubectl"
    return NodeCluster(
        name=name,
        kubeconfig=kubeconfig,
        run_dir=run_dir,
        kubectl_path=kubectl,
        node_name=state["node_name"],
        node_ip=state["node_ip"],
        startup_seconds=time.monotonic() - started,
        state=state,
    )


@contextlib.contextmanager
def running_node_cluster(name: str, **options: Any) -> Iterator[NodeCluster]:
    cluster = start_node_cluster(name, **options)
    try:
        yield cluster
    finally:
        cluster.down()
