"""ComputeDomains on the real control plane: our controller, node driver and IMEX daemons.

The real kube-apiserver, kube-controller-manager (DaemonSet, resourceclaim and garbage
collector controllers) and kube-scheduler; the chart's CRDs, RBAC, admission policies and
DeviceClasses with ``computeDomains.enabled``; four simulated P6e-GB200 nodes in two NVLink
cliques (``gb-a1``, ``gb-a2`` on rack a; ``gb-b1``, ``gb-b2`` on rack b), each with a
``gpu-dra kubelet-plugin --compute-domains`` process; ``gpu-dra compute-domain-controller`` as a
process with the chart's ServiceAccount.

No node runs a kubelet here, so :class:`Kubelets` does its part for the pods bound to those
nodes, through the same gRPC calls and the same objects: it prepares each pod's claims on the
node's plugin (retrying a pending one, as the kubelet does), runs a daemon pod's container as
``gpu-dra compute-domain-daemon run`` with the environment the daemon claim's CDI spec gives and
the downward API would (its own loopback address as the pod IP, the stand-in IMEX, a token of
the daemon's ServiceAccount bound to its pod), probes it with ``check`` as the chart's
readiness probe does, restarts a container that dies, and on deletion stops the container,
unprepares and removes the pod. Everything else is the real thing: the DaemonSet controller
puts the daemon pods on the nodes our node driver labelled, the scheduler allocates the
channel and daemon claims, and the status is our controller's, from the cliques the daemons
write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from driver.nvml.profile import load_profile
from drivers.computedomain import names
from sandbox.kubeletsim import KubeletSim
from tests import cdnode, imexstandin
from tests.chart_render import NAMESPACE, render
from tests.e2e import build
from tests.e2e.cluster import ControlPlane, kubeconfig, run_root
from tests.e2e.kube import (
    await_until,
    node_object,
    patch_node_ready,
    plugin_dirs,
    plugin_token,
    service_account_token,
)
from tests.imexharness import loopback_block
from tests.pluginharness import PluginProcess
from tests.test_cdi import assert_valid_spec

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]

MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "charts" / "gpu-dra-driver" / "crds"
NODES = {"gb-a1": "rack-a", "gb-a2": "rack-a", "gb-b1": "rack-b", "gb-b2": "rack-b"}
TEAM = "team"
CDS = f"/apis/{names.GROUP}/{names.VERSION}"
VENDOR = "k8s.compute-domain.nvidia.com"
PROBE_PERIOD = 0.5  # the chart's readiness probe runs every 10 s; quicker here, same rule
RESTART_DELAY = 1.0  # the kubelet's first crash-loop backoff is 10 s
IMAGE = "gpu-dra-driver:e2e"  # the daemons' image: only named, the simulated kubelets run gpu-dra


@dataclass(frozen=True, slots=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str


@dataclass(slots=True)
class Running:
    """One pod as the simulated kubelet runs it."""

    pod: dict[str, Any]
    claims: list[ClaimRef] = field(default_factory=list)
    prepared: bool = False
    ip: str = ""
    proc: subprocess.Popen[bytes] | None = None
    ready: bool = False
    restarts: int = 0
    dir: Path = Path()
    edits: dict[str, Any] = field(default_factory=dict)  # CDI edits of its claims
    env: dict[str, str] = field(default_factory=dict)  # a daemon container's environment
    flags: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.pod["metadata"]["namespace"], self.pod["metadata"]["name"]

    @property
    def node(self) -> str:
        return str(self.pod["spec"]["nodeName"])

    @property
    def is_daemon(self) -> bool:
        return names.COMPUTE_DOMAIN_LABEL in (self.pod["metadata"].get("labels") or {})


class Kubelets:
    """The kubelet's part for every simulated node (see the module's docstring)."""

    def __init__(self, cp: ControlPlane, plugins: dict[str, PluginProcess]) -> None:
        self.cp = cp
        self.plugins = plugins
        self.sims: dict[str, KubeletSim] = {}
        self.pods: dict[tuple[str, str], Running] = {}
        self.addresses = iter(loopback_block(16))
        self.tasks: set[asyncio.Task[None]] = set()
        self.errors: list[str] = []

    async def start(self) -> None:
        for node, plugin in self.plugins.items():
            self.sims[node] = await KubeletSim.register(cdnode.cd_paths(plugin.dirs).registration)
        self._spawn(self._loop())

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for running in self.pods.values():
            self._kill(running)
        for sim in self.sims.values():
            await sim.close()

    async def _loop(self) -> None:
        while True:
            try:
                await self._round()
            except Exception as exc:  # a failed round is retried; the test reads the errors
                self.errors.append(repr(exc))
            await asyncio.sleep(0.2)

    async def _round(self) -> None:
        pods = await asyncio.to_thread(
            self.cp.call, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%21%3D"
        )
        seen = set()
        for pod in pods["items"]:
            if pod["spec"]["nodeName"] not in self.plugins or not pod["spec"].get("resourceClaims"):
                continue  # the plugins' own pods stand for processes the test runs
            key = pod["metadata"]["namespace"], pod["metadata"]["name"]
            seen.add(key)
            running = self.pods.get(key)
            if running is None or running.pod["metadata"]["uid"] != pod["metadata"]["uid"]:
                running = self.pods[key] = Running(pod)
                self._spawn(self._run(running))
            running.pod = pod
        for key in set(self.pods) - seen:
            self._kill(self.pods.pop(key))

    # ---- one pod ------------------------------------------------------------------------

    async def _run(self, running: Running) -> None:
        try:
            await self._lifecycle(running)
        except Exception as exc:
            self.errors.append(f"{running.key}: {exc!r}")
            raise

    async def _lifecycle(self, running: Running) -> None:
        while not await self._prepare(running):
            if running.pod["metadata"].get("deletionTimestamp"):
                break
            await asyncio.sleep(1.0)  # the kubelet retries a failed prepare
        if running.pod["metadata"].get("deletionTimestamp"):
            await self._terminate(running)
            return
        if running.is_daemon:
            running.ip = next(self.addresses)
            self._start_daemon(running)
        await self._status(running, ready=not running.is_daemon)
        while not running.pod["metadata"].get("deletionTimestamp"):
            if running.is_daemon:
                await self._probe(running)
            await asyncio.sleep(PROBE_PERIOD)
        await self._terminate(running)

    async def _prepare(self, running: Running) -> bool:
        if not running.claims:
            statuses = (running.pod.get("status") or {}).get("resourceClaimStatuses") or ()
            wanted = len(running.pod["spec"].get("resourceClaims") or ())
            if len(statuses) < wanted:
                return False
            ns = running.pod["metadata"]["namespace"]
            for status in statuses:
                claim = await asyncio.to_thread(
                    self.cp.call,
                    "GET",
                    f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{status['resourceClaimName']}",
                )
                if not (claim.get("status") or {}).get("allocation"):
                    return False
                running.claims.append(
                    ClaimRef(claim["metadata"]["uid"], ns, claim["metadata"]["name"])
                )
        result = await self.sims[running.node].prepare(running.claims)
        errors = [r.error for r in result.claims.values() if r.error]
        if errors:
            return False
        running.prepared = True
        cdi = self.plugins[running.node].dirs.cdi
        for ref in running.claims:
            spec = json.loads((cdi / f"{VENDOR}-claim_{ref.uid}.json").read_text())
            assert_valid_spec(spec)  # what containerd's CDI registry would refuse
            # A runtime applies the spec's edits with any of its devices, then the device's.
            for edits in (
                spec.get("containerEdits") or {},
                *(d["containerEdits"] for d in spec["devices"]),
            ):
                for key, value in edits.items():
                    running.edits.setdefault(key, []).extend(value)
        return True

    def _start_daemon(self, running: Running) -> None:
        env = dict(e.split("=", 1) for e in running.edits.get("env", ()))
        (imexd,) = [
            m["hostPath"] for m in running.edits["mounts"] if m["containerPath"] == "/imexd"
        ]
        meta = running.pod["metadata"]
        running.dir = self.cp.root / "daemons" / meta["name"]
        running.dir.mkdir(parents=True, exist_ok=True)
        imex, ctl = imexstandin.install(running.dir / "bin")
        hosts = running.dir / "hosts"
        hosts.write_text("127.0.0.1\tlocalhost\n")
        token = service_account_token(self.cp, names.DAEMON_SERVICE_ACCOUNT, running.pod)
        config = running.dir / "kubeconfig"
        config.write_text(kubeconfig(self.cp.server, self.cp.pki / "ca.crt", token=token))
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_DRA_", "POD_"))}
        running.env = {
            **base,
            **env,
            "PYTHONPATH": str(ROOT),
            "NODE_NAME": running.node,
            "POD_IP": running.ip,
            "POD_NAME": meta["name"],
            "POD_NAMESPACE": meta["namespace"],
            "POD_UID": meta["uid"],
            "KUBECONFIG": str(config),
            "IMEX_STANDIN_HOSTS": str(hosts),
            "IMEX_STANDIN_EVENTS": str(running.dir / "events"),
        }
        running.flags = [
            f"--imex-config-dir={imexd}",
            f"--hosts-file={hosts}",
            f"--nvidia-imex={imex}",
            f"--nvidia-imex-ctl={ctl}",
        ]
        self._exec(running)

    def _exec(self, running: Running) -> None:
        log = (running.dir / "daemon.log").open("ab")
        running.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "compute-domain-daemon", "run", *running.flags,
             "--nvml=simulated", f"--profile={cdnode.PROFILE}"],
            env=running.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True,  # a container: killing it kills IMEX too
        )  # fmt: skip

    async def _probe(self, running: Running) -> None:
        assert running.proc is not None
        if running.proc.poll() is not None:  # the container died: the kubelet restarts it
            await self._set_ready(running, False)
            await asyncio.sleep(RESTART_DELAY)
            running.restarts += 1
            self._exec(running)
            return
        check = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli", "compute-domain-daemon", "check", *running.flags,
            env=running.env, cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await self._set_ready(running, await check.wait() == 0)

    async def _set_ready(self, running: Running, ready: bool) -> None:
        if ready != running.ready:
            await self._status(running, ready=ready)

    async def _status(self, running: Running, *, ready: bool) -> None:
        running.ready = ready
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        condition = {"type": "Ready", "status": str(ready), "lastTransitionTime": now}
        status: dict[str, Any] = {"phase": "Running", "conditions": [condition]}
        if running.ip:
            status |= {"podIP": running.ip, "podIPs": [{"ip": running.ip}]}
        ns, name = running.key
        await asyncio.to_thread(
            self.cp.raw, "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
            {"status": status}, content_type="application/merge-patch+json",
        )  # fmt: skip

    async def _terminate(self, running: Running) -> None:
        if running.proc is not None:
            running.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(running.proc.wait, 30)
        if running.prepared:
            result = await self.sims[running.node].unprepare(running.claims)
            assert all(not r.error for r in result.claims.values()), result
        ns, name = running.key
        await asyncio.to_thread(
            self.cp.raw, "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
            {"gracePeriodSeconds": 0, "preconditions": {"uid": running.pod["metadata"]["uid"]}},
        )  # fmt: skip

    def _kill(self, running: Running) -> None:
        if running.proc is not None and running.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.proc.pid, signal.SIGKILL)
            running.proc.wait()

    def daemon(self, node: str) -> Running:
        (found,) = [r for r in self.pods.values() if r.is_daemon and r.node == node]
        return found


def _start_controller(cp: ControlPlane, config: Path) -> subprocess.Popen[bytes]:
    with (cp.root / "controller.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", "compute-domain-controller", f"--kubeconfig={config}",
             f"--driver-namespace={NAMESPACE}", f"--image={IMAGE}", "--pod-name=e2e"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip


@dataclass(slots=True)
class World:
    cp: ControlPlane
    kubelets: Kubelets
    plugins: dict[str, PluginProcess]
    controller: subprocess.Popen[bytes]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world() -> AsyncIterator[World]:
    async with ControlPlane(run_root() / f"gpu-dra-e2e-cd-{MINOR}", MINOR) as cp:
        for crd in sorted(CRDS.glob("*.yaml")):
            cp.create(yaml.safe_load(crd.read_text()))
        cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}})
        # The image the controller is started with below: the chart's policy admits only
        # DaemonSets of the chart's image.
        objects = render(
            (), ["computeDomains.enabled=true", f"image.tag={IMAGE.partition(':')[2]}"]
        )
        for obj in objects:
            if obj["kind"] not in ("Namespace", "DaemonSet", "Deployment"):
                cp.create(obj, NAMESPACE)
        (controller_sa,) = [
            o["spec"]["template"]["spec"]["serviceAccountName"]
            for o in objects
            if o["kind"] == "Deployment"
        ]
        await cp.wait_for(
            "computedomains served", lambda: cp.get(f"{CDS}/computedomains")[0] == 200, 60
        )
        plugins: dict[str, PluginProcess] = {}
        kubelets: Kubelets | None = None
        controller: subprocess.Popen[bytes] | None = None
        try:
            for node, rack in NODES.items():
                cp.create(node_object(node, load_profile(cdnode.PROFILE).name))
                patch_node_ready(cp, node)
                dirs, config = plugin_dirs(cp, node, plugin_token(cp, node))
                state = dirs.root / "fabric.yaml"
                state.write_text(f"fabricCluster: {rack}\n")
                plugins[node] = PluginProcess(
                    dirs, kubeconfig=config, node_name=node, profile=cdnode.PROFILE,
                    extra_env={"GPU_DRA_SIM_STATE": str(state), "POD_NAMESPACE": NAMESPACE},
                    extra_args=("--compute-domains", f"--driver-namespace={NAMESPACE}"),
                )  # fmt: skip
            for plugin in plugins.values():
                await plugin.wait_log("ComputeDomain driver ready", 120)
            config = cp.root / "controller.kubeconfig"
            token = service_account_token(cp, controller_sa)
            config.write_text(kubeconfig(cp.server, cp.pki / "ca.crt", token=token))
            controller = _start_controller(cp, config)
            kubelets = Kubelets(cp, plugins)
            await kubelets.start()
            yield World(cp, kubelets, plugins, controller)
        finally:
            if kubelets is not None:
                await kubelets.stop()
                print(f"\nsimulated kubelets' errors: {kubelets.errors or 'none'}")
            if controller is not None:
                controller.terminate()
                controller.wait(30)
            for plugin in plugins.values():
                await plugin.terminate()


def _domain(name: str, num_nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION, "kind": names.COMPUTE_DOMAIN_KIND,
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {"numNodes": num_nodes,
                 "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
    }  # fmt: skip


def _workload_pod(name: str, template: str, clique: str) -> dict[str, Any]:
    """A worker as AWS's example has it: the channel claim, and affinity to one clique."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": names.GPU_CLIQUE_NODE_LABEL,
                                "operator": "In",
                                "values": [clique],
                            }
                        ]
                    }
                ]
            }
        }
    }
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": TEAM},
        "spec": {"affinity": affinity,
                 "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": template}],
                 "containers": [{"name": "worker", "image": "busybox",
                                 "resources": {"claims": [{"name": "channel"}]}}]},
    }  # fmt: skip


def _get(cp: ControlPlane, path: str) -> dict[str, Any] | None:
    code, body = cp.get(path)
    return json.loads(body) if code == 200 else None


def _status(cp: ControlPlane, name: str) -> tuple[str, list[tuple[str, str]]]:
    found = _get(cp, f"{CDS}/namespaces/{TEAM}/computedomains/{name}") or {}
    status = found.get("status") or {}
    nodes = sorted((n["name"], n.get("status", "")) for n in status.get("nodes") or ())
    return status.get("status", ""), nodes


def _node_label(cp: ControlPlane, node: str) -> str | None:
    labels = cp.call("GET", f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
    value = labels.get(names.COMPUTE_DOMAIN_LABEL)
    return str(value) if value is not None else None


async def test_a_domain_of_two_nodes_gets_its_daemons_ready_and_its_workers_channel_0(
    world: World,
) -> None:
    cp, kubelets = world.cp, world.kubelets
    made = cp.create(_domain("train", 2))
    uid = made["metadata"]["uid"]
    rack_a = cdnode.clique_id("rack-a")
    # The node driver labels each node with its clique, as GPU Feature Discovery would.
    await await_until(
        "clique labels",
        lambda: all(
            cp.call("GET", f"/api/v1/nodes/{n}")["metadata"]["labels"].get(
                names.GPU_CLIQUE_NODE_LABEL
            )
            == cdnode.clique_id(rack)
            for n, rack in NODES.items()
        ),
        60,
    )
    await await_until(
        "the workload claim template",
        lambda: _get(
            cp, f"/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaimtemplates/train-channel"
        ),
        60,
    )
    started = time.monotonic()
    for i in range(2):
        cp.create(_workload_pod(f"worker-{i}", "train-channel", rack_a))

    def workers_running() -> bool:
        return all(
            (r := kubelets.pods.get((TEAM, f"worker-{i}"))) is not None and r.ready
            for i in range(2)
        )

    await await_until("both workers prepared and running", workers_running, 240)
    elapsed = time.monotonic() - started
    workers = [kubelets.pods[(TEAM, f"worker-{i}")] for i in range(2)]
    assert sorted(w.node for w in workers) == ["gb-a1", "gb-a2"]  # channel-0 is one per node
    for worker in workers:
        (node,) = worker.edits["deviceNodes"]
        assert (node["path"], node["major"], node["minor"]) == (
            "/dev/nvidia-caps-imex-channels/channel0",
            cdnode.IMEX_CHANNELS_MAJOR,
            0,
        )
        assert _node_label(cp, worker.node) == uid
    # The DaemonSet controller ran a daemon on each labelled node, and on no other.
    assert sorted(r.node for r in kubelets.pods.values() if r.is_daemon) == ["gb-a1", "gb-a2"]
    await await_until(
        "the domain Ready",
        lambda: _status(cp, "train") == ("Ready", [("gb-a1", "Ready"), ("gb-a2", "Ready")]),
        60,
    )
    clique = cp.call(
        "GET", f"{CDS}/namespaces/{NAMESPACE}/computedomaincliques/{names.clique_name(uid, rack_a)}"
    )
    assert sorted(d["nodeName"] for d in clique["daemons"]) == ["gb-a1", "gb-a2"]
    assert sorted(d["index"] for d in clique["daemons"]) == [0, 1]  # the order they joined in
    assert {o["name"] for o in clique["metadata"]["ownerReferences"]} == {
        kubelets.daemon(n).key[1] for n in ("gb-a1", "gb-a2")
    }
    daemons = [kubelets.daemon(n) for n in ("gb-a1", "gb-a2")]
    addresses = {d.ip for d in daemons}
    for daemon in daemons:
        mapped = imexstandin.resolve(
            [names.daemon_dns_name(i) for i in range(2)], (daemon.dir / "hosts").read_text()
        )
        assert set(mapped.values()) == addresses
    print(f"\nComputeDomain of 2 nodes: workers created to both running {elapsed:.1f} s")


async def test_status_follows_a_daemon_killed_and_restarted(world: World) -> None:
    cp, kubelets = world.cp, world.kubelets
    await await_until("the domain Ready", lambda: _status(cp, "train")[0] == "Ready", 120)
    victim = kubelets.daemon("gb-a2")
    restarts = victim.restarts
    assert victim.proc is not None
    killed = time.monotonic()
    os.killpg(victim.proc.pid, signal.SIGKILL)
    await await_until("NotReady", lambda: _status(cp, "train")[0] == "NotReady", 60)
    not_ready = time.monotonic() - killed
    await await_until("Ready again", lambda: _status(cp, "train")[0] == "Ready", 120)
    ready = time.monotonic() - killed
    assert victim.restarts == restarts + 1
    print(
        f"\nkill -9 of one daemon: domain NotReady after {not_ready:.1f} s, Ready again after "
        f"{ready:.1f} s (probe period {PROBE_PERIOD} s, restart delay {RESTART_DELAY} s)"
    )


async def test_a_domain_of_zero_nodes_is_ready_without_daemons(world: World) -> None:
    cp = world.cp
    cp.create(_domain("empty", 0))
    await await_until("Ready", lambda: _status(cp, "empty") == ("Ready", []), 60)
    uid = cp.call("GET", f"{CDS}/namespaces/{TEAM}/computedomains/empty")["metadata"]["uid"]
    ds = _get(cp, f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{names.daemon_name(uid)}")
    assert ds is not None and ds["spec"]["template"]["spec"]["nodeSelector"] == {
        names.COMPUTE_DOMAIN_LABEL: uid
    }


async def test_deleting_the_domains_leaves_nothing(world: World) -> None:
    cp, kubelets = world.cp, world.kubelets
    uids = [
        cp.call("GET", f"{CDS}/namespaces/{TEAM}/computedomains/{n}")["metadata"]["uid"]
        for n in ("train", "empty")
    ]
    for i in range(2):
        cp.raw("DELETE", f"/api/v1/namespaces/{TEAM}/pods/worker-{i}")
    for name in ("train", "empty"):
        cp.raw("DELETE", f"{CDS}/namespaces/{TEAM}/computedomains/{name}")

    def leftovers() -> list[str]:
        found = []
        for path in (
            f"{CDS}/namespaces/{TEAM}/computedomains",
            f"{CDS}/namespaces/{NAMESPACE}/computedomaincliques",
            f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets",
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
            f"/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaimtemplates",
            f"/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaims",
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
            f"/api/v1/namespaces/{TEAM}/pods",
        ):
            found += [f"{path}/{o['metadata']['name']}" for o in cp.call("GET", path)["items"]]
        daemon_pods = cp.call(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={names.COMPUTE_DOMAIN_LABEL}"
        )["items"]
        found += [f"daemon pod {p['metadata']['name']}" for p in daemon_pods]
        found += [f"label on {n}" for n in NODES if _node_label(cp, n) is not None]
        return found

    with contextlib.suppress(TimeoutError):
        await await_until("nothing left", lambda: not leftovers(), 180)
    left = leftovers()
    assert not left, f"left behind: {left}; the simulated kubelets' errors: {kubelets.errors}"
    for node, plugin in world.plugins.items():
        specs = [p.name for p in plugin.dirs.cdi.glob(f"{VENDOR}-*")]
        domains = plugin.dirs.plugins / names.DRIVER_NAME / "domains"
        left = [p.name for p in domains.iterdir()] if domains.exists() else []
        assert (specs, left) == ([], []), node
        assert not any(u in p for u in uids for p in left)
    assert kubelets.errors == []
