"""Consumable capacity at prepare, over the real sockets: shares of one GPU for several
claims, each its own CDI device and reservation, its share ID back to the kubelet; bad
shares refused per claim. The claims live in the local API server with the allocation
a 1.36 scheduler writes (shareID, consumedCapacity)."""

import asyncio
import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

from drivers.gpu import node
from kubeletplugin.state import DeviceState
from sandbox.kubeletsim import KubeletSim
from tests import test_mps
from tests.pluginharness import NodeDirs, create_claim, create_node, wait_for
from tests.test_grpc_state import NODE, _config
from tests.test_mps import Control, daemon_pids, mps
from tests.test_state import DRIVER as STATE_DRIVER
from tests.test_state import NODE as STATE_NODE
from tests.test_state import _config as state_config
from tests.test_state import _inventory, devices_of
from tests.test_state import create_claim as create_state_claim
from tests.test_timeslicing import Smi

# The fixtures of test_mps, used here as they are (dirs and kube come from conftest): a short
# tmp_path, as the daemons' sockets live under it.
control = test_mps.control
tmp_path = test_mps.tmp_path
DRIVER = "gpu.nvidia.com"
KIND = "k8s.gpu.nvidia.com/claim"


def share(
    device: str, memory: str, share_id: str | None = None, request: str = "gpu"
) -> dict[str, Any]:
    return {
        "request": request,
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": share_id or str(uuid.uuid4()),
        "consumedCapacity": {"memory": memory},
    }


async def test_shares_of_one_gpu_are_prepared_for_several_claims(
    kube: tuple[Any, Path], dirs: NodeDirs
) -> None:
    api, kubeconfig = kube
    await create_node(api, NODE)
    a_share, b_share = share("gpu-0", "20Gi"), share("gpu-0", "20Gi")
    a = await create_claim(api, "a", node=NODE, devices=["gpu-0"], results=[a_share])
    b = await create_claim(api, "b", node=NODE, devices=["gpu-0"], results=[b_share])
    reused = await create_claim(
        api,
        "reused",
        node=NODE,
        devices=["gpu-0"],
        results=[share("gpu-0", "1Gi", a_share["shareID"])],
    )
    whole = await create_claim(api, "whole", node=NODE, devices=["gpu-0"])
    off_step = await create_claim(
        api, "off-step", node=NODE, devices=["gpu-1"], results=[share("gpu-1", "20500Mi")]
    )
    bad_id = await create_claim(
        api, "bad-id", node=NODE, devices=["gpu-1"], results=[share("gpu-1", "1Gi", "gpu-1/../x")]
    )
    two = await create_claim(
        api,
        "two",
        node=NODE,
        devices=["gpu-1"],
        results=[share("gpu-1", "8Gi", request="gpu"), share("gpu-1", "8Gi", request="more")],
    )
    stop = asyncio.Event()
    config = dataclasses.replace(_config(dirs, kubeconfig), consumable_capacity=True)
    running = asyncio.create_task(node.run(config, stop))
    paths = dirs.paths()
    try:
        await wait_for(paths.registration.is_socket, "registration socket")
        async with await KubeletSim.register(
            paths.registration, known_versions=["v1.DRAPlugin"]
        ) as kubelet:
            response = await kubelet.prepare([a, b, reused, whole, off_step, bad_id, two])
            errors = {uid: r.error for uid, r in response.claims.items()}
            assert errors[a.uid] == errors[b.uid] == errors[two.uid] == ""
            for ref, held in ((a, a_share), (b, b_share)):
                (device,) = response.claims[ref.uid].devices
                assert device.device_name == "gpu-0"
                assert device.share_id == held["shareID"]
                assert list(device.cdi_device_ids) == [f"{KIND}={ref.uid}-gpu-0-{held['shareID']}"]
            assert len({d.share_id for d in response.claims[two.uid].devices}) == 2
            spec = json.loads((dirs.cdi / f"k8s.gpu.nvidia.com-claim_{two.uid}.json").read_text())
            assert len(spec["devices"]) == 2  # one CDI device per share
            reservations = sorted(p.name for p in (dirs.plugins / DRIVER / "devices").iterdir())
            assert f"gpu-0#{a_share['shareID']}" in reservations
            assert f"gpu-0#{b_share['shareID']}" in reservations

            assert (
                f"share {a_share['shareID']} of device gpu-0 is already prepared for claim"
                in (errors[reused.uid])
            )
            assert "a share ID is never used twice" in errors[reused.uid]
            assert "device gpu-0: shares of it are already prepared" in errors[whole.uid]
            assert (
                'field "consumedCapacity.memory": 20500Mi is not on the device\'s step'
                in (errors[off_step.uid])
            )
            assert 'field "shareID"' in errors[bad_id.uid] and "is not a UUID" in errors[bad_id.uid]

            out = await kubelet.unprepare([a, b, reused, whole, off_step, bad_id, two])
            assert {uid: r.error for uid, r in out.claims.items()} == dict.fromkeys(out.claims, "")
            assert not list(dirs.cdi.iterdir())
            assert not list((dirs.plugins / DRIVER / "devices").iterdir())
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0


async def test_without_the_switch_a_share_is_refused(
    kube: tuple[Any, Path], dirs: NodeDirs
) -> None:
    api, kubeconfig = kube
    await create_node(api, NODE)
    ref = await create_claim(
        api, "a", node=NODE, devices=["gpu-0"], results=[share("gpu-0", "20Gi")]
    )
    stop = asyncio.Event()
    running = asyncio.create_task(node.run(_config(dirs, kubeconfig), stop))
    paths = dirs.paths()
    try:
        await wait_for(paths.registration.is_socket, "registration socket")
        async with await KubeletSim.register(paths.registration) as kubelet:
            response = await kubelet.prepare([ref])
            assert "without --consumable-capacity" in response.claims[ref.uid].error
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0


async def test_mps_enforces_a_share_of_memory_as_its_pinned_limit(
    api_client: Any,
    tmp_path: Path,
    control: Control,
) -> None:
    smi = Smi(tmp_path / "smi")
    config = state_config(
        tmp_path, nvidia_smi=smi.path, mps_control=control.path, consumable_capacity=True
    )
    devices = devices_of(_inventory("p5.48xlarge", tmp_path), config)
    state = await DeviceState.open(config, api_client, devices)
    results = []
    refs = []
    for name, memory, limits in (
        ("small", "20Gi", {}),
        ("capped", "40Gi", {"defaultPinnedDeviceMemoryLimit": "10Gi"}),
    ):
        result = {
            "request": "gpu",
            "driver": STATE_DRIVER,
            "pool": STATE_NODE,
            "device": "gpu-0",
            "shareID": str(uuid.uuid4()),
            "consumedCapacity": {"memory": memory},
        }
        results.append(result)
        refs.append(
            await create_state_claim(
                api_client, name, ["gpu-0"], results=[result], config=[mps(**limits)]
            )
        )
    answers = await state.prepare(refs)
    assert {uid: r.error for uid, r in answers.items()} == dict.fromkeys(answers, "")
    assert len(daemon_pids(tmp_path)) == 1  # one daemon for the GPU's shares
    envs = [
        json.loads((tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{r.uid}.json").read_text())[
            "containerEdits"
        ]["env"]
        for r in refs
    ]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in envs[0]  # the share: 20Gi
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in envs[1]  # the config's 10Gi, smaller
    assert await state.unprepare(refs) == dict.fromkeys(answers, "")
    assert daemon_pids(tmp_path) == []
