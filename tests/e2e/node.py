"""A real node on this VM: containerd 2.x with CDI, and a real kubelet.

This VM has cgroup v1 and no systemd as PID 1, so the kubelet runs with the cgroupfs
driver (``failCgroupV1: false``) and relaxed eviction thresholds; runc and the CNI plugins
come from Debian's packages. On levels 1 and 2 pods run on the host network; containerd
still needs a CNI configuration (loopback only) or the node stays NotReady. With
``pod_network`` (level 3, inside :mod:`tests.e2e.netns`) pods get addresses on a bridge
(``bridge`` and ``host-local``), and the real kube-proxy translates the Service range, so a
pod reaches the API server by in-cluster config as on EKS. No registry is reachable: the
images come from :mod:`tests.e2e.images`, imported into containerd's ``k8s.io`` namespace
under the names the pods use, the sandbox image pinned in containerd's config.

All processes are started through the :class:`ControlPlane` so that its sweep and stop
cover them; :func:`unmount_under` removes the kubelet's mounts (projected volumes) so the
tree can be deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.e2e import build, images, netns
from tests.e2e.cluster import ControlPlane, free_port, issue, kubeconfig

SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
CNI_BIN = Path("/usr/lib/cni")
DEPENDENCIES = {
    "CNI plugins": CNI_BIN / "loopback",
    "busybox-static": images.BUSYBOX,
}


def missing_dependencies() -> list[str]:
    return [name for name, path in DEPENDENCIES.items() if not path.exists()]


def unmount_under(root: Path) -> None:
    """Lazily unmount every mount point below ``root``, deepest first."""
    prefix = str(root.resolve()) + "/"
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(prefix):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def commands() -> list[tuple[int, list[bytes]]]:
    """(pid, argv) of every process this one can read."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if argv[0]:
                    out.append((int(entry.name), argv))
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


@dataclass
class RealNode:
    cp: ControlPlane
    name: str
    root: Path
    images: tuple[str, ...]
    # OCI archives imported as they are (the plugin's image), beside the busybox images.
    archives: tuple[Path, ...] = ()
    pod_network: bool = False
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    def _containerd_config(self) -> str:
        r = self.root
        return f"""
version = 3
root = "{r / "containerd" / "root"}"
state = "{r / "containerd" / "state"}"

[grpc]
  address = "{self.containerd_socket}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{SANDBOX_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  # This VM's root may not lower an OOM score (no CAP_SYS_RESOURCE); the kubelet asks
  # -998 for sandboxes, and runc then fails ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{self.cdi_root}"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{build.build_runc()}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{r / "cni"}"
"""

    def _cni_config(self) -> dict[str, object]:
        if not self.pod_network:
            return {"cniVersion": "1.0.0", "name": "loopback", "plugins": [{"type": "loopback"}]}
        return {
            "cniVersion": "1.0.0",
            "name": "pods",
            "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
                "ipam": {"type": "host-local", "subnet": netns.POD_SUBNET,
                         "routes": [{"dst": "0.0.0.0/0"}],
                         # Not /var/lib/cni: nothing of the run outside its root.
                         "dataDir": str(self.root / "cni-ipam")},
            }],
        }  # fmt: skip

    def _kubelet_config(self) -> dict[str, object]:
        config: dict[str, object] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cp.pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "0.0.0.0" if self.pod_network else "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "failSwapOn": False,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(self.pod_logs),
            "resolvConf": "",
            "localStorageCapacityIsolation": False,
            "makeIPTablesUtilChains": False,
            "serializeImagePulls": False,
            "featureGates": self.cp.feature_gates(),
        }
        return config

    async def start(self) -> None:
        missing = missing_dependencies()
        if missing:
            raise RuntimeError(f"missing for a real node: {', '.join(missing)} (apt-get install "
                               "runc containernetworking-plugins busybox-static)")  # fmt: skip
        ctd = build.build_containerd()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "cni").mkdir(exist_ok=True)
        (self.root / "cni" / "10-pods.conflist").write_text(json.dumps(self._cni_config()))
        self.cdi_root.mkdir(exist_ok=True)
        (self.root / "containerd.toml").write_text(self._containerd_config())
        env_path = f"{ctd}:{os.environ.get('PATH', '')}"
        os.environ["PATH"] = env_path  # containerd finds its shim on PATH
        await self._start_containerd()
        await asyncio.to_thread(self._import_images, ctd)
        cert, key = issue(self.cp.pki, f"kubelet-{self.name}",
                          f"/O=system:nodes/CN=system:node:{self.name}",
                          "extendedKeyUsage=clientAuth")  # fmt: skip
        kc = self.root / "kubelet.kubeconfig"
        kc.write_text(kubeconfig(self.cp.server, self.cp.pki / "ca.crt", cert=cert, key=key))
        (self.root / "kubelet.yaml").write_text(json.dumps(self._kubelet_config()))
        await self._start_kubelet()
        if self.pod_network:
            await self._start_kube_proxy()

    async def _start_containerd(self) -> None:
        ctd = build.build_containerd()
        await self.cp.spawn(f"containerd-{self.name}", [
            str(ctd / "containerd"), "--config", str(self.root / "containerd.toml")
        ])  # fmt: skip
        await self.cp.wait_for("containerd", self.containerd_socket.is_socket, 60)

    async def _start_kubelet(self) -> None:
        extra = []
        if self.pod_network:
            extra.append(f"--node-ip={netns.API_ADDRESS}")
        if self.labels:
            extra.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in self.labels))
        await self.cp.spawn(f"kubelet-{self.name}", [
            str(self.cp.bindir / "kubelet"), f"--config={self.root / 'kubelet.yaml'}",
            f"--kubeconfig={self.root / 'kubelet.kubeconfig'}",
            f"--root-dir={self.kubelet_dir}", f"--cert-dir={self.root / 'kubelet-pki'}",
            f"--hostname-override={self.name}", "--v=2", *extra,
        ])  # fmt: skip
        await self.cp.wait_for(f"node {self.name} Ready", self._ready, 120)

    async def power_cycle(self) -> None:
        """The node loses power and boots again: the kubelet, containerd, its shims and every
        container killed at once (SIGKILL), what lives on a real node's tmpfs ``/run`` gone
        (containerd's state, the CDI specs, the pods' tmpfs volumes), then containerd and the
        kubelet started again on the same disk (their roots, the kubelet's checkpoints).
        Plugins run beside the node are the caller's: a new boot ID is theirs to see too.
        kube-proxy is left running, its rules in place: it would write the same ones again."""
        names = (f"kubelet-{self.name}", f"containerd-{self.name}")
        mine = [p for p in self.cp.processes if p.name in names]
        shims = [pid for pid, argv in commands() if b"containerd-shim" in argv[0]
                 and str(self.containerd_socket).encode() in b" ".join(argv)]  # fmt: skip
        doomed = [q for pid in [*(p.proc.pid for p in mine), *shims] for q in process_tree(pid)]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in mine:
            await p.proc.wait()
            self.cp.processes.remove(p)
        unmount_under(self.root / "containerd")
        unmount_under(self.kubelet_dir / "pods")
        shutil.rmtree(self.root / "containerd" / "state", ignore_errors=True)
        for spec in self.cdi_root.iterdir():
            spec.unlink()
        self.containerd_socket.unlink(missing_ok=True)
        await self._start_containerd()
        await self._start_kubelet()

    async def _start_kube_proxy(self) -> None:
        cert, key = issue(self.cp.pki, "kube-proxy", "/CN=system:kube-proxy",
                          "extendedKeyUsage=clientAuth")  # fmt: skip
        kc = self.root / "kube-proxy.kubeconfig"
        kc.write_text(kubeconfig(self.cp.server, self.cp.pki / "ca.crt", cert=cert, key=key))
        health = free_port()
        config = self.root / "kube-proxy.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clientConnection": {"kubeconfig": str(kc)},
            "hostnameOverride": self.name, "clusterCIDR": netns.POD_SUBNET,
            "healthzBindAddress": f"127.0.0.1:{health}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # A network namespace's conntrack table size is not its own to set.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
        }))  # fmt: skip
        await self.cp.spawn(f"kube-proxy-{self.name}", [
            str(self.cp.bindir / "kube-proxy"), f"--config={config}", "--v=2",
        ])  # fmt: skip

        def rules() -> bool:  # the kubernetes Service translated: kube-proxy synced once
            out = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True)
            return f"-d {netns.KUBERNETES_SERVICE_IP}/32" in out.stdout

        await self.cp.wait_for("kube-proxy's rules for the kubernetes Service", rules, 60)

    def _import_images(self, ctd: Path) -> None:
        tars = self.root / "images"
        tars.mkdir(exist_ok=True)
        built = [images.pause_image(tars / "pause.tar", SANDBOX_IMAGE)]
        built += [images.busybox_image(tars / f"busybox-{i}.tar", ref)
                  for i, ref in enumerate(self.images)]  # fmt: skip
        for tar in [*built, *self.archives]:
            subprocess.run([str(ctd / "ctr"), "--address", str(self.containerd_socket), "-n",
                            "k8s.io", "images", "import", "--local", "--snapshotter", "native",
                            str(tar)],
                           check=True, capture_output=True)  # fmt: skip

    def _ready(self) -> bool:
        code, body = self.cp.get(f"/api/v1/nodes/{self.name}")
        if code != 200:
            return False
        for cond in json.loads(body).get("status", {}).get("conditions") or []:
            if cond["type"] == "Ready":
                return bool(cond["status"] == "True")
        return False
