"""Automatic recovery (off by default): a device unschedulable only for an XID NVIDIA
resolves by restarting the application is cleared after N consecutive healthy probes with
no new event; never a lost GPU, XID 79 or 48."""

from pathlib import Path

import pynvml
import pytest

from driver.nvml.faults import write_state_file
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.healthmonitor import HealthMonitor, Recovery
from drivers.gpu.model import devicehealth
from drivers.gpu.model.devicehealth import GpuLost, MigPlacement, Taint, Unmonitored, Xid
from drivers.gpu.model.events import probe
from kubeletplugin.healthstream import HealthBoard

XID8 = Taint(devicehealth.XID_KEY, "8", "NoSchedule")
XID13 = Taint(devicehealth.XID_KEY, "13", "None")
XID79 = Taint(devicehealth.XID_KEY, "79", "NoSchedule")
UNMONITORED = Taint(devicehealth.UNMONITORED_KEY, "", "None")
LOST = Taint(devicehealth.GPU_LOST_KEY, "", "NoSchedule")
XIDS = frozenset({8, 11})


def test_only_devices_unschedulable_for_recoverable_xids_alone_may_recover() -> None:
    assert devicehealth.recoverable([XID8], XIDS)
    assert devicehealth.recoverable([XID8, XID13], XIDS)
    assert not devicehealth.recoverable([XID8, XID79], XIDS)
    assert not devicehealth.recoverable([LOST], XIDS)
    assert not devicehealth.recoverable([XID13], XIDS)  # schedulable already
    # Even configured, 79 and 48 are never recovered.
    assert not devicehealth.recoverable([XID79], frozenset({79}))
    with pytest.raises(ValueError, match=r"\[48, 79\]"):
        devicehealth.parse_recoverable_xids("8, 79,48")
    assert devicehealth.parse_recoverable_xids("8,94") == {8, 94}


class _Probe:
    def __init__(self) -> None:
        self.healthy = True
        self.asked: list[str] = []

    def __call__(self, uuid: str) -> bool:
        self.asked.append(uuid)
        return self.healthy


def _monitor(tmp_path: Path, probe: _Probe, writes: list[int]) -> HealthMonitor:
    monitor = HealthMonitor(
        tmp_path,
        HealthBoard(),
        pool="node-a",
        on_change=lambda: writes.append(1),
        recovery=Recovery(probes=3, period=0.01, xids=XIDS, probe=probe),
    )
    monitor.set_devices({"GPU-a": "gpu-0", "GPU-b": "gpu-1", "GPU-c": "gpu-2"})
    return monitor


async def test_three_healthy_probes_in_a_row_clear_a_recoverable_xid_only(tmp_path: Path) -> None:
    probe = _Probe()
    writes: list[int] = []
    monitor = _monitor(tmp_path, probe, writes)
    events: list[devicehealth.Event] = [
        Xid("GPU-a", 8),
        Unmonitored("GPU-a", "test"),
        Xid("GPU-b", 79),
        GpuLost("GPU-c"),
    ]
    await monitor._apply(events)
    assert len(writes) == 1
    for _ in range(2):
        await monitor.probe_once()
    assert monitor.taints["GPU-a"] == (UNMONITORED, XID8) and len(writes) == 1
    await monitor.probe_once()
    # The informational taint stays; one write for the recovery.
    assert monitor.taints == {"GPU-a": (UNMONITORED,), "GPU-b": (XID79,), "GPU-c": (LOST,)}
    assert len(writes) == 2 and monitor.recoveries == 1
    for _ in range(10):
        await monitor.probe_once()
    assert set(monitor.taints) == {"GPU-a", "GPU-b", "GPU-c"} and len(writes) == 2
    assert set(probe.asked) == {"GPU-a"}  # the others are never candidates
    assert "GPU-a" not in devicehealth.loads((tmp_path / "health.json").read_text())


async def test_a_new_event_or_a_failed_probe_starts_the_count_again(tmp_path: Path) -> None:
    probe = _Probe()
    writes: list[int] = []
    monitor = _monitor(tmp_path, probe, writes)
    await monitor._apply([Xid("GPU-a", 8)])
    await monitor.probe_once()
    await monitor.probe_once()
    await monitor._apply([Xid("GPU-a", 11)])  # the GPU is still failing: count from zero
    await monitor.probe_once()
    await monitor.probe_once()
    probe.healthy = False
    await monitor.probe_once()
    probe.healthy = True
    await monitor.probe_once()
    await monitor.probe_once()
    assert monitor.taints["GPU-a"] and monitor.recoveries == 0
    await monitor.probe_once()
    assert "GPU-a" not in monitor.taints and monitor.recoveries == 1


async def test_a_fatal_xid_after_a_recoverable_one_stops_the_recovery(tmp_path: Path) -> None:
    probe = _Probe()
    monitor = _monitor(tmp_path, probe, [])
    await monitor._apply([Xid("GPU-a", 8)])
    await monitor.probe_once()
    await monitor._apply([Xid("GPU-a", 79)])
    for _ in range(5):
        await monitor.probe_once()
    assert monitor.taints["GPU-a"] == (XID79,) and monitor.recoveries == 0


async def test_a_mig_device_is_probed_through_its_gpu(tmp_path: Path) -> None:
    probe = _Probe()
    writes: list[int] = []
    monitor = _monitor(tmp_path, probe, writes)
    migs = {"GPU-m": (MigPlacement("MIG-a", 1, 0), MigPlacement("MIG-b", 2, 0))}
    monitor.set_devices({"MIG-a": "gpu-0-mig-a", "MIG-b": "gpu-0-mig-b"}, migs)
    await monitor._apply([Xid("GPU-m", 8, gi=1, ci=0)])
    assert set(monitor.taints) == {"MIG-a"}
    for _ in range(3):
        await monitor.probe_once()
    assert monitor.taints == {} and set(probe.asked) == {"GPU-m"} and len(writes) == 2


def test_the_probe_asks_nvml_for_the_gpu(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {})
    node = SimulatedNode("g6e.12xlarge", "rec", tmp_path / "root", state_file=state)
    node.nvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1))
        minor = pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(1))
    finally:
        node.nvml.nvmlShutdown()
    assert probe(node.nvml, uuid)
    assert not probe(node.nvml, "GPU-00000000-0000-0000-0000-000000000000")
    write_state_file(
        state,
        {"failingQueries": [{"gpu": minor, "call": "nvmlDeviceGetUUID", "error": "GpuIsLost"}]},
    )
    assert not probe(node.nvml, uuid)
    write_state_file(state, {"removedGpus": [minor]})
    assert not probe(node.nvml, uuid)
    write_state_file(state, {})
    assert probe(node.nvml, uuid)


def test_recovery_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from cli import build_parser

    for env in ("AUTO_RECOVER_PROBES", "AUTO_RECOVER_PERIOD", "RECOVERABLE_XIDS"):
        monkeypatch.delenv(f"GPU_DRA_{env}", raising=False)
    args = build_parser().parse_args(["kubelet-plugin"])
    assert args.auto_recover_probes == 0 and args.recoverable_xids == {8, 11}
    assert args.auto_recover_period == 10.0
