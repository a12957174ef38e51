"""Time-slicing over the real socket of a real ``gpu-dra kubelet-plugin`` process, SIGKILLed
at each step of a prepare and an unprepare: after recovery the GPU's setting agrees with
the records, the kubelet's retry finishes the job, and nothing is left behind."""

import re
from pathlib import Path
from typing import Any

import pytest

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
