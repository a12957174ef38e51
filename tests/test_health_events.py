"""NVML events to device health: the watcher thread over the simulated C library, the
coalescing monitor, the persisted taints and the clear action."""

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver.nvml.faults import write_state_file
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.healthmonitor import CLEAR_FILE, STATE_FILE, HealthMonitor
from drivers.gpu.model import devicehealth
from drivers.gpu.model.devicehealth import GpuLost, Taint, Unmonitored, Xid
from drivers.gpu.model.events import EventWatcher
from kubeletplugin.healthstream import HealthBoard

XID79 = Taint(devicehealth.XID_KEY, "79", "NoSchedule")


@dataclass
class _Sim:
    node: SimulatedNode
    state: Path
    uuids: list[str]  # by minor number

    def inject(self, **faults: Any) -> None:
        # The library re-reads its state at nvmlInit: a re-init is how the hardware changes.
        write_state_file(self.state, faults)
        self.node.nvml.nvmlInit()
        self.node.nvml.nvmlShutdown()


@pytest.fixture
def sim(tmp_path: Path) -> _Sim:
    state = tmp_path / "state.yaml"
    write_state_file(state, {})
    node = SimulatedNode("g6e.12xlarge", "ev", tmp_path / "root", state_file=state)
    node.nvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
        uuids = {pynvml.nvmlDeviceGetMinorNumber(h): pynvml.nvmlDeviceGetUUID(h) for h in handles}
    finally:
        node.nvml.nvmlShutdown()
    return _Sim(node, state, [uuids[m] for m in sorted(uuids)])


class _Events:
    def __init__(self) -> None:
        self.got: list[devicehealth.Event] = []
        self._cond = threading.Condition()

    def emit(self, events: list[devicehealth.Event]) -> None:
        with self._cond:
            self.got.extend(events)
            self._cond.notify_all()

    def wait(self, count: int) -> list[devicehealth.Event]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.got) >= count, 15), self.got
            return list(self.got)


@pytest.fixture
def watching(sim: _Sim) -> Iterator[tuple[EventWatcher, _Events]]:
    events = _Events()
    watcher = EventWatcher(sim.node.nvml, sim.uuids, events.emit, wait_ms=50)
    yield watcher, events
    watcher.stop()  # each test joins its thread


def _start(watcher: EventWatcher) -> threading.Thread:
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    assert watcher.ready.wait(10)
    return thread


def test_xids_reach_the_watcher_for_the_gpu_they_name(
    sim: _Sim, watching: tuple[EventWatcher, _Events]
) -> None:
    watcher, events = watching
    thread = _start(watcher)
    assert watcher.monitored == tuple(sim.uuids)
    sim.inject(xidEvents=[{"gpu": 1, "xid": 79}, {"gpu": 2, "xid": 13}])
    assert events.wait(2) == [Xid(sim.uuids[1], 79), Xid(sim.uuids[2], 13)]
    watcher.stop()
    thread.join(10)
    assert not thread.is_alive()


def test_a_gpu_whose_registration_fails_is_unmonitored(
    sim: _Sim, watching: tuple[EventWatcher, _Events]
) -> None:
    sim.inject(failingQueries=[{"gpu": 2, "call": "nvmlDeviceRegisterEvents", "error": "Unknown"}])
    watcher, events = watching
    thread = _start(watcher)
    (event,) = events.wait(1)
    assert isinstance(event, Unmonitored) and event.uuid == sim.uuids[2]
    assert watcher.monitored == (sim.uuids[0], sim.uuids[1], sim.uuids[3])
    watcher.stop()
    thread.join(10)
    assert not thread.is_alive()


def test_gpu_is_lost_from_the_wait_marks_that_gpu_lost(
    sim: _Sim, watching: tuple[EventWatcher, _Events]
) -> None:
    watcher, events = watching
    thread = _start(watcher)
    sim.inject(removedGpus=[3])
    assert events.wait(1) == [GpuLost(sim.uuids[3])]
    watcher.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert events.got == [GpuLost(sim.uuids[3])]  # reported once, not once per wait


def test_gpus_found_after_start_are_watched_once_handed_over(sim: _Sim) -> None:
    events = _Events()
    # A GPU the first discovery did not see (still initialising, hot-added).
    watcher = EventWatcher(sim.node.nvml, sim.uuids[:3], events.emit, wait_ms=50)
    thread = _start(watcher)
    try:
        assert watcher.monitored == tuple(sim.uuids[:3])
        watcher.watch(sim.uuids[1:])  # a rediscovery: GPU 3 came, GPU 0 went
        deadline = time.monotonic() + 10
        while watcher.monitored != tuple(sim.uuids[1:]):
            assert time.monotonic() < deadline, watcher.monitored
            time.sleep(0.01)
        sim.inject(xidEvents=[{"gpu": 3, "xid": 79}, {"gpu": 1, "xid": 48}])
        assert events.wait(2) == [Xid(sim.uuids[3], 79), Xid(sim.uuids[1], 48)]
    finally:
        watcher.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_after_a_gpu_is_lost_a_rediscovery_watches_the_others_again(sim: _Sim) -> None:
    events = _Events()
    watcher = EventWatcher(sim.node.nvml, sim.uuids, events.emit, wait_ms=50)
    thread = _start(watcher)
    try:
        sim.inject(removedGpus=[3])  # off the bus: this set's waits answer GPU_IS_LOST now
        assert events.wait(1) == [GpuLost(sim.uuids[3])]
        watcher.watch(sim.uuids[:3])  # the rediscovery that no longer finds it
        deadline = time.monotonic() + 10
        while watcher.monitored != tuple(sim.uuids[:3]):
            assert time.monotonic() < deadline, watcher.monitored
            time.sleep(0.01)
        sim.inject(removedGpus=[3], xidEvents=[{"gpu": 1, "xid": 79}])
        # On a fresh set: the XID reaches the watcher, and no other GPU was called lost.
        assert events.wait(2) == [GpuLost(sim.uuids[3]), Xid(sim.uuids[1], 79)]
    finally:
        watcher.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_without_nvml_events_gpus_found_later_are_unmonitored_too(sim: _Sim) -> None:
    write_state_file(sim.state, {"nvml": "not-loaded"})  # nvmlInit fails in the watcher
    events = _Events()
    watcher = EventWatcher(sim.node.nvml, sim.uuids[:3], events.emit, wait_ms=50)
    thread = _start(watcher)
    thread.join(10)
    assert not thread.is_alive() and watcher.monitored == ()
    assert {e.uuid for e in events.wait(3)} == set(sim.uuids[:3])
    watcher.watch(sim.uuids)
    got = events.wait(4)
    assert len(got) == 4 and isinstance(got[3], Unmonitored) and got[3].uuid == sim.uuids[3]


def test_taints_apply_never_weaken_and_round_trip() -> None:
    ignored = devicehealth.DEFAULT_IGNORED_XIDS
    taints = devicehealth.apply({}, [Xid("a", 79), Xid("a", 13), Xid("b", 13)], ignored)
    assert taints == {"a": (XID79,), "b": (Taint(devicehealth.XID_KEY, "13", "None"),)}
    assert devicehealth.health_of(taints["a"])[0] == "Unhealthy"
    assert devicehealth.health_of(taints["b"])[0] == "Healthy"
    unmonitored = devicehealth.apply({}, [Unmonitored("c", "x")], ignored)
    assert devicehealth.health_of(unmonitored["c"])[0] == "Unknown"
    assert devicehealth.apply(taints, [Xid("a", 79)], ignored) == taints
    assert devicehealth.loads(devicehealth.dumps(taints)) == taints
    assert devicehealth.loads(devicehealth.dumps({**taints, **unmonitored})) == taints
    assert devicehealth.parse_xids("13, 31,,94") == {13, 31, 94}
    with pytest.raises(ValueError, match="'x1'"):
        devicehealth.parse_xids("13,x1")


def _monitor(tmp_path: Path, board: HealthBoard, writes: list[int], **kwargs: Any) -> HealthMonitor:
    monitor = HealthMonitor(
        tmp_path, board, pool="node-a", window=0.2, on_change=lambda: writes.append(1), **kwargs
    )
    return monitor


async def _until(predicate: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition never held")
        await asyncio.sleep(0.01)


async def test_an_xid_storm_is_one_change_and_bounded_log_lines(
    sim: _Sim, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    board = HealthBoard()
    writes: list[int] = []
    monitor = _monitor(tmp_path, board, writes)
    monitor.set_devices({u: f"gpu-{i}" for i, u in enumerate(sim.uuids)})
    watcher = EventWatcher(sim.node.nvml, sim.uuids, monitor.submit, wait_ms=50)
    runner = asyncio.create_task(monitor.run())
    thread = _start(watcher)
    caplog.set_level(logging.INFO, logger="drivers.gpu.healthmonitor")
    try:
        # 250 events through the C library, then 5,000 more straight from a thread.
        storm = [{"gpu": 1, "xid": 79 if i % 2 else 13} for i in range(250)]
        await asyncio.to_thread(sim.inject, xidEvents=storm)
        await _until(lambda: monitor.events_by_xid.total() == 250)

        def more() -> None:
            for _ in range(50):
                monitor.submit([Xid(sim.uuids[1], 79)] * 100)

        await asyncio.to_thread(more)
        await _until(lambda: monitor.events_by_xid.total() == 5250)
    finally:
        watcher.stop()
        await asyncio.to_thread(thread.join, 10)
        runner.cancel()
    assert monitor.events_by_xid == {79: 5125, 13: 125}
    assert writes == [1] and monitor.changes == 1  # one state change, one publish
    lines = [r for r in caplog.records if r.getMessage() == "NVML health events"]
    assert 1 <= len(lines) == monitor.windows <= 10
    assert monitor.taints == {sim.uuids[1]: (XID79,)}
    health = {d.device: d.health for d in board.snapshot()[1]}
    assert health == {
        "gpu-0": "Healthy",
        "gpu-1": "Unhealthy",
        "gpu-2": "Healthy",
        "gpu-3": "Healthy",
    }


async def test_taints_survive_a_restart_and_the_clear_file_removes_them(tmp_path: Path) -> None:
    writes: list[int] = []
    first = _monitor(tmp_path, HealthBoard(), writes)
    first.set_devices({"GPU-a": "gpu-0", "GPU-b": "gpu-1"})
    runner = asyncio.create_task(first.run(clear_check=0.05))
    first.submit([Xid("GPU-a", 79), Xid("GPU-b", 79)])
    await _until(lambda: first.changes == 1)
    runner.cancel()
    assert (tmp_path / STATE_FILE).exists()

    board = HealthBoard()
    again = _monitor(tmp_path, board, writes)  # a restarted plugin
    again.set_devices({"GPU-a": "gpu-0", "GPU-b": "gpu-1"})
    assert again.device_taints("gpu-0") == [XID79.published()]
    assert [d.health for d in board.snapshot()[1]] == ["Unhealthy", "Unhealthy"]

    runner = asyncio.create_task(again.run(clear_check=0.05))
    try:
        (tmp_path / CLEAR_FILE).write_text("GPU-a\n")
        await _until(lambda: not (tmp_path / CLEAR_FILE).exists())
        assert again.device_taints("gpu-0") == [] and again.device_taints("gpu-1")
        (tmp_path / CLEAR_FILE).write_text("")  # empty: every GPU
        await _until(lambda: not (tmp_path / CLEAR_FILE).exists())
    finally:
        runner.cancel()
    assert again.taints == {} and again.changes == 2 and len(writes) == 3
    assert [d.health for d in board.snapshot()[1]] == ["Healthy", "Healthy"]
    assert devicehealth.loads((tmp_path / STATE_FILE).read_text()) == {}


async def test_published_devices_carry_their_taints(tmp_path: Path) -> None:
    monitor = _monitor(tmp_path, HealthBoard(), [])
    monitor.set_devices({"GPU-a": "gpu-0", "GPU-b": "gpu-1"})
    await monitor._apply([Xid("GPU-a", 79), Unmonitored("GPU-b", "no events")])

    async def source() -> list[dict[str, Any]]:
        return [{"name": "gpu-0"}, {"name": "gpu-1"}, {"name": "other"}]

    assert await monitor.tainted(source)() == [
        {
            "name": "gpu-0",
            "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}],
        },
        {
            "name": "gpu-1",
            "taints": [{"key": "gpu.nvidia.com/unmonitored", "value": "", "effect": "None"}],
        },
        {"name": "other"},
    ]
