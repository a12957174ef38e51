"""Static MIG devices prepared and unprepared over the real DRA socket: the kubelet's view.

A p4d.24xlarge with GPUs 0-3 in MIG mode (3g.20gb@0, 2g.10gb@4, 1g.10gb@6 each): the
kubelet simulator drives NodePrepareResources / NodeUnprepareResources, and the CDI spec
the plugin writes must give a container the MIG device's nvidia-cap nodes and its parent's
device node.
"""

import asyncio
import json
from pathlib import Path
from typing import Any

from api.config import API_VERSION
from driver.nvml.simulated import mig_minor
from drivers.gpu import node
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import NodeDirs, create_claim, create_node, wait_for

NODE = "node-a"
THREE_G = "gpu-0-mig-3g20gb-9-0"  # GPU instance 1 of GPU 0
ONE_G = "gpu-0-mig-1g10gb-15-6"  # GPU instance 3 of GPU 0
TWO_G_1 = "gpu-1-mig-2g10gb-14-4"  # GPU instance 2 of GPU 1


def _config(dirs: NodeDirs, kubeconfig: Path) -> node.NodeConfig:
    return dirs.node_config(kubeconfig, node_name=NODE, profile="p4d.24xlarge-mig")


def _spec(dirs: NodeDirs, uid: str) -> dict[str, Any]:
    (path,) = [p for p in dirs.cdi.iterdir() if uid in p.name]
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def _nodes(edits: dict[str, Any]) -> list[str]:
    return [n["path"] for n in edits.get("deviceNodes", [])]


def _caps(gpu: int, gi: int) -> list[str]:
    return [
        f"/dev/nvidia-caps/nvidia-cap{mig_minor(gpu, gi)}",
        f"/dev/nvidia-caps/nvidia-cap{mig_minor(gpu, gi, 0)}",
    ]


async def test_mig_devices_are_prepared_with_their_cap_nodes_and_unprepared(
    kube: tuple[Any, Path], dirs: NodeDirs
) -> None:
    api, kubeconfig = kube
    await create_node(api, NODE)
    two_sizes = await create_claim(api, "two-sizes", node=NODE, devices=[THREE_G, ONE_G])
    mixed = await create_claim(api, "mixed", node=NODE, devices=["gpu-4", TWO_G_1])
    whole = await create_claim(api, "whole", node=NODE, devices=["gpu-0"])
    taken = await create_claim(api, "taken", node=NODE, devices=[ONE_G])
    sharing = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    config = [
        {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": sharing}}
    ]
    free = "gpu-2-mig-2g10gb-14-4"
    shared = await create_claim(api, "shared", node=NODE, devices=[free], config=config)
    stop = asyncio.Event()
    running = asyncio.create_task(node.run(_config(dirs, kubeconfig), stop))
    paths = dirs.paths()
    try:
        await wait_for(paths.registration.is_socket, "registration socket")
        async with await KubeletSim.register(paths.registration) as kubelet:
            response = await kubelet.prepare([two_sizes, mixed])
            assert {uid: r.error for uid, r in response.claims.items()} == {
                two_sizes.uid: "",
                mixed.uid: "",
            }
            devices = response.claims[two_sizes.uid].devices
            assert sorted(d.device_name for d in devices) == sorted([THREE_G, ONE_G])
            assert sorted(i for d in devices for i in d.cdi_device_ids) == sorted(
                f"k8s.gpu.nvidia.com/claim={two_sizes.uid}-{name}" for name in (THREE_G, ONE_G)
            )

            spec = _spec(dirs, two_sizes.uid)
            by_name = {d["name"]: d for d in spec["devices"]}
            three = by_name[f"{two_sizes.uid}-{THREE_G}"]
            assert _nodes(three["containerEdits"]) == ["/dev/nvidia0", *_caps(0, 1)]
            one = by_name[f"{two_sizes.uid}-{ONE_G}"]
            assert _nodes(one["containerEdits"]) == ["/dev/nvidia0", *_caps(0, 3)]
            assert three["annotations"]["gpu-dra.io/kind"] == "mig"
            assert three["annotations"]["gpu-dra.io/mig-uuid"].startswith("MIG-")
            claim_wide = spec["containerEdits"]
            assert "NVIDIA_VISIBLE_DEVICES=void" in claim_wide["env"]
            (visible,) = [
                e for e in claim_wide["env"] if e.startswith("GPU_DRA_VISIBLE_MIG_UUIDS=")
            ]
            assert visible.count("MIG-") == 2
            assert _nodes(claim_wide)[:1] == ["/dev/nvidiactl"]

            # A whole GPU and a MIG device in one claim: the control nodes once.
            mixed_spec = _spec(dirs, mixed.uid)
            control = _nodes(mixed_spec["containerEdits"])
            assert control.count("/dev/nvidiactl") == 1
            assert mixed_spec["containerEdits"]["env"].count("NVIDIA_VISIBLE_DEVICES=void") == 1
            mixed_by = {d["name"]: d for d in mixed_spec["devices"]}
            assert _nodes(mixed_by[f"{mixed.uid}-{TWO_G_1}"]["containerEdits"]) == [
                "/dev/nvidia1",
                *_caps(1, 2),
            ]

            # GPU 0 is in MIG mode: not a device of this node as a whole.
            refused = await kubelet.prepare([whole, taken, shared])
            assert "gpu-0" in refused.claims[whole.uid].error
            assert "does not exist" in refused.claims[whole.uid].error
            assert ONE_G in refused.claims[taken.uid].error  # held by two-sizes
            assert "not supported on MIG devices" in refused.claims[shared.uid].error
            assert not any(shared.uid in p.name for p in dirs.cdi.iterdir())

            out = await kubelet.unprepare([two_sizes, mixed, whole, taken, shared])
            assert {uid: r.error for uid, r in out.claims.items()} == {
                c.uid: "" for c in (two_sizes, mixed, whole, taken, shared)
            }
            assert not list(dirs.cdi.iterdir())
            # Released: the 1g.10gb goes to the claim that was refused.
            again = await kubelet.prepare([taken])
            assert again.claims[taken.uid].error == ""
            await kubelet.unprepare([taken])
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
