"""Time-slicing through GpuConfig: prepare, unprepare, bad input, against a recording
``nvidia-smi`` stand-in (NVML has no time-slice setter on bare metal)."""

import json
import multiprocessing
import random
import sys
import threading
import uuid as uuid_module
from pathlib import Path
from typing import Any

import pytest

from driver.devicekind import PreparedClaim, PreparedDevice
from driver.kube.session import Session
from drivers.gpu.flavor import GPU
from drivers.gpu.kinds import GpuKindContext, GpuNode
from drivers.gpu.kinds.gpu import UUID_KEY
from drivers.gpu.kinds.timeslicing import TimeSliceConflictError, TimeSlicing
from drivers.gpu.model.nvidiasmi import TIMESLICE_LEVELS
from kubeletplugin import cdi
from kubeletplugin.state import DeviceState
from tests.fsfaults import disk_full, read_only
from tests.standin import StandIn
from tests.test_state import (
    DRIVER,
    GPU_CONFIG,
    NODE,
    _config,
    _inventory,
    create_claim,
    devices_of,
)

ROOT = Path(__file__).resolve().parent.parent

# Records each call; refuses what the real nvidia-smi refuses, as it does (tests.smiforms).
# The driver's two forms, exactly, skip the interpreter: one costs ~140 ms on a loaded
# machine, and the concurrency tests below make hundreds of calls; test_smiforms holds
# this shortcut to the checker.
STAND_IN = f"""#!/bin/sh
echo "$*" >> {{log}}
id=; ok=
if [ $# -eq 4 ] && [ "$1" = -i ] && [ "$3" = -c ] && [ "$4" = DEFAULT ]; then id=$2; fi
if [ "$1" = compute-policy ] && [ "$2" = -i ]; then
  if [ $# -eq 5 ] && [ "$4" = --set-timeslice ]; then case $5 in [0-3]) id=$3;; esac; fi
  if [ $# -eq 4 ]; then case $4 in --set-timeslice=[0-3]) id=$3;; esac; fi
fi
case $id in GPU-*|MIG-*) ok=1;; esac
if [ -z "$ok" ]; then
  {sys.executable} -IS -c "import sys; sys.path.insert(0, '{ROOT}'); \\
from tests.smiforms import main; main()" "$@" || exit $?
fi
if [ -e {{fail}} ]; then
  only=$(cat {{fail}})
  case "$*" in *"$only"*) echo "Unable to set the compute policy: GPU is busy" >&2; exit 3;; esac
fi
exit 0
"""


class Smi(StandIn):
    """A stand-in nvidia-smi that appends its arguments, one call a line, to a file. While
    ``fail`` exists it fails every call, or, when the file holds a GPU UUID, that GPU's."""

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


async def _state(api: Session, tmp_path: Path, smi_path: Path) -> DeviceState:
    config = _config(tmp_path, nvidia_smi=smi_path)
    devices = devices_of(_inventory("p5.48xlarge", tmp_path), config)
    return await DeviceState.open(config, api, devices)


def _uuid(tmp_path: Path, device: str) -> str:
    return _inventory("p5.48xlarge", tmp_path).by_device_name()[device].uuid


def _holders(tmp_path: Path) -> list[str]:
    root = tmp_path / "plugins" / DRIVER / "kinds" / "gpu" / "timeslice"
    # <gpu uuid>/<claim uid>; beside them, each GPU's lock file, which is no holder
    return sorted(str(p.relative_to(root)) for p in root.glob("*/*") if p.is_file())


async def test_prepare_sets_the_interval_and_the_last_unprepare_restores_default(
    api_client: Session, tmp_path: Path, smi: Smi
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
    api_client: Session, tmp_path: Path, smi: Smi, interval: str, level: int
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    ref = await create_claim(api_client, "sliced", ["gpu-2"], config=[timeslicing(interval)])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert smi.calls() == sliced(_uuid(tmp_path, "gpu-2"), level)


async def test_no_interval_means_default(api_client: Session, tmp_path: Path, smi: Smi) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    ref = await create_claim(api_client, "sliced", ["gpu-3"], config=[timeslicing()])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert smi.calls() == sliced(_uuid(tmp_path, "gpu-3"), 0)


async def test_bad_input_is_a_per_claim_error_naming_the_cause(
    api_client: Session, tmp_path: Path, smi: Smi
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
    api_client: Session, tmp_path: Path, smi: Smi
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


async def test_nvidia_smi_missing_is_named(api_client: Session, tmp_path: Path, smi: Smi) -> None:
    missing = tmp_path / "no-such-dir" / "nvidia-smi"
    state = await _state(api_client, tmp_path, missing)
    ref = await create_claim(api_client, "nosmi", ["gpu-6"], config=[timeslicing("Short")])
    plain = await create_claim(api_client, "plain", ["gpu-7"])
    results = await state.prepare([ref, plain])
    assert results[plain.uid].error == ""
    assert f"cannot run nvidia-smi at {missing}" in results[ref.uid].error
    assert _holders(tmp_path) == []


async def test_a_holder_of_an_earlier_boot_does_not_keep_the_setting(
    api_client: Session, tmp_path: Path, smi: Smi
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
    api_client: Session, tmp_path: Path, smi: Smi, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = await _state(api_client, tmp_path, smi.path)
    uuid = _uuid(tmp_path, "gpu-0")
    ref = await create_claim(api_client, "sliced", ["gpu-0"], config=[timeslicing("Short")])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert smi.calls() == sliced(uuid, 1)
    # The spec in release 0.1.0's layout (no record version, pretty-printed): same claim,
    # another layout, which a repeat prepare rewrites.
    path = cdi.spec_path(tmp_path / "cdi", ref.uid, GPU)
    spec = json.loads(path.read_bytes())
    del spec["annotations"][cdi.RECORD_VERSION]
    path.write_text(json.dumps(spec, indent=1))
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
    api_client: Session, tmp_path: Path, smi: Smi, monkeypatch: pytest.MonkeyPatch
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


INTERVALS = ("Default", "Short", "Medium", "Long")


def _share(device: str) -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": str(uuid_module.uuid4()),
        "consumedCapacity": {"memory": "10Gi"},
    }


async def test_a_share_at_another_interval_than_the_gpus_holder_is_refused_naming_both(
    api_client: Session, tmp_path: Path, smi: Smi
) -> None:
    config = _config(tmp_path, nvidia_smi=smi.path, consumable_capacity=True)
    devices = devices_of(_inventory("p5.48xlarge", tmp_path), config)
    state = await DeviceState.open(config, api_client, devices)
    rng = random.Random(6)
    gpus = [f"gpu-{n}" for n in range(8)]
    both: list[str] = []
    pairs = 0
    # A pair on every GPU of the node at once, three times. The claims' fetches from the API
    # server rarely let two prepares race here; the test below makes them race.
    for round_ in range(3):
        asked = {device: rng.sample(INTERVALS, 2) for device in gpus}
        refs = {
            device: [
                await create_claim(
                    api_client,
                    f"r{round_}-{device}-{i}",
                    [device],
                    results=[_share(device)],
                    config=[timeslicing(interval)],
                )
                for i, interval in enumerate(intervals)
            ]
            for device, intervals in asked.items()
        }
        order = [ref for pair in refs.values() for ref in pair]
        rng.shuffle(order)
        smi.calls()
        results = await state.prepare(order)
        calls = smi.calls()
        for device, pair in refs.items():
            pairs += 1
            intervals = asked[device]
            errors = [results[ref.uid].error for ref in pair]
            if errors == ["", ""]:
                both.append(f"{device} in round {round_}: {intervals}")
                continue
            (won,) = [i for i, e in enumerate(errors) if e == ""]
            lost = errors[1 - won]
            assert f"is time-sliced at interval {intervals[won]}" in lost, lost
            assert f"this claim asks for {intervals[1 - won]}" in lost, lost
            # The GPU runs at the interval of the claim that holds it, and that one only.
            uuid = _uuid(tmp_path, device)
            levels = [c.rsplit(" ", 1)[1] for c in calls if f"-i {uuid} --set-timeslice" in c]
            assert levels == [str(TIMESLICE_LEVELS[intervals[won]])], (device, levels)
        assert await state.unprepare(order) == dict.fromkeys(results, "")
        assert _holders(tmp_path) == []
    assert both == [], f"{len(both)} of {pairs} pairs both succeeded: {both}"


def _claim(uid: str, gpu: str, interval: str) -> PreparedClaim:
    device = PreparedDevice(
        request_names=("gpu",),
        pool_name=NODE,
        device_name="gpu-0",
        cdi_device_ids=(),
        kind="gpu",
        identity=((UUID_KEY, gpu),),
        sharing=(("strategy", "TimeSlicing"), ("interval", interval)),
    )
    return PreparedClaim(uid, "default", uid, (device,))


def _instance(
    state_dir: Path, smi: Path, who: int, rounds: list[tuple[str, str]], barrier: Any, out: Path
) -> None:
    """One plugin instance of a node (a surge upgrade): its own process, the node's files."""
    kind = TimeSlicing(UUID_KEY)
    kind.attach(
        GpuKindContext(
            state_dir, "boot-1", GpuNode(container_driver_root=Path("/"), nvidia_smi=smi)
        )
    )
    outcomes = []
    for n, (gpu, interval) in enumerate(rounds):
        barrier.wait(timeout=60)  # both instances prepare their share of round n at once
        try:
            kind.prepare(_claim(f"claim-{n}-{who}", gpu, interval))
            outcomes.append("")
        except TimeSliceConflictError as exc:
            outcomes.append(str(exc))
    out.write_text(json.dumps(outcomes))


@pytest.mark.parametrize("instances", ["threads", "processes"])
def test_shares_of_one_gpu_prepared_at_once_never_both_get_their_interval(
    tmp_path: Path, smi: Smi, instances: str
) -> None:
    """Two preparers of one node's kind state: threads (one plugin, the claim state's
    worker threads) or processes (two plugin instances in a surge upgrade)."""
    state_dir = tmp_path / "kinds" / "gpu"
    state_dir.mkdir(parents=True)
    rng = random.Random(7)
    rounds = 200
    gpus = [f"GPU-{n:08x}-0000-0000-0000-000000000000" for n in range(rounds)]  # one a round
    asked = [rng.sample(INTERVALS, 2) for _ in range(rounds)]
    outs = [tmp_path / f"instance-{who}.json" for who in (0, 1)]

    def args(who: int, barrier: Any) -> tuple[Any, ...]:
        mine = [(gpu, pair[who]) for gpu, pair in zip(gpus, asked, strict=True)]
        return (state_dir, smi.path, who, mine, barrier, outs[who])

    if instances == "threads":
        barrier: Any = threading.Barrier(2)
        threads = [threading.Thread(target=_instance, args=args(who, barrier)) for who in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive()
    else:
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(2)
        procs = [context.Process(target=_instance, args=args(who, barrier)) for who in (0, 1)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(120)
            assert proc.exitcode == 0
    first, second = (json.loads(out.read_text()) for out in outs)
    both = [n for n in range(rounds) if first[n] == second[n] == ""]
    assert both == [], f"{len(both)} of {rounds} rounds both succeeded: {both}"
    for n in range(rounds):
        assert (first[n] == "") != (second[n] == ""), (n, first[n], second[n])
        lost = first[n] or second[n]
        won, refused = asked[n] if first[n] == "" else asked[n][::-1]
        assert f"is time-sliced at interval {won} for claim uid" in lost, lost
        assert f"this claim asks for {refused}" in lost, lost
