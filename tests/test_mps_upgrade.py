"""MPS across the upgrade that moved the pipe directory out of the kind's state (where its
sockets did not fit ``sun_path`` on a node) to ``<plugin dir>/mps/<digest>``: a claim the
last release prepared is read, recovered and unprepared; its daemon is adopted and serves
on, restarted where its claims' containers see it; new claims name the new path, which
reaches the adopted daemon while it serves, and the GPU's next daemon is of the new layout;
the same for a daemon run as a pod (``--mps-daemon=pod``).

The last release is reproduced by its one difference: the pipe it made, ``<state>/pipe``
(``Mps._legacy_pipe``), where this release makes the new one (``Mps._new_pipe``). Its
daemons ran only where that pipe fit the sockets (not on a node at the chart's paths, nor
under a test's usual plugin directory): the plugin directory here is a short one."""

import asyncio
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.kube.rest import Client
from driver.kube.session import Session
from drivers.gpu import flavor
from drivers.gpu.kinds import mpspaths
from drivers.gpu.kinds.mps import Mps
from drivers.gpu.kinds.mpspod import MpsPods, pipe_of
from kubeletplugin import cdi
from kubeletplugin.claims import ClaimRef
from kubeletplugin.state import DeviceState
from tests import test_mps, test_mps_pod
from tests.pluginharness import wait_for
from tests.podrunner import PodRunner
from tests.test_mps import Control, _mps, daemon_pids, mps
from tests.test_state import DRIVER, NODE, _config, _inventory, create_claim, devices_of
from tests.test_timeslicing import Smi

control = test_mps.control
tmp_path = test_mps.tmp_path
runner = test_mps_pod.runner


async def _state(
    api: Session, root: Path, smi: Smi, control: Control, *, pods: bool = False
) -> DeviceState:
    more: dict[str, Any] = {}
    if pods:
        loop = asyncio.get_running_loop()
        more["mps_pods"] = MpsPods(Client(api), loop, test_mps_pod.POD_CONFIG, NODE)
    config = _config(
        root,
        nvidia_smi=smi.path,
        mps_control=control.path,
        plugin_dir=root / "p",
        consumable_capacity=True,
        **more,
    )
    devices = devices_of(_inventory("p5.48xlarge", root), config)
    return await DeviceState.open(config, api, devices)


async def _share(api: Session, name: str, device: str) -> ClaimRef:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device,
              "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "10Gi"}}  # fmt: skip
    return await create_claim(api, name, [device], results=[result], config=[mps()])


def _env(root: Path, ref: ClaimRef) -> list[str]:
    spec: Any = json.loads(cdi.spec_path(root / "cdi", ref.uid, flavor.GPU).read_text())
    return list(spec["containerEdits"]["env"])


def _daemon_pipe(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (pipe,) = [e for e in environ if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")]
    return pipe.decode().partition("=")[2]


@pytest.fixture
def last_release(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    with monkeypatch.context() as m:
        m.setattr(Mps, "_new_pipe", Mps._legacy_pipe)
        yield m


async def test_a_daemon_of_the_last_release_serves_its_claims_and_new_ones_until_the_last(
    api_client: Session, tmp_path: Path, control: Control, last_release: Any
) -> None:
    smi = Smi(tmp_path / "smi")
    uuid0 = _inventory("p5.48xlarge", tmp_path).by_device_name()["gpu-0"].uuid
    uuid1 = _inventory("p5.48xlarge", tmp_path).by_device_name()["gpu-1"].uuid
    plugin_dir = tmp_path / "p"
    legacy = plugin_dir / "kinds" / "gpu" / "mps" / uuid0 / "pipe"
    new = mpspaths.pipe_dir(plugin_dir, uuid0)

    state = await _state(api_client, tmp_path, smi, control)
    old = await _share(api_client, "old", "gpu-0")
    assert (await state.prepare([old]))[old.uid].error == ""
    assert f"CUDA_MPS_PIPE_DIRECTORY={legacy}" in _env(tmp_path, old)
    (adopted,) = daemon_pids(tmp_path)
    assert _daemon_pipe(adopted) == str(legacy)
    old_spec = cdi.spec_path(tmp_path / "cdi", old.uid, flavor.GPU).read_bytes()
    last_release.undo()
    control.calls()

    # The upgrade: the claim is read and recovered as it is, its daemon adopted.
    state = await _state(api_client, tmp_path, smi, control)
    assert cdi.spec_path(tmp_path / "cdi", old.uid, flavor.GPU).read_bytes() == old_spec
    assert _mps(state).running_pid(uuid0) == adopted and control.calls() == []

    # A new share of the GPU names the new path, which reaches the adopted daemon; a new
    # claim on another GPU starts a daemon of the new layout.
    shared, other = (
        await _share(api_client, "shared", "gpu-0"),
        await _share(api_client, "b", "gpu-1"),
    )
    answers = await state.prepare([shared, other])
    assert {uid: r.error for uid, r in answers.items()} == {shared.uid: "", other.uid: ""}
    assert f"CUDA_MPS_PIPE_DIRECTORY={new}" in _env(tmp_path, shared)
    assert new.is_symlink() and new.readlink() == legacy and (new / "control").exists()
    other_pipe = mpspaths.pipe_dir(plugin_dir, uuid1)
    assert control.calls() == [f"-f CUDA_VISIBLE_DEVICES={uuid1}"]
    assert other_pipe.is_dir() and not other_pipe.is_symlink()
    assert _daemon_pipe(_mps(state).running_pid(uuid1) or 0) == str(other_pipe)

    # The adopted daemon dies: it comes back where the old claim's container sees it.
    os.kill(adopted, signal.SIGKILL)
    await wait_for(lambda: _mps(state).running_pid(uuid0) is None, "the daemon gone")
    await state.watch()
    restarted = _mps(state).running_pid(uuid0)
    assert restarted is not None and _daemon_pipe(restarted) == str(legacy)
    assert (new / "control").exists()

    # Its claims go; the last one stops it and the link; the GPU's next daemon is new.
    assert await state.unprepare([old]) == {old.uid: ""}
    assert _mps(state).running_pid(uuid0) == restarted
    assert await state.unprepare([shared]) == {shared.uid: ""}
    assert _mps(state).running_pid(uuid0) is None and not new.is_symlink()
    control.calls()
    again = await _share(api_client, "again", "gpu-0")
    assert (await state.prepare([again]))[again.uid].error == ""
    assert new.is_dir() and not new.is_symlink()
    assert _daemon_pipe(_mps(state).running_pid(uuid0) or 0) == str(new)
    assert await state.unprepare([again, other]) == {again.uid: "", other.uid: ""}
    assert daemon_pids(tmp_path) == []


async def test_the_last_releases_claims_restart_their_dead_daemon_at_their_pipe(
    api_client: Session, tmp_path: Path, control: Control, last_release: Any
) -> None:
    """A daemon that died during the upgrade: the plugin never saw it serve, and only its
    claims' holders and pipe tell where it was."""
    smi = Smi(tmp_path / "smi")
    uuid0 = _inventory("p5.48xlarge", tmp_path).by_device_name()["gpu-0"].uuid
    plugin_dir = tmp_path / "p"
    legacy = plugin_dir / "kinds" / "gpu" / "mps" / uuid0 / "pipe"
    state = await _state(api_client, tmp_path, smi, control)
    old = await _share(api_client, "old", "gpu-0")
    assert (await state.prepare([old]))[old.uid].error == ""
    (pid,) = daemon_pids(tmp_path)
    os.kill(pid, signal.SIGKILL)
    await wait_for(lambda: daemon_pids(tmp_path) == [], "the daemon gone")
    last_release.undo()

    state = await _state(api_client, tmp_path, smi, control)
    await state.watch()
    restarted = _mps(state).running_pid(uuid0)
    assert restarted is not None and _daemon_pipe(restarted) == str(legacy)
    assert mpspaths.pipe_dir(plugin_dir, uuid0).readlink() == legacy
    assert await state.unprepare([old]) == {old.uid: ""}
    assert daemon_pids(tmp_path) == [] and not mpspaths.pipe_dir(plugin_dir, uuid0).exists()


async def test_a_daemon_pod_of_the_last_release_is_adopted_and_deleted_with_its_last_claim(
    api_client: Session,
    tmp_path: Path,
    control: Control,
    runner: PodRunner,
    last_release: Any,
) -> None:
    smi = Smi(tmp_path / "smi")
    uuid0 = _inventory("p5.48xlarge", tmp_path).by_device_name()["gpu-0"].uuid
    plugin_dir = tmp_path / "p"
    legacy = plugin_dir / "kinds" / "gpu" / "mps" / uuid0 / "pipe"
    new = mpspaths.pipe_dir(plugin_dir, uuid0)
    state = await _state(api_client, tmp_path, smi, control, pods=True)
    old = await _share(api_client, "old", "gpu-0")
    assert (await state.prepare([old]))[old.uid].error == ""
    (pod,) = runner.pods()
    assert pipe_of(pod) == str(legacy)
    last_release.undo()
    control.calls()

    state = await _state(api_client, tmp_path, smi, control, pods=True)
    shared = await _share(api_client, "shared", "gpu-0")
    assert (await state.prepare([shared]))[shared.uid].error == ""
    (again,) = runner.pods()  # adopted: the same pod, no second daemon
    assert again["metadata"]["uid"] == pod["metadata"]["uid"] and control.calls() == []
    assert f"CUDA_MPS_PIPE_DIRECTORY={new}" in _env(tmp_path, shared)
    assert new.readlink() == legacy and (new / "control").exists()

    assert await state.unprepare([old]) == {old.uid: ""}
    assert len(runner.pods()) == 1
    assert await state.unprepare([shared]) == {shared.uid: ""}
    assert control.calls() == ["quit"]  # through the pipe the pod serves
    assert runner.pods() == [] and daemon_pids(tmp_path) == [] and not new.is_symlink()


async def test_a_prepare_of_the_last_release_cut_short_is_recovered_by_this_one(
    api_client: Session, tmp_path: Path, control: Control, last_release: Any
) -> None:
    """Killed between the daemon's start and the spec: the claim's record of its side
    effects is what is left, and recovery undoes them, the last release's daemon too."""
    smi = Smi(tmp_path / "smi")
    uuid0 = _inventory("p5.48xlarge", tmp_path).by_device_name()["gpu-0"].uuid
    state = await _state(api_client, tmp_path, smi, control)
    old = await _share(api_client, "old", "gpu-0")
    assert (await state.prepare([old]))[old.uid].error == ""
    assert len(daemon_pids(tmp_path)) == 1
    cdi.spec_path(tmp_path / "cdi", old.uid, flavor.GPU).unlink()  # the spec is written last
    assert list((tmp_path / "p" / "claims").glob(f"{old.uid}*"))
    last_release.undo()
    control.calls()

    await _state(api_client, tmp_path, smi, control)
    assert control.calls() == ["quit"] and daemon_pids(tmp_path) == []
    assert _mps(state).running_pid(uuid0) is None
    assert not list((tmp_path / "p" / "claims").glob(f"{old.uid}*"))
    assert not mpspaths.pipe_dir(tmp_path / "p", uuid0).exists()
