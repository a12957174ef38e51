"""Ours and NVIDIA's GPU kubelet plugin, one at a time, on one real node (issue #40).

A level-3 node (:mod:`tests.e2e.netns`: an EKS-like control plane, the real kubelet and
containerd 2.x with CDI, a pod network, kube-proxy) with one simulated driver root, the
C stand-in of ``libnvidia-ml.so.1`` under it (both plugins load it as they would load the real
library, ``--nvml=system`` for ours). Both plugins register as ``gpu.nvidia.com``, so the
kubelet talks to one at a time: :meth:`SideBySide.switch` stops one, waits until the kubelet
has no prepared claim of it left and its slices are gone, and starts the other.

Both run as host processes in the node's namespaces, not as their charts' DaemonSets:
NVIDIA's chart runs ``registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu``, which
cannot be pulled here (no registry is reachable) nor built (its Dockerfile builds on
NVIDIA's CUDA base images), and ours runs as a process too so that the two are measured
alike. NVIDIA's runs as :mod:`tests.e2e.nvidia_plugin` runs it: the flags its chart's
DaemonSet sets and its default feature gates, in a mount namespace of its own whose ``/sys``
(and ``/proc/devices``, ``/proc/driver``) are the simulated node's, with the admin's
kubeconfig (its chart's RBAC is not installed). Ours gets the chart's RBAC and a token of
the chart's ServiceAccount bound to a pod on the node, as the kubelet gives it.

The workload class is NVIDIA's chart's ``gpu.nvidia.com`` DeviceClass (its CEL, verbatim), in
place of ours of the same name: a pod written for NVIDIA's driver runs on either plugin.

NVIDIA's CDI specs name ``nvidia-cdi-hook`` (its image ships the toolkit's); it is built here
from the NVIDIA Container Toolkit module this tier already builds ``nvidia-ctk`` from, and put
where the chart's ``--nvidia-cdi-hook-path`` would point, under the driver root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chart_render import NAMESPACE
from tests.e2e import build, nvidia_plugin
from tests.e2e.cluster import ControlPlane, Process, kubeconfig, run_root
from tests.e2e.kube import PLUGIN_POD_IMAGE, await_until, install_chart, plugin_token
from tests.e2e.node import RealNode, missing_dependencies, process_tree, unmount_under

DRIVER = "gpu.nvidia.com"
NODE = "node-1"
PROFILE = "p4d.24xlarge"  # 8 whole GPUs (level 3's: no MIG, whose caps need a kernel)
GPUS = 8
MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
IMAGE = "registry.example/bench/busybox:1"  # busybox under this name (tests.e2e.images)
NS = "bench"
TEMPLATE = "one-gpu"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# NVIDIA's chart's DeviceClass (deployments/helm/dra-driver-nvidia-gpu/templates/
# deviceclass-gpu.yaml at v0.4.1), its CEL verbatim.
NVIDIA_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )}}]},
}  # fmt: skip
SLICES = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{NODE}"
HOOK_PKG = "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"


def cdi_hook() -> Path:
    """``nvidia-cdi-hook`` of the toolkit version this tier pins, built once (cgo: go-nvml)."""
    version = build.VERSIONS["nvidia-container-toolkit"]["version"]
    out = build.cache_root() / f"nvidia-container-toolkit-{version}" / "nvidia-cdi-hook"
    if not out.exists():
        build.build_nvidia_ctk()  # its module, which holds this package too
        module = out.parent / "module"
        build._build(module, HOOK_PKG, out, cgo=True)
    return out


def missing() -> str | None:
    """Why a side-by-side run cannot start here, or None."""
    if not nvidia_plugin.binary().exists():
        return f"{nvidia_plugin.binary()} not built: make nvidia-plugin (needs the mirror)"
    deps = missing_dependencies()
    if deps:
        return f"a real node needs {', '.join(deps)}"
    return None


# -- processes -------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and its live descendants (helpers a plugin forks count)."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid``, its reaped children and its live descendants."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for i, p in enumerate(process_tree(pid)):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            # utime, stime (fields 14, 15); cutime, cstime (16, 17) for the root only: a
            # live child's reaped children are in its own, counted when it is reaped.
            own = int(fields[11]) + int(fields[12])
            total += own + (int(fields[13]) + int(fields[14]) if i == 0 else 0)
    return total / ticks


@dataclass
class Plugin:
    """One of the two plugins on the node: how it starts and what it leaves."""

    side: SideBySide
    name: str = ""  # "ours" or "nvidia"
    process: Process | None = None
    registrations_before: int = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.proc.pid

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return {}

    # What the plugin logs once the kubelet's NotifyRegistrationStatus says it registered it
    # (the kubelet calls it after adding the plugin): pods can be prepared from then on. The
    # registration socket alone is not enough: a pod created before the kubelet's plugin
    # watcher has seen it fails "DRA driver gpu.nvidia.com is not registered" and backs off.
    registered_log = ""

    def registered(self) -> bool:
        return bool(self.registered_log) and re.search(self.registered_log, self.log()) is not None

    def registration(self) -> Path:
        return self.side.node.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"

    async def start(self) -> None:
        self.registrations_before = self.side.kubelet_registrations()
        env = [f"{k}={v}" for k, v in self.env().items()]
        # The node's boot ID as this process reads it (both plugins read the kernel's to
        # tell a reboot): :meth:`SideBySide.power_cycle` changes it. unshare without --fork
        # and exec: the plugin keeps the spawned pid, which the measurements read.
        booted = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                  f'mount --bind "$0" {BOOT_ID} && exec "$@"', str(self.side.boot_id)]  # fmt: skip
        self.process = await self.side.cp.spawn(
            f"plugin-{self.name}-{time.monotonic_ns()}", [*booted, "env", *env, *self.argv()]
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.proc.returncode is None

    async def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.process is None:
            return None
        proc = self.process
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.proc.pid, sig)
        try:
            await asyncio.wait_for(proc.proc.wait(), 30)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.proc.pid, signal.SIGKILL)
            await proc.proc.wait()
        self.side.cp.processes.remove(proc)
        self.process = None
        return proc.proc.returncode

    def log(self) -> str:
        if self.process is None:
            return ""
        return self.process.log.read_text(errors="replace")


@dataclass
class Ours(Plugin):
    name: str = "ours"
    # As the chart's pods pass theirs: sockets named after it, so that two instances (a
    # surging upgrade) are registered side by side. "": one instance, the plain names.
    pod_uid: str = ""
    registered_log = "registered with the kubelet|plugin_registered=True"

    @property
    def token_pod(self) -> str:
        return f"gpu-dra-plugin-{NODE}" + (f"-{self.pod_uid[:8]}" if self.pod_uid else "")

    def argv(self) -> list[str]:
        side = self.side
        root, kubelet = side.driver_root, side.node.kubelet_dir
        config = side.root / f"ours{self.pod_uid}.kubeconfig"
        # A fresh token per start: the chart's ServiceAccount bound to a pod on the node.
        token = plugin_token(side.cp, NODE, self.token_pod)
        config.write_text(kubeconfig(side.cp.server, side.cp.pki / "ca.crt", token=token))
        return [
            sys.executable, "-m", "cli", "kubelet-plugin", f"--node-name={NODE}",
            f"--kubeconfig={config}",
            f"--kubelet-registrar-directory-path={kubelet / 'plugins_registry'}",
            f"--kubelet-plugins-directory-path={kubelet / 'plugins'}",
            f"--cdi-root={side.node.cdi_root}", "--healthcheck-port=0",
            "--nvml=system", f"--container-driver-root={root}", f"--nvidia-driver-root={root}",
            f"--sysfs-root={root}", *([f"--pod-uid={self.pod_uid}"] if self.pod_uid else []),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {"POD_NAMESPACE": NAMESPACE, **self.side.sim_env()}

    async def start(self) -> None:
        # plugin_token creates a pod; its name must be free again on a restart.
        pod = f"/api/v1/namespaces/{NAMESPACE}/pods/{self.token_pod}"
        self.side.cp.raw("DELETE", f"{pod}?gracePeriodSeconds=0")
        await await_until("the token pod gone", lambda: self.side.cp.raw("GET", pod)[0] == 404, 60)
        await super().start()


@dataclass
class Nvidia(Plugin):
    name: str = "nvidia"
    gates: str = ""
    registered_log = "registration status: plugin_registered:true"

    def registered(self) -> bool:
        # It logs the kubelet's registration status once, a second after it starts: true
        # only if the kubelet was that quick. Else the kubelet's own log says it started
        # registering this socket (GetInfo, the DRA handler, NotifyRegistrationStatus: a few
        # ms, while a pod created then still has the scheduler ahead of it).
        return super().registered() or (
            self.side.kubelet_registrations() > self.registrations_before
        )

    def argv(self) -> list[str]:
        side = self.side
        root, kubelet = side.driver_root, side.node.kubelet_dir
        argv = [
            str(nvidia_plugin.binary()), f"--node-name={NODE}",
            "--namespace=nvidia-dra-driver-gpu", f"--cdi-root={side.node.cdi_root}",
            f"--nvidia-driver-root={root}", f"--container-driver-root={root}",
            f"--nvidia-cdi-hook-path={root / 'usr' / 'bin' / 'nvidia-cdi-hook'}",
            f"--kubelet-registrar-directory-path={kubelet / 'plugins_registry'}",
            f"--kubelet-plugins-directory-path={kubelet / 'plugins'}",
            f"--kubeconfig={side.cp.admin_kubeconfig}", f"--image-name={nvidia_plugin.IMAGE}",
            "--service-account-name=nvidia-dra-driver-gpu-service-account-kubeletplugin",
            "-v=4",
        ]  # fmt: skip
        if self.gates:
            argv.append(f"--feature-gates={self.gates}")
        # As nvidia_plugin.run_plugin: the simulated /sys and the /proc files NVIDIA's
        # toolkit library reads (it has no flag to move them). unshare without --fork and
        # exec: the plugin keeps the spawned pid, which the measurements read.
        shell = (
            'mount --bind "$0/sys" /sys && mount --bind "$0/proc/devices" /proc/devices && '
            'mount --bind "$0/proc/driver" /proc/driver && exec "$@"'
        )
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", shell, str(root), *argv]

    def env(self) -> dict[str, str]:
        return self.side.sim_env()


# -- the node --------------------------------------------------------------------------


@dataclass
class SideBySide:
    node: RealNode
    driver_root: Path
    hardware: Path
    root: Path
    current: Plugin | None = None
    last: str | None = None  # the name of the plugin that ran last
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def cp(self) -> ControlPlane:
        return self.node.cp

    @property
    def boot_id(self) -> Path:
        """The file the plugins read as the kernel's boot ID."""
        return self.root / "boot_id"

    async def power_cycle(self) -> None:
        """The node reboots (:meth:`RealNode.power_cycle`), the current plugin killed with it
        and started again (as its DaemonSet's pod is) with a new boot ID; returns once the
        kubelet is back, leaving the plugin to register when it can."""
        plugin = self.current
        assert plugin is not None
        await plugin.stop(signal.SIGKILL)
        self.boot_id.write_text(f"{uuid.uuid4()}\n")
        await self.node.power_cycle()
        await plugin.start()

    def sim_env(self) -> dict[str, str]:
        from driver.nvml.simulated import HARDWARE_ENV

        return {HARDWARE_ENV: str(self.hardware)}

    def ours(self) -> Ours:
        return Ours(side=self)

    def nvidia(self, gates: str = "") -> Nvidia:
        return Nvidia(side=self, gates=gates)

    # - slices
    def slices(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cp.call("GET", SLICES)["items"]
        return [s for s in items if s["spec"]["driver"] == DRIVER]

    def complete_pool(self) -> list[dict[str, Any]] | None:
        ours = self.slices()
        if not ours:
            return None
        top = max(s["spec"]["pool"]["generation"] for s in ours)
        latest = [s for s in ours if s["spec"]["pool"]["generation"] == top]
        return latest if len(latest) == latest[0]["spec"]["pool"]["resourceSliceCount"] else None

    def devices(self) -> list[dict[str, Any]]:
        return [d for s in self.complete_pool() or [] for d in s["spec"].get("devices") or []]

    async def start(self, plugin: Plugin, wait_s: float = 120) -> float:
        """Start ``plugin``; the seconds from its start to its complete pool published (and
        in ``timings["registered_s"]``, to the kubelet's registration of it, which it waits
        for too)."""
        assert self.current is None, f"{self.current and self.current.name} still runs"
        assert not self.slices(), "slices of the previous plugin left"
        # The other plugin's checkpoint is not this one's to read: ours and NVIDIA's both
        # keep checkpoint.json in the driver's plugin directory, and NVIDIA's exits 1 on
        # ours ("unable to get checkpoint: json: cannot unmarshal string into Go struct
        # field Checkpoint.checksum"). A node changing drivers is drained, and this set aside.
        if self.last not in (None, plugin.name) and self.plugin_data().exists():
            shutil.move(self.plugin_data(), self.root / f"data-{self.last}-{time.monotonic_ns()}")
        self.last = plugin.name
        started = time.monotonic()
        await plugin.start()
        self.current = plugin

        def ready() -> bool:
            if not plugin.alive():
                raise RuntimeError(f"{plugin.name} exited:\n{plugin.log()[-4000:]}")
            return bool(self.complete_pool())

        def registered() -> bool:
            if not plugin.alive():
                raise RuntimeError(f"{plugin.name} exited:\n{plugin.log()[-4000:]}")
            return plugin.registered()

        await self.cp.wait_for(f"{plugin.name}'s pool", ready, wait_s)
        pool = time.monotonic() - started
        await self.cp.wait_for(f"{plugin.name} registered by the kubelet", registered, wait_s)
        self.timings["registered_s"] = time.monotonic() - started
        return pool

    async def stop(self) -> None:
        """Stop the current plugin and remove its slices (a drained node, between drivers)."""
        plugin, self.current = self.current, None
        if plugin is None:
            return
        await plugin.stop()
        self.cp.raw("DELETE", SLICES)  # the collection, by the node's field selector
        for s in self.slices():
            self.cp.raw(
                "DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}"
            )
        await await_until("the slices gone", lambda: not self.slices(), 60)

    def plugin_data(self) -> Path:
        return self.node.kubelet_dir / "plugins" / DRIVER

    async def switch(self, plugin: Plugin) -> float:
        """``plugin`` in place of the current one, on a node with no claim prepared; returns
        :meth:`start`'s seconds."""
        await self.stop()
        return await self.start(plugin)

    # - workloads
    def ensure_namespace(self, ns: str = NS) -> None:
        self.cp.call("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
        }, ok=(201, 409))  # fmt: skip
        self.cp.call("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}},
        }, ok=(201, 409))  # fmt: skip

    def pod_body(self, name: str, command: str = "exec sleep 3600") -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
                "containers": [{
                    "name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": "gpu"}]},
                }],
            },
        }  # fmt: skip

    def pod(self, name: str, ns: str = NS) -> dict[str, Any]:
        code, body = self.cp.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return json.loads(body) if code == 200 else {}

    def pod_log(self, name: str) -> str:
        """What the pod's container ``c`` printed, from the kubelet's log files, timestamps cut."""
        meta = self.pod(name)["metadata"]
        base = self.node.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "c"
        return "".join(
            line.split(" ", 3)[-1] + "\n" for f in sorted(base.glob("*.log"))
            for line in f.read_text().splitlines()
        ).strip()  # fmt: skip

    def phase(self, name: str, ns: str = NS) -> str:
        return str(self.pod(name, ns).get("status", {}).get("phase", ""))

    def describe(self, name: str, ns: str = NS) -> str:
        """The pod's status and the namespace's events, for a failure message."""
        events = self.cp.call("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        said = [f"{e.get('reason')}: {e.get('message')}" for e in events
                if e.get("involvedObject", {}).get("name") == name]  # fmt: skip
        return f"status {json.dumps(self.pod(name, ns).get('status'))[:3000]}; events {said[-8:]}"

    async def run_pod(self, name: str, ns: str = NS, wait_s: float = 120) -> float:
        """Create a one-GPU pod and wait until it runs; the seconds from create to Running
        (polled every 20 ms: the pod's own timestamps have whole seconds only)."""
        body = self.pod_body(name)
        started = time.monotonic()
        self.cp.call("POST", f"/api/v1/namespaces/{ns}/pods", body)
        deadline = started + wait_s
        while (phase := self.phase(name, ns)) != "Running":
            if phase in ("Failed", "Succeeded") or time.monotonic() > deadline:
                raise RuntimeError(f"pod {ns}/{name} not Running: {self.describe(name, ns)}")
            await asyncio.sleep(0.02)
        return time.monotonic() - started

    def claims(self, ns: str = NS) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cp.call(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
        )["items"]
        return items

    def specs(self) -> list[Path]:
        """The CDI specs of claims on the node (both plugins name theirs after the claim)."""
        return [p for p in self.node.cdi_root.iterdir() if "claim" in p.name]

    async def delete_pod(self, name: str, ns: str = NS, wait_s: float = 120) -> None:
        """Delete the pod and wait until the kubelet has unprepared its claim (its CDI spec
        gone) and the claim controller has deleted the claim."""
        self.cp.raw("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
        await await_until(f"pod {name} gone", lambda: not self.pod(name, ns), wait_s)
        await await_until(f"{name}'s claim gone", lambda: not [
            c for c in self.claims(ns) if c["metadata"]["name"].startswith(f"{name}-")
        ], wait_s)  # fmt: skip
        await await_until("its CDI spec removed by unprepare", lambda: not self.specs(), wait_s)

    def kubelet_registrations(self) -> int:
        """How many plugin registrations the kubelet has started (its log, at --v=2)."""
        log = self.cp.root / "logs" / f"kubelet-{self.node.name}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return text.count("OperationExecutor.RegisterPlugin started")

    # - the kubelet's metrics
    def kubelet_port(self) -> int:
        return int(json.loads((self.node.root / "kubelet.yaml").read_text())["port"])

    def kubelet_metrics(self) -> str:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the kubelet's self-signed serving certificate
        pki = self.cp.pki
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        url = f"https://127.0.0.1:{self.kubelet_port()}/metrics"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
            return bytes(r.read()).decode()


@contextlib.asynccontextmanager
async def side_by_side(name: str = "sbs") -> AsyncIterator[SideBySide]:
    """A control plane and one real node with the simulated driver root of :data:`PROFILE`;
    no plugin started. Inside :mod:`tests.e2e.netns` only."""
    from driver.nvml.simulated import SimulatedNode
    from tests.simroot import install_driver_files

    why = missing()
    if why:
        raise RuntimeError(why)
    root = run_root() / name
    cp = ControlPlane(root, MINOR, node_lifecycle=True, eks=True)
    node = RealNode(cp, NODE, root / "n", images=(IMAGE, PLUGIN_POD_IMAGE), pod_network=True,
                    labels=(("node.kubernetes.io/instance-type", PROFILE),))  # fmt: skip
    try:
        await cp.start()
        install_chart(cp)
        cp.raw("DELETE", "/apis/resource.k8s.io/v1/deviceclasses/gpu.nvidia.com")
        cp.create(NVIDIA_CLASS)
        await node.start()
        driver_root = node.root / "nvidia"
        sim = SimulatedNode(PROFILE, NODE, driver_root)
        hardware = sim.nvml.render()
        install_driver_files(driver_root, sim.profile.driver_version, build.build_nvidia_ctk())
        shutil.copy2(cdi_hook(), driver_root / "usr" / "bin" / "nvidia-cdi-hook")
        side = SideBySide(node, driver_root, hardware, root)
        shutil.copyfile(BOOT_ID, side.boot_id)
        side.ensure_namespace()
        yield side
    finally:
        await cp.stop()
        unmount_under(cp.root)
