"""Level 3 for ComputeDomains: the chart installed with ``computeDomains.enabled`` on a real
kubelet of a simulated ``p6e-gb200.36xlarge`` node (:mod:`tests.e2e.installed`).

Everything runs from the project's image as the real kubelet runs it: the kubelet plugin
serving both drivers, the controller Deployment, and the IMEX daemon pod of the DaemonSet the
controller makes. The daemon gets ``nvidia-imex`` and ``nvidia-imex-ctl`` from the host driver
root through the toolkit's CDI edits, as on the AL2023 NVIDIA AMI; here they are the stand-ins
(:mod:`tests.imexstandin`, copied as Python scripts: the image has no shell), which refuse what
the real ones refuse. The workload is the example's own pod (``compute-domain-two-nodes.yaml``:
four GPUs and the domain's channel, clique affinity), one of its two, since this cluster has
one node. Runs inside :mod:`tests.e2e.netns` (``make e2e`` does that); elsewhere it is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from drivers.computedomain import names
from tests import imexstandin
from tests.chart_render import NAMESPACE
from tests.e2e.installed import (
    LEVEL3,
    NODE,
    VERSION,
    Installed,
    create_namespace,
    holder,
    ready,
    simulated_node,
)
from tests.e2e.kube import as_pod, await_until
from tests.e2e.workloads import example_docs, get_pod, spec_files

pytestmark = [*LEVEL3, pytest.mark.timeout(900)]

PROFILE = "p6e-gb200.36xlarge"
EXAMPLE = "compute-domain-two-nodes.yaml"
TEAM = "team-a"
WORKER = "worker"
CDS = f"/apis/{names.API_VERSION}"
CONTROLLER = "app.kubernetes.io/component%3Dcompute-domain-controller"
CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"
DOMAINS = names.COMPUTE_DOMAIN_LABEL  # as a label selector: objects of any domain


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def release() -> AsyncIterator[Installed]:
    # One letter: the kubelet's registration socket of compute-domain.nvidia.com, with the
    # pod's UID, must fit in the 105 bytes gRPC binds (as it does, exactly, on a node under
    # /var/lib/kubelet); /tmp/c/n/kubelet/plugins_registry/... is 105.
    async with simulated_node("c", PROFILE) as node:
        # Where the driver installs them, which the toolkit mounts into the daemon's container.
        imexstandin.install(node.driver_root / "usr" / "bin", "/usr/bin/python3", copy=True)
        create_namespace(node.cp)
        await node.install("--set", "computeDomains.enabled=true")
        try:
            await await_until("both controller replicas Ready",
                              lambda: len(node.ready_pods(CONTROLLER)) == 2, 120)  # fmt: skip
        except TimeoutError as exc:
            pods = node.pods(CONTROLLER)
            said = node.diagnose(pods, "compute-domain-controller")
            raise AssertionError(f"{exc}: {said}") from exc
        yield node


def _channel_major(driver_root: Path) -> int:
    """The IMEX channels' major as the simulated kernel lists it (dynamic on a real host)."""
    for line in (driver_root / "proc" / "devices").read_text().splitlines():
        number, _, name = line.strip().partition(" ")
        if name == "nvidia-caps-imex-channels":
            return int(number)
    raise AssertionError("no nvidia-caps-imex-channels in the simulated /proc/devices")


def _worker(domain_template: str) -> dict[str, Any]:
    """The example Job's pod, as one of its two: it sleeps instead of running nvbandwidth."""
    (job,) = [d for d in example_docs(EXAMPLE) if d["kind"] == "Job"]
    pod = as_pod(job)
    pod["metadata"] = {"name": WORKER, "labels": job["spec"]["template"]["metadata"]["labels"]}
    spec = pod["spec"]
    spec["terminationGracePeriodSeconds"] = 1
    (container,) = spec["containers"]
    container["command"] = ["sh", "-c", "exec sleep 3600"]
    container["imagePullPolicy"] = "IfNotPresent"
    container["env"] = [{"name": "HOLDER", "value": WORKER}]
    assert {c["resourceClaimTemplateName"] for c in spec["resourceClaims"]} >= {domain_template}
    return pod


def _domain(cp: Any) -> dict[str, Any]:
    (domain,) = cp.call("GET", f"{CDS}/namespaces/{TEAM}/computedomains")["items"]
    return dict(domain)


def _daemon_pods(release: Installed) -> list[dict[str, Any]]:
    return release.pods(DOMAINS)


async def test_the_daemon_pod_runs_from_the_image_and_the_worker_gets_channel_0(
    release: Installed,
) -> None:
    cp = release.cp
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}})
    await await_until(f"default SA in {TEAM}", lambda: cp.raw(
        "GET", f"/api/v1/namespaces/{TEAM}/serviceaccounts/default")[0] == 200)  # fmt: skip
    docs = example_docs(EXAMPLE)
    for doc in docs:
        if doc["kind"] in ("ComputeDomain", "ResourceClaimTemplate"):
            cp.create(doc, TEAM)
    (domain,) = [d for d in docs if d["kind"] == "ComputeDomain"]
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]

    # The pod's affinity keys on the clique label our node driver sets.
    def clique() -> str | None:
        labels = cp.call("GET", f"/api/v1/nodes/{NODE}")["metadata"]["labels"]
        value = labels.get(names.GPU_CLIQUE_NODE_LABEL)
        return str(value) if value else None

    try:
        await await_until("the node's clique label", clique, 60)
    except TimeoutError as exc:
        said = release.pod_log(release.pods()[0])[-20:]
        raise AssertionError(f"{exc}: the plugin said {said}") from exc
    cp.create(_worker(template), TEAM)
    created = time.monotonic()

    def running() -> bool:
        return bool(get_pod(cp, TEAM, WORKER).get("status", {}).get("phase") == "Running")

    try:
        await await_until("the worker Running", running, 240)
        took = time.monotonic() - created
    except TimeoutError as exc:
        events = cp.call("GET", f"/api/v1/namespaces/{TEAM}/events")["items"]
        said = [f"{e.get('reason')}: {e.get('message')}" for e in events]
        daemons = _daemon_pods(release)
        raise AssertionError(
            f"{exc}: worker {get_pod(cp, TEAM, WORKER).get('status')}; events {said}; "
            f"daemons: {release.diagnose(daemons, names.DAEMON_CONTAINER)}"
        ) from exc

    # The daemon: the DaemonSet's pod on the real kubelet, from the project's image, Ready.
    (daemon,) = _daemon_pods(release)
    assert ready(daemon), daemon["status"]
    (container,) = daemon["status"]["containerStatuses"]
    assert container["image"].endswith(f"gpu-dra-driver:{VERSION}")
    assert container["restartCount"] == 0, release.pod_log(daemon, names.DAEMON_CONTAINER)
    status = _domain(cp)["status"]
    assert status["status"] == names.READY
    assert [(n["name"], n["status"]) for n in status["nodes"]] == [(NODE, names.READY)]

    # The worker: channel 0 as containerd made it from the CDI spec, and its four GPUs.
    worker, _ = await await_until("the worker's process", lambda: holder(WORKER), 30)
    found = (worker / "root" / CHANNEL.lstrip("/")).stat()
    assert stat.S_ISCHR(found.st_mode)
    major = _channel_major(release.driver_root)
    assert (os.major(found.st_rdev), os.minor(found.st_rdev)) == (major, 0)
    gpus = sorted(p.name for p in (worker / "root" / "dev").glob("nvidia[0-9]*"))
    assert len(gpus) == 4, gpus

    # The worker's claims say what each device is: the channel names its domain and clique.
    def entries() -> dict[str, list[dict[str, Any]]] | None:
        claims = cp.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaims")
        found: dict[str, list[dict[str, Any]]] = {}
        for claim in claims["items"]:
            for entry in (claim.get("status") or {}).get("devices") or []:
                found.setdefault(entry["driver"], []).append(entry)
        return found if len(found.get(names.DRIVER_NAME, [])) == 1 else None

    written = await await_until("the channel's status.devices entry", entries, 60)
    (channel,) = written[names.DRIVER_NAME]
    meta = _domain(cp)["metadata"]
    assert channel["data"]["sharing"]["domainID"] == meta["uid"], channel
    assert channel["data"]["computeDomain"] == {
        "namespace": TEAM, "name": meta["name"], "uid": meta["uid"],
    }, channel  # fmt: skip
    # The clique the node is in: its label, which the worker's affinity matched.
    assert channel["data"]["cliqueID"] == clique(), channel
    assert [(c["type"], c["status"]) for c in channel["conditions"]] == [("Ready", "True")]
    print(f"the channel's status.devices entry: {json.dumps(channel)}")
    print(f"worker Running {took:.1f} s after its creation (the domain's daemon started and "
          f"Ready meanwhile); it sees {CHANNEL} c {major}:0 and {gpus}; daemon "
          f"{daemon['metadata']['name']} Ready from {container['image']}")  # fmt: skip


async def test_deleting_the_domain_leaves_the_node_clean(release: Installed) -> None:
    cp, node = release.cp, release.node
    uid = _domain(cp)["metadata"]["uid"]
    cp.raw("DELETE", f"/api/v1/namespaces/{TEAM}/pods/{WORKER}")
    deleted = time.monotonic()
    cp.raw("DELETE", f"{CDS}/namespaces/{TEAM}/computedomains/{_domain(cp)['metadata']['name']}")
    plugin = node.kubelet_dir / "plugins" / names.DRIVER_NAME

    def leftovers() -> list[str]:
        found = []
        for path in (
            f"{CDS}/namespaces/{TEAM}/computedomains",
            f"{CDS}/namespaces/{NAMESPACE}/computedomaincliques",
            f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets?labelSelector={DOMAINS}",
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
            f"/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaims",
            f"/api/v1/namespaces/{TEAM}/pods",
        ):
            found += [f"{path}/{o['metadata']['name']}" for o in cp.call("GET", path)["items"]]
        templates = cp.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{TEAM}/"
                            "resourceclaimtemplates")["items"]  # fmt: skip
        found += [f"template {t['metadata']['name']}" for t in templates
                  if names.COMPUTE_DOMAIN_LABEL in (t["metadata"].get("labels") or {})]  # fmt: skip
        found += [f"daemon pod {p['metadata']['name']}" for p in _daemon_pods(release)]
        labels = cp.call("GET", f"/api/v1/nodes/{NODE}")["metadata"].get("labels") or {}
        if names.COMPUTE_DOMAIN_LABEL in labels:
            found.append(f"node label {labels[names.COMPUTE_DOMAIN_LABEL]}")
        found += [f"CDI spec {p.name}" for p in spec_files(node)]
        for sub in ("claims", "domains"):
            found += [f"{sub}/{p.name}" for p in (plugin / sub).glob("*")]
        return found

    with contextlib.suppress(TimeoutError):
        await await_until("nothing left", lambda: not leftovers(), 180)
    left = leftovers()
    assert not left, f"left behind after deleting domain {uid}: {left}"
    print(f"nothing of domain {uid} left {time.monotonic() - deleted:.1f} s after the deletes")
