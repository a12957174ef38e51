"""Time-slicing over the real socket of a real ``gpu-dra kubelet-plugin`` process, SIGKILLed
at each step of a prepare and an unprepare: after recovery the GPU's setting agrees with
the records, the kubelet's retry finishes the job, and nothing is left behind."""

import re
from pathlib import Path
from typing import Any

import pytest

from driver.nvml.faults import write_state_file
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import (
    PREPARE_STEPS,
    UNPREPARE_STEPS,
    NodeDirs,
    PluginProcess,
    create_claim,
    create_node,
    die_at,
)
from tests.test_timeslicing import Smi, timeslicing

NODE = "node-t"


@pytest.fixture
async def kube(kube: tuple[Any, Path]) -> tuple[Any, Path]:
    await create_node(kube[0], NODE)  # the plugin reads its Node at start
    return kube


def _levels(calls: list[str]) -> list[int]:
    return [int(m[1]) for c in calls if (m := re.search(r"--set-timeslice (\d)$", c))]


def _holders(dirs: NodeDirs) -> list[Path]:
    root = dirs.plugin_data / "kinds" / "gpu" / "timeslice"
    # <gpu uuid>/<claim uid>; beside them, each GPU's lock file, which is no holder
    return [p for p in root.glob("*/*") if p.is_file()] if root.exists() else []


def _left(dirs: NodeDirs) -> dict[str, list[str]]:
    """What records remain: specs, reservations, side-effect records, holders."""
    return {
        "specs": sorted(p.name for p in dirs.cdi.glob("*.json")),
        "reservations": sorted(p.name for p in (dirs.plugin_data / "devices").iterdir()),
        "claim records": sorted(p.name for p in (dirs.plugin_data / "claims").iterdir()),
        "holders": sorted(p.name for p in _holders(dirs)),
    }


@pytest.mark.parametrize("step", PREPARE_STEPS + UNPREPARE_STEPS)
async def test_sigkill_at_each_step_leaves_no_setting_behind(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess], step: str
) -> None:
    api, kubeconfig = kube
    smi = Smi(dirs.root / "smi")
    env = {"GPU_DRA_NVIDIA_SMI": str(smi.path)}
    claim = await create_claim(
        api, "sliced", node=NODE, devices=["gpu-0"], config=[timeslicing("Short")]
    )

    def start(**kwargs: Any) -> PluginProcess:
        proc = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE, extra_env=env, **kwargs)
        processes.append(proc)
        return proc

    await die_at(start(crashpoint=step), step, claim)
    before = smi.calls()

    plugin = start()
    await plugin.wait_ready()
    recovered = smi.calls()
    left = _left(dirs)
    # The setting agrees with the records: time-sliced exactly while the claim is prepared.
    if step == "after-cdi-write":
        assert _levels(before) == [1] and _levels(recovered) == []
        assert len(left["specs"]) == 1 and left["holders"] == [claim.uid]
    else:
        assert _levels(before + recovered)[-1:] in ([], [0])
        assert left["specs"] == [] and left["holders"] == [] and left["claim records"] == []
        if step in ("after-side-effects", "after-spec-removed"):
            assert _levels(recovered) == [0]  # it had been set: recovery set it back
    assert left["reservations"] == ["gpu-0"]  # until the kubelet retries: no claim lost

    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        if step in PREPARE_STEPS:
            entry = (await kubelet.prepare([claim])).claims[claim.uid]
            assert entry.error == ""
            assert [d.device_name for d in entry.devices] == ["gpu-0"]
            assert _levels(smi.calls()) == ([] if step == "after-cdi-write" else [1])
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert _levels(smi.calls())[-1:] in ([], [0])
    assert _left(dirs) == {"specs": [], "reservations": [], "claim records": [], "holders": []}
    assert await plugin.terminate() == 0


async def test_a_gpu_whose_nvidia_smi_fails_keeps_only_its_own_claim_from_recovering(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    api, kubeconfig = kube
    smi = Smi(dirs.root / "smi")
    env = {"GPU_DRA_NVIDIA_SMI": str(smi.path)}
    bad = await create_claim(
        api, "bad", node=NODE, devices=["gpu-0"], config=[timeslicing("Short")]
    )
    other = await create_claim(
        api, "other", node=NODE, devices=["gpu-1"], config=[timeslicing("Long")]
    )

    def start(**kwargs: Any) -> PluginProcess:
        proc = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE, extra_env=env, **kwargs)
        processes.append(proc)
        return proc

    # Killed after setting gpu-0's time slice, before the spec: recovery must set it back.
    await die_at(start(crashpoint="after-side-effects"), "after-side-effects", bad)
    (uuid,) = {m[1] for c in smi.calls() if (m := re.search(r"-i (GPU-[0-9a-f-]+) ", c))}
    smi.fail.write_text(uuid)  # that GPU's nvidia-smi fails from now on (an XID 79 does)

    plugin = start()
    await plugin.wait_ready()  # the rest of the node serves
    await plugin.wait_log(rf"interrupted prepare not rolled back.*claim_uid={bad.uid}")
    left = _left(dirs)
    # Its record stays for the retry; its holder went first, as in any unprepare.
    assert left["claim records"] == [f"{bad.uid}.json"] and left["specs"] == []
    assert left["reservations"] == ["gpu-0"]  # the bad claim keeps its GPU meanwhile
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        assert (await kubelet.prepare([other])).claims[other.uid].error == ""
        error = (await kubelet.prepare([bad])).claims[bad.uid].error
        assert uuid in error and "nvidia-smi" in error and "GPU is busy" in error, error
        smi.fail.unlink()  # the GPU is back (replaced, reset)
        assert (await kubelet.prepare([bad])).claims[bad.uid].error == ""
        assert _levels(smi.calls())[-1:] == [1]
        response = await kubelet.unprepare([bad, other])
        assert {uid: r.error for uid, r in response.claims.items()} == {bad.uid: "", other.uid: ""}
    assert _left(dirs) == {"specs": [], "reservations": [], "claim records": [], "holders": []}
    assert await plugin.terminate() == 0


async def test_a_gpu_lost_after_an_xid_79_keeps_no_other_claim_waiting(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    api, kubeconfig = kube
    smi = Smi(dirs.root / "smi")
    env = {"GPU_DRA_NVIDIA_SMI": str(smi.path)}
    bad = await create_claim(
        api, "bad", node=NODE, devices=["gpu-0"], config=[timeslicing("Short")]
    )
    other = await create_claim(api, "other", node=NODE, devices=["gpu-1"])

    def start(**kwargs: Any) -> PluginProcess:
        proc = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE, **kwargs)
        processes.append(proc)
        return proc

    await die_at(start(crashpoint="after-side-effects", extra_env=env), "after-side-effects", bad)
    (uuid,) = {m[1] for c in smi.calls() if (m := re.search(r"-i (GPU-[0-9a-f-]+) ", c))}
    # The GPU fell off the bus: an XID 79, NVML answers GpuIsLost, nvidia-smi fails on it.
    state = dirs.root / "sim-state.yaml"
    lost = {"gpu": 0, "call": "nvmlDeviceGetUUID", "error": "GpuIsLost"}
    write_state_file(state, {"xidEvents": [{"gpu": 0, "xid": 79}], "failingQueries": [lost]})
    smi.fail.write_text(uuid)

    plugin = start(extra_env={**env, "GPU_DRA_SIM_STATE": str(state)})
    await plugin.wait_ready()
    await plugin.wait_log(rf"interrupted prepare not rolled back.*claim_uid={bad.uid}")
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        assert (await kubelet.prepare([other])).claims[other.uid].error == ""
        # Discovery skipped the lost GPU: its claim is refused by name, and its unprepare
        # (the recovery's retry) fails naming the GPU, keeping the record for the next one.
        assert "device gpu-0" in (await kubelet.prepare([bad])).claims[bad.uid].error
        error = (await kubelet.unprepare([bad])).claims[bad.uid].error
        assert uuid in error and "GPU is busy" in error, error
        smi.fail.unlink()
        assert (await kubelet.unprepare([bad])).claims[bad.uid].error == ""
        assert _levels(smi.calls())[-1:] == [0]  # set back to Default at last
        assert (await kubelet.unprepare([other])).claims[other.uid].error == ""
    assert _left(dirs) == {"specs": [], "reservations": [], "claim records": [], "holders": []}
    assert await plugin.terminate() == 0
