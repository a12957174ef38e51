"""Upgrade from release 0.1.0 (one node checkpoint) to per-claim records, and back.

The 0.1.0 state in tests/data/v0_1_0 was written by 0.1.0's own code (see its README).
An upgrade migrates it at start without unpreparing a live claim. A rollback runs
0.1.0's code, taken from this repository's history, on what this release leaves:
0.1.0 finds the marker in place of its checkpoint, takes it for a corrupt one and
rebuilds its state from the CDI specs, losing no claim.
"""

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from driver.kube.session import Session
from drivers.gpu.flavor import GPU
from kubeletplugin import cdi, checkpoint
from kubeletplugin.claims import ClaimRef
from kubeletplugin.state import DeviceState, StateConfig
from sandbox.apiserver import LocalApiServer
from tests.fsfaults import disk_full
from tests.test_state import _config, _inventory, create_claim, devices_of, reservations

DATA = Path(__file__).resolve().parent / "data" / "v0_1_0"
RELEASE_0_1_0 = "08b23bf"
ROOT = Path(__file__).resolve().parents[1]
CLAIMS: dict[str, str] = json.loads((DATA / "claims.json").read_text())
LIVE_A, LIVE_B = CLAIMS["live-a"], CLAIMS["live-b"]


def _node_of_0_1_0(tmp_path: Path) -> StateConfig:
    config = _config(tmp_path)
    shutil.copytree(DATA / "plugin", config.plugin_dir)
    shutil.copytree(DATA / "cdi", config.cdi_root)
    return config


def _specs(config: StateConfig) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(config.cdi_root.iterdir())}


async def _open(config: StateConfig, api: Session, tmp_path: Path) -> DeviceState:
    return await DeviceState.open(
        config, api, devices_of(_inventory("p5.48xlarge", tmp_path), config)
    )


async def test_upgrade_keeps_every_live_claim_prepared(api_client: Session, tmp_path: Path) -> None:
    config = _node_of_0_1_0(tmp_path)
    before = _specs(config)
    assert len(before) == 2
    state = await _open(config, api_client, tmp_path)
    assert _specs(config) == before  # not one live claim unprepared, not one spec rewritten
    assert reservations(config) == {"gpu-0": LIVE_A, "gpu-1": LIVE_A, "gpu-2": LIVE_B}
    assert checkpoint.is_marker((config.plugin_dir / checkpoint.FILE_NAME).read_bytes())
    rival = await create_claim(api_client, "rival", ["gpu-2"])
    refused = (await state.prepare([rival]))[rival.uid].error
    assert "device gpu-2 is already prepared for claim default/live-b" in refused
    # The migrated claims unprepare like any other; restarting migrates nothing twice.
    live_b = cdi.claim_from_spec(json.loads(before[cdi.spec_name(LIVE_B, GPU)]), GPU)
    ref = ClaimRef(uid=live_b.uid, namespace=live_b.namespace, name=live_b.name)
    assert await state.unprepare([ref]) == {ref.uid: ""}
    state = await _open(config, api_client, tmp_path)
    assert reservations(config) == {"gpu-0": LIVE_A, "gpu-1": LIVE_A}
    assert (await state.prepare([rival]))[rival.uid].error == ""


async def test_upgrade_follows_0_1_0s_checkpoint_for_interrupted_and_orphaned_claims(
    api_client: Session, tmp_path: Path
) -> None:
    config = _node_of_0_1_0(tmp_path)
    path = config.plugin_dir / checkpoint.FILE_NAME
    document = json.loads(path.read_text())
    claims = document["data"]["claims"]
    claims[LIVE_A]["state"] = "PrepareStarted"  # killed between its two checkpoint writes
    del claims[LIVE_B]  # its spec explains no claim 0.1.0 prepared
    document["checksum"] = checkpoint._checksum(document["data"])
    path.write_text(json.dumps(document))
    unrelated = config.cdi_root / "vendor.example.com-thing.json"
    unrelated.write_text("{}")
    await _open(config, api_client, tmp_path)
    assert _specs(config) == {unrelated.name: b"{}"}
    assert reservations(config) == {"gpu-0": LIVE_A, "gpu-1": LIVE_A}  # until the retry


async def test_a_0_1_0_node_that_rebooted_keeps_nothing(
    api_client: Session, tmp_path: Path
) -> None:
    config = _node_of_0_1_0(tmp_path)
    config.boot_id_path.write_text("boot-2\n")
    await _open(config, api_client, tmp_path)
    assert _specs(config) == {}
    assert reservations(config) == {}


def _release_0_1_0(tmp_path: Path) -> Path:
    """0.1.0's code, from this repository's history, in a directory of its own."""
    if subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{RELEASE_0_1_0}^{{commit}}"],
        capture_output=True,
        check=False,
    ).returncode:
        pytest.skip(f"release 0.1.0 ({RELEASE_0_1_0}) is not in this checkout's git history")
    old = tmp_path / "release-0.1.0"
    old.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", RELEASE_0_1_0, "api", "driver", "kubeletplugin"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    return old


# In each script of 0.1.0: every module of ours it imported is 0.1.0's (the editable install
# of this checkout would serve a module 0.1.0 lacks, and the move once rewrote an import here).
_ONLY_OLD_CODE = (
    "import os, sys; assert not [n for n, m in list(sys.modules.items()) "
    "if n.split('.')[0] in ('api', 'driver', 'kubeletplugin') "
    "and not os.path.abspath(getattr(m, '__file__', None) or os.getcwd()).startswith(os.getcwd())]"
)


async def _with_0_1_0(tmp_path: Path, config: StateConfig, api_url: str, then: str) -> None:
    """0.1.0's own code on this node's files: its startup (recovery, checkpoint), then
    ``then``, a line run with its ``state`` open."""
    old = _release_0_1_0(tmp_path)
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from kubernetes.aio import client
        from driver.discovery import discover
        from driver.nvml.simulated import SimulatedNode
        from kubeletplugin.state import ClaimRef, DeviceState, StateConfig
        {_ONLY_OLD_CODE}

        async def main():
            node = SimulatedNode("p5.48xlarge", "node-a", Path({str(tmp_path / "sysfs-0.1.0")!r}))
            inventory = discover(node.nvml, sysfs_root=node.sysfs_root)
            config = StateConfig(
                plugin_dir=Path({str(config.plugin_dir)!r}),
                cdi_root=Path({str(config.cdi_root)!r}),
                driver_name="gpu.nvidia.com",
                node_name="node-a",
                boot_id_path=Path({str(config.boot_id_path)!r}),
                nvml_mode="simulated",
            )
            async with client.ApiClient(client.Configuration(host={api_url!r})) as api:
                state = await DeviceState.open(config, api, inventory)
                {then}

        asyncio.run(main())
        """
    )
    # In a thread: a local API server it calls runs on this event loop.
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script],
        cwd=old,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


async def _run_0_1_0(tmp_path: Path, config: StateConfig) -> None:
    """0.1.0's startup recovery alone (its API server is never reached)."""
    await _with_0_1_0(tmp_path, config, "http://127.0.0.1:9", "del state")


async def test_rollback_to_0_1_0_reads_the_claims_from_the_specs_and_back(
    api_client: Session, tmp_path: Path
) -> None:
    config = _node_of_0_1_0(tmp_path)
    state = await _open(config, api_client, tmp_path)
    fresh = await create_claim(api_client, "after-upgrade", ["gpu-5"])
    assert (await state.prepare([fresh]))[fresh.uid].error == ""
    specs = _specs(config)

    await _run_0_1_0(tmp_path, config)  # helm rollback
    assert _specs(config) == specs  # 0.1.0 removed no spec of a live claim
    rebuilt = checkpoint.decode((config.plugin_dir / checkpoint.FILE_NAME).read_bytes())
    assert set(rebuilt.claims) == {LIVE_A, LIVE_B, fresh.uid}
    assert {c.state for c in rebuilt.claims.values()} == {checkpoint.ClaimState.PREPARE_COMPLETED}

    state = await _open(config, api_client, tmp_path)  # and forward again
    assert _specs(config) == specs
    assert reservations(config) == {
        "gpu-0": LIVE_A,
        "gpu-1": LIVE_A,
        "gpu-2": LIVE_B,
        "gpu-5": fresh.uid,
    }
    assert await state.prepare([fresh]) == await state.prepare([fresh])


async def _prepare_with_0_1_0(
    tmp_path: Path, config: StateConfig, api_url: str, ref: ClaimRef
) -> None:
    """0.1.0's own prepare of ``ref`` on this node's files (a claim it prepared before the
    upgrade): its checkpoint, and the CDI spec in its own layout."""
    claim = f"ClaimRef(uid={ref.uid!r}, namespace={ref.namespace!r}, name={ref.name!r})"
    then = f"assert (r := (await state.prepare([{claim}]))[{ref.uid!r}]).error == '', r.error"
    await _with_0_1_0(tmp_path, config, api_url, then)


async def test_a_failed_repeat_prepare_keeps_the_claim_0_1_0_prepared(
    api_client: Session,
    apiserver: LocalApiServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(tmp_path)
    ref = await create_claim(api_client, "by-0-1-0", ["gpu-3"])
    await _prepare_with_0_1_0(tmp_path, config, apiserver.url, ref)
    by_0_1_0 = _specs(config)
    state = await _open(config, api_client, tmp_path)  # the upgrade keeps 0.1.0's spec
    assert _specs(config) == by_0_1_0 and reservations(config) == {"gpu-3": ref.uid}

    # The kubelet prepares its claims again after the upgrade; this release would write
    # the spec in its own layout, and the disk is full.
    full = disk_full(monkeypatch, config.cdi_root)
    error = (await state.prepare([ref]))[ref.uid].error
    assert full.hits and "No space left on device" in error
    # The claim a pod runs with stays prepared as 0.1.0 left it.
    assert _specs(config) == by_0_1_0
    assert reservations(config) == {"gpu-3": ref.uid}
    rival = await create_claim(api_client, "rival", ["gpu-3"])
    assert "already prepared for claim default/by-0-1-0" in (
        (await state.prepare([rival]))[rival.uid].error
    )
    monkeypatch.undo()
    assert (await state.prepare([ref]))[ref.uid].error == ""  # the retry rewrites it
    assert reservations(config) == {"gpu-3": ref.uid}
