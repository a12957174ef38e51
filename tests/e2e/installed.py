"""The driver installed as users install it, on one real node: what level 3's modules share.

The project's image imported into the node's containerd; the chart installed by the real helm
with ``values-eks.yaml`` and only what this node needs (the image's pull policy, the host
driver root of the simulated node, and this kubelet's directories, which are not
``/var/lib/kubelet`` because the run keeps everything under its own root). The control plane
runs as EKS runs it: the default ``--runtime-config``, no alpha feature gate, an advertised
address; pods reach it by in-cluster config through the real kube-proxy, on a pod network of
their own.

The simulated node's ``libnvidia-ml.so.1`` sits in its driver root at ``usr/lib64``, as on
AL2023, and finds its hardware file there (the pod's environment is the chart's alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import chart_render
from tests.chart_render import NAMESPACE
from tests.e2e import build, netns
from tests.e2e.cluster import ControlPlane, run_root
from tests.e2e.kube import await_until
from tests.e2e.node import RealNode, missing_dependencies, unmount_under
from tests.e2e.workloads import example_docs
from tests.simroot import fake_root, install_driver_files

MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpu-dra-driver"
RELEASE = "gpu-dra-driver"
NODE = "node-1"
VERSION = build.IMAGE_TAGS[0]
TAGS = build.IMAGE_TAGS  # the second: the same build, another tag and version label
SELECTOR = "app.kubernetes.io/component%3Dkubelet-plugin"
# Every level 3 module's marks: one event loop per module (its cluster), and the namespaces.
LEVEL3 = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        not netns.isolated(),
        reason="level 3 needs network and mount namespaces of its own: make e2e runs it as "
        "`python -m tests.e2e.netns python -m pytest tests/e2e/test_level3*.py`",
    ),
]


@dataclass
class Installed:
    node: RealNode
    helm: Path
    driver_root: Path

    @property
    def cp(self) -> ControlPlane:
        return self.node.cp

    def run_helm(self, *args: str) -> str:
        argv = [str(self.helm), "--kubeconfig", str(self.cp.admin_kubeconfig), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def node_values(self) -> list[str]:
        """What this test node needs beyond values-eks.yaml, and nothing else."""
        kubelet = self.node.kubelet_dir
        return [
            "--set", "image.pullPolicy=Never",
            "--set", f"nvidiaDriverRoot={self.driver_root}",
            "--set", f"kubeletPlugin.kubeletRegistrarDirectoryPath={kubelet / 'plugins_registry'}",
            "--set", f"kubeletPlugin.kubeletPluginsDirectoryPath={kubelet / 'plugins'}",
            "--set", f"cdiRoot={self.node.cdi_root}",
            # The one flag beyond paths: a simulated node's sysfs and /proc files (PCI
            # topology, MIG capability minors) live in its driver root, not this kernel's.
            "--set", "kubeletPlugin.extraArgs={--sysfs-root=/driver-root}",
        ]  # fmt: skip

    def pods(self, selector: str = SELECTOR) -> list[dict[str, Any]]:
        """The driver namespace's pods of a (URL-encoded) label selector; the plugin's."""
        items: list[dict[str, Any]] = self.cp.call(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}"
        )["items"]
        return items

    def ready_pods(self, selector: str = SELECTOR) -> list[dict[str, Any]]:
        return [p for p in self.pods(selector) if ready(p) and not p["metadata"].get(
            "deletionTimestamp")]  # fmt: skip

    def pod_log(self, pod: dict[str, Any], container: str = "kubelet-plugin") -> list[str]:
        """A container's log lines as the kubelet keeps them (CRI format)."""
        meta = pod["metadata"]
        base = self.node.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
        lines: list[str] = []
        for f in sorted(base.glob("*.log")):  # "<time> stdout F <line>"
            lines.extend(line.split(" ", 3)[-1] for line in f.read_text().splitlines())
        return lines

    def published(self) -> int:
        slices = self.cp.call(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{NODE}"
        )["items"]
        return sum(len(s["spec"].get("devices") or []) for s in slices)

    async def install(self, *values: str) -> None:
        """``helm install`` with values-eks.yaml, this node's values and ``values``; returns
        when the plugin's pod is Ready, else fails with what the pod and events said."""
        await asyncio.to_thread(
            self.run_helm, "install", RELEASE, str(CHART), "-n", NAMESPACE,
            "-f", str(CHART / "values-eks.yaml"), *self.node_values(), *values,
        )  # fmt: skip
        try:
            await await_until("the plugin pod Ready", lambda: len(self.ready_pods()) == 1, 240)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {self.diagnose(self.pods())}") from exc

    def diagnose(self, pods: list[dict[str, Any]], container: str = "kubelet-plugin") -> str:
        said = [self.pod_log(p, container)[-30:] for p in pods]
        events = self.cp.call("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
        return (
            f"pods {json.dumps([p.get('status') for p in pods])[:4000]}; logs {said}; "
            f"events {[(e.get('reason'), e.get('message')) for e in events]}"
        )


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def json_lines(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                out.append(doc)
    return out


def archive(tag: str) -> Path:
    path = build.image_archive(tag)
    if not path.is_file():
        pytest.fail(f"{path} missing: make e2e-build builds it (python -m tests.e2e.build "
                    "images), before level 3 enters its network namespace")  # fmt: skip
    return path


def chart_image(tag: str) -> str:
    docs = chart_render.render([chart_render.EKS_VALUES], [f"image.tag={tag}"])
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


def workload_images() -> tuple[str, ...]:
    """The images of the examples' pods and jobs (busybox under their names)."""
    refs: set[str] = set()
    for path in (REPO / "charts" / "examples").glob("*.yaml"):
        for doc in example_docs(path.name):
            spec = doc.get("spec", {})
            if doc["kind"] == "Job":
                spec = spec["template"]["spec"]
            elif doc["kind"] != "Pod":
                continue
            refs.update(c["image"] for c in spec.get("containers", []))
    return tuple(sorted(refs))


def holder(marker: str) -> tuple[Path, dict[str, str]] | None:
    """The /proc entry and environment of the container whose environment holds
    ``HOLDER=marker`` (the tests' pods set it), read from the host."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            text = (entry / "environ").read_text()
            env = dict(kv.split("=", 1) for kv in text.split("\0") if "=" in kv)
            if env.get("HOLDER") == marker:
                return entry, env
    return None


def create_namespace(cp: ControlPlane) -> None:
    """What the README has users run before helm install."""
    cp.create({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE,
                     "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
    })  # fmt: skip


@contextlib.asynccontextmanager
async def simulated_node(name: str, profile: str) -> AsyncIterator[Installed]:
    """A control plane and one real node of ``profile`` under the run's root ``name`` (short:
    the kubelet's socket paths under it must fit in the 105 bytes gRPC binds), the images
    imported and a simulated driver root laid out as the AL2023 NVIDIA AMI's; the chart not
    yet installed."""
    missing = missing_dependencies()
    if missing:
        pytest.skip(f"a real node needs {', '.join(missing)}")
    root = run_root() / name
    archives = tuple(archive(t) for t in TAGS)
    assert chart_image(VERSION) == f"gpu-dra-driver:{VERSION}"
    cp = ControlPlane(root, MINOR, node_lifecycle=True, eks=True)
    node = RealNode(
        cp, NODE, root / "n", images=workload_images(),
        archives=archives, pod_network=True,
        labels=(("node.kubernetes.io/instance-type", profile),),
    )  # fmt: skip
    try:
        await cp.start()
        await node.start()
        driver_root = node.root / "nvidia"  # the host's driver root ("/" on AL2023)
        sim, _ = fake_root(driver_root, profile)
        # As on the AL2023 NVIDIA AMI: the driver's libraries and binaries, and nvidia-ctk in
        # usr/bin, which the plugin runs for every spec's driver mounts (NVML "system").
        install_driver_files(driver_root, sim.profile.driver_version, build.build_nvidia_ctk())
        yield Installed(node, build.build_helm(), driver_root)
    finally:
        await cp.stop()
        unmount_under(cp.root)
