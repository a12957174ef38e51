"""Dynamic MIG with two plugin instances on one node, as during a surge upgrade.

Both instances share the plugin directory, so both must agree on which MIG instances a
claim of the driver made: a placement the sibling made (or is making) stays published by
each, one no claim made stays out of both. Two kinds over one state directory and one
simulated node stand for the two processes (their process memory is apart, as two
processes' is; the NVML library and the directory are shared, as on a node).
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from driver.devicekind import PreparedClaim, PreparedDevice
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.kinds import GpuKindContext, GpuNode, dynmig
from drivers.gpu.kinds.dynmig import NAME, DynamicMigKind
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Inventory
from drivers.gpu.model.migmake import MadeMig, Maker

NODE = "node-s"
UID = "0b8f5a52-1c3e-4f57-9d1a-5d0c7b8e9f01"
DEVICE = "gpu-0-mig-3g40gb-9-4"  # 3g.40gb at memory slices 4-7 of GPU 0


def _node(tmp_path: Path) -> SimulatedNode:
    profile = tmp_path / "mig.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: [0]}\n")
    return SimulatedNode(profile, NODE, tmp_path / "root")


def _attached(node: SimulatedNode, state_dir: Path, maker: Any = None) -> DynamicMigKind:
    """A kind as a plugin instance's process has it: its own object, the node's directory."""
    kind = DynamicMigKind()
    kind.attach(
        GpuKindContext(
            state_dir=state_dir,
            boot_id="boot-1",
            node=GpuNode(
                container_driver_root=node.root,
                mig_maker=maker or Maker(node.nvml, node.sysfs_root),
            ),
        )
    )
    return kind


def _inventory(node: SimulatedNode) -> Inventory:
    return discover(node.nvml, sysfs_root=node.sysfs_root, dynamic_mig=True)


def _published(kind: DynamicMigKind, inventory: Inventory) -> list[str]:
    return [d.name for d in kind.devices(inventory, node_name=NODE)]


def _claim(kind: DynamicMigKind, inventory: Inventory, device: str) -> PreparedClaim:
    (found,) = [d for d in kind.devices(inventory, node_name=NODE) if d.name == device]
    prepared = PreparedDevice(
        request_names=("gpu",),
        pool_name=NODE,
        device_name=device,
        cdi_device_ids=(f"k8s.gpu.nvidia.com/claim={UID}-{device}",),
        kind=NAME,
        identity=tuple(sorted(found.identity.items())),
    )
    return PreparedClaim(UID, "default", "mig", (prepared,))


def _make_out_of_band(node: SimulatedNode, profile_id: int, start: int, size: int) -> None:
    """An instance made by hand (nvidia-smi mig -cgi), which no claim of the driver made."""
    from drivers.gpu.model import migmake

    node.nvml.nvmlInit()
    try:
        migmake.make(node.nvml, _uuid(node), profile_id, start, size, node.sysfs_root)
    finally:
        node.nvml.nvmlShutdown()


def _uuid(node: SimulatedNode) -> str:
    return node.nvml.gpus[0].uuid


def test_a_placement_the_sibling_instance_made_stays_published_by_both(tmp_path: Path) -> None:
    node = _node(tmp_path)
    state_dir = tmp_path / "plugin" / "kinds" / NAME
    old = _attached(node, state_dir)  # the old pod's, attached before the claim came
    new = _attached(node, state_dir)
    before = _inventory(node)
    everything = _published(old, before)
    assert DEVICE in everything
    claim = _claim(new, before, DEVICE)

    new.prepare(claim)  # through the new instance
    made = _inventory(node)
    assert [m.placement_start for m in made.gpus[0].mig_devices] == [4]
    assert _published(new, made) == everything
    assert _published(old, made) == everything  # not taken for an instance made out of band

    # Unprepared through the old instance (the kubelet talks to either): gone, all free.
    old.unprepare(claim)
    after = _inventory(node)
    assert after.gpus[0].mig_devices == ()
    assert _published(old, after) == _published(new, after) == everything


def test_a_placement_the_sibling_is_making_is_never_taken_for_out_of_band(
    tmp_path: Path,
) -> None:
    """The window between the instance's create and the record of what it is: the old
    instance's publisher rediscovers right there."""
    node = _node(tmp_path)
    state_dir = tmp_path / "plugin" / "kinds" / NAME
    old = _attached(node, state_dir)
    seen: list[Sequence[str]] = []

    class Watched(Maker):
        def make(self, parent_uuid: str, profile_id: int, start: int, size: int) -> MadeMig:
            made = super().make(parent_uuid, profile_id, start, size)
            seen.append(_published(old, _inventory(node)))
            return made

    new = _attached(node, state_dir, Watched(node.nvml, node.sysfs_root))
    everything = _published(old, _inventory(node))
    new.prepare(_claim(new, _inventory(node), DEVICE))
    assert seen == [everything]


def test_an_instance_no_claim_made_stays_out_of_both(tmp_path: Path) -> None:
    node = _node(tmp_path)
    state_dir = tmp_path / "plugin" / "kinds" / NAME
    old = _attached(node, state_dir)
    new = _attached(node, state_dir)
    _make_out_of_band(node, 9, 4, 4)  # the very placement DEVICE is
    inventory = _inventory(node)
    assert DEVICE not in _published(old, inventory)
    assert _published(old, inventory) == _published(new, inventory)


def test_an_instance_unprepared_after_discovery_listed_it_is_not_taken_for_out_of_band(
    tmp_path: Path,
) -> None:
    """The old instance's discovery lists the claim's instance; the new instance unprepares
    the claim (instance and record gone) before the old one builds its devices from what it
    listed. The tombstone of the record still names the instance as a claim's."""
    node = _node(tmp_path)
    state_dir = tmp_path / "plugin" / "kinds" / NAME
    old = _attached(node, state_dir)
    new = _attached(node, state_dir)
    everything = _published(old, _inventory(node))
    claim = _claim(new, _inventory(node), DEVICE)
    new.prepare(claim)
    listed = _inventory(node)  # the old instance's discovery, under way
    new.unprepare(claim)
    assert _inventory(node).gpus[0].mig_devices == ()
    assert _published(old, listed) == everything
    assert [p.name for p in state_dir.iterdir()] == [f"{UID}.gone"]


def test_a_tombstone_goes_once_no_discovery_can_have_listed_its_instances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node(tmp_path)
    state_dir = tmp_path / "plugin" / "kinds" / NAME
    kind = _attached(node, state_dir)
    claim = _claim(kind, _inventory(node), DEVICE)
    kind.prepare(claim)
    kind.unprepare(claim)
    kind.ours()
    assert [p.name for p in state_dir.iterdir()] == [f"{UID}.gone"]  # within the minute
    monkeypatch.setattr(dynmig, "TOMBSTONE_S", -1.0)
    assert kind.ours() == dynmig.Claimed()
    assert list(state_dir.iterdir()) == []


class _OtherGoes:
    """The node's NVML, where another claim's instance at slice 0 of GPU 0 is destroyed
    (its unprepare, in another thread or the sibling instance) right after ``call``
    first answers."""

    def __init__(self, node: SimulatedNode, call: str) -> None:
        self._node, self._call = node, call
        self.gone = False

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._node.nvml, name)
        if name != self._call:
            return real

        def hooked(*args: Any) -> Any:
            from drivers.gpu.model import migmake

            answer = real(*args)
            if not self.gone:
                self.gone = True
                assert migmake.unmake(self._node.nvml, _uuid(self._node), 9, 0)
            return answer

        return hooked


def test_an_instance_of_another_claim_destroyed_meanwhile_fails_no_make_or_unmake(
    tmp_path: Path,
) -> None:
    """Two claims' instances side by side on one GPU: one claim's make or unmake walks the
    GPU's instances while the other claim's unprepare destroys its own."""
    from drivers.gpu.model import migmake

    node = _node(tmp_path)
    uuid = _uuid(node)
    node.nvml.nvmlInit()
    try:
        # Unmake: the listing of the profile's GPU instances holds the other's, gone next.
        migmake.make(node.nvml, uuid, 9, 0, 4, node.sysfs_root)
        migmake.make(node.nvml, uuid, 9, 4, 4, node.sysfs_root)
        nvml = _OtherGoes(node, "nvmlDeviceGetGpuInstances")
        assert migmake.unmake(nvml, uuid, 9, 4) and nvml.gone
        # Make: the walk of the GPU's MIG devices meets the other's first, gone next.
        migmake.make(node.nvml, uuid, 9, 0, 4, node.sysfs_root)
        nvml = _OtherGoes(node, "nvmlDeviceGetMigDeviceHandleByIndex")
        made = migmake.make(nvml, uuid, 9, 4, 4, node.sysfs_root)
        assert nvml.gone and made.uuid.startswith("MIG-")
        assert migmake.unmake(node.nvml, uuid, 9, 4)
    finally:
        node.nvml.nvmlShutdown()


def test_two_claims_made_and_destroyed_side_by_side_on_one_gpu(tmp_path: Path) -> None:
    """Bounded, with a discovery beside them: no make, unmake or read of the GPU fails."""
    import threading

    node = _node(tmp_path)
    maker = Maker(node.nvml, node.sysfs_root)
    failures: list[BaseException] = []

    def churn(start: int) -> None:
        try:
            for _ in range(40):
                maker.make(_uuid(node), 9, start, 4)
                assert maker.unmake(_uuid(node), 9, start)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    def read() -> None:
        try:
            for _ in range(10):
                assert _inventory(node).skipped == ()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=churn, args=(s,)) for s in (0, 4)]
    threads.append(threading.Thread(target=read))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
