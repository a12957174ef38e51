"""Level 2: a real kubelet with containerd 2.x and CDI calls our plugin; containers run.

One node on this VM (:mod:`tests.e2e.node`), our plugin beside its kubelet (started after
it: a kubelet wipes its node's slices when it starts), the chart's classes and RBAC. Pods
from the examples run busybox in place of their CUDA command and print what they got (the
env var naming their GPU UUIDs, ``NVIDIA_VISIBLE_DEVICES``, the ``/dev/nvidia*`` nodes of
the CDI spec: character devices made with mknod under a fake driver root) into their
termination message, which the test reads from the pod status.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.chart_render import NAMESPACE
from tests.e2e import build
from tests.e2e.cluster import ControlPlane, kubeconfig, run_root
from tests.e2e.kube import (
    PLUGIN_POD_IMAGE,
    TAINT_RULES,
    as_pod,
    await_until,
    explain_cluster,
    install_chart,
    plugin_token,
    recipe_rule,
)
from tests.e2e.node import RealNode, missing_dependencies, unmount_under
from tests.e2e.workloads import (
    EXAMPLES,
    delete_namespace_claims,
    example_docs,
    finished_pod,
    get_pod,
    reports,
    run_example,
    runnable,
    spec_files,
    wait_finished,
)
from tests.pluginharness import NodeDirs, PluginProcess
from tests.simroot import fake_root
from tests.test_mps import Control
from tests.test_timeslicing import Smi, sliced

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
NODE = "node-1"
# GPUs 0-3 in MIG mode (3g.20gb, 2g.10gb, 1g.10gb each), 4-7 whole.
PROFILE = "p4d.24xlarge-mig"
GPUS = 4 + 4 * 3  # devices published


@dataclass(frozen=True)
class KubeletDirs(NodeDirs):
    """The plugin's directories are the real kubelet's."""

    kubelet_root: Path = Path("/nonexistent")
    cdi_root: Path = Path("/nonexistent")

    @property
    def registry(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.kubelet_root / "plugins"

    @property
    def cdi(self) -> Path:
        return self.cdi_root


def example_images() -> tuple[str, ...]:
    refs = set()
    for path in EXAMPLES.glob("*.yaml"):
        for doc in example_docs(path.name):
            for c in doc.get("spec", {}).get("containers", []) if doc["kind"] == "Pod" else []:
                refs.add(c["image"])
    return (*sorted(refs), PLUGIN_POD_IMAGE)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node() -> AsyncIterator[RealNode]:
    missing = missing_dependencies()
    if missing:
        pytest.skip(f"a real node needs {', '.join(missing)}")
    cp = ControlPlane(run_root() / f"gpu-dra-e2e-{MINOR}-l2", MINOR, node_lifecycle=True)
    real = RealNode(cp, NODE, cp.root / "node", example_images())
    try:
        await cp.start()
        install_chart(cp)
        await real.start()
        yield real
    finally:
        await cp.stop()
        unmount_under(cp.root)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plugin(node: RealNode) -> AsyncIterator[PluginProcess]:
    cp = node.cp
    token = plugin_token(cp, NODE)
    dirs = KubeletDirs(node.root / "plugin", node.kubelet_dir, node.cdi_root)
    dirs.root.mkdir(parents=True, exist_ok=True)
    config = dirs.root / "kubeconfig"
    config.write_text(kubeconfig(cp.server, cp.pki / "ca.crt", token=token))
    # A fake AL2023 driver root whose dev/ holds the character devices (mknod) the CDI
    # spec names; the plugin's simulated NVML (real pynvml over the simulated C library)
    # describes the same profile's GPUs.
    fake_root(dirs.root / "driver-root", PROFILE)
    proc = start_plugin(dirs, config)
    try:
        await proc.wait_ready(120)
        await proc.wait_log("registered with the kubelet|plugin_registered=True", 60)
        yield proc
    finally:
        await proc.terminate()


def plugin_smi(dirs: NodeDirs) -> Smi:
    """The plugin's nvidia-smi: a stand-in that records its calls (NVML sets no time slice)."""
    return Smi(dirs.root / "nvidia-smi")


def plugin_mps(dirs: NodeDirs) -> Control:
    """The plugin's nvidia-cuda-mps-control: a stand-in daemon that records its calls."""
    return Control(dirs.root / "mps-control")


def start_plugin(dirs: NodeDirs, config: Path, pod_uid: str | None = None) -> PluginProcess:
    return PluginProcess(
        dirs,
        kubeconfig=config,
        node_name=NODE,
        profile=PROFILE,
        pod_uid=pod_uid,
        extra_env={"POD_NAMESPACE": NAMESPACE},
        # One machine: the host sees the driver root where the plugin does.
        extra_args=(
            f"--nvidia-driver-root={dirs.root / 'driver-root'}",
            f"--nvidia-smi={plugin_smi(dirs).path}",
            f"--mps-control={plugin_mps(dirs).path}",
        ),
    )


async def test_the_kubelet_registers_the_plugin_and_slices_appear(
    node: RealNode, plugin: PluginProcess
) -> None:
    cp = node.cp

    def published() -> int:
        slices = cp.call(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{NODE}"
        )["items"]
        return sum(len(s["spec"].get("devices") or []) for s in slices)

    # Registration and publishing are separate loops: the slices may land a moment later.
    await await_until(f"{GPUS} devices published", lambda: published() == GPUS, 60)
    assert published() == GPUS
    assert (node.kubelet_dir / "plugins_registry").is_dir()


async def test_one_gpu_pod_runs_with_its_cdi_edits(node: RealNode, plugin: PluginProcess) -> None:
    cp = node.cp
    (pod,) = await run_example(cp, "single", "single-gpu.yaml")
    (report,) = reports(pod).values()
    uuids = report["uuids"].split(",")
    assert len(uuids) == 1 and uuids[0].startswith("GPU-")
    assert report["visible"] == "void"
    assert "nvidiactl" in report["devices"].split()
    assert len([d for d in report["devices"].split() if d[len("nvidia") :].isdigit()]) == 1
    await delete_namespace_claims(cp, "single")
    await await_until("spec removed by unprepare", lambda: not spec_files(node), 60)


async def test_mig_pod_gets_its_two_mig_devices_cap_nodes(
    node: RealNode, plugin: PluginProcess
) -> None:
    cp = node.cp
    (pod,) = await run_example(cp, "mig", "mig-two-sizes.yaml")
    got = reports(pod)
    assert set(got) == {"server", "sidecar"}
    # Each container gets its request's MIG device: gpu-0's GI 1 (3g.20gb) for the server,
    # its GI 3 (1g.10gb) for the sidecar, each as a GI and a CI access node.
    caps = {"server": (12, 13), "sidecar": (30, 31)}
    for container, report in got.items():
        migs = report["migs"].split(",")  # claim-wide, as the GPU UUIDs are
        assert len(migs) == 2 and all(m.startswith("MIG-") for m in migs)
        assert report["uuids"] == "" and report["visible"] == "void"
        expected = sorted(f"nvidia-cap{n}" for n in caps[container])
        assert report["caps"].rstrip(",").split(",") == expected, container
        devices = report["devices"].split()
        assert "nvidia0" in devices and "nvidiactl" in devices and "nvidia-caps" in devices
        assert not any(d in devices for d in ("nvidia1", "nvidia4"))
    await delete_namespace_claims(cp, "mig")
    await await_until("spec removed by unprepare", lambda: not spec_files(node), 60)


async def test_two_containers_share_one_gpu(node: RealNode, plugin: PluginProcess) -> None:
    cp = node.cp
    (pod,) = await run_example(cp, "two-containers", "shared-gpu-two-containers.yaml")
    got = reports(pod)
    assert len(got) == 2
    first, second = got.values()
    assert first["uuids"] == second["uuids"] and len(first["uuids"].split(",")) == 1
    await delete_namespace_claims(cp, "two-containers")
    await await_until("spec removed by unprepare", lambda: not spec_files(node), 60)


async def test_two_pods_time_slice_one_gpu(node: RealNode, plugin: PluginProcess) -> None:
    cp = node.cp
    smi = plugin_smi(plugin.dirs)
    smi.calls()  # what earlier tests left
    pods = await run_example(cp, "time-sliced", "time-sliced-gpu-two-pods.yaml")
    (uuid,) = {r["uuids"] for pod in pods for r in reports(pod).values()}
    assert len(pods) == 2 and uuid.startswith("GPU-")
    # The kubelet unprepares the claim once both pods have finished, or at the latest
    # when it is deleted: Short once (one claim, one prepare), then back to Default.
    await delete_namespace_claims(cp, "time-sliced")
    await await_until("spec removed by unprepare", lambda: not spec_files(node), 60)
    assert smi.calls() == sliced(uuid, 1) + sliced(uuid, 0)


async def test_mps_pods_reach_their_daemons_pipe(node: RealNode, plugin: PluginProcess) -> None:
    cp, ns = node.cp, "mps"
    smi, control = plugin_smi(plugin.dirs), plugin_mps(plugin.dirs)
    smi.calls(), control.calls()  # what earlier tests left
    docs = example_docs("mps-memory-limit.yaml")
    (template,) = (d for d in docs if d["kind"] == "ResourceClaimTemplate")
    (deployment,) = (d for d in docs if d["kind"] == "Deployment")
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    await await_until(
        f"default SA in {ns}",
        lambda: cp.raw("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200,
    )
    cp.create(template, ns)
    names = [f"mps-{i}" for i in range(deployment["spec"]["replicas"])]
    for name in names:  # the Deployment's pods, as its ReplicaSet would make them
        pod = runnable(as_pod(deployment))
        pod["metadata"]["name"] = name
        cp.create(pod, ns)
    got = [reports(await wait_finished(cp, ns, name))["cuda"] for name in names]
    # Without consumable capacity each claim is a GPU of its own, under its own daemon.
    uuids = [r["uuids"] for r in got]
    assert len(set(uuids)) == 2 and all(u.startswith("GPU-") for u in uuids)
    for report in got:
        pipe, threads, listing = report["mps"].split(":")
        assert pipe and threads == "50"
        assert "control" in listing.split(",")  # the host daemon's pipe, mounted in
    # The kubelet unprepares each claim once its pod has finished, or at the latest when it
    # is deleted: each daemon started for its GPU, then stopped with its last claim.
    await delete_namespace_claims(cp, ns)
    await await_until("specs removed by unprepare", lambda: not spec_files(node), 60)
    calls = control.calls()
    assert sorted(c for c in calls if c != "quit") == sorted(
        f"-f CUDA_VISIBLE_DEVICES={u}" for u in uuids
    )
    assert calls.count("quit") == 2
    modes = smi.calls()
    for u in uuids:  # exclusive-process for its daemon, back to default after it
        assert [m for m in modes if u in m] == [
            f"-i {u} -c EXCLUSIVE_PROCESS",
            f"-i {u} -c DEFAULT",
        ]


async def test_two_pods_share_one_claim(node: RealNode, plugin: PluginProcess) -> None:
    cp = node.cp
    pods = await run_example(cp, "two-pods", "shared-claim-two-pods.yaml")
    uuids = {r["uuids"] for pod in pods for r in reports(pod).values()}
    assert len(pods) == 2 and len(uuids) == 1
    await delete_namespace_claims(cp, "two-pods")
    await await_until("spec removed by unprepare", lambda: not spec_files(node), 60)


async def test_a_claims_status_names_what_each_device_got(
    node: RealNode, plugin: PluginProcess
) -> None:
    """status.devices on the real API server, written by the plugin with its node's token,
    for a MIG pair and an MPS share: what `kubectl get resourceclaim -o yaml` shows."""
    cp = node.cp
    mig = await _held_claim(cp, "status-mig", "mig-two-sizes.yaml", entries=2)
    mps = await _held_claim(cp, "status-mps", "mps-memory-limit.yaml", entries=1)
    shown = {"mig": mig, "mps": mps}
    (cp.root / "status-devices.json").write_text(json.dumps(shown, indent=2))
    profiles = sorted(e["data"]["attributes"]["profile"] for e in mig)
    assert profiles[0] == "1g.10gb" and profiles[1].startswith("3g."), mig
    for entry in mig:
        data = entry["data"]
        assert entry["driver"] == "gpu.nvidia.com" and data["kind"] == "mig", entry
        assert data["identity"]["mig-uuid"] == data["attributes"]["uuid"], entry
        assert data["attributes"]["uuid"].startswith("MIG-"), entry
        assert data["identity"]["parent-uuid"] == data["attributes"]["parentUUID"], entry
        assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")]
    (entry,) = mps
    assert entry["data"]["kind"] == "gpu", entry
    assert entry["data"]["identity"]["gpu-uuid"].startswith("GPU-"), entry
    assert entry["data"]["sharing"] == {"activeThreadPercentage": "50", "strategy": "MPS"}
    for ns in shown:
        await delete_namespace_claims(cp, f"status-{ns}")
    await await_until("specs removed by unprepare", lambda: not spec_files(node), 60)


async def _held_claim(
    cp: ControlPlane, ns: str, example: str, *, entries: int
) -> list[dict[str, Any]]:
    """The status.devices entries of the claim of ``example``'s first pod, kept prepared by a
    pod that sleeps, once the plugin has written ``entries`` of them."""
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    await await_until(
        f"default SA in {ns}",
        lambda: cp.raw("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200,
    )
    docs = example_docs(example)
    for doc in docs:
        if doc["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
            cp.create(doc, ns)
    workload = next(d for d in docs if d["kind"] not in ("ResourceClaim", "ResourceClaimTemplate"))
    pod = runnable(as_pod(workload))
    pod["metadata"] = {"name": "holder"}
    for container in pod["spec"]["containers"]:
        container["command"] = ["sh", "-c", "exec sleep 3600"]
    cp.create(pod, ns)

    def written() -> list[dict[str, Any]] | None:
        items = cp.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")
        found = [e for c in items["items"] for e in (c.get("status") or {}).get("devices") or []]
        return found if len(found) == entries else None

    got: list[dict[str, Any]] = await await_until(f"{ns}: status.devices", written, 120)
    return got


# Before the restart and surge tests: the surge test ends the module's plugin.
async def test_a_drained_gpu_evicts_its_running_pod_and_explain_names_the_gpu(
    node: RealNode, plugin: PluginProcess
) -> None:
    """`explain --cluster` on a running pod's claim says which GPU it got, from the status
    the plugin wrote; the drain recipe's NoExecute rule on that GPU then evicts the pod, and
    the real kubelet stops it."""
    cp, ns = node.cp, "drain"
    if cp.raw("GET", TAINT_RULES)[0] != 200:
        pytest.skip(f"{MINOR} does not serve DeviceTaintRule as resource.k8s.io/v1 (1.37+)")
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "held"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }  # fmt: skip
    (template_pod,) = [d for d in example_docs("single-gpu.yaml") if d["kind"] == "Pod"]
    pod = runnable(template_pod)
    pod["metadata"] = {"name": "held"}
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "held"}]
    for c in pod["spec"]["containers"]:
        c["command"] = ["sh", "-c", "sleep 3600"]
        c["resources"] = {"claims": [{"name": "gpu"}]}
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    sa_path = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
    await await_until(f"default SA in {ns}", lambda: cp.raw("GET", sa_path)[0] == 200, 60)
    rule: dict[str, Any] | None = None
    claim_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/held"
    try:
        cp.create(claim, ns)
        cp.create(pod, ns)
        await await_until(
            "held running",
            lambda: get_pod(cp, ns, "held").get("status", {}).get("phase") == "Running",
            120,
        )
        # The plugin writes the claim's status once prepared, in the background.
        await await_until(
            "status.devices", lambda: cp.call("GET", claim_path)["status"].get("devices"), 30
        )
        named = {**claim, "metadata": {"name": "held", "namespace": ns}}
        allocated = (await explain_cluster(cp, named, NODE))["allocated"]
        (held,) = allocated["devices"]
        slices = cp.call("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
        (published,) = [
            d for s in slices for d in s["spec"]["devices"] if d["name"] == held["device"]
        ]
        assert held["data"]["attributes"]["uuid"] == published["attributes"]["uuid"]["string"]
        assert (held["ready"]["status"], held["ready"]["reason"]) == ("True", "Prepared")
        assert allocated["node"] == NODE and allocated["reservedFor"] == ["pods/held"]
        attributes = held["data"]["attributes"]
        print(f"\nexplain --cluster: {held['device']} {attributes['uuid']} "
              f"{attributes['productName']} Ready={held['ready']['status']}")  # fmt: skip
        rule = recipe_rule(NODE, held["device"], "NoExecute")
        tainted = time.monotonic()
        cp.create(rule)
        await await_until(
            "held evicted",
            lambda: get_pod(cp, ns, "held")["metadata"].get("deletionTimestamp"),
            60,
        )
        evicted = time.monotonic() - tainted
        # The kubelet stops the container (grace 1 s) and the pod goes.
        await await_until(
            "held gone", lambda: cp.raw("GET", f"/api/v1/namespaces/{ns}/pods/held")[0] == 404, 60
        )
        gone = time.monotonic() - tainted
        await await_until(
            "held deallocated", lambda: "allocation" not in cp.call("GET", claim_path)["status"], 60
        )
        print(f"NoExecute on a running pod's GPU: deleted {evicted:.2f}s after the rule, "
              f"gone (container stopped by the kubelet) {gone:.2f}s after it")  # fmt: skip
    finally:
        if rule is not None:
            cp.raw("DELETE", f"{TAINT_RULES}/{rule['metadata']['name']}")
        await delete_namespace_claims(cp, ns)


async def test_sigkill_while_pods_start_then_restart(node: RealNode, plugin: PluginProcess) -> None:
    """The plugin dies mid-flight; the kubelet retries against its successor."""
    cp = node.cp
    ns = "killed"
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    await await_until(
        f"default SA in {ns}",
        lambda: cp.raw("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200,
    )
    docs = example_docs("single-gpu.yaml")
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    pod = next(d for d in docs if d["kind"] == "Pod")
    cp.create(template, ns)
    names = []
    for i in range(3):
        p = runnable(pod)
        p["metadata"]["name"] = f"gpu-{i}"
        cp.create(p, ns)
        names.append(p["metadata"]["name"])
    os.kill(plugin.pid, signal.SIGKILL)
    plugin.proc.wait()
    successor = start_plugin(plugin.dirs, plugin.dirs.root / "kubeconfig")
    plugin.proc = successor.proc  # the fixture's teardown stops the successor
    plugin.log_path = successor.log_path
    await successor.wait_ready(120)
    seen = set()
    for name in names:
        finished = await await_until(
            f"pod {name} finished", partial(finished_pod, cp, ns, name), 240
        )
        assert finished["status"]["phase"] == "Succeeded", json.dumps(finished["status"])
        (report,) = reports(finished).values()
        seen.add(report["uuids"])
    assert len(seen) == 3  # three claims, three distinct GPUs
    await delete_namespace_claims(cp, ns)
    await await_until("no orphan spec", lambda: not spec_files(node), 60)


async def test_surge_a_second_plugin_beside_the_first(
    node: RealNode, plugin: PluginProcess
) -> None:
    """A rolling update's surge: the new pod's plugin registers beside the old one (sockets
    named by pod UID); pods keep getting devices while both run and after the old one stops."""
    cp = node.cp
    surge = start_plugin(plugin.dirs, plugin.dirs.root / "kubeconfig", pod_uid="surge-pod-2")
    try:
        await surge.wait_ready(120)
        await surge.wait_log("registered with the kubelet", 60)
        (pod,) = await run_example(cp, "surge-both", "single-gpu.yaml")
        assert reports(pod)["cuda"]["uuids"].startswith("GPU-")
        await delete_namespace_claims(cp, "surge-both")
        assert await plugin.terminate() == 0  # the old pod goes once the new one is ready
        (pod,) = await run_example(cp, "surge-new", "single-gpu.yaml")
        assert reports(pod)["cuda"]["uuids"].startswith("GPU-")
        await delete_namespace_claims(cp, "surge-new")
        await await_until("no orphan spec", lambda: not spec_files(node), 60)
    finally:
        await surge.terminate()
