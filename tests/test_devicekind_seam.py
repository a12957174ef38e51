"""The device-kind seam: a second kind, registered in the one table, is published and
prepared with no edit anywhere but its own module (tests/fakekind.py)."""

import json
from pathlib import Path

import pytest

from driver.kube.session import Session
from driver.slices.model import build_slices
from drivers.gpu import kinds as devicekinds
from drivers.gpu.kinds import discovered, gpu
from drivers.gpu.resourceslice import build_resource_slices
from kubeletplugin import cdi
from kubeletplugin.state import DeviceState
from tests.fakekind import NAME, FakeAccelerator
from tests.test_state import (
    DRIVER,
    NODE,
    _config,
    _inventory,
    create_claim,
    devices_of,
    reservations,
)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    kind = FakeAccelerator(tmp_path / "side-effects")
    # Its registration: one entry of the table every claim state and publisher makes.
    monkeypatch.setattr(devicekinds, "KIND_TYPES", (gpu.GpuKind, lambda node: kind))
    return kind


def _claim_record(tmp_path: Path, uid: str) -> Path:
    return tmp_path / "plugins" / DRIVER / "claims" / f"{uid}.json"


async def test_a_second_kind_is_published_beside_the_gpus(
    fake: FakeAccelerator, tmp_path: Path
) -> None:
    inventory = _inventory("p5.48xlarge", tmp_path)
    source = discovered(inventory, node_name=NODE)  # what the publisher is given
    slices = build_slices(await source.published(), driver_name=DRIVER, node_name=NODE)
    devices = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    assert devices["fake-0"]["attributes"] == {"fakeAttr": {"string": "shiny"}}
    assert len(devices) == len(inventory.gpus) + 1
    # `gpu-dra discover` builds the same slices from the same table.
    assert build_resource_slices(inventory, driver_name=DRIVER, node_name=NODE) == slices


async def test_a_second_kind_is_prepared_with_its_side_effects_recorded_first(
    fake: FakeAccelerator, api_client: Session, tmp_path: Path
) -> None:
    config = _config(tmp_path)
    devices = devices_of(_inventory("p5.48xlarge", tmp_path), config)
    state = await DeviceState.open(config, api_client, devices)
    ref = await create_claim(api_client, "mixed", ["gpu-0", "fake-0"])
    result = (await state.prepare([ref]))[ref.uid]
    assert result.error == ""
    assert sorted(d.device_name for d in result.devices) == ["fake-0", "gpu-0"]
    spec = json.loads(cdi.spec_path(config.cdi_root, ref.uid, config.flavor).read_text())
    by_name = {d["annotations"][cdi.DEVICE_NAME]: d for d in spec["devices"]}
    assert by_name["fake-0"]["annotations"][cdi.DEVICE_KIND] == NAME
    assert by_name["fake-0"]["containerEdits"] == {"env": ["FAKE_ACCELERATOR=fake-0"]}
    assert fake.mark(cdi.claim_from_spec(spec, config.flavor)).read_text() == "prepared"
    assert _claim_record(tmp_path, ref.uid).exists()
    assert reservations(config) == {"gpu-0": ref.uid, "fake-0": ref.uid}
    assert await state.prepare([ref]) == {ref.uid: result}  # idempotent

    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert list(fake.side_effects.iterdir()) == []
    assert not _claim_record(tmp_path, ref.uid).exists()
    assert reservations(config) == {}


async def test_a_crash_before_the_spec_has_its_side_effects_undone_at_restart(
    fake: FakeAccelerator, api_client: Session, tmp_path: Path
) -> None:
    config = _config(tmp_path)
    devices = devices_of(_inventory("p5.48xlarge", tmp_path), config)
    state = await DeviceState.open(config, api_client, devices)
    ref = await create_claim(api_client, "crashed", ["fake-0"])
    rival = await create_claim(api_client, "rival", ["fake-0"])
    prepared = await state.prepare([ref])
    # What a crash after the side effect, before the CDI write, leaves.
    cdi.spec_path(config.cdi_root, ref.uid, config.flavor).unlink()
    state = await DeviceState.open(config, api_client, devices)
    assert list(fake.side_effects.iterdir()) == []  # the kind's recover undid it
    assert not _claim_record(tmp_path, ref.uid).exists()
    assert "already prepared" in (await state.prepare([rival]))[rival.uid].error
    assert await state.prepare([ref]) == prepared
