"""NVML events on GPUs in MIG mode: an XID lands on the MIG devices of the GPU and
compute instance it names, or on every MIG device of the GPU when it names none; a lost
GPU takes all of them. Over the simulated C library (p4d.24xlarge-mig: GPUs 0-3 hold a
3g.20gb, a 2g.10gb and a 1g.10gb instance, GPU instances 1, 2, 3, each one compute
instance 0)."""

import asyncio
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver.devicekind import NodeDevice
from driver.nvml.faults import Faults, SimulationConfigError, XidEvent, write_state_file
from driver.nvml.simulated import SimulatedNode
from drivers.gpu import node as gpunode
from drivers.gpu.healthmonitor import CLEAR_FILE, HealthMonitor, Watched
from drivers.gpu.kinds import discovered, dynmig, gpu_kinds
from drivers.gpu.model import devicehealth
from drivers.gpu.model.devicehealth import GpuLost, MigPlacement, Taint, Unmonitored, Xid, placed
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.events import EventWatcher
from drivers.gpu.model.inventory import MigDevice
from kubeletplugin.healthstream import HealthBoard
from tests.pluginharness import NodeDirs, create_node

XID79 = Taint(devicehealth.XID_KEY, "79", "NoSchedule")
LOST = Taint(devicehealth.GPU_LOST_KEY, "", "NoSchedule")
MIGS = {
    "GPU-m": (
        MigPlacement("MIG-a", gi=1, ci=0),
        MigPlacement("MIG-b", gi=2, ci=0),
        MigPlacement("MIG-c", gi=2, ci=1),
    )
}


def test_an_xid_naming_a_gpu_and_compute_instance_hits_that_mig_device_only() -> None:
    events, unplaced = placed([Xid("GPU-m", 79, gi=2, ci=1)], MIGS)
    assert events == [Xid("MIG-c", 79, gi=2, ci=1)] and unplaced == []


def test_an_xid_naming_a_gpu_instance_only_hits_each_of_its_compute_instances() -> None:
    events, _ = placed([Xid("GPU-m", 79, gi=2)], MIGS)
    assert [e.uuid for e in events] == ["MIG-b", "MIG-c"]


def test_an_xid_naming_no_instance_and_a_lost_or_unmonitored_gpu_hit_every_mig_device() -> None:
    every = ["MIG-a", "MIG-b", "MIG-c"]
    for event in (Xid("GPU-m", 48), GpuLost("GPU-m"), Unmonitored("GPU-m", "no events")):
        events, unplaced = placed([event], MIGS)
        assert [e.uuid for e in events] == every and unplaced == []
        assert all(type(e) is type(event) for e in events)


def test_an_xid_naming_an_unpublished_instance_taints_nothing_and_is_reported() -> None:
    stray = Xid("GPU-m", 79, gi=7, ci=0)
    assert placed([stray], MIGS) == ([], [stray])


def test_on_a_whole_gpu_the_gpu_is_the_device_whatever_the_event_names() -> None:
    events: list[devicehealth.Event] = [Xid("GPU-w", 79, gi=1, ci=0), GpuLost("GPU-w")]
    assert placed(events, MIGS) == (events, [])


def test_the_state_file_places_an_xid_and_refuses_a_compute_instance_alone() -> None:
    faults = Faults.from_mapping(
        {"xidEvents": [{"gpu": 1, "xid": 79, "gi": 2, "ci": 0}, {"gpu": 1, "xid": 48}]},
        source="t",
    )
    assert faults.xid_events == (XidEvent(1, 79, 2, 0), XidEvent(1, 48))
    for bad in ({"gpu": 1, "xid": 79, "ci": 0}, {"gpu": 1, "xid": 79, "gi": -1}):
        with pytest.raises(SimulationConfigError, match="xidEvents"):
            Faults.from_mapping({"xidEvents": [bad]}, source="t")
    with pytest.raises(SimulationConfigError, match="unknown keys"):
        Faults.from_mapping({"xidEvents": [{"gpu": 1, "xid": 79, "instance": 2}]}, source="t")


@pytest.fixture
def node(tmp_path: Path) -> tuple[SimulatedNode, Path]:
    state = tmp_path / "state.yaml"
    write_state_file(state, {})
    return SimulatedNode("p4d.24xlarge-mig", "mig", tmp_path / "root", state_file=state), state


def _watched(sim: SimulatedNode) -> Watched:
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    devices = discovered(inventory, node_name="mig")
    return Watched.of(devices.current, inventory, gpu_kinds())


def test_the_watcher_follows_mig_parents_and_whole_gpus(node: tuple[SimulatedNode, Path]) -> None:
    watched = _watched(node[0])
    assert len(watched.gpus) == 8 and len(watched.migs) == 4
    assert len(watched.devices) == 4 * 3 + 4  # 3 MIG devices on GPUs 0-3, GPUs 4-7 whole
    for parent, migs in watched.migs.items():
        assert parent in watched.gpus and parent not in watched.devices
        assert [(m.gi, m.ci) for m in migs] == [(1, 0), (2, 0), (3, 0)]
        names = [watched.devices[m.uuid] for m in migs]
        assert all("-mig-" in name for name in names), names


def test_nvml_events_name_the_instance_they_hit(node: tuple[SimulatedNode, Path]) -> None:
    sim, state = node
    watched = _watched(sim)
    got: list[devicehealth.Event] = []
    cond = threading.Condition()

    def emit(events: list[devicehealth.Event]) -> None:
        with cond:
            got.extend(events)
            cond.notify_all()

    watcher = EventWatcher(sim.nvml, watched.gpus, emit, wait_ms=50)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        assert watcher.ready.wait(10)
        write_state_file(
            state,
            {"xidEvents": [{"gpu": 1, "xid": 79, "gi": 2, "ci": 0}, {"gpu": 2, "xid": 48}]},
        )
        sim.nvml.nvmlInit()  # the library re-reads its state at nvmlInit
        sim.nvml.nvmlShutdown()
        with cond:
            assert cond.wait_for(lambda: len(got) >= 2, 15), got
    finally:
        watcher.stop()
        thread.join(10)
    sim.nvml.nvmlInit()
    try:
        by_minor = {
            pynvml.nvmlDeviceGetMinorNumber(h): pynvml.nvmlDeviceGetUUID(h)
            for h in (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8))
        }
    finally:
        sim.nvml.nvmlShutdown()
    assert got == [Xid(by_minor[1], 79, gi=2, ci=0), Xid(by_minor[2], 48)]


async def _until(predicate: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition never held")
        await asyncio.sleep(0.01)


async def test_the_monitor_taints_mig_devices_and_a_gpu_clear_clears_them(tmp_path: Path) -> None:
    board = HealthBoard()
    writes: list[int] = []
    monitor = HealthMonitor(
        tmp_path, board, pool="node-a", window=0.05, on_change=lambda: writes.append(1)
    )
    names = {"MIG-a": "gpu-0-mig-a", "MIG-b": "gpu-0-mig-b", "MIG-c": "gpu-0-mig-c"}
    monitor.set_devices({**names, "GPU-w": "gpu-1"}, MIGS)
    runner = asyncio.create_task(monitor.run(clear_check=0.05))
    try:
        monitor.submit([Xid("GPU-m", 79, gi=2, ci=1), Xid("GPU-m", 79, gi=9, ci=0)])
        await _until(lambda: monitor.changes == 1)
        assert monitor.taints == {"MIG-c": (XID79,)}
        assert monitor.device_taints("gpu-0-mig-c") == [XID79.published()]
        assert monitor.device_taints("gpu-0-mig-b") == []
        health = {d.device: d.health for d in board.snapshot()[1]}
        assert health == {
            "gpu-0-mig-a": "Healthy",
            "gpu-0-mig-b": "Healthy",
            "gpu-0-mig-c": "Unhealthy",
            "gpu-1": "Healthy",
        }
        monitor.submit([GpuLost("GPU-m")])
        await _until(lambda: monitor.changes == 2)
        assert monitor.taints == {
            "MIG-a": (LOST,),
            "MIG-b": (LOST,),
            "MIG-c": (LOST, XID79),
        }
        (tmp_path / CLEAR_FILE).write_text("GPU-m\n")  # the parent's UUID, as nvidia-smi shows
        await _until(lambda: not (tmp_path / CLEAR_FILE).exists())
    finally:
        runner.cancel()
    assert monitor.taints == {} and monitor.changes == 3 and len(writes) == 3
    assert {d.health for d in board.snapshot()[1]} == {"Healthy"}


# -- dynamic MIG (--dynamic-mig): devices are placements of a GPU in MIG mode ------------


def _dynamic_node(tmp_path: Path) -> tuple[SimulatedNode, Path]:
    profile = tmp_path / "dynamic.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: all}\n")
    state = tmp_path / "state.yaml"
    write_state_file(state, {})
    return SimulatedNode(profile, "dyn", tmp_path / "root", state_file=state), state


def test_the_watcher_follows_gpus_published_for_dynamic_mig(tmp_path: Path) -> None:
    sim, _ = _dynamic_node(tmp_path)
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root, dynamic_mig=True)
    devices = discovered(inventory, node_name="dyn")
    watched = Watched.of(devices.current, inventory, gpu_kinds())
    assert len(devices.current) == 8 * 25  # every placement of every H100
    assert watched.gpus == tuple(sorted(g.uuid for g in inventory.gpus))
    assert sorted(watched.devices.values()) == sorted(devices.current)
    for parent, placements in watched.migs.items():
        assert parent not in watched.devices and len(placements) == 25
        # No instance is made before a claim needs one: only whole-GPU events hit them.
        assert {(m.gi, m.ci) for m in placements} == {(None, None)}


def test_a_dynamic_mig_device_with_an_instance_gets_the_xids_naming_it(tmp_path: Path) -> None:
    sim, _ = _dynamic_node(tmp_path)
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root, dynamic_mig=True)
    gpu0 = inventory.gpus[0]
    made, other = gpu0.mig_partitions[0], gpu0.mig_partitions[-1]
    instance = MigDevice(
        uuid="MIG-made", profile=made.profile, profile_id=made.profile_id, gi_id=5, ci_id=0,
        placement_start=made.placement_start, placement_size=made.placement_size,
        spans_gpu_instance=True, memory_bytes=made.memory_bytes,
        multiprocessors=made.multiprocessors, copy_engines=made.copy_engines,
        decoders=made.decoders, encoders=made.encoders, jpeg_engines=made.jpeg_engines,
        ofa_engines=made.ofa_engines, gi_access_minor=1, ci_access_minor=2,
    )  # fmt: skip
    with_instance = dataclasses.replace(
        inventory, gpus=(dataclasses.replace(gpu0, mig_devices=(instance,)),)
    )
    current = {
        dynmig.device_name(gpu0, p): NodeDevice(
            kind=dynmig.NAME,
            name=dynmig.device_name(gpu0, p),
            published={},
            edits={},
            identity=dynmig.identity(gpu0, p),
        )
        for p in (made, other)
    }
    watched = Watched.of(current, with_instance, gpu_kinds())
    assert watched.gpus == (gpu0.uuid,)
    by_name = {name: key for key, name in watched.devices.items()}
    events, unplaced = placed([Xid(gpu0.uuid, 79, gi=5, ci=0)], watched.migs)
    assert [e.uuid for e in events] == [by_name[dynmig.device_name(gpu0, made)]] and not unplaced
    events, _ = placed([Xid(gpu0.uuid, 79)], watched.migs)  # no instance named: the GPU
    assert sorted(e.uuid for e in events) == sorted(by_name.values())


async def test_a_fatal_xid_on_a_dynamic_mig_gpu_taints_its_devices(
    kube: tuple[Any, Path], dirs: NodeDirs
) -> None:
    api, kubeconfig = kube
    await create_node(api, "dyn")
    profile = dirs.root / "dynamic.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: all}\n")
    state = dirs.root / "sim-state.yaml"
    write_state_file(state, {})
    config = dirs.node_config(
        kubeconfig, node_name="dyn", profile=str(profile), sim_state=state, dynamic_mig=True
    )
    stop, hup = asyncio.Event(), asyncio.Event()
    running = asyncio.create_task(gpunode.run(config, stop, hup=hup))

    async def taints() -> dict[str, list[Any]]:
        from kubernetes.aio import client

        found = await client.ResourceV1Api(api).list_resource_slice(
            field_selector="spec.nodeName=dyn"
        )
        return {
            d.name: [(t.key, t.value, t.effect) for t in d.taints or []]
            for s in found.items
            for d in s.spec.devices or []
        }

    async def until(predicate: Any) -> dict[str, list[Any]]:
        deadline = time.monotonic() + 30
        while True:
            assert not running.done(), running.result()
            now = await taints()
            if now and predicate(now):
                return now
            assert time.monotonic() < deadline, {k: v for k, v in now.items() if v}
            await asyncio.sleep(0.05)

    try:
        await until(lambda t: len(t) == 8 * 25)
        write_state_file(state, {"xidEvents": [{"gpu": 2, "xid": 79}]})
        hup.set()  # a rediscovery: the simulated library re-reads its state at nvmlInit
        found = await until(lambda t: any(t.values()))
        tainted = sorted(name for name, ts in found.items() if ts)
        assert tainted == sorted(n for n in found if n.startswith("gpu-2-mig-"))
        assert len(tainted) == 25
        assert {tuple(ts) for n, ts in found.items() if n in tainted} == {
            (("gpu.nvidia.com/xid", "79", "NoSchedule"),)
        }
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
