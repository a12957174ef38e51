"""NVIDIA's real ``nvidia-ctk cdi generate`` over a fake driver root with the simulated NVML.

The toolkit is built from its Go module by ``python -m tests.e2e.build nvidia-ctk``; its
go-nvml drives the same simulated ``libnvidia-ml.so.1`` as our pynvml. Its output goes
through our path translation and spec merge, and must come out as a valid CDI spec whose
host paths all lie in the host's driver root.
"""

import json
from pathlib import Path

import pytest

from driver.nvml.simulated import HARDWARE_FILE
from drivers.gpu.kinds.gpu import CONTROL_NODES, own_node
from kubeletplugin.containertoolkit import base_edits
from tests.simroot import ctk_binary, fake_root, install_driver_files
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
    for key in ("GPU_DRA_SIM_NVML",):
        monkeypatch.setenv(key, env[key])  # nvidia-ctk inherits it and reads the same GPUs

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
