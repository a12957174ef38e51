"""Dynamic MIG, the publishing half: GPUs in MIG mode as partitionable devices (KEP-4815).

Through the simulated NVML library: one counter set per GPU, one device per profile and
placement NVML lists, each consuming exactly its placement's memory slices; the slice
layout of the server's version (1.34: counters beside their devices; 1.35+: counters in
slices of their own), accepted by the local API server and within the limits for an
8-GPU p5 with every placement; and the allocator behind ``explain`` never hands out two
overlapping placements, across claims.
"""

import asyncio
import contextlib
import ctypes
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from kubernetes.aio import client as k8s

from driver.common.limits import validate_resource_slice
from driver.kube import client as kubeclient
from driver.kube.session import Session
from driver.nvml.simulated import SimulatedNode
from driver.slices import SliceController
from driver.slices.model import counters_apart_for
from drivers.gpu.kinds import counter_sets, discovered, gpu_kinds, node_devices
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Inventory
from drivers.gpu.resourceslice import build_resource_slices
from sandbox.apiserver import LocalApiServer
from tests.pluginharness import wait_for
from tools.allocation import explain_claim

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
TIMEOUT = 10.0
CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "mig.nvidia.com"},
    "spec": {
        "selectors": [
            {"cel": {"expression": f'device.driver == "{DRIVER}" && '
                     f'device.attributes["{DRIVER}"].type == "mig"'}}
        ]
    },
}  # fmt: skip


def _node(tmp_path: Path, mig: str = "{enabled: all}", base: str = "p5.48xlarge") -> SimulatedNode:
    profile = tmp_path / "dynamic.yaml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    profile.write_text(f"extends: {base}\nmig: {mig}\n")
    return SimulatedNode(profile, NODE, tmp_path / "root")


def _discover(node: SimulatedNode, dynamic: bool = True) -> Inventory:
    return discover(node.nvml, sysfs_root=node.sysfs_root, dynamic_mig=dynamic)


def _placements(node: SimulatedNode, minor: int) -> set[tuple[int, int, int]]:
    """(profile ID, start, size) of every placement NVML lists for GPU ``minor``."""
    found: set[tuple[int, int, int]] = set()
    node.nvml.nvmlInit()
    try:
        gpu = node.nvml.nvmlDeviceGetHandleByIndex(minor)
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = node.nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, index)
            except pynvml.NVMLError_NotSupported:
                continue
            except pynvml.NVMLError_InvalidArgument:
                break
            count = ctypes.c_uint(0)
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                gpu, info.id, None, ctypes.byref(count)
            )
            array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                gpu, info.id, array, ctypes.byref(count)
            )
            found.update((int(info.id), p.start, p.size) for p in array[: count.value])
    finally:
        node.nvml.nvmlShutdown()
    return found


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}


def test_every_placement_nvml_lists_is_one_device_consuming_exactly_its_slices(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    inventory = _discover(node)
    slices = build_resource_slices(inventory, driver_name=DRIVER, node_name=NODE)
    devices = _devices(slices)
    assert len(devices) == 8 * 25  # 7 + 7 + 4 + 3 + 2 + 1 + 1 placements per H100
    assert not any(n == f"gpu-{i}" for n in devices for i in range(8))  # never a whole GPU
    for gpu in inventory.gpus:
        mine = {n: d for n, d in devices.items() if n.startswith(f"gpu-{gpu.minor}-mig-")}
        published = set()
        for name, device in mine.items():
            (use,) = device["consumesCounters"]
            assert use["counterSet"] == f"gpu-{gpu.minor}-counter-set"
            slots = sorted(
                int(c.removeprefix("memory-slice-")) for c in use["counters"] if "slice" in c
            )
            start = int(name.rsplit("-", 1)[1])
            assert slots == list(range(start, start + len(slots))), name
            profile_id = int(name.rsplit("-", 2)[1])
            published.add((profile_id, start, len(slots)))
            assert device["attributes"]["parentUUID"] == {"string": gpu.uuid}
        assert published == _placements(node, gpu.minor)
    (sets,) = [s["spec"]["sharedCounters"] for s in slices if s["spec"].get("sharedCounters")]
    assert [s["name"] for s in sets] == [f"gpu-{i}-counter-set" for i in range(8)]
    counters = sets[0]["counters"]
    assert {f"memory-slice-{i}" for i in range(8)} <= set(counters)
    assert counters["multiprocessors"] == {"value": "132"}  # the 7g's, NVML's number


def test_counters_admit_every_profile_at_its_instance_count(tmp_path: Path) -> None:
    """The capacity counters never refuse what the GPU itself allows: each profile as
    many times as it has disjoint placements fits in the GPU's counter set (but for the
    +me profile, of which a GPU has one)."""
    inventory = _discover(_node(tmp_path))
    (counters,) = counter_sets(inventory)[:1]
    limit = {k: int(v["value"]) for k, v in counters["counters"].items()}
    devices = discovered(inventory, node_name=NODE).discovered()
    by_profile: dict[str, list[dict[str, Any]]] = {}
    for device in devices:
        if device["name"].startswith("gpu-0-"):
            by_profile.setdefault(device["attributes"]["profile"]["string"], []).append(device)
    for profile, group in by_profile.items():
        taken: set[str] = set()
        used: dict[str, int] = {}
        for device in group:  # greedy: placements whose slices are still free
            counts = device["consumesCounters"][0]["counters"]
            slots = {c for c in counts if c.startswith("memory-slice-")}
            if slots & taken:
                continue
            taken |= slots
            for c, v in counts.items():
                used[c] = used.get(c, 0) + int(v["value"])
        if profile.endswith("+me"):
            # One instance in all, as NVML says: the media engines' counter allows one.
            assert used["ofa-engines"] == len(taken) > limit["ofa-engines"] == 1
            continue
        assert all(used[c] <= limit[c] for c in used), (profile, used, limit)


def test_the_layout_of_each_server_version_is_within_its_limits(tmp_path: Path) -> None:
    inventory = _discover(_node(tmp_path))
    split = build_resource_slices(inventory, driver_name=DRIVER, node_name=NODE)
    # 1.35+: the counter sets alone in the first slice, then at most 64 devices a slice.
    assert [bool(s["spec"].get("sharedCounters")) for s in split] == [True] + [False] * 4
    assert "devices" not in split[0]["spec"]
    assert [len(s["spec"]["devices"]) for s in split[1:]] == [64, 64, 64, 8]
    assert all(validate_resource_slice(s, release=(1, 36)) == [] for s in split)
    combined = build_resource_slices(
        inventory, driver_name=DRIVER, node_name=NODE, counters_apart=False
    )
    # 1.34: one slice per GPU, its counter set beside the 25 devices that consume it.
    assert len(combined) == 8
    for i, obj in enumerate(combined):
        spec = obj["spec"]
        assert [c["name"] for c in spec["sharedCounters"]] == [f"gpu-{i}-counter-set"]
        assert {d["name"].split("-mig-")[0] for d in spec["devices"]} == {f"gpu-{i}"}
        assert validate_resource_slice(obj, release=(1, 34)) == []
        # Each layout is invalid on the other version.
        assert validate_resource_slice(obj, release=(1, 36)) != []
    (error,) = validate_resource_slice(split[0], release=(1, 34))  # 8 sets of 14: too many
    assert "at most 32 in all sets together" in error
    assert counters_apart_for("v1.34.2-eks-113cf36") is False
    assert counters_apart_for("v1.35.0") is True and counters_apart_for("v1.36.1") is True


def test_without_the_flag_nothing_changes(tmp_path: Path) -> None:
    node = _node(tmp_path, "{enabled: all, instances: [{profile: 3g.40gb, start: 0}]}")
    before = _discover(node, dynamic=False)
    assert all(g.mig_partitions == () for g in before.gpus)
    assert counter_sets(before) == []
    names = sorted(_devices(build_resource_slices(before, driver_name=DRIVER, node_name=NODE)))
    assert names == sorted(f"gpu-{i}-mig-3g40gb-9-0" for i in range(8))  # static MIG


def test_gpus_not_in_mig_mode_stay_whole_and_gpus_without_mig_get_none(tmp_path: Path) -> None:
    half = _discover(_node(tmp_path / "p5", "{enabled: [0, 1]}"))
    names = _devices(build_resource_slices(half, driver_name=DRIVER, node_name=NODE))
    assert [f"gpu-{i}" for i in range(2, 8)] == sorted(n for n in names if "-mig-" not in n)
    assert {n.split("-mig-")[0] for n in names if "-mig-" in n} == {"gpu-0", "gpu-1"}
    assert [c["name"] for c in counter_sets(half)] == ["gpu-0-counter-set", "gpu-1-counter-set"]
    for profile in ("g6e.12xlarge", "g6.xlarge"):  # L40S, L4: NVML says no MIG
        node = SimulatedNode(profile, NODE, tmp_path / profile)
        inventory = _discover(node)
        assert counter_sets(inventory) == []
        assert not any("-mig-" in n for n in _devices(
            build_resource_slices(inventory, driver_name=DRIVER, node_name=NODE)))  # fmt: skip


def test_an_instance_made_out_of_band_takes_the_placements_it_overlaps_out(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path, "{enabled: all, instances: [{profile: 3g.40gb, start: 4}]}")
    inventory = _discover(node)
    names = set(_devices(build_resource_slices(inventory, driver_name=DRIVER, node_name=NODE)))
    gpu0 = {n for n in names if n.startswith("gpu-0-")}
    assert "gpu-0-mig-3g40gb-9-0" in gpu0 and "gpu-0-mig-4g40gb-5-0" in gpu0
    for gone in ("gpu-0-mig-3g40gb-9-4", "gpu-0-mig-7g80gb-0-0", "gpu-0-mig-1g10gb-19-4",
                 "gpu-0-mig-2g20gb-14-4", "gpu-0-mig-1g20gb-15-6"):  # fmt: skip
        assert gone not in gpu0
    assert len(gpu0) == 25 - 3 - 3 - 2 - 1 - 1 - 1  # what lies in slices 0-3 only


# ---- the allocator behind explain: counters across claims ----------------------------------


def _claim(name: str, profile: str) -> dict[str, Any]:
    expression = (
        f'device.attributes["{DRIVER}"].profile == "{profile}" && '
        f'device.attributes["{DRIVER}"].index == 0'
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.nvidia.com",
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def _allocate(
    claim: dict[str, Any], slices: list[dict[str, Any]], held: list[dict[str, Any]]
) -> list[str]:
    node = explain_claim(claim, slices=slices, classes=[CLASS], allocated=held).node(NODE)
    if not node.allocatable:
        return list(node.reasons)
    devices = [r.device for r in node.results]
    results = [{"request": "mig", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    held.append({**claim, "status": {"allocation": {"devices": {"results": results}}}})
    return devices


@pytest.mark.parametrize("apart", [True, False], ids=["1.35+", "1.34"])
def test_explain_never_allocates_overlapping_placements_to_two_claims(
    tmp_path: Path, apart: bool
) -> None:
    inventory = _discover(_node(tmp_path))
    slices = build_resource_slices(
        inventory, driver_name=DRIVER, node_name=NODE, counters_apart=apart
    )
    held: list[dict[str, Any]] = []
    assert _allocate(_claim("x", "4g.40gb"), slices, held) == ["gpu-0-mig-4g40gb-5-0"]
    # 3g@0 overlaps the 4g: the next claim gets 3g@4, and a third none on GPU 0.
    assert _allocate(_claim("y", "3g.40gb"), slices, held) == ["gpu-0-mig-3g40gb-9-4"]
    reasons = _allocate(_claim("z", "1g.10gb"), slices, held)
    assert any("memory-slice-" in r and "claim default/" in r for r in reasons), reasons


# ---- the publisher picks the layout from the server's version ------------------------------


@pytest.fixture
async def servers() -> AsyncIterator[list[tuple[LocalApiServer, Session]]]:
    opened: list[tuple[LocalApiServer, Session]] = []
    yield opened
    for server, api in opened:
        await kubeclient.close(api)
        await server.stop()


@contextlib.asynccontextmanager
async def _publishing(
    tmp_path: Path, servers: list[tuple[LocalApiServer, Session]], version: str
) -> AsyncIterator[tuple[LocalApiServer, SliceController]]:
    """A server of ``version`` and a publisher of a p5 with every GPU in MIG mode, running."""
    server = LocalApiServer(bookmark_interval=0.2, version=version)
    await server.start()
    api = Session(k8s.Configuration(host=server.url))
    servers.append((server, api))
    server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    node = _node(tmp_path)

    async def discover_now() -> Inventory:
        return await asyncio.to_thread(_discover, node)

    devices = node_devices(discover_now, node_name=NODE, kinds=gpu_kinds())
    controller = SliceController(
        api,
        node_name=NODE,
        driver_name=DRIVER,
        devices=devices.published,
        counter_sets=devices.counter_sets,
        request_timeout=2.0,
        backoff_cap=0.2,
    )
    task = asyncio.create_task(controller.run())
    try:
        await asyncio.wait_for(controller.published.wait(), TIMEOUT)
        await asyncio.wait_for(controller.resync(), TIMEOUT)
        yield server, controller
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(("version", "slices"), [("1.34.0", 8), ("1.36.0", 5)])
async def test_the_publisher_writes_the_layout_of_the_servers_version(
    tmp_path: Path,
    servers: list[tuple[LocalApiServer, Session]],
    version: str,
    slices: int,
) -> None:
    async with _publishing(tmp_path, servers, version) as (server, _):
        stored = server.objects("resourceslices")
        assert len(stored) == slices
        assert sum(len(s["spec"].get("devices") or ()) for s in stored) == 200
        assert sum(len(s["spec"].get("sharedCounters") or ()) for s in stored) == 8
        creates = [r.verb for r in server.requests.writes("resourceslices")]
        assert creates == ["create"] * slices  # accepted once, never rewritten


@pytest.mark.parametrize(
    ("before", "after", "slices"), [("1.34.0", "1.36.0", 5), ("1.36.0", "1.34.0", 8)]
)
async def test_a_control_plane_upgrade_or_rollback_republishes_in_the_new_layout(
    tmp_path: Path,
    servers: list[tuple[LocalApiServer, Session]],
    before: str,
    after: str,
    slices: int,
) -> None:
    async with _publishing(tmp_path, servers, before) as (server, _):
        assert len(server.objects("resourceslices")) == 13 - slices  # the other layout

        await server.restart(version=after)  # every watch ends; the version is new

        def republished() -> bool:
            stored = server.objects("resourceslices")
            apart = [s for s in stored if s["spec"].get("sharedCounters")]
            return len(stored) == slices and all(
                bool(s["spec"].get("devices")) != counters_apart_for(after) for s in apart
            )

        await wait_for(republished, f"slices in the layout of {after}", TIMEOUT)
        stored = server.objects("resourceslices")
        assert sum(len(s["spec"].get("devices") or ()) for s in stored) == 200
        assert sum(len(s["spec"].get("sharedCounters") or ()) for s in stored) == 8
        # No write was refused on the way (the probes' dry runs aside).
        writes = server.requests.writes("resourceslices")
        assert [r for r in writes if r.code >= 300 and not r.dry_run] == []
