"""Level 3: installed as users install it (:mod:`tests.e2e.installed`).

The real DaemonSet controller creates the plugin's pod, the real kubelet runs it from the
image under the chart's securityContext and probes, and workload pods from
``charts/examples/`` get devices it prepared.
Runs inside :mod:`tests.e2e.netns` (``make e2e`` does that); elsewhere it is skipped.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import json
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.chart_render import NAMESPACE
from tests.e2e.cluster import ControlPlane
from tests.e2e.installed import (
    CHART,
    LEVEL3,
    MINOR,
    NODE,
    RELEASE,
    TAGS,
    VERSION,
    Installed,
    create_namespace,
    holder,
    json_lines,
    ready,
    simulated_node,
)
from tests.e2e.kube import DRIVER, as_pod, await_until, wait_until
from tests.e2e.node import RealNode
from tests.e2e.workloads import (
    delete_namespace_claims,
    example_docs,
    get_pod,
    reports,
    run_example,
    runnable,
    spec_files,
)
from tests.standin import StandIn
from tests.test_timeslicing import sliced

pytestmark = [*LEVEL3, pytest.mark.timeout(1800)]

# Whole GPUs: MIG devices are level 2's. With NVML "system" the plugin runs nvidia-ctk,
# which reads the MIG capability minors from the kernel's /proc/driver/nvidia-caps, and a
# simulated node has no kernel files the pod's /proc could show.
PROFILE = "p4d.24xlarge"
GPUS = 8


# The image has no shell (a real nvidia-smi is an ELF binary): level 2's stand-ins, in the
# image's Python. Each call is one line of {log}. The MPS daemon runs until SIGTERM or a
# `quit`, which reaches it through its pipe directory as the real one's does: the daemon's
# pod is in the host's PID namespace, the plugin that sends `quit` is not.
SMI = """#!/usr/bin/python3
import sys
with open("{log}", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
"""
MPS_CONTROL = """#!/usr/bin/python3
import os, signal, sys, time
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
if sys.argv[1:] == ["-f"]:
    line = "-f CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "") + "\\n"
    try:  # the daemon's pod mounts no log of the stand-ins
        with open("{log}", "a") as log:
            log.write(line)
    except OSError:
        pass
    # As the real one (drivers.gpu.kinds.mpspaths): a socket over 106 bytes, exit 1, silent.
    open(os.path.join(pipe, "control_lock"), "a").close()
    if len(os.fsencode(os.path.join(pipe, "control_privileged"))) > 106:
        sys.exit(1)
    if os.path.exists(os.path.join(pipe, "quit")):  # a quit that found no daemon
        os.unlink(os.path.join(pipe, "quit"))
    with open(os.path.join(pipe, "daemon.pid"), "w") as f:
        f.write(str(os.getpid()))
    open(os.path.join(pipe, "control"), "w").close()
    def stop(*_):
        os.unlink(os.path.join(pipe, "control"))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    while not os.path.exists(os.path.join(pipe, "quit")):
        time.sleep(0.05)
    os.unlink(os.path.join(pipe, "quit"))
    stop()
command = sys.stdin.readline().strip()
with open("{log}", "a") as log:
    log.write(command + "\\n")
if command == "quit":
    open(os.path.join(pipe, "quit"), "w").close()
"""


@dataclass
class GpuNode(Installed):
    smi: StandIn


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def installed() -> AsyncIterator[GpuNode]:
    async with simulated_node(f"l3-{MINOR}", PROFILE) as node:
        # nvidia-smi and nvidia-cuda-mps-control stand-ins where the driver installs them;
        # their calls go to a directory the plugin pod sees at the host's path.
        logs = node.node.kubelet_dir / "plugins" / "e2e-stand-ins"
        smi = StandIn(logs / "smi", "nvidia-smi", SMI)
        control = StandIn(logs / "mps", "nvidia-cuda-mps-control", MPS_CONTROL)
        for tool in (smi, control):
            shutil.copy2(tool.path, node.driver_root / "usr" / "bin" / tool.path.name)
        yield GpuNode(node.node, node.helm, node.driver_root, smi)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def release(installed: GpuNode) -> AsyncIterator[GpuNode]:
    create_namespace(installed.cp)
    await installed.install()
    yield installed


async def test_the_daemonsets_pod_registers_and_publishes_from_the_image(
    release: GpuNode,
) -> None:
    (pod,) = release.ready_pods()
    await await_until(f"{GPUS} devices published", lambda: release.published() == GPUS, 60)
    status = pod["status"]
    (container,) = status["containerStatuses"]
    assert container["ready"] and container["restartCount"] == 0
    assert container["image"].endswith(f"gpu-dra-driver:{VERSION}")
    assert status["podIP"].startswith("10.244.0."), status  # the pod network, not the host's
    lines = json_lines(release.pod_log(pod))
    loaded = [d for d in lines if d.get("msg") == "NVML library loaded"]
    assert loaded and loaded[0]["path"].startswith("/driver-root/usr/lib64/libnvidia-ml.so"), lines
    assert any(d.get("msg") == "registered with the kubelet" for d in lines)
    assert any(d.get("msg") == "slices published" for d in lines)
    for d in (*loaded[:1], *(d for d in lines if d.get("msg") in (
            "registered with the kubelet", "slices published"))):  # fmt: skip
        print("plugin pod:", json.dumps(d))


def _host_paths_only(specs: list[Path], driver_root: Path) -> None:
    """The pod's CDI specs name the host's paths (the runtime reads them on the host), each
    device node under the host driver root and there."""
    assert specs
    for spec in specs:
        text = spec.read_text()
        assert "/driver-root" not in text, text  # the pod's mount point of driver_root
        for device in json.loads(text)["devices"]:
            for dn in device["containerEdits"].get("deviceNodes") or []:
                host = Path(dn.get("hostPath") or dn["path"])
                assert host.is_relative_to(driver_root), dn
                assert host.exists(), dn


async def test_workload_pods_get_devices_the_pod_prepared(release: GpuNode) -> None:
    cp, node = release.cp, release.node
    # The spec of a claim whose pod runs (the kubelet unprepares once a pod has finished).
    await asyncio.to_thread(_start_holder, cp, "held")
    _host_paths_only(spec_files(node), release.driver_root)
    # The claim says which GPU it got: written by the DaemonSet's pod, through the chart's
    # grants and its node-bound token (the API server checks resourceclaims/driver from 1.36).
    entry = await await_until("the claim's status.devices", partial(_device_status, cp, "held"), 60)
    assert entry["driver"] == DRIVER and entry["data"]["kind"] == "gpu", entry
    assert entry["data"]["attributes"]["uuid"].startswith("GPU-"), entry
    assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")], entry
    await delete_namespace_claims(cp, "held")
    (pod,) = await run_example(cp, "single", "single-gpu.yaml", host_network=False)
    (report,) = reports(pod).values()
    assert report["uuids"].startswith("GPU-") and "nvidiactl" in report["devices"].split()
    await delete_namespace_claims(cp, "single")
    await await_until("spec removed by unprepare", lambda: not spec_files(node), 60)
    (pod,) = await run_example(cp, "two-containers", "shared-gpu-two-containers.yaml",
                               host_network=False)  # fmt: skip
    first, second = reports(pod).values()
    assert first["uuids"] == second["uuids"] and len(first["uuids"].split(",")) == 1
    await delete_namespace_claims(cp, "two-containers")
    pods = await run_example(cp, "two-pods", "shared-claim-two-pods.yaml", host_network=False)
    assert len({r["uuids"] for p in pods for r in reports(p).values()}) == 1
    await delete_namespace_claims(cp, "two-pods")
    await await_until("specs removed by unprepare", lambda: not spec_files(node), 60)


# -- upgrade and rollback ----------------------------------------------------------------


@dataclass
class Prober:
    """A one-GPU pod every 2 s, each deleted once it finished, and the node's slices polled
    meanwhile: what users and the scheduler see during an upgrade."""

    cp: ControlPlane
    ns: str
    period: float = 2.0
    created: int = 0
    succeeded: int = 0
    failed: list[str] = field(default_factory=list)
    slice_uids: set[str] = field(default_factory=set)
    vanished: set[str] = field(default_factory=set)  # slice UIDs seen, then gone
    fewest_devices: int = GPUS
    stop: threading.Event = field(default_factory=threading.Event)

    def setup(self) -> None:
        self.cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})
        wait_until(f"default SA in {self.ns}", lambda: self.cp.raw(
            "GET", f"/api/v1/namespaces/{self.ns}/serviceaccounts/default")[0] == 200)  # fmt: skip
        (template,) = [d for d in example_docs("single-gpu.yaml") if d["kind"] != "Pod"]
        self.cp.create(template, self.ns)

    def run(self) -> None:
        (pod,) = [d for d in example_docs("single-gpu.yaml") if d["kind"] == "Pod"]
        pending: set[str] = set()
        next_at = 0.0
        while not self.stop.is_set() or pending:
            if not self.stop.is_set() and time.monotonic() >= next_at:
                probe = runnable(pod, host_network=False)
                probe["metadata"]["name"] = f"probe-{self.created}"
                self.cp.create(probe, self.ns)
                pending.add(probe["metadata"]["name"])
                self.created += 1
                next_at = time.monotonic() + self.period
            for name in sorted(pending):
                status = get_pod(self.cp, self.ns, name).get("status", {})
                if status.get("phase") == "Succeeded":
                    self.succeeded += 1
                elif status.get("phase") == "Failed":
                    self.failed.append(f"{name}: {json.dumps(status)[:600]}")
                else:
                    continue
                pending.discard(name)
                self.cp.raw("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}"
                            "?gracePeriodSeconds=0")  # fmt: skip
            self._poll_slices()
            time.sleep(0.2)

    def _poll_slices(self) -> None:
        slices = self.cp.call(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{NODE}"
        )["items"]
        uids = {s["metadata"]["uid"] for s in slices}
        self.vanished |= self.slice_uids - uids
        self.slice_uids |= uids
        # A pool is complete when every slice of its generation is there.
        devices = sum(len(s["spec"].get("devices") or []) for s in slices)
        self.fewest_devices = min(self.fewest_devices, devices)

    def failed_prepares(self) -> list[str]:
        events = self.cp.call("GET", f"/api/v1/namespaces/{self.ns}/events")["items"]
        said = [f"{e.get('reason')}: {e.get('message')}" for e in events]
        return [m for m in said if "prepare" in m.lower()]


def _inside(marker: str) -> dict[str, Any]:
    """What the container marked ``marker`` sees, read through its /proc from the host: its
    GPU env and its /dev/nvidia* nodes."""
    found = holder(marker)
    if found is None:
        return {}
    entry, env = found
    with contextlib.suppress(OSError):
        devices = sorted(p.name for p in (entry / "root" / "dev").iterdir()
                         if p.name.startswith("nvidia"))  # fmt: skip
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "")
        seen: dict[str, Any] = {"uuids": env.get("GPU_DRA_VISIBLE_GPU_UUIDS", ""),
                                "devices": devices, "mps_pipe": pipe}  # fmt: skip
        if pipe:  # what an MPS client reaches: its server's control pipe, and which one
            inside = entry / "root" / pipe.lstrip("/")
            seen["mps_control"] = (inside / "control").exists()
            with contextlib.suppress(OSError, ValueError):
                seen["mps_daemon_pid"] = int((inside / "daemon.pid").read_text())
        return seen
    return {}


def _device_status(cp: ControlPlane, ns: str) -> dict[str, Any] | None:
    """The one status.devices entry of the one claim in ``ns``, once written."""
    (claim,) = cp.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
    entries = (claim.get("status") or {}).get("devices") or []
    return dict(entries[0]) if len(entries) == 1 else None


def _start_holder(cp: ControlPlane, ns: str, example: str = "single-gpu.yaml") -> str:
    """A pod of ``example`` that keeps its claim while it runs; the claim's UID."""
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_until(f"default SA in {ns}", lambda: cp.raw(
        "GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200)  # fmt: skip
    docs = example_docs(example)
    claims = [d for d in docs if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate")]
    workload = next(d for d in docs if d["kind"] not in ("ResourceClaim", "ResourceClaimTemplate"))
    for claim in claims:
        cp.create(claim, ns)
    pod = runnable(as_pod(workload), host_network=False)
    pod["metadata"] = {"name": "holder"}
    (container, *_) = pod["spec"]["containers"]
    container["command"] = ["sh", "-c", "exec sleep 3600"]
    container["env"] = [*container.get("env", []), {"name": "HOLDER", "value": ns}]
    cp.create(pod, ns)
    try:
        wait_until(f"{ns}/holder running", lambda: get_pod(cp, ns, "holder").get(
            "status", {}).get("phase") == "Running", 120)  # fmt: skip
    except TimeoutError as exc:
        events = cp.call("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        said = [f"{e.get('reason')}: {e.get('message')}" for e in events]
        status = get_pod(cp, ns, "holder").get("status")
        raise TimeoutError(f"{exc}: {json.dumps(status)[:1500]}; events {said}") from exc
    wait_until(f"{ns}/holder seen", lambda: _inside(ns), 30)
    (claim,) = cp.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
    return str(claim["metadata"]["uid"])


def mps_pods(cp: ControlPlane) -> list[tuple[str, str, str]]:
    """(name, uid, phase) of the MPS control daemon pods in the driver's namespace."""
    items = cp.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector="
                    "app.kubernetes.io/component%3Dmps-control-daemon")["items"]  # fmt: skip
    return sorted((p["metadata"]["name"], p["metadata"]["uid"], p["status"].get("phase", ""))
                  for p in items)  # fmt: skip


def mps_daemons() -> dict[str, int]:
    """GPU UUID -> host PID of its MPS control daemon (the stand-in, run by a plugin pod),
    read from the host's /proc: a daemon's own pid file names its pod's PID namespace."""
    found = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(a.endswith(b"/nvidia-cuda-mps-control") for a in argv) or b"-f" not in argv:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            for kv in (entry / "environ").read_bytes().split(b"\0"):
                if kv.startswith(b"CUDA_VISIBLE_DEVICES=") and state != "Z":
                    found[kv.split(b"=", 1)[1].decode()] = int(entry.name)
    return found


_CONNECTION = re.compile(
    r'^I(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2}\.\d+) .*"Connection changed".*'
    r'driverName="gpu\.nvidia\.com" endpoint="([^"]+)" connected=(true|false)'
)


def _connections(node: RealNode, since: float) -> list[tuple[float, str, bool]]:
    """(time, endpoint, connected) of the kubelet's DRA connections to our driver's plugins,
    from its log (klog: month, day and UTC time)."""
    out = []
    year = time.gmtime(since).tm_year
    for line in (node.cp.root / "logs" / f"kubelet-{node.name}.log").read_text().splitlines():
        m = _CONNECTION.match(line)
        if m:
            whole = time.strptime(f"{year} {m[1]} {m[2]} {m[3]} {m[4]}", "%Y %m %d %H %M")
            at = calendar.timegm(whole) + float(m[5])
            if at >= since:
                out.append((at, Path(m[6]).name, m[7] == "true"))
    return out


def longest_gap(events: list[tuple[float, str, bool]], connected: set[str]) -> float:
    """The longest time with no plugin connected, from ``connected`` at the start."""
    now, gap, since = set(connected), 0.0, None
    for at, endpoint, up in sorted(events):
        (now.add if up else now.discard)(endpoint)
        if not now and since is None:
            since = at
        elif now and since is not None:
            gap, since = max(gap, at - since), None
    return gap if since is None else float("inf")


def _orphans(release: GpuNode) -> list[str]:
    """Specs, reservations and claim records left on the node: none once every claim ended."""
    plugin = release.node.kubelet_dir / "plugins" / "gpu.nvidia.com"
    left = [p.name for p in spec_files(release.node)]
    for sub in ("devices", "claims"):
        # A reservation is a symlink to "<uid>:<namespace>:<name>", dangling by design.
        left += [f"{sub}/{p.name}" for p in (plugin / sub).glob("*")
                 if p.is_symlink() or p.is_file()]  # fmt: skip
    return left


async def _roll(release: GpuNode, tag: str, *helm: str) -> dict[str, Any]:
    """Run ``helm`` with a prober, a holder pod and the slices watched; the figures."""
    cp, node = release.cp, release.node
    holder_ns = f"held-{tag.replace('.', '-')}"
    claim_uid = await asyncio.to_thread(_start_holder, cp, holder_ns)
    before = _inside(holder_ns)
    # Claims with side effects: an MPS daemon, a GPU's time slice (nvidia-smi's calls).
    mps_ns, sliced_ns = f"{holder_ns}-mps", f"{holder_ns}-sliced"
    await asyncio.to_thread(_start_holder, cp, mps_ns, "mps-memory-limit.yaml")
    await asyncio.to_thread(_start_holder, cp, sliced_ns, "time-sliced-gpu-two-pods.yaml")
    mps_gpu, sliced_gpu = _inside(mps_ns)["uuids"], _inside(sliced_ns)["uuids"]
    release.smi.calls()
    mps_before, mps_pods_before = mps_daemons(), mps_pods(cp)
    mps_client_before = _inside(mps_ns)
    (old,) = release.ready_pods()
    prober = Prober(cp, f"probe-{tag.replace('.', '-')}")
    await asyncio.to_thread(prober.setup)
    worker = threading.Thread(target=prober.run, daemon=True)
    started = time.time()
    worker.start()
    try:
        await asyncio.to_thread(release.run_helm, *helm)

        def rolled() -> bool:
            pods = release.pods()
            return len(pods) == 1 and ready(pods[0]) and pods[0]["spec"]["containers"][0][
                "image"].endswith(f":{tag}")  # fmt: skip

        await await_until(f"the DaemonSet rolled to {tag}", rolled, 300)
        created = prober.created
        await await_until("three more probes", lambda: prober.succeeded >= created + 3, 120)
    finally:
        prober.stop.set()
        await asyncio.to_thread(worker.join, 240)
    (new,) = release.ready_pods()
    after = _inside(holder_ns)  # the old plugin pod is gone now
    mps_after, mps_pods_after = mps_daemons(), mps_pods(cp)
    mps_client_after = _inside(mps_ns)
    smi_during = [c for c in release.smi.calls() if sliced_gpu in c]
    for ns in (mps_ns, sliced_ns):
        await delete_namespace_claims(cp, ns)
    cp.raw("DELETE", f"/api/v1/namespaces/{holder_ns}/pods/holder?gracePeriodSeconds=0")

    def unprepared() -> bool:
        return any(d.get("msg") == "unprepare" and d.get("claim_uid") == claim_uid
                   and d.get("outcome") == "unprepared"
                   for d in json_lines(release.pod_log(new)))  # fmt: skip

    await await_until("the holder's claim unprepared by the new pod", unprepared, 120)
    await delete_namespace_claims(cp, holder_ns)
    await delete_namespace_claims(cp, prober.ns)
    await await_until("no spec left", lambda: not spec_files(node), 60)
    # The spec goes first at unprepare; the daemon's pod is deleted after it.
    await await_until("no MPS daemon pod left", lambda: not mps_pods(cp), 60)
    # An MPS claim's record and reservation go after its daemon's pod: wait for them, and
    # report what is still there after a minute.
    with contextlib.suppress(TimeoutError):
        await await_until("no record or reservation left", lambda: not _orphans(release), 60)
    return {
        "old_pod": old["metadata"]["name"], "new_pod": new["metadata"]["name"],
        "probes": prober.created, "probes_ok": prober.succeeded, "probes_failed": prober.failed,
        "failed_prepares": prober.failed_prepares(), "slices_deleted": len(prober.vanished),
        "fewest_devices": prober.fewest_devices, "before": before, "after": after,
        "connections": (events := _connections(node, started)),
        "longest_gap_s": longest_gap(events, {f"dra-{old['metadata']['uid']}.sock"}),
        "orphans": _orphans(release),
        "mps_daemon": {"gpu": mps_gpu, "before": mps_before.get(mps_gpu),
                       "after_old_pod_gone": mps_after.get(mps_gpu),
                       "pods_before": mps_pods_before, "pods_after": mps_pods_after,
                       "client_before": mps_client_before, "client_after": mps_client_after},
        "before_sliced": sliced_gpu,
        "time_slice_calls_during": smi_during,
        "time_slice_reset_after": [c for c in release.smi.calls() if sliced_gpu in c],
    }  # fmt: skip


ROLLS: dict[str, dict[str, Any]] = {}  # the figures of the upgrade and the rollback


async def test_helm_upgrade_then_rollback_keep_claims_and_the_pool(release: GpuNode) -> None:
    ROLLS["upgrade"] = upgrade = await _roll(
        release, TAGS[1], "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
        "--set", f"image.tag={TAGS[1]}",
    )  # fmt: skip
    ROLLS["rollback"] = rollback = await _roll(
        release, TAGS[0], "rollback", RELEASE, "1", "-n", NAMESPACE
    )
    for name, got in (("upgrade", upgrade), ("rollback", rollback)):
        print(name, json.dumps(got, indent=1))
        assert got["probes_failed"] == [] and got["failed_prepares"] == [], got
        assert got["probes_ok"] >= 3
        assert got["slices_deleted"] == 0 and got["fewest_devices"] == GPUS, got
        assert got["before"]["uuids"].startswith("GPU-") and got["after"] == got["before"], got
        assert got["old_pod"] != got["new_pod"]
        # The new pod's socket connected before the old one's went: never no plugin.
        assert got["longest_gap_s"] == 0 and len(got["connections"]) >= 2, got
        assert got["orphans"] == [], got
        # The time slice set at prepare is kept through the upgrade, reset at unprepare.
        assert got["time_slice_calls_during"] == [], got
        assert got["time_slice_reset_after"] == sliced(got["before_sliced"], 0), got
        assert got["mps_daemon"]["before"] and got["mps_daemon"]["after_old_pod_gone"], got


async def test_an_mps_daemon_outlives_the_plugin_pod_that_started_it() -> None:
    """The daemon is a pod of its own (the chart's kubeletPlugin.mpsDaemon=pod): the same
    process (host PID) and pod through the upgrade and the rollback, its client still
    reaching its control pipe after the plugin pod that started it is gone."""
    if not ROLLS:
        pytest.skip("needs the figures of test_helm_upgrade_then_rollback_keep_claims_and_the_pool")
    for name, got in ROLLS.items():
        daemon = got["mps_daemon"]
        assert daemon["after_old_pod_gone"] == daemon["before"], (name, daemon)  # the same PID
        (pod,) = daemon["pods_before"]  # (name, uid, phase): the same pod, still running
        (after,) = daemon["pods_after"]
        assert after[:2] == pod[:2] and after[2] == "Running", (name, daemon)
        client = daemon["client_after"]
        assert client["mps_control"] and client == daemon["client_before"], (name, daemon)
        assert client["mps_daemon_pid"] == daemon["before"], (name, daemon)


async def test_helm_uninstall_with_a_gpu_pod_running(release: GpuNode) -> None:
    """What uninstall leaves, 35 s after the plugin pods are gone (the kubelet removes a
    driver's slices 30 s after its last plugin deregistered); the README's cleanup step."""
    cp, node = release.cp, release.node
    claim_uid = await asyncio.to_thread(_start_holder, cp, "held-uninstall")
    release.run_helm("uninstall", RELEASE, "-n", NAMESPACE)
    await await_until("the plugin pods gone", lambda: not release.pods(), 120)
    gone = time.monotonic()
    await await_until("the kubelet wiped the slices", lambda: release.published() == 0, 60)
    # An observation window, not a wait for a state: what is left once the kubelet's own
    # grace period has passed.
    await asyncio.sleep(max(0.0, 35 - (time.monotonic() - gone)))
    classes = cp.call("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    slices = cp.call("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    holder = get_pod(cp, "held-uninstall", "holder")
    crds = cp.call("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
    plugin_dir = node.kubelet_dir / "plugins" / "gpu.nvidia.com"
    files = sorted(str(p.relative_to(plugin_dir)) for p in plugin_dir.rglob("*") if not p.is_dir())
    left = {
        "slices": len(slices),
        "device_classes": [c["metadata"]["name"] for c in classes],
        "namespace": cp.raw("GET", f"/api/v1/namespaces/{NAMESPACE}")[0] == 200,
        "specs": [p.name for p in spec_files(node)],
        "plugin_dir": files,
        "crds": sorted(c["metadata"]["name"] for c in crds),
        "holder": holder["status"]["phase"],
        "holder_sees": _inside("held-uninstall"),
    }
    print("left after uninstall:", json.dumps(left, indent=1))
    assert left["slices"] == 0 and left["device_classes"] == []
    assert left["namespace"]  # created before install, as the README has users do
    # Helm installs crds/ once and never deletes them: the README's step removes them.
    assert left["crds"] == ["computedomaincliques.resource.nvidia.com",
                            "computedomains.resource.nvidia.com"], left  # fmt: skip
    # The running pod keeps its devices; its claim's spec and record stay on the node until
    # the README's cleanup (drain first, then remove them).
    assert left["holder"] == "Running" and left["holder_sees"]["uuids"].startswith("GPU-")
    assert any(claim_uid in name for name in left["specs"]), left
    assert any(f.startswith("devices/") for f in files), left  # its GPU's reservation


# -- a driver root without NVML, and none at all -----------------------------------------


async def test_an_empty_driver_root_keeps_the_pod_unready_without_restarts(
    release: GpuNode,
) -> None:
    """After the uninstall above: installed again over a driver root with no NVIDIA driver
    (the AMI without its driver, or the wrong nvidiaDriverRoot). The pod stays Running and
    unready, is not restarted (the liveness service answers), and says why in one line."""
    empty = release.node.root / "empty-root"
    empty.mkdir(exist_ok=True)
    values = [v if not v.startswith("nvidiaDriverRoot=") else f"nvidiaDriverRoot={empty}"
              for v in release.node_values()]  # fmt: skip
    release.run_helm("install", RELEASE, str(CHART), "-n", NAMESPACE,
                     "-f", str(CHART / "values-eks.yaml"), *values)  # fmt: skip

    def said_why() -> list[dict[str, Any]]:
        pods = release.pods()
        if len(pods) != 1:
            return []
        return [d for d in json_lines(release.pod_log(pods[0]))
                if "not found under the driver root" in str(d.get("msg"))]  # fmt: skip

    (line, *_) = await await_until("the plugin says why it is not ready", said_why, 120)
    print("empty driver root:", json.dumps(line))
    assert "/driver-root/usr/lib64/libnvidia-ml.so.1" in line["msg"]  # every path tried
    # Its log can come before the kubelet's status update says Running.
    await await_until("the pod Running", lambda: release.pods()[0]["status"].get(
        "phase") == "Running", 60)  # fmt: skip
    # Three liveness periods (10 s each, the chart's default) with the pod unready: a
    # liveness probe that failed would have restarted it by now.
    deadline = time.monotonic() + 35
    while time.monotonic() < deadline:
        (pod,) = release.pods()
        status = pod["status"]
        assert status["phase"] == "Running" and not ready(pod), status
        assert status["containerStatuses"][0]["restartCount"] == 0, status
        await asyncio.sleep(1)
    assert len(said_why()) == 1  # one line per distinct problem, not one per retry


async def test_a_missing_driver_root_is_the_kubelets_event(release: GpuNode) -> None:
    """nvidiaDriverRoot names a directory the node lacks: the kubelet refuses the pod's
    hostPath volume (type Directory) and says so in an event; README, troubleshooting."""
    cp = release.cp
    missing = release.node.root / "no-such-root"
    release.run_helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
                     "--set", f"nvidiaDriverRoot={missing}")  # fmt: skip

    def event() -> str:
        events = cp.call("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
        return next((e["message"] for e in events if e.get("reason") == "FailedMount"
                     and str(missing) in e.get("message", "")), "")  # fmt: skip

    message = await await_until("the kubelet's FailedMount event", event, 120)
    print("missing driver root:", message)
    # The kubelet's words: "hostPath type check failed: <path> is not a directory" through
    # 1.37, "hostPath <path> doesn't exist" from 1.38 (it checks existence first).
    assert any(w in message for w in ("is not a directory", "does not exist", "doesn't exist")), (
        message
    )
    release.run_helm("uninstall", RELEASE, "-n", NAMESPACE)
    await await_until("the plugin pods gone", lambda: not release.pods(), 120)
