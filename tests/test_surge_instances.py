"""Two plugin instances on one node, as during a surge upgrade: the old pod serves while
the new one starts, recovers and serves too, on the same plugin directory and CDI root.
Per claim, the claim's file lock keeps them apart: a new instance's recovery leaves the
old one's prepare in flight alone, and a prepare through one instance racing an unprepare
of the same claim through the other ends with the claim whole, prepared or not."""

import asyncio
import os
import random
import signal
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from driver.kube.session import Session
from drivers.gpu.flavor import GPU
from drivers.gpu.kinds import discovered
from kubeletplugin import cdi
from kubeletplugin import state as state_module
from kubeletplugin.records import Records
from kubeletplugin.state import DeviceState
from sandbox.kubeletsim import KubeletSim
from tests import pluginharness
from tests.pluginharness import NodeDirs, PluginProcess, create_node, wait_for
from tests.test_state import DRIVER, NODE, _config, _inventory, create_claim
from tests.test_timeslicing import Smi, timeslicing
from tests.test_timeslicing_process import _left, _levels

SURGE_NODE = "node-s"
ROUNDS = 40
SEED = int(os.environ.get("GPU_DRA_RACE_SEED", "20261202"))


def _stopped(pid: int) -> bool:
    """The process has stopped itself (its pause point)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("step", ["after-claim-record", "after-side-effects"])
async def test_a_new_instances_recovery_leaves_the_old_ones_prepare_in_flight_alone(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess], step: str
) -> None:
    api, kubeconfig = kube
    await create_node(api, SURGE_NODE)  # the plugin reads its Node at start
    smi = Smi(dirs.root / "smi")
    env = {"GPU_DRA_NVIDIA_SMI": str(smi.path)}
    claim = await pluginharness.create_claim(
        api, "sliced", node=SURGE_NODE, devices=["gpu-0"], config=[timeslicing("Short")]
    )

    def start(pod_uid: str, **extra: str) -> PluginProcess:
        proc = PluginProcess(
            dirs,
            kubeconfig=kubeconfig,
            node_name=SURGE_NODE,
            pod_uid=pod_uid,
            extra_env={**env, **extra},
        )
        processes.append(proc)
        return proc

    old = start("old-pod", GPU_DRA_PAUSEPOINT=step)
    await old.wait_ready()
    async with await KubeletSim.register(old.paths.registration) as kubelet:
        call = asyncio.ensure_future(kubelet.prepare([claim]))
        await wait_for(lambda: _stopped(old.pid), f"the old instance to pause at {step}")
        # The new instance starts and recovers while the old one's prepare is half done.
        new = start("new-pod")
        await new.wait_ready()
        os.kill(old.pid, signal.SIGCONT)
        answer = await call
    assert answer.claims[claim.uid].error == ""
    # The prepare the kubelet was answered OK for is whole: its spec, its device, its
    # side effect (the time slice, never reset since it was set) and the record of it.
    left = _left(dirs)
    assert left == {
        "specs": [cdi.spec_name(claim.uid, GPU)],
        "reservations": ["gpu-0"],
        "claim records": [f"{claim.uid}.json"],
        "holders": [claim.uid],
    }
    assert _levels(smi.calls())[-1:] == [1]
    # And the new instance unprepares it whole: the setting is restored.
    async with await KubeletSim.register(new.paths.registration) as kubelet:
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert _levels(smi.calls()) == [0]
    assert _left(dirs) == {"specs": [], "reservations": [], "claim records": [], "holders": []}


async def test_unprepare_through_one_instance_racing_prepare_through_the_other(
    api_client: Session, tmp_path: Path
) -> None:
    smi = Smi(tmp_path / "smi")
    devices = discovered(_inventory("p5.48xlarge", tmp_path), node_name=NODE)
    old, new = [
        await DeviceState.open(
            _config(tmp_path, nvidia_smi=smi.path, pod_uid=pod), api_client, devices
        )
        for pod in ("old-pod", "new-pod")
    ]
    ref = await create_claim(api_client, "raced", ["gpu-0"], config=[timeslicing("Short")])
    plugin_dir = tmp_path / "plugins" / DRIVER
    spec = cdi.spec_path(tmp_path / "cdi", ref.uid, GPU)
    rng = random.Random(SEED)
    outcomes = {"prepared": 0, "unprepared": 0}

    async def after(delay: float, call: Any) -> Any:
        # A random head start for each side, to meet the other at a random step; the
        # outcome is read from the records, never from how long anything took.
        await asyncio.sleep(delay)
        return await call

    for _ in range(ROUNDS):
        if rng.random() < 0.5:
            assert (await rng.choice((old, new)).prepare([ref]))[ref.uid].error == ""
        prepared, unprepared = await asyncio.gather(
            after(rng.uniform(0, 0.02), old.prepare([ref])),
            after(rng.uniform(0, 0.02), new.unprepare([ref])),
        )
        assert prepared[ref.uid].error == "" and unprepared == {ref.uid: ""}
        reserved = {
            p.name: p.readlink().name.split(":")[0] for p in (plugin_dir / "devices").iterdir()
        }
        # <gpu uuid>/<claim uid>; each GPU's lock file beside them is no holder
        holders = [
            p.name for p in (plugin_dir / "kinds" / "gpu" / "timeslice").glob("*/*") if p.is_file()
        ]
        record = (plugin_dir / "claims" / f"{ref.uid}.json").exists()
        if spec.exists():  # prepared: whole, with its device and its side effect
            assert reserved == {"gpu-0": ref.uid} and holders == [ref.uid] and record
            outcomes["prepared"] += 1
            assert await new.unprepare([ref]) == {ref.uid: ""}
        else:  # unprepared: nothing of it left, the GPU free for the next claim
            assert reserved == {} and holders == [] and not record
            outcomes["unprepared"] += 1
    assert all(outcomes.values()), outcomes  # both orders were met


async def test_a_claim_another_instance_holds_waits_then_is_a_retryable_error(
    api_client: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devices = discovered(_inventory("p5.48xlarge", tmp_path), node_name=NODE)
    config = _config(tmp_path)
    state = await DeviceState.open(config, api_client, devices)
    ref = await create_claim(api_client, "held", ["gpu-7"])
    # The other instance's hold on the claim: the same lock, taken the same way.
    records = Records(config.plugin_dir, config.cdi_root, boot_id="boot-1", flavor=GPU)
    held = records.try_lock_claim(ref.uid)
    assert held is not None
    assert records.try_lock_claim(ref.uid) is None  # one holder at a time, also in one process
    monkeypatch.setattr(state_module, "CLAIM_LOCK_WAIT_S", 0.3)
    started = time.monotonic()
    error = (await state.prepare([ref]))[ref.uid].error
    assert "another plugin instance of this node" in error
    assert 0.3 <= time.monotonic() - started < 5
    assert not cdi.spec_path(config.cdi_root, ref.uid, GPU).exists()  # it did nothing

    # Released while a call waits: the call goes on, within a poll of the release.
    waiting = asyncio.ensure_future(state.prepare([ref]))
    await asyncio.sleep(0.1)  # the call is waiting on the lock now (it cannot finish)
    assert not waiting.done()
    released = time.monotonic()
    records.unlock_claim(ref.uid, held)
    assert (await waiting)[ref.uid].error == ""
    assert time.monotonic() - released < 1.0
    lock = config.plugin_dir / "locks" / f"{ref.uid}.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600  # exactly, whatever the umask
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert not lock.exists()  # the claim is gone, and so is its lock file


async def test_a_symlink_in_place_of_a_lock_file_is_refused(
    api_client: Session, tmp_path: Path
) -> None:
    devices = discovered(_inventory("p5.48xlarge", tmp_path), node_name=NODE)
    config = _config(tmp_path)
    state = await DeviceState.open(config, api_client, devices)
    ref = await create_claim(api_client, "planted", ["gpu-6"])
    victim = tmp_path / "victim"
    victim.write_text("not ours to lock, truncate or chmod\n")
    victim.chmod(0o644)
    (config.plugin_dir / "locks" / f"{ref.uid}.lock").symlink_to(victim)
    error = (await state.prepare([ref]))[ref.uid].error
    assert "is a symlink, not a claim lock: refused" in error
    assert victim.read_text() == "not ours to lock, truncate or chmod\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644


async def test_start_up_sweeps_what_killed_writes_left_but_not_the_other_instances_in_flight(
    api_client: Session, tmp_path: Path
) -> None:
    """The temp files of a write a kill cut off go at the next start, in a kind's state
    directory too (dynamic MIG's per-claim records); the other instance's, of a claim whose
    lock it holds, are its write in flight and stay."""
    config = _config(tmp_path)
    devices = discovered(_inventory("p5.48xlarge", tmp_path), node_name=NODE)
    await DeviceState.open(config, api_client, devices)  # the directories, as a first start
    killed, in_flight = (
        "1e2d3c4b-0000-4000-8000-00000000000a",
        "1e2d3c4b-0000-4000-8000-00000000000b",
    )
    kind_dir = config.plugin_dir / "kinds" / "dynamic-mig"
    left = [
        kind_dir / f".{killed}.json.0badf00d.tmp",
        config.plugin_dir / "claims" / f".{killed}.json.0badf00d.tmp",
        cdi.spec_path(config.cdi_root, killed, GPU).with_name(
            f".{cdi.spec_name(killed, GPU)}.0badf00d.tmp"
        ),
    ]
    writing = [
        kind_dir / f".{in_flight}.json.5ca1ab1e.tmp",
        config.plugin_dir / "claims" / f".{in_flight}.json.5ca1ab1e.tmp",
    ]
    for path in left + writing:
        path.write_text("{")
    other = Records(config.plugin_dir, config.cdi_root, boot_id="boot-1", flavor=GPU)
    held = other.try_lock_claim(in_flight)  # the other instance, mid-prepare of that claim
    assert held is not None
    try:
        await DeviceState.open(config, api_client, devices)
        assert [p.exists() for p in left] == [False, False, False]
        assert [p.exists() for p in writing] == [True, True]
    finally:
        other.unlock_claim(in_flight, held)
    await DeviceState.open(config, api_client, devices)  # its writer died: now they are void
    assert [p.exists() for p in writing] == [False, False]
