"""SIGKILL at random moments: while claims prepare and unprepare, while the plugin starts up
and recovers. Seeded and bounded (``GPU_DRA_KILL_SEED`` replays another sequence).

After every kill a new instance starts and the kubelet retries the call that died, as a
real kubelet does; then the invariants must hold:
- no prepared claim lost (each has its spec and its device reservations);
- no spec and no reservation for a claim that is not prepared;
- no GPU reserved for two claims;
- no temporary file left once the successor has recovered.

The second test does it to two instances of one node at once (a surge upgrade), with
claims whose prepare has side effects: MPS daemons, time-slice settings and dynamic-MIG
instances (the simulated driver's instances are the node's, shared by both processes).
Besides the above, each run ends with no side effect without a prepared claim (no daemon,
holder, claim record, MIG instance or half-made instance left over) and no prepared claim
without its side effects (its MIG instance at its placement, the very one its spec names).
"""

import asyncio
import contextlib
import json
import os
import random
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from driver.nvml import SIM_ROOT_ENV
from drivers.gpu.kinds.mig import VISIBLE_UUIDS_ENV
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


# ---- two instances at once (a surge upgrade), claims with side effects ---------------------

SURGE_NODE = "node-u"
SURGE_KILLS = 12
PODS = ("old-pod", "new-pod")
# name -> (device, the kind of side effect it has). GPUs 6 and 7 are in MIG mode and
# published for dynamic MIG: two claims' instances side by side on GPU 6, so each instance
# of the plugin sees there an instance its sibling made.
SURGE_CLAIMS: dict[str, tuple[str, str]] = {
    "mps-a": ("gpu-1", "mps"),
    "mps-b": ("gpu-2", "mps"),
    "sliced-a": ("gpu-3", "timeslicing"),
    "sliced-b": ("gpu-4", "timeslicing"),
    "plain": ("gpu-5", "none"),
    "mig-a": ("gpu-6-mig-3g40gb-9-0", "dynamic-mig"),
    "mig-b": ("gpu-6-mig-3g40gb-9-4", "dynamic-mig"),
    "mig-c": ("gpu-7-mig-4g40gb-5-0", "dynamic-mig"),
}
SURGE_PROFILE = "extends: p5.48xlarge\nmig: {enabled: [6, 7]}\n"
_PLACEMENT = re.compile(r"^gpu-(\d+)-mig-.+-(\d+)-(\d+)$")  # minor, profile ID, start


def _mig_instances(sim_root: Path) -> dict[tuple[int, int], str]:
    """(GPU minor, placement start) -> MIG device UUID of every instance the simulated
    library has made and not destroyed; "-" for a GPU instance without its compute
    instance (half made)."""
    path = sim_root / "run" / "gpu-dra-sim" / "created"
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return {(int(minor), int(start)): uuid for minor, _, _, start, _, uuid in rows}


def _spec_mig_uuids(dirs: NodeDirs) -> dict[str, str]:
    """claim uid -> the MIG device UUIDs its CDI spec gives the container."""
    found = {}
    for path in dirs.cdi.glob("*.json") if dirs.cdi.exists() else ():
        spec = json.loads(path.read_text())
        edits = [spec.get("containerEdits") or {}] + [d["containerEdits"] for d in spec["devices"]]
        for env in (e for edit in edits for e in edit.get("env") or ()):
            if env.startswith(f"{VISIBLE_UUIDS_ENV}="):
                found[spec["annotations"]["gpu-dra.io/claim-uid"]] = env.partition("=")[2]
    return found


def _side_effects(dirs: NodeDirs) -> dict[str, Any]:
    from tests.test_mps import daemon_pids

    holders = dirs.plugin_data / "kinds" / "gpu" / "timeslice"
    migs = dirs.plugin_data / "kinds" / "dynamic-mig"
    return {
        "mig instances": sorted(_mig_instances(dirs.root / "sim")),
        "mig records": sorted(p.stem for p in migs.glob("*.json")),
        "mps daemons": len(daemon_pids(dirs.root)),
        # <gpu uuid>/<claim uid>; each GPU's lock file beside them is no holder
        "time-slice holders": sorted(p.name for p in holders.glob("*/*") if p.is_file())
        if holders.exists()
        else [],
        "claim records": sorted(p.stem for p in (dirs.plugin_data / "claims").glob("*.json")),
    }


def _expected_side_effects(
    prepared: set[str], kind_of: dict[str, str], gpu_of: dict[str, str]
) -> dict[str, Any]:
    mig = sorted(uid for uid in prepared if kind_of[uid] == "dynamic-mig")
    placements = [_PLACEMENT.fullmatch(gpu_of[uid]) for uid in mig]
    return {
        "mig instances": sorted((int(m[1]), int(m[3])) for m in placements if m),
        "mig records": mig,
        "mps daemons": sum(kind_of[uid] == "mps" for uid in prepared),
        "time-slice holders": sorted(uid for uid in prepared if kind_of[uid] == "timeslicing"),
        "claim records": sorted(uid for uid in prepared if kind_of[uid] != "none"),
    }


async def _retry(plugin: PluginProcess, claims: list[ClaimRef], prepare: bool) -> None:
    """The kubelet's retry of a call whose answer it never got (or got: idempotent)."""
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        answer = await (kubelet.prepare(claims) if prepare else kubelet.unprepare(claims))
        errors = {c.name: answer.claims[c.uid].error for c in claims}
        assert set(errors.values()) == {""}, errors


async def test_random_sigkills_of_two_instances_at_once_lose_nothing_and_leak_nothing(
    kube: tuple[Any, Path], dirs: NodeDirs
) -> None:
    from tests.test_mps import Control, daemon_pids, mps
    from tests.test_timeslicing import Smi, timeslicing

    api, kubeconfig = kube
    await create_node(api, SURGE_NODE)
    rng = random.Random(SEED)
    env = {
        "GPU_DRA_NVIDIA_SMI": str(Smi(dirs.root / "smi").path),
        "GPU_DRA_MPS_CONTROL": str(Control(dirs.root / "mps").path),
        # One simulated node for both instances: its driver's MIG instances are shared.
        SIM_ROOT_ENV: str(dirs.root / "sim"),
    }
    profile = dirs.root / "surge.yaml"
    profile.write_text(SURGE_PROFILE)
    configs = {"mps": [mps()], "timeslicing": [timeslicing("Medium")]}
    claims: list[ClaimRef] = []
    gpu_of: dict[str, str] = {}
    kind_of: dict[str, str] = {}
    for name, (device, kind) in SURGE_CLAIMS.items():
        ref = await create_claim(
            api, name, node=SURGE_NODE, devices=[device], config=configs.get(kind, [])
        )
        claims.append(ref)
        gpu_of[ref.uid], kind_of[ref.uid] = device, kind
    prepared: set[str] = set()
    started: list[PluginProcess] = []

    def start(pod: str) -> PluginProcess:
        proc = PluginProcess(
            dirs,
            kubeconfig=kubeconfig,
            node_name=SURGE_NODE,
            profile=str(profile),
            pod_uid=pod,
            extra_env=env,
            extra_args=("--dynamic-mig=true",),
        )
        started.append(proc)
        return proc

    def check() -> None:
        _check(dirs, prepared, gpu_of)
        assert _side_effects(dirs) == _expected_side_effects(prepared, kind_of, gpu_of)
        # Each prepared MIG claim's container gets the very instance at its placement.
        instances = _mig_instances(dirs.root / "sim")
        assert _spec_mig_uuids(dirs) == {
            uid: instances[int(m[1]), int(m[3])]
            for uid in prepared
            if (m := _PLACEMENT.fullmatch(gpu_of[uid]))
        }

    kills = cut = most = churn = 0
    try:
        plugins = {}
        for pod in PODS:  # one after the other: each builds the simulated node's sysfs
            plugins[pod] = start(pod)
            await plugins[pod].wait_ready()
        # Until enough kills, and at least one of them cut a call off (a seed whose kills
        # all land between calls proves less), within a bound.
        while (kills < SURGE_KILLS or not cut) and kills < 3 * SURGE_KILLS:
            chosen = rng.sample(claims, rng.randint(1, 3))
            prepare = rng.random() < 0.6
            # Each claim of the call through either instance: the kubelet talks to both.
            through = {c.uid: rng.choice(PODS) for c in chosen}
            doomed = rng.sample(PODS, 1 if rng.random() < 0.8 else 2)
            kubelets = {
                pod: await KubeletSim.register(plugins[pod].paths.registration) for pod in PODS
            }
            try:
                calls = []
                for pod in PODS:
                    mine = [c for c in chosen if through[c.uid] == pod]
                    if mine:
                        kubelet = kubelets[pod]
                        call = kubelet.prepare(mine) if prepare else kubelet.unprepare(mine)
                        calls.append(asyncio.ensure_future(call))
                # A random moment: before the calls arrive, during them, or after.
                await asyncio.sleep(rng.uniform(0, 0.04))
                for pod in doomed:
                    os.kill(plugins[pod].pid, signal.SIGKILL)
                answers = await asyncio.gather(*calls, return_exceptions=True)
                cut += sum(isinstance(a, BaseException) for a in answers)
            finally:
                for kubelet in kubelets.values():
                    await kubelet.close()
            for n, pod in enumerate(doomed):
                await plugins[pod].wait_exit()
                kills += 1
                if n:  # two simulated nodes must not build their sysfs at once
                    await plugins[doomed[0]].wait_ready()
                # The successor starts, and recovers, while the other instance serves.
                plugins[pod] = start(pod)
            survivors = [pod for pod in PODS if pod not in doomed]
            if survivors:
                # The instance that lives serves on while its sibling starts up and
                # recovers: the kubelet prepares and unprepares the claims through it
                # over and over, then retries the call the kill cut off.
                ready = asyncio.ensure_future(
                    asyncio.gather(*(plugins[pod].wait_ready() for pod in doomed))
                )
                while not ready.done():
                    await _retry(plugins[survivors[0]], chosen, not prepare)
                    await _retry(plugins[survivors[0]], chosen, prepare)
                    churn += 1
                await ready
                await _retry(plugins[survivors[0]], chosen, prepare)
            else:
                for pod in doomed:
                    await plugins[pod].wait_ready()
                await _retry(plugins[rng.choice(PODS)], chosen, prepare)
            prepared = (
                prepared | {c.uid for c in chosen}
                if prepare
                else prepared - {c.uid for c in chosen}
            )
            check()
            most = max(most, len(prepared))
        # Both instances gone at once, and back: everything prepared is still whole.
        for plugin in plugins.values():
            plugin.kill()
        plugins = {}
        for pod in PODS:  # one after the other: each builds the simulated node's sysfs
            plugins[pod] = start(pod)
            await plugins[pod].wait_ready()
        check()
        async with await KubeletSim.register(plugins[PODS[1]].paths.registration) as kubelet:
            undone = await kubelet.unprepare(claims)
            assert all(undone.claims[c.uid].error == "" for c in claims), undone
        prepared.clear()
        check()
        # The run met what it is for: calls cut off by a kill, several claims prepared.
        assert kills >= SURGE_KILLS and cut > 0 and most >= 3 and churn > 0, (kills, cut, most)
    except BaseException:
        for proc in started:  # shown with the failure: what each instance did
            print(f"---- {proc.log_path.name}\n{proc.log()}")
        raise
    finally:
        for proc in started:
            proc.kill()
        for pid in daemon_pids(dirs.root):  # whatever a failed run left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
