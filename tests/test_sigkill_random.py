"""SIGKILL at random moments: while claims prepare and unprepare, while the plugin starts up
and recovers. Seeded and bounded (``GPU_DRA_KILL_SEED`` replays another sequence).

After every kill a new instance starts and the kubelet retries the call that died, as a
real kubelet does; then the invariants must hold:
- no prepared claim lost (each has its spec and its device reservations);
- no spec and no reservation for a claim that is not prepared;
- no GPU reserved for two claims;
- no temporary file left once the successor has recovered.
"""

import asyncio
import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.state import ClaimRef
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import NodeDirs, PluginProcess, create_claim, create_node

pytestmark = pytest.mark.timeout(600)

NODE = "node-k"
KILLS = 30
CLAIMS = 6  # claim i is allocated gpu-i, so each has a GPU of its own
SEED = int(os.environ.get("GPU_DRA_KILL_SEED", "20261201"))


@pytest.fixture
async def kube(kube: tuple[Any, Path]) -> tuple[Any, Path]:
    await create_node(kube[0], NODE)  # the plugin reads its Node at start
    return kube


def _reservations(dirs: NodeDirs) -> dict[str, str]:
    """device -> uid of the claim it is reserved for."""
    devices = dirs.plugin_data / "devices"
    if not devices.exists():
        return {}
    return {p.name: str(p.readlink()).split(":")[0] for p in devices.iterdir()}


def _spec_uids(dirs: NodeDirs) -> set[str]:
    uids = set()
    for path in dirs.cdi.glob("*.json") if dirs.cdi.exists() else ():
        uids.add(json.loads(path.read_text())["annotations"]["gpu-dra.io/claim-uid"])
    return uids


def _temp_files(dirs: NodeDirs) -> list[str]:
    return [p.name for root in (dirs.cdi, dirs.plugin_data) for p in root.rglob("*.tmp")]


def _check(dirs: NodeDirs, prepared: set[str], gpu_of: dict[str, str]) -> None:
    reserved = _reservations(dirs)
    assert _spec_uids(dirs) == prepared, "a spec for exactly the prepared claims"
    assert reserved == {gpu_of[uid]: uid for uid in prepared}, "reservations: prepared claims"
    assert len(set(reserved)) == len(reserved)  # one claim per GPU (a name is one link)
    assert _temp_files(dirs) == []


async def test_random_sigkills_lose_nothing_and_grant_nothing_twice(
    kube: tuple[Any, Path], dirs: NodeDirs
) -> None:
    api, kubeconfig = kube
    rng = random.Random(SEED)
    claims: list[ClaimRef] = []
    gpu_of: dict[str, str] = {}
    for i in range(CLAIMS):
        ref = await create_claim(api, f"claim-{i}", node=NODE, devices=[f"gpu-{i}"])
        claims.append(ref)
        gpu_of[ref.uid] = f"gpu-{i}"
    prepared: set[str] = set()
    started: list[PluginProcess] = []

    def start() -> PluginProcess:
        proc = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE)
        started.append(proc)
        return proc

    kills = {"call": 0, "startup": 0}
    try:
        plugin = start()
        await plugin.wait_ready()
        while sum(kills.values()) < KILLS:
            chosen = rng.sample(claims, rng.randint(1, 3))
            prepare = rng.random() < 0.6
            async with await KubeletSim.register(plugin.paths.registration) as kubelet:
                call = kubelet.prepare(chosen) if prepare else kubelet.unprepare(chosen)
                task = asyncio.ensure_future(call)
                # A random moment: before the call arrives, during it, or after its answer.
                await asyncio.sleep(rng.uniform(0, 0.03))
                os.kill(plugin.pid, signal.SIGKILL)
                await asyncio.gather(task, return_exceptions=True)
            await plugin.wait_exit()
            kills["call"] += 1
            plugin = start()
            if rng.random() < 0.3 and sum(kills.values()) < KILLS:
                # Killed again while starting up and recovering what the first one left.
                await asyncio.sleep(rng.uniform(0, 1.0))
                plugin.kill()
                kills["startup"] += 1
                plugin = start()
            await plugin.wait_ready()
            async with await KubeletSim.register(plugin.paths.registration) as kubelet:
                # The kubelet retries the call whose answer it never got (or got: idempotent).
                if prepare:
                    answer = await kubelet.prepare(chosen)
                    assert all(answer.claims[c.uid].error == "" for c in chosen), answer
                    prepared |= {c.uid for c in chosen}
                else:
                    undone = await kubelet.unprepare(chosen)
                    assert all(undone.claims[c.uid].error == "" for c in chosen), undone
                    prepared -= {c.uid for c in chosen}
            _check(dirs, prepared, gpu_of)
        # Everything still prepared survives one more crash and restart.
        plugin.kill()
        plugin = start()
        await plugin.wait_ready()
        _check(dirs, prepared, gpu_of)
        assert sum(kills.values()) >= KILLS and kills["startup"] > 0
    finally:
        for proc in started:
            proc.kill()
