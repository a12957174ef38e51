"""What prepare and unprepare write, in which order, and which fsyncs and locks they take.

The argument is in kubeletplugin/records.py: with a boot ID nothing is fsynced (a
power loss, the only thing that loses a page-cache write, voids the boot's records);
without one each record file is fsynced before its rename so none can be torn. The one
lock is the claim's own, which every plugin instance of the node takes.
"""

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from driver.kube.session import Session
from drivers.gpu.flavor import GPU
from kubeletplugin import cdi
from kubeletplugin.state import DeviceState
from tests.test_state import _config, _inventory, create_claim, devices_of


def _trace(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    real = {n: getattr(os, n) for n in ("fsync", "replace", "symlink", "unlink")}
    real_flock = fcntl.flock

    def fsync(fd: int) -> None:
        events.append(("fsync", str(Path(f"/proc/self/fd/{fd}").readlink())))
        real["fsync"](fd)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        events.append(("rename", str(dst)))
        real["replace"](src, dst, **kwargs)

    def symlink(target: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        events.append(("symlink", str(path)))
        real["symlink"](target, path, *args, **kwargs)

    def unlink(path: Any, **kwargs: Any) -> None:
        events.append(("unlink", str(path)))
        real["unlink"](path, **kwargs)

    def flock(fd: Any, operation: int) -> None:
        events.append(("flock", str(Path(f"/proc/self/fd/{fd}").readlink())))
        real_flock(fd, operation)

    for name, fake in (("fsync", fsync), ("replace", replace), ("symlink", symlink)):
        monkeypatch.setattr(os, name, fake)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(fcntl, "flock", flock)
    return events


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("boot_id", [True, False], ids=["boot-id", "no-boot-id"])
async def test_prepare_and_unprepare_write_one_record_per_claim_in_order(
    api_client: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, boot_id: bool
) -> None:
    config = _config(tmp_path)
    if not boot_id:
        config.boot_id_path.unlink()
    state = await DeviceState.open(
        config, api_client, devices_of(_inventory("p5.48xlarge", tmp_path), config)
    )
    ref = await create_claim(api_client, "durable", ["gpu-5", "gpu-6"])
    events = _trace(monkeypatch)
    assert (await state.prepare([ref]))[ref.uid].error == ""
    prepare_events = list(events)
    assert await state.unprepare([ref]) == {ref.uid: ""}
    unprepare_events = events[len(prepare_events) :]

    spec = str(cdi.spec_path(config.cdi_root, ref.uid, GPU))
    devices = config.plugin_dir / "devices"
    lock = str(config.plugin_dir / "locks" / f"{ref.uid}.lock")
    reserve = [("symlink", str(devices / "gpu-5")), ("symlink", str(devices / "gpu-6"))]
    # The claim's lock, each device reserved, then the spec: one rename, fsynced (its
    # temp file) only where no boot ID voids what a power loss could tear.
    fsync = [("fsync", prepare_events[3][1])] if not boot_id else []
    assert prepare_events == [("flock", lock), *reserve, *fsync, ("rename", spec)]
    if not boot_id:
        assert Path(prepare_events[3][1]).parent == config.cdi_root
    # Unprepare: the spec first, then the reservations, then the lock file of a claim
    # that is gone; no fsync, no rename.
    assert unprepare_events == [
        ("flock", lock),
        ("unlink", spec),
        ("unlink", str(devices / "gpu-5")),
        ("unlink", str(devices / "gpu-6")),
        ("unlink", lock),
    ]
    assert _listing(Path(spec).parent) == [] and _listing(devices) == []
    assert _listing(config.plugin_dir / "locks") == []


async def test_an_already_prepared_claim_writes_nothing(
    api_client: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    state = await DeviceState.open(
        config, api_client, devices_of(_inventory("p5.48xlarge", tmp_path), config)
    )
    ref = await create_claim(api_client, "again", ["gpu-1"])
    first = await state.prepare([ref])
    events = _trace(monkeypatch)
    assert await state.prepare([ref]) == first
    assert events == [("flock", str(config.plugin_dir / "locks" / f"{ref.uid}.lock"))]
