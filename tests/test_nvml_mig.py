"""The simulated NVML's MIG answers, through the real pynvml: profiles, placements, the
instances a profile configures, MIG device handles, the access files the driver keeps."""

import ctypes
import re
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver.nvml.faults import Faults, QueryFault
from driver.nvml.profile import load_profile, profile_names
from driver.nvml.simulated import SimulatedNode, mig_minor

MIG_PROFILE = "p4d.24xlarge-mig"  # GPUs 0-3: 3g.20gb@0, 2g.10gb@4, 1g.10gb@6


def _placements(gpu: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, None, ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, array, ctypes.byref(count))
    return [(p.start, p.size) for p in array[: count.value]]


@pytest.mark.parametrize(
    ("profile", "names", "memory"),
    [
        ("p4d.24xlarge", ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me",
                          "1g.10gb"], [4864, 9856, 19968, 19968, 40192, 4864, 9856]),
        ("p4de.24xlarge", ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me",
                           "1g.20gb"], [9728, 19968, 40192, 40192, 80640, 9728, 19968]),
        ("p5.48xlarge", ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me",
                         "1g.20gb"], [9984, 20096, 40448, 40448, 81152, 9984, 20096]),
        ("p5e.48xlarge", ["1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "1g.18gb+me",
                          "1g.35gb"], [16384, 33280, 71424, 71424, 143360, 16384, 33280]),
    ],
)  # fmt: skip
def test_profiles_by_index_ids_and_placements(
    tmp_path: Path, profile: str, names: list[str], memory: list[int]
) -> None:
    node = SimulatedNode(profile, "n", tmp_path)
    node.nvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        found: dict[int, Any] = {}
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                found[index] = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, index)
            except pynvml.NVMLError_NotSupported:
                continue
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past the last index
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
        # The index is the NVML_GPU_INSTANCE_PROFILE_* constant, the id what nvidia-smi shows.
        by_index = {i: (info.id, str(info.name)) for i, info in found.items()}
        assert sorted(by_index) == [0, 1, 2, 3, 4, 7, 9]
        assert [by_index[i][1] for i in (0, 1, 2, 3, 4, 7, 9)] == [f"MIG {n}" for n in names]
        # memorySizeMB, what published MIG devices carry: the sources are in each profile file
        assert [found[i].memorySizeMB for i in (0, 1, 2, 3, 4, 7, 9)] == memory
        ids = {name.removeprefix("MIG "): pid for pid, name in by_index.values()}
        assert ids[names[0]] == 19 and ids[names[2]] == 9 and ids[names[4]] == 0
        assert _placements(gpu, ids[names[0]]) == [(s, 1) for s in range(7)]  # never slice 7
        assert _placements(gpu, ids[names[6]]) == [(0, 2), (2, 2), (4, 2), (6, 2)]
        assert _placements(gpu, ids[names[1]]) == [(0, 2), (2, 2), (4, 2)]
        assert _placements(gpu, ids[names[2]]) == [(0, 4), (4, 4)]
        assert _placements(gpu, ids[names[3]]) == [(0, 4)]
        assert _placements(gpu, ids[names[4]]) == [(0, 8)]
        short = (pynvml.c_nvmlGpuInstancePlacement_t * 1)()
        count = ctypes.c_uint(1)
        with pytest.raises(pynvml.NVMLError_InsufficientSize):
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, 19, short, ctypes.byref(count))
        assert count.value == 7
    finally:
        pynvml.nvmlShutdown()


def test_static_instances_are_gpu_compute_instances_and_mig_devices(tmp_path: Path) -> None:
    node = SimulatedNode(MIG_PROFILE, "n", tmp_path)
    node.nvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetMigMode(gpu) == [1, 1]
        parent_uuid = pynvml.nvmlDeviceGetUUID(gpu)
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
            gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
        )
        gis = (pynvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint()
        pynvml.nvmlDeviceGetGpuInstances(gpu, info.id, gis, ctypes.byref(count))
        assert count.value == 1
        gi = pynvml.nvmlGpuInstanceGetInfo(gis[0])
        assert (gi.profileId, gi.placement.start, gi.placement.size) == (9, 0, 4)
        ci_profile = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gis[0], pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0
        )
        assert (ci_profile.sliceCount, ci_profile.multiprocessorCount) == (3, 42)
        with pytest.raises(pynvml.NVMLError_NotSupported):  # the sim offers full CIs only
            pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gis[0], 0, 0)
        cis = (pynvml.c_nvmlComputeInstance_t * 1)()
        pynvml.nvmlGpuInstanceGetComputeInstances(gis[0], ci_profile.id, cis, ctypes.byref(count))
        assert count.value == 1
        ci = pynvml.nvmlComputeInstanceGetInfo(cis[0])
        mig = ci.device
        assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
        assert pynvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
        assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 19968 << 20
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert pynvml.nvmlDeviceGetUUID(parent) == parent_uuid
        by_index = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i) for i in range(3)]
        assert pynvml.nvmlDeviceGetUUID(by_index[0]) == pynvml.nvmlDeviceGetUUID(mig)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 3)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a MIG handle is no parent
            pynvml.nvmlDeviceGetMinorNumber(mig)
        whole = pynvml.nvmlDeviceGetHandleByIndex(4)
        assert pynvml.nvmlDeviceGetMigMode(whole) == [0, 0]
    finally:
        pynvml.nvmlShutdown()


def test_access_files_and_cap_nodes_as_the_driver_keeps_them(tmp_path: Path) -> None:
    node = SimulatedNode(MIG_PROFILE, "n", tmp_path)
    caps = tmp_path / "proc" / "driver" / "nvidia" / "capabilities"
    for minor in range(4):
        for gi in (1, 2, 3):
            gi_text = (caps / f"gpu{minor}" / "mig" / f"gi{gi}" / "access").read_text()
            ci_text = (caps / f"gpu{minor}" / "mig" / f"gi{gi}" / "ci0" / "access").read_text()
            assert f"DeviceFileMinor: {mig_minor(minor, gi)}\n" in gi_text
            assert f"DeviceFileMinor: {mig_minor(minor, gi, 0)}\n" in ci_text
            assert (tmp_path / "dev" / "nvidia-caps" / f"nvidia-cap{mig_minor(minor, gi)}").exists()
    assert not (caps / "gpu4").exists()
    assert mig_minor(0, 0) == 3 and mig_minor(0, 0, 0) == 4 and mig_minor(0, 1) == 12
    assert node.nvml.gpus[4].mig_instances == ()


def test_mig_pending_reset_reports_both_modes(tmp_path: Path) -> None:
    profile = tmp_path / "pending.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: [0], pending: [0, 1]}\n")
    node = SimulatedNode(profile, "n", tmp_path / "root")
    node.nvml.nvmlInit()
    try:
        modes = [
            pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(3)
        ]
        assert modes == [[1, 0], [0, 1], [0, 0]]
    finally:
        pynvml.nvmlShutdown()


def test_gpu_without_mig_answers_not_supported(tmp_path: Path) -> None:
    node = SimulatedNode("g6e.12xlarge", "n", tmp_path)
    node.nvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigMode(gpu)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
    finally:
        pynvml.nvmlShutdown()


def test_injected_fault_hits_gpu_instance_calls_of_that_gpu_only(tmp_path: Path) -> None:
    fault = QueryFault(gpu=1, call="nvmlGpuInstanceGetInfo", error="Unknown")
    node = SimulatedNode(MIG_PROFILE, "n", tmp_path, faults=Faults(failing_queries=(fault,)))
    node.nvml.nvmlInit()
    try:
        infos = []
        for minor in (0, 1):
            gpu = pynvml.nvmlDeviceGetHandleByIndex(minor)
            gis = (pynvml.c_nvmlGpuInstance_t * 2)()
            count = ctypes.c_uint()
            pynvml.nvmlDeviceGetGpuInstances(gpu, 9, gis, ctypes.byref(count))
            try:
                infos.append(pynvml.nvmlGpuInstanceGetInfo(gis[0]).id)
            except pynvml.NVMLError_Unknown:
                infos.append(None)
        assert infos == [1, None]
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.parametrize(
    ("instances", "error"),
    [
        ("[{profile: 3g.20gb, start: 2}]", "cannot start at memory slice 2"),
        ("[{profile: 3g.20gb, start: 0}, {profile: 2g.10gb, start: 2}]", "overlaps"),
        ("[{profile: 9g.1gb, start: 0}]", "unknown profile"),
    ],
)
def test_invalid_instance_layouts_are_refused(tmp_path: Path, instances: str, error: str) -> None:
    from driver.nvml.faults import SimulationConfigError
    from driver.nvml.profile import load_profile

    profile = tmp_path / "bad.yaml"
    profile.write_text(f"extends: p4d.24xlarge\nmig: {{enabled: all, instances: {instances}}}\n")
    with pytest.raises(SimulationConfigError, match=error):
        load_profile(profile)


def _mig_on(tmp_path: Path) -> SimulatedNode:
    profile = tmp_path / "mig-on.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: [0]}\n")  # no instances yet
    return SimulatedNode(profile, "n", tmp_path / "root")


def _placement(start: int, size: int) -> Any:
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = start, size
    return ctypes.byref(placement)


def test_instances_created_at_a_placement_and_destroyed_ci_first(tmp_path: Path) -> None:
    node = _mig_on(tmp_path)
    caps = node.root / "proc/driver/nvidia/capabilities/gpu0/mig"
    node.nvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7  # in MIG mode: the 1g's count
        gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, _placement(4, 4))  # 3g
        info = pynvml.nvmlGpuInstanceGetInfo(gi)
        assert (info.profileId, info.placement.start, info.placement.size) == (9, 4, 4)
        # Memory slices 0-3 and 4 compute slices are left: 3g, 1g.5gb, 2g, 4g, 7g, 1g.10gb.
        remaining = [pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, p)
                     for p in (9, 19, 14, 5, 0, 15)]  # fmt: skip
        assert remaining == [1, 4, 2, 1, 0, 2]
        assert (
            (caps / f"gi{info.id}" / "access")
            .read_text()
            .startswith(f"DeviceFileMinor: {mig_minor(0, info.id)}\n")
        )
        with pytest.raises(pynvml.NVMLError_InsufficientResources):  # slices 4-5 are taken
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 14, _placement(4, 2))
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # not a 3g placement
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, _placement(2, 4))
        with pytest.raises(pynvml.NVMLError_NotFound):  # a GI without a CI is no MIG device
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        ci = pynvml.nvmlGpuInstanceCreateComputeInstance(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
        )
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        uuid = pynvml.nvmlDeviceGetUUID(mig)
        assert re.fullmatch(
            r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid
        )
        assert (caps / f"gi{info.id}" / "ci0" / "access").is_file()
        # A re-init (the next discovery) still sees it: the GPU stayed in MIG mode.
        pynvml.nvmlShutdown()
        node.nvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)) == uuid
        with pytest.raises(pynvml.NVMLError_InUse):  # its compute instance goes first
            pynvml.nvmlGpuInstanceDestroy(gi)
        pynvml.nvmlComputeInstanceDestroy(ci)
        pynvml.nvmlGpuInstanceDestroy(gi)
        assert not (caps / f"gi{info.id}").exists()
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a destroyed handle
            pynvml.nvmlGpuInstanceGetInfo(gi)
        whole = pynvml.nvmlDeviceGetHandleByIndex(1)  # MIG mode off
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(whole, 9, _placement(0, 4))
    finally:
        pynvml.nvmlShutdown()


def test_created_instances_are_discovered_as_mig_devices(tmp_path: Path) -> None:
    from drivers.gpu.model.discovery import discover

    node = _mig_on(tmp_path)
    node.nvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        for profile_id, start, size, ci_profile in ((19, 0, 1, 0), (14, 2, 2, 1)):
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                gpu, profile_id, _placement(start, size)
            )
            pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
    finally:
        pynvml.nvmlShutdown()
    inventory = discover(node.nvml, sysfs_root=node.sysfs_root)
    assert [(m.profile, m.placement_start) for m in inventory.gpus[0].mig_devices] == [
        ("1g.10gb", 0),
        ("2g.20gb", 2),
    ]


def test_a_mig_device_is_found_by_its_uuid_with_its_share_of_the_gpu(tmp_path: Path) -> None:
    """As NVML since R470, and as nvidia-ctk cdi generate looks every MIG device up."""
    node = SimulatedNode("p4d.24xlarge-mig", "n", tmp_path)
    node.nvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        uuid = pynvml.nvmlDeviceGetUUID(mig)
        found = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        assert pynvml.nvmlDeviceGetUUID(found) == uuid and uuid.startswith("MIG-")
        gi = pynvml.nvmlDeviceGetGpuInstanceById(gpu, pynvml.nvmlDeviceGetGpuInstanceId(found))
        profile = pynvml.nvmlGpuInstanceGetInfo(gi).profileId
        info = next(
            i for i in (pynvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, n) for n in (0, 1, 2, 3, 4))
            if i.id == profile
        )  # fmt: skip
        attrs = pynvml.nvmlDeviceGetAttributes(found)
        assert attrs.multiprocessorCount == info.multiprocessorCount
        assert attrs.gpuInstanceSliceCount == info.sliceCount
        assert attrs.memorySizeMB == info.memorySizeMB
        with pytest.raises(pynvml.NVMLError_NotSupported):  # whole GPUs: not a MIG share
            pynvml.nvmlDeviceGetAttributes(gpu)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID("MIG-00000000-0000-0000-0000-000000000000")
    finally:
        pynvml.nvmlShutdown()


# A second process of the same simulated node (a sibling plugin instance during a surge
# upgrade): it opens the library of the root, runs the ops, prints what each returned.
_SIBLING = """
import ctypes, json, sys
from pathlib import Path
import pynvml
from driver.nvml.simulated import SimulatedNode

profile, root, ops = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
node = SimulatedNode(profile, "n", root)
node.nvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
out = []
for op, *args in ops:
    if op == "create":
        profile_id, start, size, ci_profile = args
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            gpu, profile_id, ctypes.byref(placement))
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
        out.append(pynvml.nvmlGpuInstanceGetInfo(gi).id)
    elif op == "destroy":
        gi = pynvml.nvmlDeviceGetGpuInstanceById(gpu, args[0])
        cis, count = (pynvml.c_nvmlComputeInstance_t * 1)(), ctypes.c_uint(0)
        pynvml.nvmlGpuInstanceGetComputeInstances(gi, args[1], cis, ctypes.byref(count))
        pynvml.nvmlComputeInstanceDestroy(cis[0])
        pynvml.nvmlGpuInstanceDestroy(gi)
        out.append(None)
pynvml.nvmlShutdown()
print(json.dumps(out))
"""


def _sibling(node: SimulatedNode, profile: Path, *ops: tuple[Any, ...]) -> list[Any]:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _SIBLING, str(profile), str(node.root), json.dumps(ops)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: list[Any] = json.loads(done.stdout)
    return result


def _mig_layout(gpu: Any) -> list[tuple[int, int, int]]:
    """(GPU instance ID, placement start, size) of every MIG device of ``gpu``, as NVML
    answers now."""
    found = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
        except pynvml.NVMLError_NotFound:
            continue
        gi = pynvml.nvmlDeviceGetGpuInstanceById(gpu, pynvml.nvmlDeviceGetGpuInstanceId(mig))
        info = pynvml.nvmlGpuInstanceGetInfo(gi)
        found.append((int(info.id), int(info.placement.start), int(info.placement.size)))
    return sorted(found, key=lambda f: f[1])


def test_instances_are_one_state_for_every_process_of_the_node(tmp_path: Path) -> None:
    """As the driver's are: what one process makes or destroys, another sees at its next
    call, without a re-init, and never makes twice (two plugin instances of one node)."""
    node = _mig_on(tmp_path)
    profile = tmp_path / "mig-on.yaml"
    three_slice = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
    node.nvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, _placement(4, 4))
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, three_slice)
        mine = int(pynvml.nvmlGpuInstanceGetInfo(gi).id)
        # The sibling makes another at slices 0-3 while this process stays initialized.
        (theirs,) = _sibling(node, profile, ("create", 9, 0, 4, three_slice))
        assert theirs != mine  # GPU instance IDs are the GPU's, not a process's
        assert _mig_layout(gpu) == [(theirs, 0, 4), (mine, 4, 4)]
        with pytest.raises(pynvml.NVMLError_InsufficientResources):  # its slices are taken
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, _placement(0, 4))
        # The sibling destroys this process's instance: gone here too, its handle stale.
        _sibling(node, profile, ("destroy", mine, three_slice))
        assert _mig_layout(gpu) == [(theirs, 0, 4)]
        assert not (node.root / f"proc/driver/nvidia/capabilities/gpu0/mig/gi{mine}").exists()
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpuInstanceGetInfo(gi)
        # What this process writes next never brings the destroyed one back.
        small = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 19, _placement(4, 1))
        pynvml.nvmlGpuInstanceCreateComputeInstance(
            small, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
        )
        small_id = int(pynvml.nvmlGpuInstanceGetInfo(small).id)
        assert _mig_layout(gpu) == [(theirs, 0, 4), (small_id, 4, 1)]
        pynvml.nvmlShutdown()
        node.nvml.nvmlInit()  # and a re-init reads the same
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert _mig_layout(gpu) == [(theirs, 0, 4), (small_id, 4, 1)]
    finally:
        pynvml.nvmlShutdown()


def test_every_mig_table_is_on_nvmls_grid() -> None:
    """Every real memorySizeMB recorded (the H200's from NVML, the others' from nvidia-smi) is
    a multiple of 128 MiB, grows with the memory slices, and stays under the GPU's memory."""
    tables = 0
    for name in profile_names():
        profile = load_profile(name)
        by_slices: dict[int, set[int]] = {}
        for m in profile.mig_profiles:
            assert m.memory_mib % 128 == 0, (name, m.name, m.memory_mib)
            by_slices.setdefault(m.memory_slices, set()).add(m.memory_mib)
        sizes = [by_slices[s] for s in sorted(by_slices)]
        assert all(len(s) == 1 for s in sizes), (name, by_slices)  # one size per slice count
        flat = [next(iter(s)) for s in sizes]
        assert flat == sorted(flat) and all(v < profile.memory_mib for v in flat), name
        tables += bool(flat)
    assert tables >= 4  # A100 40GB and 80GB, H100, H200
