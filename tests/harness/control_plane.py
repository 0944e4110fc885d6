"""A real Kubernetes control plane on this machine, without Docker: the cluster test tier's platform.

etcd, kube-apiserver (RBAC on), kube-controller-manager (all default controllers: StatefulSets create
Pods, garbage collection follows owner references, namespaces finish deleting), kube-scheduler and KWOK
(fake nodes: scheduled Pods are reported Running and Ready, deleted Pods go away). The binaries are built
from Go modules by `tools/control-plane` into a cache outside the repository; every server listens on
127.0.0.1 on a free port, with certificates made here (`cryptography`) in a fresh work folder.

    with running_control_plane(tmp_path) as plane:
        api = kubernetes.config.new_client_from_config(str(plane.kubeconfig))
        ...

Pods as local processes
-----------------------
No kubelet runs, so no container ever starts: KWOK only *reports* scheduled Pods Running. A test that
needs the pods' programs (e.g. `hubshift consume`, one per consumer pod) runs them on this machine with
`PodProcessRunner`: it watches the Pods that match a label selector and keeps exactly one local process
per Running pod, started from a command template with the pod's name as its identity (`{pod}`,
`{namespace}`, `{ordinal}`; plus the downward-API-like variables POD_NAME, POD_NAMESPACE, POD_UID). When
the pod goes (scale-in, deletion, a new pod with the same name), its process gets SIGTERM and, after the
pod's `terminationGracePeriodSeconds` (capped), SIGKILL, like a kubelet would; a process that exits while
its pod still runs is restarted after a short back-off (restartPolicy Always). Readiness is not mirrored:
KWOK marks the pod Ready at once. Pod IPs and Service IPs are fake, so processes talk to 127.0.0.1 only.

    with PodProcessRunner(plane, "ns", "app=consumer",
                          ["hubshift", "consume", "--identity", "{pod}", ...]) as runner:
        runner.wait_for_pods({"consumer-0", "consumer-1"}, timeout=60)
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.client import HTTPSConnection
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.harness.ports import free_port, wait_for_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "control-plane"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/24"
# KWOK manages only the nodes carrying this annotation (so a test may add other, unmanaged nodes).
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

JSON = dict[str, Any]


class ControlPlaneUnavailable(RuntimeError):
    """The binaries are not built and cannot be built here (no Go, no module proxy, not cached)."""


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


# --------------------------------------------------------------------------- binaries


def control_plane_bin(build: bool = False, timeout: float = 3600) -> Path:
    """The folder holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (and kubectl,
    helm). `$HUBSHIFT_KUBE_BIN` overrides; otherwise `tools/control-plane` finds them in the cache, and with
    `build=True` builds them first (tens of minutes when cold). Raises ControlPlaneUnavailable saying why."""
    override = os.environ.get("HUBSHIFT_KUBE_BIN")
    if override:
        folder = Path(override)
    else:
        if not BUILD_SCRIPT.exists():
            raise ControlPlaneUnavailable(f"{BUILD_SCRIPT} not found (not running from a source checkout)")
        args = [str(BUILD_SCRIPT)] if build else [str(BUILD_SCRIPT), "--cached"]
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            reason = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.returncode}"]
            raise ControlPlaneUnavailable(reason[0])
        folder = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in BINARIES if not (folder / name).is_file()]
    if missing:
        raise ControlPlaneUnavailable(f"{folder} lacks {', '.join(missing)}")
    return folder


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class CertificateAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common_name: str) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def issue(
        self,
        common_name: str,
        organizations: Sequence[str] = (),
        server_names: Sequence[str] = (),
        server_ips: Sequence[str] = (),
    ) -> tuple[bytes, bytes]:
        """A leaf certificate (PEM) and its key (PEM): a server certificate if names are given, else a
        client certificate whose CN is the user and whose O entries are the groups (Kubernetes' rule)."""
        import ipaddress

        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        server = bool(server_names or server_ips)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def write_kubeconfig(
    path: Path,
    server: str,
    ca_pem: bytes,
    *,
    user: str,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    """A one-context kubeconfig with everything embedded (JSON is valid YAML)."""
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    credentials: JSON = {}
    if cert_pem is not None and key_pem is not None:
        credentials = {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}
    if token is not None:
        credentials["token"] = token
    context: JSON = {"cluster": "hubshift-test", "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "hubshift-test",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------- processes


_LIBC: ctypes.CDLL | None = None


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the process that started it dies, so a killed test
    run leaves no servers behind (Linux prctl PR_SET_PDEATHSIG). libc is loaded in the parent beforehand:
    loading a library between fork and exec can deadlock."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)


def _load_libc() -> None:
    global _LIBC
    if _LIBC is None:
        with contextlib.suppress(OSError):
            _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)


def _terminate(processes: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM every live process by PID, wait up to `timeout` for all, then SIGKILL the rest."""
    live = [p for p in processes if p.poll() is None]
    for process in live:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in live:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(timeout=10)


# --------------------------------------------------------------------------- the control plane


# What service accounts ask the API server (an operator under a chart's role), one JSON line per request:
# tests compare what was asked and refused with what the role grants.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
"""


@dataclass(frozen=True)
class AuditedRequest:
    user: str
    verb: str
    group: str
    resource: str  # with its subresource: "statefulsets/scale"
    code: int
    namespace: str = ""
    name: str = ""  # the object's, when the request names one (a get, a patch)


@dataclass
class ControlPlane:
    """A running control plane. `kubeconfig` is an admin (system:masters) kubeconfig for `server`."""

    workdir: Path
    bin_dir: Path
    server: str
    kubeconfig: Path
    ca_file: Path
    etcd_url: str
    nodes: list[str]
    startup_seconds: float = 0.0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _ca: CertificateAuthority | None = field(default=None, repr=False)
    _admin_ssl: ssl.SSLContext | None = field(default=None, repr=False)
    _remove_workdir: bool = field(default=False, repr=False)

    def audited(self) -> list[AuditedRequest]:
        """Every resource request a service account made so far (the audit log)."""
        found = []
        path = self.workdir / "audit.log"
        for line in path.read_text().splitlines() if path.exists() else []:
            event = json.loads(line)
            target = event.get("objectRef") or {}
            if not target.get("resource"):
                continue  # discovery and other non-resource requests
            resource = target["resource"] + (f"/{target['subresource']}" if target.get("subresource") else "")
            code = int((event.get("responseStatus") or {}).get("code") or 0)
            found.append(
                AuditedRequest(
                    event["user"]["username"],
                    event["verb"],
                    target.get("apiGroup", ""),
                    resource,
                    code,
                    target.get("namespace", ""),
                    target.get("name", ""),
                )
            )
        return found

    # -- lifecycle

    def stop(self, timeout: float = 15) -> None:
        """Terminate the children by PID (clients first, etcd last), wait, and remove the etcd data (and
        the whole work folder if start_control_plane created it). Idempotent."""
        order = ["kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
        for name in order:
            process = self.processes.get(name)
            if process is not None:
                _terminate([process], timeout)
        shutil.rmtree(self.workdir / "etcd-data", ignore_errors=True)
        if self._remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def check_alive(self) -> None:
        """Raise if a component died (with the tail of its log)."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- for processes under test

    def environ(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """os.environ with KUBECONFIG set (admin unless `kubeconfig` is given), e.g. for `hubshift operator`
        run as a subprocess; kopf and the kubernetes client both read it."""
        return {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig)}

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl built with the control plane (same version), e.g. kubectl("apply", "-f", "crds/").
        Raises CalledProcessError with kubectl's message on failure."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )

    # -- a minimal admin REST client (stdlib only; tests may prefer the `kubernetes` package)

    def request(self, method: str, path: str, body: JSON | None = None, timeout: float = 30) -> JSON:
        """One admin API call; the decoded JSON answer. Raises ApiError on HTTP >= 400."""
        assert self._admin_ssl is not None
        parsed = urllib.parse.urlsplit(self.server)
        connection = HTTPSConnection(
            parsed.hostname or "127.0.0.1", parsed.port, context=self._admin_ssl, timeout=timeout
        )
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if data is not None:
                content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
                headers["Content-Type"] = content_type
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            connection.close()
        if response.status >= 400:
            raise ApiError(method, path, response.status, text)
        try:
            answer: JSON = json.loads(text) if text else {}
        except json.JSONDecodeError:
            answer = {"raw": text}
        return answer

    def readyz(self) -> bool:
        try:
            return self.request("GET", "/readyz", timeout=5).get("raw") == "ok"
        except (OSError, ApiError):
            return False

    # -- nodes

    def add_node(self, name: str, cpu: str = "32", memory: str = "256Gi", pods: str = "110") -> None:
        """A fake node that KWOK manages (marks Ready, keeps its lease, runs its pods). No taint, so
        ordinary pods schedule onto it."""
        key, value = KWOK_NODE_ANNOTATION
        capacity = {"cpu": cpu, "memory": memory, "pods": pods}
        self.request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0", key: value},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
                "status": {"allocatable": capacity, "capacity": capacity},
            },
        )
        if name not in self.nodes:
            self.nodes.append(name)

    def wait_nodes_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ready = set()
            for node in self.request("GET", "/api/v1/nodes").get("items", []):
                conditions = (node.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                    ready.add(node["metadata"]["name"])
            if set(self.nodes) <= ready:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not Ready after {timeout} s: {sorted(set(self.nodes) - ready)}")
            self.check_alive()
            time.sleep(0.2)

    # -- restricted identities (RBAC is on: only the admin kubeconfig bypasses it)

    def kubeconfig_for_user(
        self, user: str, groups: Sequence[str] = (), namespace: str | None = None
    ) -> Path:
        """A kubeconfig for a client-certificate user (CN=user, O=groups): no rights until a
        (Cluster)RoleBinding with `kind: User` names it."""
        assert self._ca is not None
        cert, key = self._ca.issue(user, organizations=groups)
        folder = self.workdir / "users"
        folder.mkdir(exist_ok=True)
        return write_kubeconfig(
            folder / f"{_safe(user)}.kubeconfig",
            self.server,
            self._ca.cert_pem,
            user=user,
            cert_pem=cert,
            key_pem=key,
            namespace=namespace,
        )

    def kubeconfig_for_service_account(
        self, namespace: str, name: str, *, create: bool = True, expiration_seconds: int = 7200
    ) -> Path:
        """A kubeconfig with a TokenRequest token for ServiceAccount namespace/name (created if missing
        and `create`), as a pod of that ServiceAccount would get: system:serviceaccount:<ns>:<name>."""
        assert self._ca is not None
        base = f"/api/v1/namespaces/{namespace}/serviceaccounts"
        if create:
            try:
                self.request("POST", base, {"metadata": {"name": name}})
            except ApiError as error:
                if error.status != 409:
                    raise
        answer = self.request(
            "POST",
            f"{base}/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        folder = self.workdir / "users"
        folder.mkdir(exist_ok=True)
        return write_kubeconfig(
            folder / f"sa-{namespace}-{name}.kubeconfig",
            self.server,
            self._ca.cert_pem,
            user=f"system:serviceaccount:{namespace}:{name}",
            token=answer["status"]["token"],
            namespace=namespace,
        )


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def start_control_plane(
    workdir: Path | None = None,
    *,
    bin_dir: Path | None = None,
    nodes: int = 1,
    timeout: float = 120,
) -> ControlPlane:
    """Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK with `nodes` fake
    nodes, all on 127.0.0.1, and return once /readyz is ok and the nodes are Ready. Logs go to
    <workdir>/logs/<component>.log. On failure everything started is stopped again."""
    started = time.monotonic()
    binaries = bin_dir or control_plane_bin()
    _load_libc()
    remove = workdir is None
    work = Path(tempfile.mkdtemp(prefix="hubshift-kube-")) if workdir is None else workdir
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    pki = work / "pki"
    pki.mkdir(exist_ok=True)

    ca = CertificateAuthority.create("hubshift-test-ca")
    ca_file = _write(pki / "ca.crt", ca.cert_pem)
    serving_cert, serving_key = ca.issue(
        "kube-apiserver",
        server_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        server_ips=["127.0.0.1", "10.96.0.1"],
    )
    _write(pki / "apiserver.crt", serving_cert)
    _write(pki / "apiserver.key", serving_key, private=True)
    admin_cert, admin_key = ca.issue("hubshift-admin", organizations=["system:masters"])
    # The aggregation layer's front proxy: without its CA, components using delegated authentication
    # (controller-manager, scheduler) keep logging that the requestheader CA bundle is missing.
    front_proxy = CertificateAuthority.create("hubshift-test-front-proxy-ca")
    _write(pki / "front-proxy-ca.crt", front_proxy.cert_pem)
    proxy_cert, proxy_key = front_proxy.issue("front-proxy-client")
    _write(pki / "front-proxy-client.crt", proxy_cert)
    _write(pki / "front-proxy-client.key", proxy_key, private=True)
    admin_cert_file = _write(pki / "admin.crt", admin_cert)
    admin_key_file = _write(pki / "admin.key", admin_key, private=True)
    # The service-account signer: kube-apiserver reads the public key file as PEM "PUBLIC KEY" (a PKCS#8
    # private key there is refused), the signing key and kube-controller-manager's as "EC PRIVATE KEY".
    signer = ec.generate_private_key(ec.SECP256R1())
    sa_key = _write(
        pki / "sa.key",
        signer.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ),
        private=True,
    )
    sa_pub = _write(
        pki / "sa.pub",
        signer.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )

    etcd_port, etcd_peer_port, api_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    kubeconfig = write_kubeconfig(
        work / "admin.kubeconfig",
        server,
        ca.cert_pem,
        user="hubshift-admin",
        cert_pem=admin_cert,
        key_pem=admin_key,
    )
    admin_ssl = ssl.create_default_context(cafile=str(ca_file))
    admin_ssl.load_cert_chain(str(admin_cert_file), str(admin_key_file))

    plane = ControlPlane(
        workdir=work,
        bin_dir=binaries,
        server=server,
        kubeconfig=kubeconfig,
        ca_file=ca_file,
        etcd_url=etcd_url,
        nodes=[],
        _ca=ca,
        _admin_ssl=admin_ssl,
        _remove_workdir=remove,
    )

    def spawn(name: str, args: Sequence[str]) -> None:
        log = (logs / f"{name}.log").open("ab")
        plane.processes[name] = subprocess.Popen(
            [str(binaries / name), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work,
            preexec_fn=_die_with_parent,
        )
        log.close()

    kube_common = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--v=1",
    ]
    try:
        spawn(
            "etcd",
            [
                "--name=hubshift",
                f"--data-dir={work / 'etcd-data'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-cluster=hubshift=http://127.0.0.1:{etcd_peer_port}",
                "--unsafe-no-fsync",
                "--watch-progress-notify-interval=5s",
                "--log-level=warn",
            ],
        )
        if not wait_for_port(etcd_port, timeout=30):
            plane.check_alive()
            raise TimeoutError("etcd did not listen within 30 s")
        spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={ca_file}",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--authorization-mode=RBAC",
                f"--audit-policy-file={_write(work / 'audit-policy.yaml', AUDIT_POLICY.encode())}",
                f"--audit-log-path={work / 'audit.log'}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
        )
        deadline = time.monotonic() + timeout
        while not plane.readyz():
            plane.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"kube-apiserver not ready after {timeout} s:\n{plane.log_tail('kube-apiserver')}"
                )
            time.sleep(0.2)
        spawn(
            "kube-controller-manager",
            [
                *kube_common,
                f"--secure-port={free_port()}",
                f"--cert-dir={work / 'kcm'}",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={ca_file}",
                "--controllers=*",
                # Pods of a StatefulSet that lost its node are not evicted in the time of a test anyway.
                "--node-monitor-grace-period=60s",
            ],
        )
        spawn(
            "kube-scheduler",
            [*kube_common, f"--secure-port={free_port()}"],
        )
        key, value = KWOK_NODE_ANNOTATION
        spawn(
            "kwok",
            [
                f"--kubeconfig={kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                "--manage-nodes-with-label-selector=",
                "--manage-single-node=",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.244.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{free_port()}",
            ],
        )
        for index in range(nodes):
            plane.add_node(f"kwok-node-{index}")
        plane.wait_nodes_ready(timeout=max(10.0, deadline - time.monotonic()))
        plane.check_alive()
    except BaseException:
        plane.stop()
        raise
    plane.startup_seconds = time.monotonic() - started
    return plane


@contextlib.contextmanager
def running_control_plane(workdir: Path | None = None, **options: Any) -> Iterator[ControlPlane]:
    plane = start_control_plane(workdir, **options)
    try:
        yield plane
    finally:
        plane.stop()


# --------------------------------------------------------------------------- pods as local processes


@dataclass
class _PodProcess:
    pod: str
    uid: str
    process: subprocess.Popen[bytes]
    grace_seconds: float
    started_at: float
    stop_deadline: float | None = None


@dataclass(frozen=True)
class PodProcessEvent:
    """What the runner did: `started`, `stopping` (SIGTERM sent, pod gone), `killed` (grace exceeded),
    `exited` (on its own, while its pod still runs; it will be restarted)."""

    kind: str
    pod: str
    pid: int
    at: float
    returncode: int | None = None


CommandTemplate = Sequence[str] | Callable[[JSON], Sequence[str]]


class PodProcessRunner:
    """Keeps one local process per Running pod matching `label_selector` in `namespace` (see the module
    docstring). `command` is a list of strings formatted with {pod}, {namespace}, {ordinal} (the number
    after the last '-', or '' if none) and {uid}, or a function of the pod (its JSON) that returns argv.
    `env` values are formatted the same way and added to os.environ, with POD_NAME, POD_NAMESPACE and
    POD_UID. Output goes to <log_dir>/<pod>.log. Runs a background thread until stop()."""

    def __init__(
        self,
        plane: ControlPlane,
        namespace: str,
        label_selector: str,
        command: CommandTemplate,
        *,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        poll_interval: float = 0.25,
        max_grace_seconds: float = 30,
        restart_delay: float = 1.0,
    ) -> None:
        self.plane = plane
        self.namespace = namespace
        self.label_selector = label_selector
        self.command = command
        self.env = dict(env or {})
        self.log_dir = log_dir or plane.workdir / "pod-processes" / namespace
        self.poll_interval = poll_interval
        self.max_grace_seconds = max_grace_seconds
        self.restart_delay = restart_delay
        self.events: list[PodProcessEvent] = []
        self.errors: list[str] = []
        self._running: dict[str, _PodProcess] = {}
        self._stopping: list[_PodProcess] = []
        self._not_before: dict[str, float] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> Self:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(
            target=self._loop, name=f"pod-processes-{self.namespace}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 15) -> None:
        """Stop watching and terminate every process (SIGTERM, then SIGKILL after `timeout`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            processes = [p.process for p in self._running.values()] + [p.process for p in self._stopping]
            self._running.clear()
            self._stopping.clear()
        _terminate(processes, timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- observation

    def pids(self) -> dict[str, int]:
        """Pod name -> PID of its live local process."""
        with self._lock:
            return {name: p.process.pid for name, p in self._running.items() if p.process.poll() is None}

    def wait_for_pods(self, pods: set[str], timeout: float) -> dict[str, int]:
        """Wait until exactly `pods` have a live process; returns pids(). Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                current = {n: p.process.pid for n, p in self._running.items() if p.process.poll() is None}
                if set(current) == pods:
                    return current
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"pod processes {sorted(current)} != expected {sorted(pods)}; {self.errors}"
                    )
                self._changed.wait(min(remaining, 0.5))

    # -- the loop

    def _argv_env(self, pod: JSON) -> tuple[list[str], dict[str, str]]:
        meta = pod["metadata"]
        name: str = meta["name"]
        tail = name.rsplit("-", 1)[-1]
        values = {
            "pod": name,
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "ordinal": tail if "-" in name and tail.isdigit() else "",
        }
        if callable(self.command):
            argv = [str(a) for a in self.command(pod)]
        else:
            argv = [a.format(**values) for a in self.command]
        env = dict(os.environ)
        env.update(POD_NAME=name, POD_NAMESPACE=values["namespace"], POD_UID=values["uid"])
        env.update({k: v.format(**values) for k, v in self.env.items()})
        return argv, env

    def _list_pods(self) -> list[JSON]:
        query = urllib.parse.urlencode({"labelSelector": self.label_selector})
        answer = self.plane.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?{query}", timeout=10)
        items: list[JSON] = answer.get("items", [])
        return items

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile(self._list_pods())
            except Exception as error:  # keep watching; a test asserts on .errors if it cares
                self.errors.append(repr(error))
                del self.errors[:-20]
            self._stop.wait(self.poll_interval)

    def _record(self, kind: str, item: _PodProcess, returncode: int | None = None) -> None:
        self.events.append(PodProcessEvent(kind, item.pod, item.process.pid, time.monotonic(), returncode))

    def _reconcile(self, pods: list[JSON]) -> None:
        now = time.monotonic()
        running: dict[str, JSON] = {
            pod["metadata"]["name"]: pod
            for pod in pods
            if (pod.get("status") or {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
        }
        with self._changed:
            # Pods gone (or replaced by a new pod of the same name): SIGTERM, SIGKILL after the grace.
            for name, item in list(self._running.items()):
                pod = running.get(name)
                if pod is None or pod["metadata"]["uid"] != item.uid:
                    del self._running[name]
                    if item.process.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            item.process.send_signal(signal.SIGTERM)
                        item.stop_deadline = now + item.grace_seconds
                        self._stopping.append(item)
                        self._record("stopping", item)
                elif item.process.poll() is not None:
                    del self._running[name]
                    self._not_before[name] = now + self.restart_delay
                    self._record("exited", item, item.process.returncode)
            for item in list(self._stopping):
                if item.process.poll() is not None:
                    self._stopping.remove(item)
                elif item.stop_deadline is not None and now > item.stop_deadline:
                    with contextlib.suppress(ProcessLookupError):
                        item.process.kill()
                    self._record("killed", item)
                    self._stopping.remove(item)
                    item.process.wait(timeout=10)
            # Running pods without a process: start one (after the back-off if it just exited).
            for name, pod in running.items():
                if name in self._running or now < self._not_before.get(name, 0.0):
                    continue
                argv, env = self._argv_env(pod)
                grace = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
                log = (self.log_dir / f"{_safe(name)}.log").open("ab")
                try:
                    process = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
                    )
                finally:
                    log.close()
                item = _PodProcess(
                    pod=name,
                    uid=pod["metadata"]["uid"],
                    process=process,
                    grace_seconds=min(float(grace), self.max_grace_seconds),
                    started_at=now,
                )
                self._running[name] = item
                self._record("started", item)
            self._changed.notify_all()
