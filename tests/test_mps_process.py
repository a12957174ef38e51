"""MPS over the real socket of a real plugin process: SIGKILL at each step of a prepare and
an unprepare, and a plugin killed while two MPS claims run: their daemons keep serving, the
next plugin adopts them, the last unprepare stops them; nothing left running."""

import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.apiserver import LocalApiServer
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
from tests.podrunner import PodRunner
from tests.test_mps import Control, daemon_pids, mps
from tests.test_timeslicing import Smi

NODE = "node-m"


@pytest.fixture
def dirs() -> Iterator[NodeDirs]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="dra") as name:
        yield NodeDirs(Path(name))
        for pid in daemon_pids(Path(name)):  # whatever a failed test left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def kube(kube: tuple[Any, Path]) -> tuple[Any, Path]:
    await create_node(kube[0], NODE)  # the plugin reads its Node at start
    return kube


def _starter(
    dirs: NodeDirs, kubeconfig: Path, processes: list[PluginProcess], more: Any = None
) -> Any:
    env = {
        "GPU_DRA_NVIDIA_SMI": str(Smi(dirs.root / "smi").path),
        "GPU_DRA_MPS_CONTROL": str(Control(dirs.root / "mps").path),
        **(more or {}),
    }

    def start(**kwargs: Any) -> PluginProcess:
        proc = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE, extra_env=env, **kwargs)
        processes.append(proc)
        return proc

    return start


def _daemon_starts(dirs: NodeDirs) -> int:
    return sum(c.startswith("-f ") for c in Control(dirs.root / "mps").calls())


@pytest.mark.parametrize("step", PREPARE_STEPS + UNPREPARE_STEPS)
async def test_sigkill_at_each_step_leaves_a_daemon_only_for_a_prepared_claim(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess], step: str
) -> None:
    api, kubeconfig = kube
    start = _starter(dirs, kubeconfig, processes)
    claim = await create_claim(api, "mps", node=NODE, devices=["gpu-0"], config=[mps()])
    await die_at(start(crashpoint=step), step, claim)

    plugin = start()
    await plugin.wait_ready()
    prepared = any(dirs.cdi.glob("*.json"))
    assert prepared == (step == "after-cdi-write")
    # Recovery: a daemon runs exactly where a claim is prepared.
    assert len(daemon_pids(dirs.root)) == (1 if prepared else 0)
    _daemon_starts(dirs)

    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        if step in PREPARE_STEPS:
            assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
            assert len(daemon_pids(dirs.root)) == 1
            assert _daemon_starts(dirs) == (0 if prepared else 1)  # adopted, not restarted
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert daemon_pids(dirs.root) == []
    assert sorted(p.name for p in (dirs.plugin_data / "devices").iterdir()) == []
    assert sorted(p.name for p in (dirs.plugin_data / "claims").iterdir()) == []
    assert await plugin.terminate() == 0


async def test_daemons_outlive_a_killed_plugin_and_are_adopted(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    api, kubeconfig = kube
    start = _starter(dirs, kubeconfig, processes)
    first = await create_claim(api, "first", node=NODE, devices=["gpu-0"], config=[mps()])
    second = await create_claim(api, "second", node=NODE, devices=["gpu-1"], config=[mps()])
    old = start()
    await old.wait_ready()
    async with await KubeletSim.register(old.paths.registration) as kubelet:
        response = await kubelet.prepare([first, second])
        assert [response.claims[c.uid].error for c in (first, second)] == ["", ""]
    running = sorted(daemon_pids(dirs.root))
    assert len(running) == 2 and _daemon_starts(dirs) == 2
    old.kill()
    assert await old.wait_exit() == -signal.SIGKILL
    assert sorted(daemon_pids(dirs.root)) == running  # the clients' daemons serve on

    new = start()
    await new.wait_ready()
    async with await KubeletSim.register(new.paths.registration) as kubelet:
        response = await kubelet.prepare([first, second])
        assert [response.claims[c.uid].error for c in (first, second)] == ["", ""]
        assert sorted(daemon_pids(dirs.root)) == running and _daemon_starts(dirs) == 0
        assert (await kubelet.unprepare([first])).claims[first.uid].error == ""
        assert len(daemon_pids(dirs.root)) == 1
        assert (await kubelet.unprepare([second])).claims[second.uid].error == ""
    assert daemon_pids(dirs.root) == []
    assert await new.terminate() == 0


POD_STEPS = ["after-mps-pod-created", "after-side-effects"]
POD_UNPREPARE_STEPS = ["after-mps-holder-removed", "after-side-effects-undone"]


@pytest.mark.parametrize("step", POD_STEPS + POD_UNPREPARE_STEPS)
async def test_sigkill_with_daemon_pods_leaves_a_pod_only_for_a_prepared_claim(
    kube: tuple[Any, Path],
    apiserver: LocalApiServer,
    dirs: NodeDirs,
    processes: list[PluginProcess],
    step: str,
) -> None:
    """``--mps-daemon=pod``: killed after the pod's create (before it served) or between the
    last holder's removal and the pod's deletion, the next plugin leaves a daemon pod
    exactly where a claim is prepared; the kubelet's retries then go through."""
    api, kubeconfig = kube
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-dra"}})
    env = {"GPU_DRA_MPS_DAEMON": "pod", "POD_NAMESPACE": "gpu-dra", "GPU_DRA_IMAGE": "img:1"}
    start = _starter(dirs, kubeconfig, processes, env)
    claim = await create_claim(api, "mps", node=NODE, devices=["gpu-0"], config=[mps()])
    async with PodRunner(apiserver, NODE) as runner:
        await die_at(start(crashpoint=step), step, claim, in_unprepare=step in POD_UNPREPARE_STEPS)
        plugin = start()
        await plugin.wait_ready()
        # No step here leaves a claim prepared (the spec comes after them, or went before):
        # recovery leaves no pod and no daemon, and nothing but it runs before the kubelet.
        assert not any(dirs.cdi.glob("*.json"))
        assert runner.pods() == [] and daemon_pids(dirs.root) == []
        async with await KubeletSim.register(plugin.paths.registration) as kubelet:
            if step in POD_STEPS:
                assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
                assert len(runner.pods()) == 1 and len(daemon_pids(dirs.root)) == 1
            assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert runner.pods() == [] and daemon_pids(dirs.root) == []
        assert await plugin.terminate() == 0
