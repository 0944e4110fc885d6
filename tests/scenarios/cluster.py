"""What a deployed scenario needs from a cluster, and nothing else: kubectl and helm with the admin's
kubeconfig, the image the chart and the pods run, where the test's servers (the emulator, Azurite) listen so
that both the pods and the test reach them, and the two things only the node side can do: SIGKILL a
container and read the API server's audit log.

    class MyCluster(ScenarioCluster):
        def kill_container(self, node: str, container_id: str) -> None: ...
        def audit_log(self) -> str: ...
        def tag_image(self, tag: str) -> Image: ...

Pods' logs and metrics go through the API server (`kubectl logs`, the pods' proxy), as a user reads them;
the test never needs a route to the pod network. Only the standard library, kubectl and helm, plus the
repository's own server launchers.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from hubshift.emulator.launch import RunningEmulator, start_emulator
from tests.harness.azurite import Azurite, start_azurite

if TYPE_CHECKING:
    from tests.scenarios.monitoring import MonitoringStack

JSON = dict[str, Any]
T = TypeVar("T")

# The run's start (set by tests/conftest.py) and the scenarios' figures per cluster name, in pytest's
# config stash.
SESSION_STARTED = pytest.StashKey[float]()
FIGURES = pytest.StashKey[dict[str, dict[str, Any]]]()


class ScenarioError(AssertionError):
    """A command on the cluster (kubectl, helm, the node side's) failed; the message has its error."""


@dataclass(frozen=True)
class Image:
    """The hubshift image as the cluster has it (no registry is asked: it was imported or `kind load`ed)."""

    repository: str
    tag: str
    pull_policy: str

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def registry_and_name(self) -> tuple[str, str]:
        """(registry, repository) as a chart's global.imageRegistry and image.repository name it: a bare
        name is Docker Hub's library (containerd's own reading of `hubshift`)."""
        registry, _, name = self.repository.rpartition("/")
        return registry or "docker.io/library", name


class ScenarioCluster(ABC):
    """One cluster with the hubshift image on its node(s) and no hubshift installed yet."""

    def __init__(
        self,
        *,
        name: str,
        kubeconfig: Path,
        kubectl: Path | str,
        helm: Path | str,
        image: Image,
        server_host: str,
        server_wrapper: Sequence[str] = (),
        monitoring: MonitoringStack | None = None,
    ) -> None:
        self.name = name  # "node" or "kind": names the figures' file
        self.kubeconfig = kubeconfig
        self.kubectl_binary = str(kubectl)
        self.helm_binary = str(helm)
        self.image = image
        # The emulator and Azurite listen on server_host (under server_wrapper, e.g. `ip netns exec NS`);
        # their connection strings name it, for the pods and for the test alike.
        self.server_host = server_host
        self.server_wrapper = tuple(server_wrapper)
        # The Prometheus Operator's image and manifests, where the cluster has them (scenarios/monitoring.py).
        self.monitoring = monitoring

    # -- the node side: what only the cluster's own machinery can do

    @abstractmethod
    def signal_container(self, node: str, container_id: str, signal: str) -> None:
        """Send `signal` (SIGKILL, SIGSTOP, SIGCONT...) to every process of the container `container_id`
        (without `containerd://`) on `node`, from the node's side, as the kernel or the runtime would."""

    def kill_container(self, node: str, container_id: str) -> None:
        """SIGKILL the container, as an OOM kill or a crash would end it: no SIGTERM, nothing the process
        can do."""
        self.signal_container(node, container_id, "SIGKILL")

    @abstractmethod
    def audit_log(self) -> str:
        """The API server's audit log so far (JSON lines; tools/kube/audit-policy.yaml says what is in it)."""

    @abstractmethod
    def node_exec(self, *command: str) -> str:
        """Run `command` on the (only) node, as root; its stdout (ScenarioError when it fails)."""

    @abstractmethod
    def tag_image(self, tag: str) -> Image:
        """The hubshift image under another tag on every node, as a registry would serve a new release
        (no registry here): the same content, a new reference for `helm upgrade --set image.tag=...`."""

    def node_folder(self, name: str) -> str:
        """A folder on the node anyone may write (a hostPath volume's, for files that outlive pods); its
        path there."""
        path = f"/var/tmp/hubshift-scenarios/{name}"
        self.node_exec("sh", "-c", f"rm -rf {path} && mkdir -p {path} && chmod 0777 {path}")
        return path

    def read_node_files(self, folder: str, pattern: str = "*") -> dict[str, str]:
        """The text of each file under `folder` on the node whose path (relative to it) matches `pattern`."""
        marker = "=== hubshift scenario file: "
        script = (
            f'cd {folder} && for f in {pattern}; do [ -f "$f" ] && echo "{marker}$f" && cat "$f"; done; true'
        )
        files: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in self.node_exec("sh", "-c", script).splitlines():
            if line.startswith(marker):
                current = files.setdefault(line.removeprefix(marker), [])
            elif current is not None:
                current.append(line)
        return {name: "\n".join(lines) + "\n" for name, lines in files.items()}

    # -- kubectl and helm

    def _run(
        self, command: Sequence[str], input: str | None, timeout: float, check: bool
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            list(command), input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            shown = " ".join(command[1:])[:300]
            raise ScenarioError(f"{shown}: exit {result.returncode}: {result.stderr.strip()[-2000:]}")
        return result

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command = [self.kubectl_binary, "--kubeconfig", str(self.kubeconfig), *args]
        return self._run(command, input, timeout, check)

    def helm(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(
            [self.helm_binary, "--kubeconfig", str(self.kubeconfig), *args], None, timeout, check
        )

    def get(self, *args: str) -> JSON:
        answer: JSON = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return answer

    def get_or_none(self, *args: str) -> JSON | None:
        result = self.kubectl("get", *args, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise ScenarioError(f"kubectl get {' '.join(args)}: {result.stderr.strip()}")
        answer: JSON = json.loads(result.stdout)
        return answer

    def apply(self, *documents: JSON) -> None:
        self.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
        )

    def logs(self, namespace: str, pod: str, *, previous: bool = False) -> str:
        args = ["-n", namespace, "logs", pod, "--all-containers"]
        return self.kubectl(*args, *(["--previous"] if previous else []), check=False).stdout

    def proxy_get(self, namespace: str, pod: str, port: int, path: str) -> str:
        """GET a pod's HTTP endpoint through the API server's pod proxy (as `kubectl get --raw` does)."""
        raw = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}"
        return self.kubectl("get", "--raw", raw, timeout=20).stdout

    # -- the servers the pods talk to

    def start_emulator(self, hubs: Sequence[str], consumer_groups: Sequence[str] = ()) -> RunningEmulator:
        return start_emulator(
            hubs, consumer_groups=consumer_groups, host=self.server_host, wrapper=self.server_wrapper
        )

    def start_azurite(self, data_dir: Path, access_log: Path | None = None) -> Azurite:
        return start_azurite(
            data_dir, host=self.server_host, wrapper=self.server_wrapper, access_log=access_log
        )


# --- audit -----------------------------------------------------------------------------------------------


def audit_events(text: str, user: str) -> list[JSON]:
    """The audit events of `user` (e.g. `system:serviceaccount:NS:NAME`), oldest first."""
    events = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a rotation or a write in progress
            continue
        if event.get("user", {}).get("username") == user:
            events.append(event)
    return events


def refused(events: Sequence[JSON]) -> list[str]:
    """The requests among `events` the API server refused (401/403), one line each."""
    lines = []
    for event in events:
        code = (event.get("responseStatus") or {}).get("code")
        if code in (401, 403):
            ref = event.get("objectRef") or {}
            where = "/".join(p for p in (ref.get("namespace"), ref.get("resource"), ref.get("name")) if p)
            lines.append(f"{code} {event.get('verb')} {where or event.get('requestURI')}")
    return lines


# --- pods, as a watch sees them ---------------------------------------------------------------------------


@dataclass
class PodWatch:
    """`kubectl get pods -w --output-watch-events -o json` in one namespace, kept in memory: the last state
    of every pod, including the final status of a deleted one (its container's exit code), which a later
    `get` can no longer show."""

    cluster: ScenarioCluster
    namespace: str
    events: list[JSON] = field(default_factory=list)
    _process: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> PodWatch:
        command = [self.cluster.kubectl_binary, "--kubeconfig", str(self.cluster.kubeconfig)]
        command += ["-n", self.namespace, "get", "pods", "--watch", "--output-watch-events", "-o", "json"]
        self._process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
        )
        self._thread = threading.Thread(target=self._read, name=f"pod-watch-{self.namespace}", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self._process.stdout:
            buffer += line
            while True:
                stripped = buffer.lstrip()
                if not stripped:
                    buffer = ""
                    break
                try:
                    event, end = decoder.raw_decode(stripped)
                except json.JSONDecodeError:
                    buffer = stripped
                    break  # not a whole object yet
                buffer = stripped[end:]
                event["seenAt"] = time.time()  # when this side learned of it (the figures' timelines)
                with self._lock:
                    self.events.append(event)

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()  # a watch has nothing to finish
            self._process.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def history(self, pod: str, uid: str | None = None) -> list[JSON]:
        """Every watch event of `pod` (of that incarnation when `uid` is given), oldest first."""
        with self._lock:
            events = list(self.events)
        return [
            e
            for e in events
            if e["object"]["metadata"]["name"] == pod
            and (uid is None or e["object"]["metadata"]["uid"] == uid)
        ]

    def history_of_label(self, label: str, value: str) -> list[JSON]:
        """Every watch event of the pods labelled `label=value`, oldest first."""
        with self._lock:
            events = list(self.events)
        return [e for e in events if (e["object"]["metadata"].get("labels") or {}).get(label) == value]

    def deleted(self, pod: str, uid: str) -> JSON | None:
        """The pod's last state when the watch saw it deleted, else None."""
        for event in self.history(pod, uid):
            if event["type"] == "DELETED":
                found: JSON = event["object"]
                return found
        return None


def termination(pod: JSON, container: str) -> tuple[int, float] | None:
    """(exit code, seconds from the deletion request to the container's end) of a deleted pod's last state,
    or None when the container had not ended. The request time is the deletion timestamp minus the grace
    period, which is how the API server set it."""
    metadata = pod["metadata"]
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status["name"] != container:
            continue
        ended = (status.get("state") or {}).get("terminated")
        if not ended or "deletionTimestamp" not in metadata:
            return None
        requested = _time(metadata["deletionTimestamp"]) - timedelta(
            seconds=int(metadata.get("deletionGracePeriodSeconds") or 0)
        )
        finished = _time(ended["finishedAt"])
        return int(ended["exitCode"]), (finished - requested).total_seconds()
    return None


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def pod_ready(pod: JSON | None) -> bool:
    if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@contextmanager
def sampling(probe: Callable[[], T], every: float = 1.0) -> Iterator[list[T]]:
    """Call `probe` every `every` seconds on a thread while the block runs; the answers, in order (an
    exception in `probe` ends the sampling and is raised when the block ends)."""
    samples: list[T] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            try:
                samples.append(probe())
            except BaseException as error:  # re-raised below, in the test's thread
                errors.append(error)
                return
            done.wait(every)

    thread = threading.Thread(target=run, name="sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(timeout=30)
    if errors:
        raise errors[0]
