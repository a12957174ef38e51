"""Time-slicing through GpuConfig: prepare, unprepare, bad input, against a recording
``nvidia-smi`` stand-in (NVML has no time-slice setter on bare metal)."""

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from driver.gpu.kinds import NodeDevices
from kubeletplugin import cdi
from kubeletplugin.state import DeviceState
from tests.fsfaults import disk_full, read_only
from tests.standin import StandIn
from tests.test_state import DRIVER, GPU_CONFIG, NODE, _config, _inventory, create_claim

STAND_IN = """#!/bin/sh
echo "$*" >> {log}
if [ -e {fail} ]; then echo "Unable to set the compute policy: GPU is busy" >&2; exit 3; fi
exit 0
"""


class Smi(StandIn):
    """A stand-in nvidia-smi that appends its arguments, one call a line, to a file."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, "nvidia-smi", STAND_IN)


def sliced(uuid: str, level: int) -> list[str]:
    return [f"-i {uuid} -c DEFAULT", f"compute-policy -i {uuid} --set-timeslice {level}"]


def timeslicing(interval: Any = None, *, driver: str = DRIVER, **extra: Any) -> dict[str, Any]:
    sharing: dict[str, Any] = {"strategy": "TimeSlicing"}
    if interval is not None:
        sharing["timeSlicingConfig"] = {"interval": interval}
    params = {"apiVersion": GPU_CONFIG, "kind": "GpuConfig", "sharing": sharing}
    return {"source": "FromClaim", "opaque": {"driver": driver, "parameters": params}, **extra}


@pytest.fixture
def smi(tmp_path: Path) -> Smi:
    return Smi(tmp_path / "smi")


async def _state(api: k8s.ApiClient, tmp_path: Path, smi_path: Path) -> DeviceState:
    config = _config(tmp_path, nvidia_smi=smi_path)
    devices = NodeDevices.of(_inventory("p5.48xlarge", tmp_path), node_name=NODE)
    return await DeviceState.open(config, api, devices)


def _uuid(tmp_path: Path, device: str) -> str:
    return _inventory("p5.48xlarge", tmp_path).by_device_name()[device].uuid


def _holders(tmp_path: Path) -> list[str]:
    root = tmp_path / "plugins" / DRIVER / "kinds" / "gpu" / "timeslice"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def test_prepare_sets_the_interval_and_the_last_unprepare_restores_default(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    uuid = _uuid(tmp_path, "gpu-0")
    ref = await create_claim(api_client, "sliced", ["gpu-0"], config=[timeslicing("Short")])
    plain = await create_claim(api_client, "plain", ["gpu-1"])
    results = await state.prepare([ref, plain])
    assert {uid: r.error for uid, r in results.items()} == {ref.uid: "", plain.uid: ""}
    assert smi.calls() == sliced(uuid, 1)  # the plain claim made no call
    assert _holders(tmp_path) == [f"{uuid}/{ref.uid}"]
    assert await state.prepare([ref]) == {ref.uid: results[ref.uid]}  # idempotent
    assert smi.calls() == []

    # An adminAccess claim on the same GPU, asking for another interval: a look, no change.
    admin = await create_claim(
        api_client, "look", ["gpu-0"], config=[timeslicing("Long")], admin=True
    )
    assert (await state.prepare([admin]))[admin.uid].error == ""
    assert await state.unprepare([admin]) == {admin.uid: ""}
    assert smi.calls() == []

    assert await state.unprepare([ref, plain]) == {ref.uid: "", plain.uid: ""}
    assert smi.calls() == sliced(uuid, 0)
    assert _holders(tmp_path) == []
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert smi.calls() == []  # nothing held, nothing recorded: nothing to undo


@pytest.mark.parametrize(("interval", "level"), [("Default", 0), ("Medium", 2), ("Long", 3)])
async def test_each_interval_maps_to_nvidias_level(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi, interval: str, level: int
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    ref = await create_claim(api_client, "sliced", ["gpu-2"], config=[timeslicing(interval)])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert smi.calls() == sliced(_uuid(tmp_path, "gpu-2"), level)


async def test_no_interval_means_default(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    ref = await create_claim(api_client, "sliced", ["gpu-3"], config=[timeslicing()])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert smi.calls() == sliced(_uuid(tmp_path, "gpu-3"), 0)


async def test_bad_input_is_a_per_claim_error_naming_the_cause(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    good = await create_claim(api_client, "good", ["gpu-0"], config=[timeslicing("Short")])
    wrong_driver = await create_claim(
        api_client, "wrong-driver", ["gpu-1"], config=[timeslicing("Short", driver="gpu.nvidia")]
    )
    conflicting = await create_claim(
        api_client,
        "conflicting",
        ["gpu-2"],
        config=[timeslicing("Short", requests=["gpu"]), timeslicing("Long", requests=["gpu"])],
    )
    wrong_type = await create_claim(api_client, "wrong-type", ["gpu-3"], config=[timeslicing(2)])
    refs = [good, wrong_driver, conflicting, wrong_type]
    results = await state.prepare(refs)
    errors = {ref.name: results[ref.uid].error for ref in refs}
    assert errors["good"] == ""
    assert 'field "opaque.driver"' in errors["wrong-driver"]
    assert "'gpu.nvidia'" in errors["wrong-driver"]
    assert "opaque config #0 (from claim, requests gpu)" in errors["conflicting"]
    assert "conflicting configs for one device" in errors["conflicting"]
    assert 'field "sharing.timeSlicingConfig.interval"' in errors["wrong-type"]
    assert smi.calls() == sliced(_uuid(tmp_path, "gpu-0"), 1)  # only the good claim's
    assert _holders(tmp_path) == [f"{_uuid(tmp_path, 'gpu-0')}/{good.uid}"]


async def test_nvidia_smi_failing_fails_that_claim_and_leaves_nothing(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    ref = await create_claim(api_client, "busy", ["gpu-4"], config=[timeslicing("Long")])
    plain = await create_claim(api_client, "plain", ["gpu-5"])
    smi.fail.touch()
    results = await state.prepare([ref, plain])
    assert results[plain.uid].error == ""
    error = results[ref.uid].error
    assert "nvidia-smi -i" in error and "exit 3" in error and "GPU is busy" in error
    uuid = _uuid(tmp_path, "gpu-4")
    # Rolled back: its holder is gone; the restore failed too (still busy), so the claim's
    # side-effect record stays for the retry or the unprepare to finish it.
    assert smi.calls() == [f"-i {uuid} -c DEFAULT", f"-i {uuid} -c DEFAULT"]
    assert _holders(tmp_path) == []
    smi.fail.unlink()
    assert (await state.prepare([ref]))[ref.uid].error == ""  # the kubelet's retry
    assert smi.calls() == sliced(uuid, 3)


async def test_nvidia_smi_missing_is_named(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi
) -> None:
    missing = tmp_path / "no-such-dir" / "nvidia-smi"
    state = await _state(api_client, tmp_path, missing)
    ref = await create_claim(api_client, "nosmi", ["gpu-6"], config=[timeslicing("Short")])
    plain = await create_claim(api_client, "plain", ["gpu-7"])
    results = await state.prepare([ref, plain])
    assert results[plain.uid].error == ""
    assert f"cannot run nvidia-smi at {missing}" in results[ref.uid].error
    assert _holders(tmp_path) == []


async def test_a_holder_of_an_earlier_boot_does_not_keep_the_setting(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    uuid = _uuid(tmp_path, "gpu-0")
    stale = tmp_path / "plugins" / DRIVER / "kinds" / "gpu" / "timeslice" / uuid / "old-claim"
    stale.parent.mkdir(parents=True)
    stale.write_text("boot-0 Long\n")
    ref = await create_claim(api_client, "sliced", ["gpu-0"], config=[timeslicing("Short")])
    assert (await state.prepare([ref]))[ref.uid].error == ""  # no conflict with boot-0's
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert smi.calls() == [*sliced(uuid, 1), *sliced(uuid, 0)]
    assert _holders(tmp_path) == []


async def test_a_failed_repeat_prepare_keeps_the_claims_setting_spec_and_devices(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    uuid = _uuid(tmp_path, "gpu-0")
    ref = await create_claim(api_client, "sliced", ["gpu-0"], config=[timeslicing("Short")])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert smi.calls() == sliced(uuid, 1)
    # The spec as the release before wrote it (pretty-printed): same claim, other bytes.
    path = cdi.spec_path(tmp_path / "cdi", ref.uid)
    path.write_text(json.dumps(json.loads(path.read_bytes()), indent=1))
    layout = path.read_bytes()
    plugin_dir = tmp_path / "plugins" / DRIVER
    record = (plugin_dir / "claims" / f"{ref.uid}.json").read_bytes()

    # The kubelet prepares it again while the disk is full: the side-effect record's
    # rewrite, the first write of the repeat, fails.
    full = disk_full(monkeypatch, plugin_dir / "claims")
    error = (await state.prepare([ref]))[ref.uid].error
    assert full.hits and "No space left on device" in error
    # The pod that runs with the claim keeps its GPU's setting, its spec and its device.
    assert path.read_bytes() == layout
    assert _holders(tmp_path) == [f"{uuid}/{ref.uid}"]
    assert (plugin_dir / "claims" / f"{ref.uid}.json").read_bytes() == record
    assert (plugin_dir / "devices" / "gpu-0").readlink().name.startswith(ref.uid)
    assert "-c DEFAULT" not in " ".join(smi.calls())  # the setting was never reset
    monkeypatch.undo()
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert smi.calls()[-1:] == [f"compute-policy -i {uuid} --set-timeslice 0"]
    assert _holders(tmp_path) == []


async def test_a_read_only_cdi_root_during_prepare_leaves_nothing_half_prepared(
    api_client: k8s.ApiClient, tmp_path: Path, smi: Smi, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    uuid = _uuid(tmp_path, "gpu-1")
    ref = await create_claim(api_client, "sliced", ["gpu-1"], config=[timeslicing("Long")])
    plugin_dir = tmp_path / "plugins" / DRIVER
    # The CDI root's mount went read-only: the spec cannot be written, and removing it
    # (which a rollback does first) fails as well, although there is none.
    ro = read_only(monkeypatch, tmp_path / "cdi")
    error = (await state.prepare([ref]))[ref.uid].error
    assert {"open", "unlink"} <= set(ro.hits)
    assert "Read-only file system" in error
    # Every other step of the rollback ran: the setting restored, its holder, the
    # side-effect record and the reservation gone; the GPU is free for the next claim.
    assert smi.calls() == [*sliced(uuid, 3), *sliced(uuid, 0)]
    assert _holders(tmp_path) == []
    assert list((plugin_dir / "claims").iterdir()) == []
    assert list((plugin_dir / "devices").iterdir()) == []
    monkeypatch.undo()
    other = await create_claim(api_client, "next", ["gpu-1"])
    assert (await state.prepare([other]))[other.uid].error == ""
