"""NVIDIA's real ``nvidia-ctk cdi generate`` over a fake driver root with the simulated NVML.

The toolkit is built from its Go module by ``python -m tests.e2e.build nvidia-ctk``; its
go-nvml drives the same simulated ``libnvidia-ml.so.1`` as our pynvml. Its output goes
through our path translation and spec merge, and must come out as a valid CDI spec whose
host paths all lie in the host's driver root.
"""

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from driver.nvml.faults import Faults, gpu_lost
from driver.nvml.simulated import HARDWARE_ENV, HARDWARE_FILE, SimulatedNvml
from drivers.gpu.kinds.gpu import CONTROL_NODES, own_node
from kubeletplugin.containertoolkit import base_edits
from tests.simroot import NODE, ctk_binary, fake_root, install_driver_files
from tests.test_cdi import _record, assert_valid_spec, build

HOST_ROOT = Path("/run/nvidia/driver")  # a driver container's root, not /
# Host paths the toolkit names outside the driver root, and why.
OUTSIDE_THE_ROOT = {
    "/dev/null",  # bound over /var/run/nvidia-container-devices/void: a host device file
}


async def test_real_toolkit_output_translates_into_the_host_driver_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctk = ctk_binary()
    if ctk is None:
        pytest.skip("nvidia-ctk is not built: run python -m tests.e2e.build nvidia-ctk")
    root = tmp_path / "driver-root"
    node, env = fake_root(root, "p5.48xlarge")
    version = node.profile.driver_version
    install_driver_files(root, version, ctk)
    # nvidia-ctk inherits it and reads the same GPUs
    monkeypatch.setenv(HARDWARE_ENV, env[HARDWARE_ENV])

    edits = await base_edits("system", container_root=root, host_root=HOST_ROOT, own_node=own_node)

    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    for name in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        path = f"/usr/lib64/{name}.so.{version}"
        assert mounts[path] == f"{HOST_ROOT}{path}"
    assert mounts["/usr/bin/nvidia-smi"] == f"{HOST_ROOT}/usr/bin/nvidia-smi"
    # The simulated hardware, where a container's copy of the simulated library finds it.
    assert mounts[f"/{HARDWARE_FILE}"] == f"{HOST_ROOT}/{HARDWARE_FILE}"
    hooks = edits["hooks"]
    assert {h["path"] for h in hooks} == {f"{HOST_ROOT}/usr/bin/nvidia-ctk"}
    links = [a for h in hooks for a in h["args"] if "::" in a]
    assert f"libnvidia-ml.so.{version}::/usr/lib64/libnvidia-ml.so.1" in links
    host_paths = [*mounts.values(), *(n["hostPath"] for n in edits.get("deviceNodes", []))]
    host_paths += [h["path"] for h in hooks]
    outside = {p for p in host_paths if not Path(p).is_relative_to(HOST_ROOT)}
    assert outside == OUTSIDE_THE_ROOT
    assert str(root) not in json.dumps(edits)  # no path of this container is left
    # Our claim spec adds its own GPU and control nodes; the toolkit's are dropped.
    assert all(n["path"] not in CONTROL_NODES for n in edits.get("deviceNodes", []))

    spec = build(_record("gpu-0", "gpu-1"), edits)
    assert_valid_spec(spec)
    assert spec["containerEdits"]["mounts"] == edits["mounts"]


async def test_a_lost_gpu_does_not_stop_the_toolkit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU fallen off the bus answers GPU_IS_LOST to a handle; the toolkit that visits every
    GPU exits 1 on it (NVIDIA's plugin then crash-loops). The spec-level edits ask for none."""
    ctk = ctk_binary()
    if ctk is None:
        pytest.skip("nvidia-ctk is not built: run python -m tests.e2e.build nvidia-ctk")
    edits = []
    for lost in (None, 3):
        root = tmp_path / f"lost-{lost}"
        node, env = fake_root(root, "p5.48xlarge")
        install_driver_files(root, node.profile.driver_version, ctk)
        if lost is not None:
            faults = Faults(failing_queries=gpu_lost(lost))
            nvml = SimulatedNvml(node.profile, root, node_name=NODE, faults=faults)
            assert str(nvml.render()) == env[HARDWARE_ENV]
            visiting = await asyncio.to_thread(
                subprocess.run,
                [str(ctk), "cdi", "generate", f"--driver-root={root}"],
                capture_output=True, text=True, env=env, timeout=60, check=False,
            )  # fmt: skip
            assert visiting.returncode == 1 and "GPU is lost" in visiting.stderr  # the defect
        monkeypatch.setenv(HARDWARE_ENV, env[HARDWARE_ENV])
        edits.append(
            await base_edits("system", container_root=root, host_root=HOST_ROOT, own_node=own_node)
        )
    healthy, with_a_lost_gpu = edits
    assert with_a_lost_gpu == healthy and healthy["mounts"]


_OLD_CTK = r"""#!/bin/sh
echo "$@" >> "$0.log"
for a in "$@"; do case "$a" in
  --device-id=*) echo "Incorrect Usage: flag provided but not defined: -device-id" >&2; exit 1;;
  --driver-root=*) root="${a#--driver-root=}";;
esac; done
lib=/usr/lib64/libcuda.so.1
printf '{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[],"containerEdits":'
printf '{"mounts":[{"hostPath":"%s","containerPath":"%s"}]}}\n' "$root$lib" "$lib"
"""


async def test_a_toolkit_before_v1_19_is_asked_for_every_gpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """v1.18 and before have no --device-id (the AL2023 AMI has 1.19.1): asked again without
    it, and told once that a lost GPU will stop it."""
    ctk = tmp_path / "usr" / "bin" / "nvidia-ctk"
    ctk.parent.mkdir(parents=True)
    ctk.write_text(_OLD_CTK)
    ctk.chmod(0o755)
    edits = await base_edits(
        "system", container_root=tmp_path, host_root=HOST_ROOT, own_node=own_node
    )
    assert edits["mounts"][0]["hostPath"] == f"{HOST_ROOT}/usr/lib64/libcuda.so.1"
    calls = (tmp_path / "usr" / "bin" / "nvidia-ctk.log").read_text().splitlines()
    assert len(calls) == 2 and "--device-id=none" in calls[0].split()
    assert "--device-id=none" not in calls[1].split()
    assert [r.getMessage() for r in caplog.records if "predates" in r.getMessage()]
