"""A real Kubernetes control plane on 127.0.0.1, as processes: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, built by ``tests.e2e.build``.

Like upstream's local-up-cluster: a generated CA, serving and client certificates (openssl),
a service-account signing key, one kubeconfig per identity. etcd runs with
``--unsafe-no-fsync``; readiness is waited for by condition (``/readyz``), never a sleep.

Every process it starts is recorded in ``<root>/pids`` before it runs, so a run killed
mid-way (SIGKILL, a CI timeout) is swept by the next one at start; :meth:`stop` ends them
all, also on failure or SIGINT (the fixture's finally). The harness makes itself a child
subreaper, so a grandchild (a containerd shim) re-parents to it and is reaped here.

The node-lifecycle controller is off unless asked for: Nodes without a kubelet would be
tainted unreachable within a minute and their pods evicted. So are the controllers that need
a cloud or a pod network (service load balancers, routes, node IPAM).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e import build, netns

PR_SET_CHILD_SUBREAPER = 36

# Feature gates per minor: what the tier needs beyond each version's defaults.
# 1.34: DRA v1 is GA; partitionable devices, consumable capacity, device taints are alpha.
FEATURE_GATES: dict[str, dict[str, bool]] = {
    "1.34": {
        "DRAPartitionableDevices": True,
        "DRADeviceTaints": True,
        "DRAConsumableCapacity": True,
    },
    "1.35": {  # the same three are still alpha and off in 1.35
        "DRAPartitionableDevices": True,
        "DRADeviceTaints": True,
        "DRAConsumableCapacity": True,
    },
    "1.36": {},
    "1.37": {},
    "1.38": {},
}


def run_root() -> Path:
    """Where runs keep their state: ``$GPU_DRA_E2E_RUN`` (default /tmp), short for sockets.
    Two runs at once need two roots: each sweeps what an earlier run left in its own."""
    return Path(os.environ.get("GPU_DRA_E2E_RUN", "/tmp"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def issue(pki: Path, name: str, subject: str, extension: str) -> tuple[Path, Path]:
    """A certificate and key signed by the CA in ``pki``: (cert, key)."""
    _openssl("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
             cwd=pki)  # fmt: skip
    (pki / f"{name}.ext").write_text(extension + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "3", "-out", f"{name}.crt",
             "-extfile", f"{name}.ext", cwd=pki)  # fmt: skip
    return pki / f"{name}.crt", pki / f"{name}.key"


def make_pki(pki: Path, addresses: tuple[str, ...] = ()) -> None:
    """CA, apiserver serving cert (also for ``addresses``), admin client cert and a
    service-account key (EC P-256)."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3",
             "-subj", "/CN=gpu-dra-e2e-ca", cwd=pki)  # fmt: skip
    sans = "subjectAltName=" + ",".join(
        [f"IP:{a}" for a in ("127.0.0.1", *addresses)]
        + ["DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default.svc"]
    )
    issue(pki, "apiserver", "/CN=kube-apiserver", sans)
    issue(pki, "admin", "/O=system:masters/CN=e2e-admin", "extendedKeyUsage=clientAuth")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=pki)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def kubeconfig(
    server: str,
    ca: Path,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> str:
    user: dict[str, str] = {}
    if cert and key:
        user = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        user = {"token": token}
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                 "certificate-authority": str(ca)}}],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    })  # fmt: skip


# kind -> (group/version path, plural, namespaced), for the objects the tier creates.
_RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("api/v1", "namespaces", False),
    "Node": ("api/v1", "nodes", False),
    "Pod": ("api/v1", "pods", True),
    "ServiceAccount": ("api/v1", "serviceaccounts", True),
    "Secret": ("api/v1", "secrets", True),
    "Service": ("api/v1", "services", True),
    "ClusterRole": ("apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ValidatingAdmissionPolicy": (
        "apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", False),
    "DeviceClass": ("apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceClaim": ("apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "ResourceSlice": ("apis/resource.k8s.io/v1", "resourceslices", False),
    "DeviceTaintRule": ("apis/resource.k8s.io/v1", "devicetaintrules", False),  # 1.37+
    "Lease": ("apis/coordination.k8s.io/v1", "leases", True),
    "DaemonSet": ("apis/apps/v1", "daemonsets", True),
    "Deployment": ("apis/apps/v1", "deployments", True),
    "Job": ("apis/batch/v1", "jobs", True),
    "CustomResourceDefinition": (
        "apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "ComputeDomain": ("apis/resource.nvidia.com/v1beta1", "computedomains", True),
    "ComputeDomainClique": ("apis/resource.nvidia.com/v1beta1", "computedomaincliques", True),
}  # fmt: skip


def collection_path(obj: dict[str, Any], namespace: str | None = None) -> str:
    group, plural, namespaced = _RESOURCES[obj["kind"]]
    if namespaced:
        ns = namespace or obj.get("metadata", {}).get("namespace") or "default"
        return f"/{group}/namespaces/{ns}/{plural}"
    return f"/{group}/{plural}"


def kill_under(root: Path) -> int:
    """SIGKILL every process whose command line names ``root``, and its descendants.

    containerd's shims leave containerd's process group (they call setsid) and outlive it;
    each names the run's containerd socket, and the containers are its children."""
    mark = str(root).encode()
    parents: dict[int, int] = {}
    marked: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            if mark in (entry / "cmdline").read_bytes():
                marked.add(int(entry.name))
    doomed = set(marked)
    grew = True
    while grew:  # descendants: children of anything doomed
        more = {pid for pid, parent in parents.items() if parent in doomed} - doomed
        doomed |= more
        grew = bool(more)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(doomed)


def sweep(root: Path) -> None:
    """End what a killed earlier run under ``root`` left running, and remove its files."""
    pids = root / "pids"
    if pids.is_dir():
        for f in pids.iterdir():
            with contextlib.suppress(ValueError, OSError):
                pid, _, argv0 = f.read_text().partition(" ")
                # Only if the pid is still that run's process: a pid is reused, and
                # killing a stranger's process group (the test runner's) would be worse.
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
                if argv0 and cmdline.decode(errors="replace") == argv0:
                    os.killpg(int(pid), signal.SIGKILL)
    if root.exists():
        kill_under(root)
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class Process:
    name: str
    proc: asyncio.subprocess.Process
    log: Path


@dataclass
class ControlPlane:
    root: Path
    minor: str
    # Off for Nodes without a kubelet (level 1); on where a real kubelet heartbeats (level 2).
    node_lifecycle: bool = False
    # As EKS runs it (level 3, inside tests.e2e.netns): the default --runtime-config (no
    # alpha API), no alpha feature gate, and an advertised non-loopback address whose
    # kubernetes Service endpoints the lease reconciler keeps, for pods' in-cluster config.
    eks: bool = False
    processes: list[Process] = field(default_factory=list)
    api_port: int = 0

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def bindir(self) -> Path:
        return build.cache_root() / f"kubernetes-{build.k8s_version(self.minor)}" / "bin"

    def feature_gates(self) -> dict[str, bool]:
        return {} if self.eks else dict(FEATURE_GATES[self.minor])

    def gates(self) -> str:
        return ",".join(f"{k}={str(v).lower()}" for k, v in self.feature_gates().items())

    async def spawn(self, name: str, argv: list[str]) -> Process:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        out = log.open("ab")
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        out.close()
        (self.root / "pids").mkdir(exist_ok=True)
        (self.root / "pids" / name).write_text(f"{proc.pid} {argv[0]}")
        p = Process(name, proc, log)
        self.processes.append(p)
        return p

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        return self.raw("GET", path, timeout=timeout)

    def raw(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        token: str | None = None,
        timeout: float = 10,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        """One request as the admin (client certificate), or as the bearer of ``token``."""
        # Compact, as kubectl and Go clients send it: the API server keeps an opaque config's
        # RawExtension as the bytes it received, the scheduler copies them into the claim's
        # allocation, and every later status write re-encodes them compactly; with spaced bytes
        # stored, no writer's status.devices update can ever match the allocation (422).
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        else:
            ctx = self.ssl_context()
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read())

    def call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        token: str | None = None,
        ok: tuple[int, ...] = (200, 201, 202),
    ) -> dict[str, Any]:
        """A JSON request that must succeed; the decoded answer."""
        code, out = self.raw(method, path, body, token=token)
        if code not in ok:
            raise AssertionError(f"{method} {path}: {code} {out[:2000]!r}")
        result: dict[str, Any] = json.loads(out) if out else {}
        return result

    def create(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self.call("POST", collection_path(obj, namespace), obj)

    async def wait_for(self, what: str, check: object, wait_s: float) -> None:
        assert callable(check)
        deadline = time.monotonic() + wait_s
        while True:
            for p in self.processes:
                if p.proc.returncode is not None:
                    tail = p.log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{p.name} exited ({p.proc.returncode}):\n{tail}")
            with contextlib.suppress(OSError):
                if await asyncio.to_thread(check):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not ready after {wait_s:.0f} s")
            await asyncio.sleep(0.2)

    async def __aenter__(self) -> ControlPlane:
        try:
            await self.start()
        except BaseException:  # what did start is stopped, as in a try/finally
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _controllers_off(self) -> list[str]:
        """Controllers a cluster without a cloud or a node IPAM must not run; the cloud ones
        left kube-controller-manager in 1.37, which refuses their names from then on."""
        off = ["-node-ipam-controller"]
        if tuple(int(x) for x in self.minor.split(".")) < (1, 37):
            off += ["-cloud-node-lifecycle-controller", "-service-lb-controller",
                    "-node-route-controller"]  # fmt: skip
        if not self.node_lifecycle:
            off.append("-node-lifecycle-controller")
        return off

    async def start(self) -> None:
        sweep(self.root)
        self.root.mkdir(parents=True)
        free = shutil.disk_usage(self.root).free
        if free < 2 * 2**30:
            raise RuntimeError(f"only {free / 2**30:.1f} GiB free under {self.root}: 2 GiB needed")
        with contextlib.suppress(OSError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        addresses = (netns.API_ADDRESS, netns.KUBERNETES_SERVICE_IP) if self.eks else ()
        await asyncio.to_thread(make_pki, self.pki, addresses)
        etcd_port, peer_port = free_port(), free_port()
        self.api_port = free_port()
        pki = self.pki
        self.admin_kubeconfig.write_text(
            kubeconfig(self.server, pki / "ca.crt", cert=pki / "admin.crt", key=pki / "admin.key")
        )
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        await self.spawn("etcd", [
            str(build.build_etcd()), "--name=e2e", f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
        ])  # fmt: skip
        gates = [f"--feature-gates={self.gates()}"] if self.gates() else []
        if self.eks:
            if not netns.isolated():
                raise RuntimeError("an EKS-like control plane runs in tests.e2e.netns only")
            network = [
                "--bind-address=0.0.0.0", f"--advertise-address={netns.API_ADDRESS}",
                "--endpoint-reconciler-type=lease",
            ]  # fmt: skip
        else:
            network = [
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none", "--runtime-config=api/all=true",
            ]  # fmt: skip
        await self.spawn("kube-apiserver", [
            str(self.bindir / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            *network, f"--secure-port={self.api_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={netns.SERVICE_SUBNET}",
            "--allow-privileged=true", "--profiling=false", *gates,
        ])  # fmt: skip
        await self.wait_for("kube-apiserver", lambda: self.get("/readyz")[0] == 200, 120)
        common = [
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", *gates,
        ]  # fmt: skip
        await self.spawn("kube-controller-manager", [
            str(self.bindir / "kube-controller-manager"), *common,
            f"--secure-port={free_port()}",
            "--controllers=" + ",".join(["*", *self._controllers_off()]),
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", "--use-service-account-credentials=true",
        ])  # fmt: skip
        await self.spawn("kube-scheduler", [
            str(self.bindir / "kube-scheduler"), *common, f"--secure-port={free_port()}",
        ])  # fmt: skip
        # The default service account exists once the controller-manager's token and
        # service-account controllers run: the first sign that it works.
        await self.wait_for(
            "kube-controller-manager",
            lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            120,
        )

    def version(self) -> dict[str, str]:
        code, body = self.get("/version")
        assert code == 200, body
        result: dict[str, str] = json.loads(body)
        return result

    async def stop(self) -> None:
        for p in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, signal.SIGTERM)
        for p in reversed(self.processes):
            try:
                await asyncio.wait_for(p.proc.wait(), 15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.proc.pid, signal.SIGKILL)
                await p.proc.wait()
            (self.root / "pids" / p.name).unlink(missing_ok=True)
        self.processes.clear()
        kill_under(self.root)  # what outlived its parent: containerd shims, their containers
