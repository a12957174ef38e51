"""Static MIG through discovery and the device kinds: what a GPU in MIG mode publishes,
and what it does not (its whole GPU, a half-configured GPU, a GPU without MIG)."""

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from driver.nvml.faults import Faults, QueryFault
from driver.nvml.simulated import SimulatedNode, mig_minor
from drivers.gpu.kinds import discovered
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Inventory
from drivers.gpu.resourceslice import build_resource_slices

MIG = "p4d.24xlarge-mig"  # GPUs 0-3 in MIG mode: 3g.20gb@0, 2g.10gb@4, 1g.10gb@6
REPO = Path(__file__).resolve().parents[1]


def _discover(tmp_path: Path, profile: str | Path = MIG, **kw: Any) -> Inventory:
    node = SimulatedNode(profile, "node-a", tmp_path / "root", **kw)
    return discover(node.nvml, sysfs_root=node.sysfs_root)


def _published(inventory: Inventory) -> dict[str, dict[str, Any]]:
    slices = build_resource_slices(inventory, driver_name="gpu.nvidia.com", node_name="node-a")
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


def test_gpus_in_mig_mode_publish_their_mig_devices_and_not_themselves(tmp_path: Path) -> None:
    inventory = _discover(tmp_path)
    published = _published(inventory)
    whole = sorted(n for n in published if "-mig-" not in n)
    assert whole == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    for minor in range(4):
        assert f"gpu-{minor}" not in published
        names = [n for n in published if n.startswith(f"gpu-{minor}-mig-")]
        assert names == [
            f"gpu-{minor}-mig-3g20gb-9-0",
            f"gpu-{minor}-mig-2g10gb-14-4",
            f"gpu-{minor}-mig-1g10gb-15-6",
        ]
    gpu0 = inventory.gpus[0]
    device = published["gpu-0-mig-3g20gb-9-0"]
    attrs = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
    assert attrs["type"] == "mig" and attrs["profile"] == "3g.20gb"
    assert attrs["parentUUID"] == gpu0.uuid and attrs["index"] == 0
    assert re.fullmatch(r"MIG-[0-9a-f-]{36}", attrs["uuid"])
    assert attrs["productName"] == "NVIDIA A100-SXM4-40GB"
    assert attrs["resource.kubernetes.io/pciBusID"] == gpu0.pci_bus_id
    assert attrs["numaNode"] == 0 and attrs["cudaComputeCapability"] == "8.0.0"
    capacity = {k: v["value"] for k, v in device["capacity"].items()}
    assert capacity == {
        "copyEngines": "3", "decoders": "2", "encoders": "0", "jpegEngines": "0",
        "memory": str(19968 << 20), "multiprocessors": "42", "ofaEngines": "0",
        "memorySlice0": "1", "memorySlice1": "1", "memorySlice2": "1", "memorySlice3": "1",
    }  # fmt: skip
    small = published["gpu-0-mig-1g10gb-15-6"]["capacity"]
    assert {k for k in small if k.startswith("memorySlice")} == {"memorySlice6", "memorySlice7"}
    assert len(device["attributes"]) + len(device["capacity"]) <= 32


def test_mig_device_edits_are_its_cap_nodes_and_its_parents_node(tmp_path: Path) -> None:
    inventory = _discover(tmp_path)
    devices = {d.name: d for d in discovered(inventory, node_name="node-a").current.values()}
    mig = devices["gpu-2-mig-2g10gb-14-4"]
    assert mig.kind == "mig"
    gi = 2  # the simulator numbers GPU instances in the order the profile lists them
    assert [n["path"] for n in mig.edits["deviceNodes"]] == [
        "/dev/nvidia2",
        f"/dev/nvidia-caps/nvidia-cap{mig_minor(2, gi)}",
        f"/dev/nvidia-caps/nvidia-cap{mig_minor(2, gi, 0)}",
    ]
    assert mig.identity["parent-uuid"] == inventory.gpus[2].uuid
    assert mig.identity["mig-uuid"].startswith("MIG-")
    assert devices["gpu-4"].kind == "gpu"


def test_mig_pending_a_reset_is_not_published_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profile = tmp_path / "pending.yaml"
    profile.write_text(
        "extends: p4d.24xlarge\n"
        "mig: {enabled: [0, 1], pending: [1, 2], instances: [{profile: 7g.40gb, start: 0}]}\n"
    )
    with caplog.at_level(logging.WARNING, logger="drivers.gpu.model.discovery"):
        inventory = _discover(tmp_path, profile)
    # GPU 0: MIG on, published as its 7g; 1: on, off after a reset; 2: off, on after a reset.
    published = _published(inventory)
    assert "gpu-0-mig-7g40gb-0-0" in published and "gpu-0" not in published
    assert not any(n.startswith(("gpu-1", "gpu-2")) for n in published)
    assert sorted(n for n in published if "-mig-" not in n) == [f"gpu-{i}" for i in range(3, 8)]
    assert [s.index for s in inventory.skipped] == [1, 2]
    assert "MIG mode is enabled but disabled after the next GPU reset" in inventory.skipped[0].error
    assert "MIG mode is disabled but enabled after the next GPU reset" in inventory.skipped[1].error
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all(r.getMessage() == "skipping GPU: MIG state" for r in warnings)


def test_a_daemon_warns_of_a_pending_reset_once_not_every_resync(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profile = tmp_path / "pending.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {pending: [3]}\n")
    node = SimulatedNode(profile, "node-a", tmp_path / "root")
    reported: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="drivers.gpu.model.discovery"):
        for _ in range(3):
            inventory = discover(node.nvml, sysfs_root=node.sysfs_root, reported=reported)
            assert [s.index for s in inventory.skipped] == [3]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


@pytest.mark.parametrize("profile", ["g6.xlarge", "g6e.12xlarge", "g5.48xlarge"])
def test_gpus_without_mig_publish_no_mig_devices(tmp_path: Path, profile: str) -> None:
    inventory = _discover(tmp_path, profile)  # L4, L40S, A10G: NVML says MIG is not supported
    assert inventory.skipped == ()
    assert all(not g.mig_enabled and g.mig_devices == () for g in inventory.gpus)
    assert {d.kind for d in discovered(inventory, node_name="node-a").current.values()} == {"gpu"}


def test_mig_capable_gpus_with_mig_off_stay_whole_gpus(tmp_path: Path) -> None:
    for profile in ("p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge"):
        inventory = _discover(tmp_path / profile, profile)
        assert sorted(_published(inventory)) == sorted(f"gpu-{i}" for i in range(8)), profile


def test_an_nvml_error_mid_mig_query_skips_that_gpu_only(tmp_path: Path) -> None:
    fault = QueryFault(gpu=1, call="nvmlGpuInstanceGetComputeInstanceById", error="Unknown")
    inventory = _discover(tmp_path, faults=Faults(failing_queries=(fault,)))
    (skipped,) = inventory.skipped
    assert skipped.index == 1 and "Unknown" in skipped.error
    published = _published(inventory)
    assert not any(n.startswith("gpu-1") for n in published)  # neither whole nor half its MIG
    assert len([n for n in published if "-mig-" in n]) == 9


def test_a_missing_access_file_skips_the_gpu_with_what_to_check(tmp_path: Path) -> None:
    node = SimulatedNode(MIG, "node-a", tmp_path / "root")
    access = node.root / "proc/driver/nvidia/capabilities/gpu3/mig/gi1/ci0/access"
    access.unlink()
    inventory = discover(node.nvml, sysfs_root=node.sysfs_root)
    (skipped,) = inventory.skipped
    assert skipped.index == 3
    assert str(access) in skipped.error and "/proc/driver/nvidia" in skipped.error


def test_no_code_of_ours_changes_mig_mode_and_only_dynamic_mig_creates_instances() -> None:
    # On Ampere a MIG mode change needs a GPU reset, which loops on cloud VMs.
    creates = ("nvmlDeviceCreateGpuInstance", "nvmlGpuInstanceCreate")
    # Dynamic MIG makes instances in one module; the NVML protocol and the library's symbol
    # table only name the calls.
    nvml = REPO / "driver" / "nvml"
    maker = REPO / "drivers" / "gpu" / "model" / "migmake.py"
    makers = {maker, nvml / "__init__.py", nvml / "library.py"}
    for package in ("cli", "driver", "drivers", "kubeletplugin"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            assert "nvmlDeviceSetMigMode" not in text, path
            if path not in makers:
                assert not any(call in text for call in creates), path
    assert all(call in maker.read_text() for call in creates)


class _DestroyedMidRead:
    """The node's NVML, with another process's unprepare (a sibling plugin instance during a
    surge upgrade) destroying GPU 0's instance once, at ``call``: ``before`` it answers (its
    handle then stale) or ``after`` (its access files then gone)."""

    def __init__(self, node: SimulatedNode, call: str, when: str) -> None:
        self._node, self._call, self._when = node, call, when
        self.destroyed = False

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._node.nvml, name)
        if name != self._call:
            return real

        def hooked(*args: Any) -> Any:
            from drivers.gpu.model import migmake

            if self._when == "before" and not self.destroyed:
                self._destroy(migmake)
            answer = real(*args)
            if self._when == "after" and not self.destroyed:
                self._destroy(migmake)
            return answer

        return hooked

    def _destroy(self, migmake: Any) -> None:
        self.destroyed = True
        assert migmake.unmake(self._node.nvml, self._node.nvml.gpus[0].uuid, 9, 4)


@pytest.mark.parametrize(
    ("call", "when"),
    [("nvmlDeviceGetGpuInstanceId", "before"), ("nvmlDeviceGetMemoryInfo", "after")],
    ids=["stale-handle", "access-file-gone"],
)
def test_an_instance_destroyed_while_its_gpu_is_read_never_skips_the_gpu(
    tmp_path: Path, call: str, when: str
) -> None:
    from drivers.gpu.model import migmake

    profile = tmp_path / "mig.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: [0]}\n")
    node = SimulatedNode(profile, "node-a", tmp_path / "root")
    node.nvml.nvmlInit()
    try:
        migmake.make(node.nvml, node.nvml.gpus[0].uuid, 9, 4, 4, node.sysfs_root)
    finally:
        node.nvml.nvmlShutdown()
    nvml = _DestroyedMidRead(node, call, when)
    inventory = discover(nvml, sysfs_root=node.sysfs_root, dynamic_mig=True)
    assert nvml.destroyed
    assert inventory.skipped == ()  # read again, as it is now: no instance left
    assert inventory.gpus[0].mig_devices == ()
    assert len(inventory.gpus[0].mig_partitions) == 25
