"""Consumable capacity, the publishing side: what ``--consumable-capacity`` publishes."""

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from cli.flagvalues import boolean as _boolean
from driver.common.limits import validate_resource_slice
from driver.common.quantity import Quantity
from driver.nvml.profile import profile_names
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.kinds.capacity import request_policy, shareable
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.published import GIB
from drivers.gpu.resourceslice import build_resource_slices

DRIVER = "gpu.nvidia.com"


def _slices(tmp_path: Path, profile: str, *, shared: bool) -> list[dict[str, Any]]:
    sim = SimulatedNode(profile, "node-a", tmp_path / profile)
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    return build_resource_slices(
        inventory, driver_name=DRIVER, node_name="node-a", consumable_capacity=shared
    )


def _value(text: str) -> int:
    return int(Quantity.parse(text).value)


def _check_policy(capacity: dict[str, Any]) -> None:
    """The API server's rules for a validRange (validateRequestPolicyRange)."""
    value = _value(capacity["value"])
    policy = capacity["requestPolicy"]
    default = _value(policy["default"])
    low, high, step = (_value(policy["validRange"][k]) for k in ("min", "max", "step"))
    assert 0 <= low <= default <= high <= value
    assert low + step <= value
    assert (default - low) % step == 0 and (high - low) % step == 0


@pytest.mark.parametrize("profile", profile_names())
def test_every_gpu_is_shareable_and_the_slice_stays_valid(tmp_path: Path, profile: str) -> None:
    for slice_ in _slices(tmp_path, profile, shared=True):
        assert validate_resource_slice(slice_) == []
        for version in ("1.34.0", "1.36.0"):
            kubernetes_validate.validate(slice_, version, strict=True)
        for device in slice_["spec"]["devices"]:
            if device["attributes"]["type"] == {"string": "mig"}:
                # A MIG device is a partition of its own: published for one claim.
                assert "allowMultipleAllocations" not in device
                continue
            assert device["allowMultipleAllocations"] is True
            assert device["capacity"].keys() == {"memory"}
            _check_policy(device["capacity"]["memory"])


def test_off_by_default_publishes_no_sharing(tmp_path: Path) -> None:
    for slice_ in _slices(tmp_path, "p5.48xlarge", shared=False):
        for device in slice_["spec"]["devices"]:
            assert "allowMultipleAllocations" not in device
            assert "requestPolicy" not in device["capacity"]["memory"]


def test_an_80_gb_gpu_holds_two_20gi_claims_and_a_plain_claim_takes_it_all() -> None:
    policy = request_policy(81559 * 1024 * 1024)  # an H100 80GB HBM3
    assert policy == {
        "default": "79Gi",
        "validRange": {"min": "1Gi", "max": "79Gi", "step": "1Gi"},
    }


def test_a_capacity_too_small_for_two_steps_leaves_the_device_unshared() -> None:
    device = {"name": "tiny", "capacity": {"memory": {"value": str(GIB + GIB // 2)}}}
    assert shareable(device) == device
    assert "allowMultipleAllocations" not in shareable({"name": "bare"})


@pytest.mark.parametrize(("text", "value"), [("true", True), ("1", True), ("false", False)])
def test_the_plugin_switch_parses(text: str, value: bool) -> None:
    assert _boolean(text) is value
