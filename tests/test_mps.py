"""MPS through GpuConfig: a control daemon per GPU (a stand-in that the plugin starts and
stops exactly as it would start ``nvidia-cuda-mps-control``), its pipe and log directories
and the limits in the CDI spec, a plugin restart adopting it, bad input per claim."""

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from driver.kube.session import Session
from drivers.gpu import flavor
from drivers.gpu.kinds import mpspaths
from drivers.gpu.kinds.gpu import GpuKind
from drivers.gpu.kinds.mps import Mps
from kubeletplugin import cdi
from kubeletplugin.state import DeviceState
from tests.pluginharness import wait_for
from tests.standin import StandIn, short_dir
from tests.test_state import (
    DRIVER,
    GPU_CONFIG,
    _config,
    _inventory,
    create_claim,
    devices_of,
)
from tests.test_timeslicing import Smi

STAND_IN = """#!/bin/sh
# nvidia-cuda-mps-control: -f runs the daemon in the foreground; otherwise a command on stdin.
if [ "$1" = "-f" ]; then
  echo "-f CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" >> {log}
  if [ -e {fail} ]; then echo "An MPS control daemon cannot start: no GPU"; exit 1; fi
  # As the real one: control_lock and the log FIFO made, then exit 1, printing nothing,
  # when a socket it binds would be over 106 bytes (drivers.gpu.kinds.mpspaths).
  : > "$CUDA_MPS_PIPE_DIRECTORY/control_lock"
  [ -p "$CUDA_MPS_PIPE_DIRECTORY/log" ] || mkfifo "$CUDA_MPS_PIPE_DIRECTORY/log"
  for name in control control_privileged; do
    path="$CUDA_MPS_PIPE_DIRECTORY/$name"
    if [ "$(printf %s "$path" | wc -c)" -gt {max_socket} ]; then exit 1; fi
  done
  cd "$CUDA_MPS_PIPE_DIRECTORY"
  echo $$ > daemon.pid
  trap 'rm -f control control_privileged; exit 0' TERM
  : > control_privileged
  : > control
  while :; do sleep 0.05; done
fi
read cmd
echo "$cmd" >> {log}
if [ "$cmd" = quit ]; then kill -TERM "$(cat "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid")"; fi
"""


class Control(StandIn):
    """The stand-in control binary; its calls, one a line, go to a file."""

    def __init__(self, root: Path) -> None:
        script = STAND_IN.replace("{max_socket}", str(mpspaths.MAX_SOCKET_PATH))
        super().__init__(root, "nvidia-cuda-mps-control", script)


def mps(driver: str = DRIVER, **settings: Any) -> dict[str, Any]:
    sharing: dict[str, Any] = {"strategy": "MPS"}
    if settings:
        sharing["mpsConfig"] = settings
    params = {"apiVersion": GPU_CONFIG, "kind": "GpuConfig", "sharing": sharing}
    return {"source": "FromClaim", "opaque": {"driver": driver, "parameters": params}}


def daemon_pids(root: Path) -> list[int]:
    """The stand-in daemons that some pid file under ``root`` names and that still run."""
    pids = []
    for path in set(root.rglob("daemon.pid")):
        pid = int(path.read_text())
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                pids.append(pid)
    return pids


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Short: the daemons' sockets live under it."""
    with short_dir() as path:
        yield path


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    yield Control(tmp_path / "mps-control")
    for pid in daemon_pids(tmp_path):  # whatever a failed test left running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _state(api: Session, tmp_path: Path, smi: Smi, control: Control) -> DeviceState:
    config = _config(tmp_path, nvidia_smi=smi.path, mps_control=control.path)
    devices = devices_of(_inventory("p5.48xlarge", tmp_path), config)
    return await DeviceState.open(config, api, devices)


def _mps(state: DeviceState) -> Mps:
    """The MPS daemons of the GPU kind of ``state``'s own table."""
    return cast(GpuKind, state.kinds["gpu"]).mps


def _uuid(tmp_path: Path, device: str) -> str:
    return _inventory("p5.48xlarge", tmp_path).by_device_name()[device].uuid


async def test_a_daemon_per_gpu_started_before_prepare_answers_stopped_at_unprepare(
    api_client: Session, tmp_path: Path, control: Control
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    uuid = _uuid(tmp_path, "gpu-0")
    config = [mps(defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit="10Gi")]
    ref = await create_claim(api_client, "mps", ["gpu-0"], config=config)
    plain = await create_claim(api_client, "plain", ["gpu-1"])
    results = await state.prepare([ref, plain])
    assert {uid: r.error for uid, r in results.items()} == {ref.uid: "", plain.uid: ""}
    assert smi.calls() == [f"-i {uuid} -c EXCLUSIVE_PROCESS"]
    assert control.calls() == [f"-f CUDA_VISIBLE_DEVICES={uuid}"]
    assert _mps(state).running_pid(uuid) is not None
    assert len(daemon_pids(tmp_path)) == 1

    spec = json.loads(cdi.spec_path(tmp_path / "cdi", ref.uid, flavor.GPU).read_text())
    pipe = _pipe(tmp_path, uuid)
    edits = spec["containerEdits"]
    assert {
        f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",  # 10Gi, in the MiB CUDA reads
    } <= set(edits["env"])
    # The pipe is all a client needs; the daemon's log directory is no container's to write.
    assert not any(e.startswith("CUDA_MPS_LOG_DIRECTORY=") for e in edits["env"])
    # The container sees the pipe at the host's path: the sockets' budget holds there too.
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [(str(pipe),) * 2]
    plain_spec = json.loads(cdi.spec_path(tmp_path / "cdi", plain.uid, flavor.GPU).read_text())
    assert "mounts" not in plain_spec["containerEdits"]

    # A plugin restart: the daemon runs on and is adopted, not started again.
    state = await _state(api_client, tmp_path, smi, control)
    assert await state.prepare([ref]) == {ref.uid: results[ref.uid]}
    assert control.calls() == [] and len(daemon_pids(tmp_path)) == 1

    assert await state.unprepare([ref, plain]) == {ref.uid: "", plain.uid: ""}
    assert control.calls() == ["quit"]
    assert smi.calls() == [f"-i {uuid} -c DEFAULT"]
    assert _mps(state).running_pid(uuid) is None and daemon_pids(tmp_path) == []


async def test_a_pinned_memory_limit_reaches_cuda_in_whole_mib(
    api_client: Session, tmp_path: Path, control: Control
) -> None:
    """CUDA reads "<n>M" and "<n>G" as binary units; a quantity's "10G" is decimal, and "Gi"
    is no unit of CUDA's: both are written in MiB, as NVIDIA's driver writes them."""
    state = await _state(api_client, tmp_path, Smi(tmp_path / "smi"), control)
    uuid = _uuid(tmp_path, "gpu-0")
    config = [
        mps(
            defaultPinnedDeviceMemoryLimit="10G",
            defaultPerDevicePinnedMemoryLimit={uuid: "1.5Gi"},
        )
    ]
    decimal = await create_claim(api_client, "decimal", ["gpu-1"], config=config)
    per_gpu = await create_claim(api_client, "per-gpu", ["gpu-0"], config=config)
    refs = [decimal, per_gpu]
    assert {u: r.error for u, r in (await state.prepare(refs)).items()} == dict.fromkeys(
        (decimal.uid, per_gpu.uid), ""
    )
    env = {
        ref.name: json.loads(cdi.spec_path(tmp_path / "cdi", ref.uid, flavor.GPU).read_text())[
            "containerEdits"
        ]["env"]
        for ref in refs
    }
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=9536M" in env["decimal"]  # 10^10 bytes
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1536M" in env["per-gpu"]
    assert await state.unprepare(refs) == dict.fromkeys((decimal.uid, per_gpu.uid), "")


async def test_bad_mps_input_and_a_daemon_that_fails_are_per_claim(
    api_client: Session, tmp_path: Path, control: Control
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    good = await create_claim(api_client, "good", ["gpu-0"])
    two = await create_claim(api_client, "two", ["gpu-1", "gpu-2"], config=[mps()])
    percent = await create_claim(
        api_client, "percent", ["gpu-3"], config=[mps(defaultActiveThreadPercentage="lots")]
    )
    failing = await create_claim(api_client, "failing", ["gpu-4"], config=[mps()])
    tiny = await create_claim(
        api_client, "tiny", ["gpu-5"], config=[mps(defaultPinnedDeviceMemoryLimit="512Ki")]
    )
    control.fail.touch()
    refs = [good, two, percent, failing, tiny]
    results = await state.prepare(refs)
    errors = {ref.name: results[ref.uid].error for ref in refs}
    assert errors["good"] == ""
    assert "the MPS pinned memory limit 512Ki for GPU" in errors["tiny"]
    assert "under 1Mi" in errors["tiny"]
    assert 'field "sharing.strategy": MPS shares one GPU per claim' in errors["two"]
    assert 'field "sharing.mpsConfig.defaultActiveThreadPercentage"' in errors["percent"]
    assert "the MPS control daemon for GPU" in errors["failing"]
    assert "cannot start: no GPU" in errors["failing"]
    assert daemon_pids(tmp_path) == []
    uuid = _uuid(tmp_path, "gpu-4")
    # Exclusive-process mode was set for the daemon, and set back when it failed.
    assert smi.calls() == [f"-i {uuid} -c EXCLUSIVE_PROCESS", f"-i {uuid} -c DEFAULT"]
    control.fail.unlink()
    assert (await state.prepare([failing]))[failing.uid].error == ""  # the kubelet's retry
    assert len(daemon_pids(tmp_path)) == 1
    assert await state.unprepare([failing]) == {failing.uid: ""}
    assert daemon_pids(tmp_path) == []


async def test_a_daemon_started_just_before_a_crash_is_found_without_its_pid_file(
    api_client: Session, tmp_path: Path, control: Control
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    uuid = _uuid(tmp_path, "gpu-5")
    ref = await create_claim(api_client, "mps", ["gpu-5"], config=[mps()])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    (running,) = daemon_pids(tmp_path)
    # What a SIGKILL between the daemon's start and its pid file leaves.
    (tmp_path / "plugins" / DRIVER / "kinds" / "gpu" / "mps" / uuid / "pid").unlink()
    state = await _state(api_client, tmp_path, smi, control)
    assert _mps(state).running_pid(uuid) == running  # found in /proc, adopted
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert daemon_pids(tmp_path) == []


async def test_a_daemon_that_dies_is_reported_and_restarted(
    api_client: Session,
    tmp_path: Path,
    control: Control,
    caplog: pytest.LogCaptureFixture,
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    uuid = _uuid(tmp_path, "gpu-0")
    ref = await create_claim(api_client, "mps", ["gpu-0"], config=[mps()])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    control.calls()
    await state.watch()  # alive: nothing to do
    assert control.calls() == []
    (pid,) = daemon_pids(tmp_path)
    os.kill(pid, signal.SIGKILL)
    await wait_for(lambda: _mps(state).running_pid(uuid) is None, "the daemon gone")
    pipe = _pipe(tmp_path, uuid)
    assert (pipe / "control").exists()  # killed: it could not remove its pipe
    await state.watch()
    assert control.calls() == [f"-f CUDA_VISIBLE_DEVICES={uuid}"]
    assert _mps(state).running_pid(uuid) is not None and daemon_pids(tmp_path) != [pid]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "MPS control daemon is gone; restarting it"
    ]
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert daemon_pids(tmp_path) == []


def _gpu_dir(tmp_path: Path, uuid: str) -> Path:
    return tmp_path / "plugins" / DRIVER / "kinds" / "gpu" / "mps" / uuid


def _pipe(tmp_path: Path, uuid: str) -> Path:
    return mpspaths.pipe_dir(tmp_path / "plugins" / DRIVER, uuid)


def serving(state: DeviceState, tmp_path: Path, uuid: str) -> bool:
    """``uuid``'s daemon restarted and ready: the plugin finds it as soon as it runs, but
    the stand-in writes its own pid file and then its pipe a moment later."""
    pid = _mps(state).running_pid(uuid)
    pipe = _pipe(tmp_path, uuid)
    with contextlib.suppress(OSError, ValueError):
        return pid == int((pipe / "daemon.pid").read_text()) and (pipe / "control").exists()
    return False


async def test_a_link_planted_in_the_log_directory_is_never_followed(
    api_client: Session, tmp_path: Path, control: Control
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    uuid = _uuid(tmp_path, "gpu-6")
    # What a container that had the log directory mounted could leave: its daemon.out a
    # link to a host file outside every root the plugin owns.
    outside = tmp_path / "host-secret"
    outside.write_text("root:SECRET-HASH:19000:0:99999:7:::\n")
    logs = _gpu_dir(tmp_path, uuid) / "log"
    logs.mkdir(parents=True)
    (logs / "daemon.out").symlink_to(outside)
    ref = await create_claim(api_client, "linked", ["gpu-6"], config=[mps()])
    control.fail.touch()  # the daemon fails: its log's tail is quoted in the claim's error
    error = (await state.prepare([ref]))[ref.uid].error
    assert outside.read_text() == "root:SECRET-HASH:19000:0:99999:7:::\n"
    assert "SECRET-HASH" not in error
    assert "cannot start: no GPU" in error  # the daemon's own output, from a file of ours
    assert not (logs / "daemon.out").is_symlink()
    control.fail.unlink()
    assert (await state.prepare([ref]))[ref.uid].error == ""  # the kubelet's retry
    assert outside.read_text() == "root:SECRET-HASH:19000:0:99999:7:::\n"
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert daemon_pids(tmp_path) == []


async def test_a_directory_planted_at_one_gpus_control_pipe_stops_no_other_restart(
    api_client: Session, tmp_path: Path, control: Control
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    # The watchdog walks the GPUs in UUID order: the tampered one comes first.
    (a_dev, a_uuid), (b_dev, b_uuid) = sorted(
        ((d, _uuid(tmp_path, d)) for d in ("gpu-0", "gpu-1")), key=lambda p: p[1]
    )
    a = await create_claim(api_client, "a", [a_dev], config=[mps()])
    b = await create_claim(api_client, "b", [b_dev], config=[mps()])
    results = await state.prepare([a, b])
    assert {uid: r.error for uid, r in results.items()} == {a.uid: "", b.uid: ""}
    for pid in daemon_pids(tmp_path):
        os.kill(pid, signal.SIGKILL)
    await wait_for(
        lambda: _mps(state).running_pid(a_uuid) is None and _mps(state).running_pid(b_uuid) is None,
        "both daemons gone",
    )
    control_a = _pipe(tmp_path, a_uuid) / "control"
    control_a.unlink()
    control_a.mkdir()  # what a container with the pipe directory mounted can do
    (control_a / "junk").write_text("x")
    watchdog = asyncio.create_task(state.run_watchdog(period=0.05))
    try:
        await wait_for(lambda: serving(state, tmp_path, b_uuid), "GPU B's daemon back")
        # The planted directory is cleared like a stale pipe: GPU A's daemon is back too.
        await wait_for(lambda: serving(state, tmp_path, a_uuid), "GPU A's daemon back")
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
    assert len(daemon_pids(tmp_path)) == 2
    assert await state.unprepare([a, b]) == {a.uid: "", b.uid: ""}
    assert daemon_pids(tmp_path) == []


@pytest.mark.parametrize("planted", ["fifo", "directory"])
async def test_what_is_not_a_file_at_the_daemon_log_is_replaced_not_opened(
    api_client: Session, tmp_path: Path, control: Control, planted: str
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    uuid = _uuid(tmp_path, "gpu-7")
    logs = _gpu_dir(tmp_path, uuid) / "log"
    logs.mkdir(parents=True)
    if planted == "fifo":
        os.mkfifo(logs / "daemon.out")  # opened for writing, it would wait for a reader
    else:
        (logs / "daemon.out").mkdir()
        (logs / "daemon.out" / "kept").write_text("x")
    ref = await create_claim(api_client, "planted", ["gpu-7"], config=[mps()])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert (logs / "daemon.out").is_file() and not (logs / "daemon.out").is_symlink()
    assert len(daemon_pids(tmp_path)) == 1
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert daemon_pids(tmp_path) == []


async def test_a_gpu_whose_nvidia_smi_fails_stops_no_other_gpus_restart(
    api_client: Session,
    tmp_path: Path,
    control: Control,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="drivers.gpu.kinds.mps")
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    (a_dev, a_uuid), (b_dev, b_uuid) = sorted(
        ((d, _uuid(tmp_path, d)) for d in ("gpu-2", "gpu-3")), key=lambda p: p[1]
    )
    a = await create_claim(api_client, "a", [a_dev], config=[mps()])
    b = await create_claim(api_client, "b", [b_dev], config=[mps()])
    results = await state.prepare([a, b])
    assert {uid: r.error for uid, r in results.items()} == {a.uid: "", b.uid: ""}
    smi.fail.write_text(a_uuid)  # the first GPU the watchdog visits is lost (an XID 79)
    for pid in daemon_pids(tmp_path):
        os.kill(pid, signal.SIGKILL)
    await wait_for(
        lambda: _mps(state).running_pid(a_uuid) is None and _mps(state).running_pid(b_uuid) is None,
        "both daemons gone",
    )
    watchdog = asyncio.create_task(state.run_watchdog(period=0.05))
    try:
        await wait_for(lambda: serving(state, tmp_path, b_uuid), "GPU B's daemon back")
        failed = [
            r for r in caplog.records if r.getMessage() == "MPS control daemon restart failed"
        ]
        assert failed and {getattr(r, "gpu_uuid", None) for r in failed} == {a_uuid}
        assert a_uuid in str(getattr(failed[0], "error", ""))
        # Round after round the same failure: reported once, not every 5 s.
        await wait_for(
            lambda: (
                len(
                    [
                        r
                        for r in caplog.records
                        if r.getMessage() == "MPS control daemon restart failed"
                    ]
                )
                > 2
            ),
            "rounds",
        )
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert [r.getMessage() for r in errors if getattr(r, "gpu_uuid", None) == a_uuid] == [
            "MPS control daemon is gone; restarting it",
            "MPS control daemon restart failed",
        ]
        assert _mps(state).running_pid(a_uuid) is None
        smi.fail.unlink()  # the GPU is back: the next round restarts its daemon
        await wait_for(lambda: serving(state, tmp_path, a_uuid), "GPU A's daemon back")
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
    assert await state.unprepare([a, b]) == {a.uid: "", b.uid: ""}
    assert daemon_pids(tmp_path) == []
