"""Dynamic MIG, the preparing half, over the real socket of a real plugin process.

Prepare creates the GPU and compute instance at exactly the allocated placement and the
claim's CDI spec names the new instance's cap nodes; unprepare destroys both. SIGKILL at
each step of a prepare and an unprepare, then a restart: no instance leaked, none handed
out twice. An NVML error in the middle of a create is that claim's error and leaves
nothing. The instances are read from the simulated library's own record of what it made
(it keeps them across processes, as the driver does) and the access files it writes.
"""

import json
from pathlib import Path
from typing import Any

import pytest

from api.config import API_VERSION
from driver.nvml import SIM_ROOT_ENV
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

NODE = "node-d"
DEVICE = "gpu-0-mig-3g40gb-9-4"  # 3g.40gb (profile ID 9, index 2) at memory slices 4-7


@pytest.fixture
async def kube(kube: tuple[Any, Path]) -> tuple[Any, Path]:
    await create_node(kube[0], NODE)  # the plugin reads its Node at start
    return kube


def _sim_root(dirs: NodeDirs) -> Path:
    return dirs.root / "sim"


def _starter(dirs: NodeDirs, kubeconfig: Path, processes: list[PluginProcess]) -> Any:
    profile = dirs.root / "p5-mig.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: all}\n")
    state = dirs.root / "faults.yaml"
    write_state_file(state, {})

    def start(**kwargs: Any) -> PluginProcess:
        proc = PluginProcess(
            dirs,
            kubeconfig=kubeconfig,
            node_name=NODE,
            profile=str(profile),
            extra_env={SIM_ROOT_ENV: str(_sim_root(dirs))},
            extra_args=("--dynamic-mig=true", f"--sim-state={state}"),
            **kwargs,
        )
        processes.append(proc)
        return proc

    return start


def _instances(dirs: NodeDirs) -> list[tuple[int, int, int, int, int]]:
    """(GPU minor, GI id, GI profile index, placement start, CI id) of each instance the
    simulated library made and still has."""
    path = _sim_root(dirs) / "run" / "gpu-dra-sim" / "created"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(m), int(g), int(p), int(s), int(c)) for m, g, p, s, c, _ in rows]


def _access_minor(dirs: NodeDirs, gi: int, ci: int | None = None) -> int:
    base = _sim_root(dirs) / "proc/driver/nvidia/capabilities/gpu0/mig" / f"gi{gi}"
    path = base / "access" if ci is None else base / f"ci{ci}" / "access"
    return int(path.read_text().split("DeviceFileMinor:")[1].split()[0])


def _spec_nodes(dirs: NodeDirs) -> list[str]:
    (spec,) = [json.loads(p.read_text()) for p in dirs.cdi.glob("*.json")]
    edits = [spec.get("containerEdits") or {}] + [d["containerEdits"] for d in spec["devices"]]
    return [n["path"] for e in edits for n in e.get("deviceNodes") or ()]


def _no_records(dirs: NodeDirs) -> None:
    assert sorted(p.name for p in (dirs.plugin_data / "devices").iterdir()) == []
    assert sorted(p.name for p in (dirs.plugin_data / "claims").iterdir()) == []
    assert list((dirs.plugin_data / "kinds" / "dynamic-mig").glob("*.json")) == []


async def test_prepare_creates_the_allocated_placement_and_unprepare_destroys_it(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    api, kubeconfig = kube
    plugin = _starter(dirs, kubeconfig, processes)()
    await plugin.wait_ready()
    claim = await create_claim(api, "mig", node=NODE, devices=[DEVICE])
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
        ((minor, gi, profile, start, ci),) = _instances(dirs)
        assert (minor, profile, start) == (0, 2, 4)  # 3g at slice 4 of GPU 0, nothing else
        nodes = _spec_nodes(dirs)
        assert f"/dev/nvidia-caps/nvidia-cap{_access_minor(dirs, gi)}" in nodes
        assert f"/dev/nvidia-caps/nvidia-cap{_access_minor(dirs, gi, ci)}" in nodes
        assert "/dev/nvidia0" in nodes
        # Prepared again (the kubelet retries): the same instance, not a second one.
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
        assert _instances(dirs) == [(minor, gi, profile, start, ci)]
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert _instances(dirs) == []
    assert not (_sim_root(dirs) / "proc/driver/nvidia/capabilities/gpu0/mig" / f"gi{gi}").exists()
    _no_records(dirs)
    assert await plugin.terminate() == 0


async def test_a_config_that_shares_the_instance_is_refused_before_anything_is_made(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    # The rule of static MIG devices and of ``gpu-dra validate`` (api.config.refused_on):
    # before it, the sharing was dropped without a word.
    api, kubeconfig = kube
    plugin = _starter(dirs, kubeconfig, processes)()
    await plugin.wait_ready()
    sharing = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    config = [
        {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": sharing}}
    ]
    claim = await create_claim(api, "mig-mps", node=NODE, devices=[DEVICE], config=config)
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        error = (await kubelet.prepare([claim])).claims[claim.uid].error
    assert (
        "field \"sharing.strategy\": 'MPS': sharing (TimeSlicing, MPS) is not supported on MIG"
        in error
    )
    assert DEVICE in error
    assert _instances(dirs) == []
    assert await plugin.terminate() == 0


# The steps of every prepare, plus the one between the GPU-instance and the
# compute-instance create of this kind.
MIG_PREPARE_STEPS = [*PREPARE_STEPS[:1], "after-gpu-instance", *PREPARE_STEPS[1:]]


@pytest.mark.parametrize("step", MIG_PREPARE_STEPS + UNPREPARE_STEPS)
async def test_sigkill_at_each_step_leaves_an_instance_only_for_a_prepared_claim(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess], step: str
) -> None:
    api, kubeconfig = kube
    start = _starter(dirs, kubeconfig, processes)
    claim = await create_claim(api, "mig", node=NODE, devices=[DEVICE])
    await die_at(start(crashpoint=step), step, claim)
    made = _instances(dirs)
    if step == "after-gpu-instance":
        assert [ci for *_, ci in made] == [-1]  # a GPU instance, no compute instance yet
    # The record came before the create: a kill after it leaves no instance yet; nor one
    # after the unprepare destroyed it.
    assert len(made) == (0 if step in ("after-claim-record", "after-side-effects-undone") else 1)

    plugin = start()
    await plugin.wait_ready()
    prepared = any(dirs.cdi.glob("*.json"))
    assert prepared == (step == "after-cdi-write")
    # Recovery: an instance exists exactly where a claim is prepared (adopted, the same).
    assert _instances(dirs) == (made if prepared else [])
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        if step in MIG_PREPARE_STEPS:
            assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
            assert len(_instances(dirs)) == 1  # never two for one claim
            if prepared:
                assert _instances(dirs) == made
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert _instances(dirs) == []
    _no_records(dirs)
    assert await plugin.terminate() == 0


async def test_an_nvml_error_mid_create_is_the_claims_error_and_leaves_nothing(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    api, kubeconfig = kube
    plugin = _starter(dirs, kubeconfig, processes)()
    await plugin.wait_ready()
    # The GPU instance is made, then its compute instance fails.
    fault = {"gpu": 0, "call": "nvmlGpuInstanceCreateComputeInstance", "error": "Unknown"}
    write_state_file(dirs.root / "faults.yaml", {"failingQueries": [fault]})
    claim = await create_claim(api, "mig", node=NODE, devices=[DEVICE])
    other = await create_claim(api, "other", node=NODE, devices=["gpu-1-mig-3g40gb-9-4"])
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        response = await kubelet.prepare([claim, other])
        error = response.claims[claim.uid].error
        assert f"cannot create MIG device {DEVICE}" in error and "Unknown" in error
        assert response.claims[other.uid].error == ""  # the other GPU's claim is served
        assert [i[0] for i in _instances(dirs)] == [1]  # GPU 0 has nothing left
        assert (await kubelet.unprepare([claim, other])).claims[other.uid].error == ""
    assert _instances(dirs) == []
    write_state_file(dirs.root / "faults.yaml", {})
    assert plugin.proc.poll() is None  # still serving
    assert await plugin.terminate() == 0
