"""The driver on this machine's real GPU: discovery through the real NVML, a whole GPU
prepared with the host's toolkit edits, an MPS pair on one GPU held to its limits as each
claim's CUDA client sees them, and nothing left after unprepare.

The plugin is the real process (``python -m cli kubelet-plugin --nvml system``) on the local
API server, prepared through the kubelet's gRPC over its real socket, with its directories at
the chart's default kubelet paths (socket and MPS pipe paths as long as on a node). Its
nvidia-smi is a recording stand-in: no GPU setting changes (conftest reads them before and
after).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drivers.gpu.kinds import mpspaths
from sandbox.kubeletsim import KubeletSim
from tests.gpu.conftest import row
from tests.pluginharness import NodeDirs, PluginProcess, create_claim, create_node
from tests.smiforms import refusal
from tests.test_mps import mps
from tests.test_timeslicing import Smi

NODE = "gpu-check"
DRIVER = "gpu.nvidia.com"
CLIENT = Path(__file__).with_name("cuda_client.py")
# The chart's kubelet root: the plugin's paths are as long here as on a node.
KUBELET_ROOT = Path("/var/lib/kubelet")


def _nvml_uuids() -> list[str]:
    import pynvml

    from driver.nvml import library

    library.load(Path("/"))
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        return [
            str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(count)
        ]
    finally:
        pynvml.nvmlShutdown()


def _mps_control() -> Path | None:
    found = shutil.which("nvidia-cuda-mps-control")
    for candidate in (
        found,
        "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
        "/usr/bin/nvidia-cuda-mps-control",
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _mps_daemons() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip().startswith("nvidia-cuda-mps"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


@pytest.fixture
def dirs() -> Iterator[NodeDirs]:
    """The chart's kubelet layout: plugins and registry under /var/lib/kubelet, which this
    machine's kubelet (if any) does not use for gpu.nvidia.com; removed after."""
    if (KUBELET_ROOT / "plugins" / DRIVER).exists():
        pytest.skip(f"{KUBELET_ROOT}/plugins/{DRIVER} exists: a real plugin may run here")
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="gpuchk") as name:
        root = Path(name)
        KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
        (root / "registry").symlink_to(KUBELET_ROOT / "plugins_registry", target_is_directory=True)
        (KUBELET_ROOT / "plugins_registry").mkdir(exist_ok=True)
        (KUBELET_ROOT / "plugins").mkdir(exist_ok=True)
        (root / "plugins").symlink_to(KUBELET_ROOT / "plugins", target_is_directory=True)
        yield _KubeletDirs(root)
        shutil.rmtree(KUBELET_ROOT / "plugins" / DRIVER, ignore_errors=True)


class _KubeletDirs(NodeDirs):
    """NodeDirs whose registry and plugins are the kubelet's own paths (not the links)."""

    @property
    def registry(self) -> Path:
        return KUBELET_ROOT / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return KUBELET_ROOT / "plugins"


@pytest.fixture
async def kube(kube: tuple[Any, Path]) -> tuple[Any, Path]:
    await create_node(kube[0], NODE)
    return kube


def _start(
    dirs: NodeDirs, kubeconfig: Path, processes: list[PluginProcess], smi: Smi
) -> PluginProcess:
    env = {"GPU_DRA_NVIDIA_SMI": str(smi.path)}
    control = _mps_control()
    if control is not None:
        env["GPU_DRA_MPS_CONTROL"] = str(control)
    proc = PluginProcess(
        dirs,
        kubeconfig=kubeconfig,
        node_name=NODE,
        driver_root=Path("/"),
        extra_env=env,
        extra_args=("--consumable-capacity=true", "--mps-daemon=process"),
    )
    processes.append(proc)
    return proc


def _edits(dirs: NodeDirs) -> dict[str, list[Any]]:
    """Every container edit of the claim specs on disk, merged as a runtime merges them."""
    merged: dict[str, list[Any]] = {"env": [], "deviceNodes": [], "mounts": [], "hooks": []}
    for path in dirs.cdi.glob("*.json"):
        spec = json.loads(path.read_text())
        for edits in [spec.get("containerEdits", {})] + [
            d.get("containerEdits", {}) for d in spec["devices"]
        ]:
            for key in merged:
                merged[key] += edits.get(key, [])
    return merged


def _env(edits: dict[str, list[Any]]) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in edits["env"])


def _leftovers(dirs: NodeDirs) -> list[str]:
    data = dirs.plugins / DRIVER
    left = [str(p) for p in dirs.cdi.glob("*.json")]
    for sub in ("claims", "devices"):
        if (data / sub).is_dir():
            left += [str(p) for p in (data / sub).iterdir()]
    return left + [f"MPS daemon pid {pid}" for pid in _mps_daemons()]


def _check_smi_calls(smi: Smi) -> list[str]:
    """The plugin's nvidia-smi calls; each must be a form the real tool accepts."""
    calls = smi.calls()
    bad = [c for c in calls if refusal(c.split()) is not None]
    assert not bad, f"nvidia-smi argv the real tool would not take: {bad}"
    return calls


def test_discover_equals_nvml() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "discover",
            "--nvml",
            "system",
            "-o",
            "json",
            "--node-name",
            NODE,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    devices = [d for s in json.loads(done.stdout)["items"] for d in s["spec"]["devices"]]
    uuids = sorted(d["attributes"]["uuid"]["string"] for d in devices if "uuid" in d["attributes"])
    assert set(uuids) >= set(_nvml_uuids())
    first = devices[0]["attributes"]
    row(
        "discover (real NVML)",
        "ok",
        f"{len(devices)} device(s), {first['productName']['string']}, "
        f"driver {first['driverVersion']['version']}, {elapsed:.2f} s",
    )


async def test_whole_gpu_prepared_with_the_hosts_edits(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess], tmp_path: Path
) -> None:
    api, kubeconfig = kube
    smi = Smi(tmp_path / "smi")
    plugin = _start(dirs, kubeconfig, processes, smi)
    await plugin.wait_ready(wait_s=60)
    claim = await create_claim(api, "whole", node=NODE, devices=["gpu-0"])
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        started = time.monotonic()
        response = await kubelet.prepare([claim])
        prepare_s = time.monotonic() - started
        assert response.claims[claim.uid].error == ""
        edits = _edits(dirs)
        nodes = [n.get("hostPath", n["path"]) for n in edits["deviceNodes"]]
        host_paths = nodes + [m["hostPath"] for m in edits["mounts"]]
        missing = [p for p in host_paths if not Path(p).exists()]  # noqa: ASYNC240 - a few stats
        assert missing == [], f"the spec names host paths that do not exist: {missing}"
        env = _env(edits)
        assert env.get("GPU_DRA_VISIBLE_GPU_UUIDS") == _nvml_uuids()[0]
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert _leftovers(dirs) == []
    assert await plugin.terminate() == 0
    row(
        "whole GPU prepare",
        "ok",
        f"{len(nodes)} device nodes, {len(edits['mounts'])} mounts, {len(edits['hooks'])} hooks "
        f"all on the host; UUID is NVML's; prepare {prepare_s * 1000:.0f} ms; nothing left",
    )


def _share(memory: str) -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": memory},
    }


# A container's own /dev/shm: a fresh tmpfs there, in a mount namespace of the client's own.
_PRIVATE_SHM = [
    "unshare", "-m", "--propagation", "private", "sh", "-c",
    'mount -t tmpfs -o size=64m shm /dev/shm && exec "$@"', "sh",
]  # fmt: skip


def _client_with_private_shm(env: dict[str, str]) -> str:
    """The claim's CUDA client as a container runs it under ours: its own /dev/shm, where
    NVIDIA's drivers share the MPS daemon's with every client. What it got, in a few words:
    the open question this answers is whether MPS still holds the client to its limit."""
    done = subprocess.run(
        [*_PRIVATE_SHM, sys.executable, str(CLIENT), "--try-gib", "25", "10"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 or not done.stdout.strip():
        return f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
    alloc = json.loads(done.stdout.splitlines()[-1])["alloc"]
    held = alloc["25"] != "ok" and alloc["10"] == "ok"
    return f"{'held to its limit' if held else 'NOT held to its limit'} ({alloc})"


def _client(env: dict[str, str]) -> dict[str, Any]:
    """The claim's CUDA client, with the claim's environment over this process's."""
    done = subprocess.run(
        [sys.executable, str(CLIENT), "--try-gib", "25", "10"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


async def test_mps_pair_held_to_its_limits(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess], tmp_path: Path
) -> None:
    if _mps_control() is None:
        pytest.skip("no nvidia-cuda-mps-control on this machine")
    api, kubeconfig = kube
    smi = Smi(tmp_path / "smi")
    plugin = _start(dirs, kubeconfig, processes, smi)
    await plugin.wait_ready(wait_s=60)
    config = [mps(defaultActiveThreadPercentage=50)]
    a = await create_claim(
        api, "mps-a", node=NODE, devices=["gpu-0"], config=config, results=[_share("20Gi")]
    )
    b = await create_claim(
        api, "mps-b", node=NODE, devices=["gpu-0"], config=config, results=[_share("20Gi")]
    )
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        response = await kubelet.prepare([a, b])
        assert [response.claims[c.uid].error for c in (a, b)] == ["", ""]
        assert len(_mps_daemons()) >= 1
        seen = []
        for claim in (a, b):
            spec = json.loads(
                next(p for p in dirs.cdi.glob("*.json") if claim.uid in p.name).read_text()
            )
            # The claim's edits (MPS's among them) are the spec's; each device's its own.
            edits = [spec.get("containerEdits", {})] + [
                d["containerEdits"] for d in spec["devices"]
            ]
            env = _env({"env": [e for edit in edits for e in edit.get("env", [])]})
            pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
            assert len(pipe + "/control_privileged") <= mpspaths.MAX_SOCKET_PATH, pipe
            result = _client(env)
            assert result["alloc"]["25"] != "ok", result  # over the claim's 20 GiB
            assert result["alloc"]["10"] == "ok", result
            seen.append((env, result))
        pipe_bytes = len(seen[0][0]["CUDA_MPS_PIPE_DIRECTORY"] + "/control_privileged")
        private_shm = _client_with_private_shm(seen[1][0])
        assert (await kubelet.unprepare([a, b])).claims[a.uid].error == ""
    assert _leftovers(dirs) == []
    calls = _check_smi_calls(smi)
    assert await plugin.terminate() == 0
    env, result = seen[0]
    row(
        "MPS pair (20Gi each)",
        "ok",
        f"limit {env.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}: 25 GiB refused, 10 GiB ok; "
        f"threads {env.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}%: "
        f"SMs used {result.get('sms_used', '-')} of attribute {result['sm_attribute']} "
        f"({result['via']}); "
        f"pipe path {pipe_bytes} B; nvidia-smi calls {len(calls)}, recorded only; nothing left; "
        f"a client with its own /dev/shm: {private_shm}",
    )


def test_container_with_the_claims_cdi_devices() -> None:
    if shutil.which("containerd") is None or not Path("/run/containerd/containerd.sock").exists():
        pytest.skip("no running containerd here: the e2e tier's level 3 runs claims in containers")
