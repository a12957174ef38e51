"""Partitionable devices in the allocator behind ``explain``: sharedCounters and
consumesCounters (KEP-4815), as MIG placements use them. A placement consumes the
memory slices it occupies, so the allocator never hands out two that overlap, in one
claim or across claims, and says which claim holds the slices a request needs."""

from typing import Any

import pytest

from tools.allocation import explain_claim

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
SET = "gpu-0-counter-set"
# (profile, start, memory slices) of one A100's placements, smallest first.
PLACEMENTS = [("1g", s, 1) for s in range(7)] + [("3g", 0, 4), ("3g", 4, 4), ("4g", 0, 4)]
PLACEMENTS.append(("7g", 0, 8))
CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "mig.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}


def _device(profile: str, start: int, size: int) -> dict[str, Any]:
    return {
        "name": f"gpu-0-mig-{profile}-{start}",
        "attributes": {"profile": {"string": profile}},
        "consumesCounters": [
            {
                "counterSet": SET,
                "counters": {
                    f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)
                },
            }
        ],
    }


def _slices(layout: str) -> list[dict[str, Any]]:
    counters = {"name": SET, "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(8)}}
    devices = [_device(*p) for p in PLACEMENTS]

    def piece(name: str, count: int, **spec: Any) -> dict[str, Any]:
        pool = {"name": NODE, "generation": 1, "resourceSliceCount": count}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": DRIVER, "pool": pool, "nodeName": NODE, **spec},
        }

    if layout == "1.34":  # counters in the slice of the devices that consume them
        return [piece("s0", 1, sharedCounters=[counters], devices=devices)]
    return [piece("s0", 2, sharedCounters=[counters]), piece("s1", 2, devices=devices)]


def _claim(*profiles: str, name: str = "c") -> dict[str, Any]:
    requests = [
        {
            "name": f"r{i}",
            "exactly": {
                "deviceClassName": "mig.nvidia.com",
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{p}"'}}
                ],
            },
        }
        for i, p in enumerate(profiles)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": requests}},
    }


def _allocated(name: str, *devices: str) -> dict[str, Any]:
    claim = _claim(name=name)
    results = [{"request": "r", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


def _got(claim: dict[str, Any], layout: str, *held: dict[str, Any]) -> list[str]:
    result = explain_claim(claim, slices=_slices(layout), classes=[CLASS], allocated=held)
    node = result.node(NODE)
    return [r.device for r in node.results] if node.allocatable else list(node.reasons)


@pytest.mark.parametrize("layout", ["1.34", "1.35"])
def test_overlapping_placements_are_never_allocated_together(layout: str) -> None:
    assert _got(_claim("3g", "3g"), layout) == ["gpu-0-mig-3g-0", "gpu-0-mig-3g-4"]
    # Two 3g take all eight memory slices: no 1g is left beside them.
    reasons = _got(_claim("3g", "3g", "1g"), layout)
    assert any("no combination" in r for r in reasons), reasons
    # 4g@0 and 3g@0 overlap: with one held, the other is out.
    assert _got(_claim("4g", "3g"), layout) == ["gpu-0-mig-4g-0", "gpu-0-mig-3g-4"]
    # The 7g takes every slice: it never goes with anything else of the GPU.
    assert any("no combination" in r for r in _got(_claim("1g", "7g"), layout))
    assert _got(_claim("7g"), layout) == ["gpu-0-mig-7g-0"]


@pytest.mark.parametrize("layout", ["1.34", "1.35"])
def test_placements_other_claims_hold_consume_their_slices(layout: str) -> None:
    held = _allocated("x", "gpu-0-mig-4g-0")
    assert _got(_claim("3g"), layout, held) == ["gpu-0-mig-3g-4"]
    assert _got(_claim("1g"), layout, held) == ["gpu-0-mig-1g-4"]
    both = _allocated("y", "gpu-0-mig-3g-4")
    reasons = _got(_claim("3g"), layout, held, both)
    assert any("allocated to other claims [gpu-0-mig-3g-4, gpu-0-mig-4g-0]" in r for r in reasons)
    (line,) = [r for r in reasons if "shared counters" in r]
    # 3g@4 is held itself; 3g@0 is free but its slices are 4g@0's.
    assert "1 device without the shared counters they consume [gpu-0-mig-3g-0]" in line
    assert "gpu-0-mig-3g-0 needs memory-slice-0 of gpu-0-counter-set" in line
    assert "gpu-0-mig-4g-0 (claim default/x)" in line


def test_a_device_consuming_a_counter_the_pool_lacks_makes_the_pool_invalid() -> None:
    slices = _slices("1.34")
    slices[0]["spec"]["devices"][0]["consumesCounters"][0]["counterSet"] = "nope"
    result = explain_claim(_claim("1g"), slices=slices, classes=[CLASS])
    node = result.node(NODE)
    assert not node.allocatable
    assert any("invalid" in r and "counter set nope" in r for r in node.reasons), node.reasons


def test_a_device_consuming_counters_of_a_pool_without_any_makes_it_invalid() -> None:
    slices = _slices("1.34")
    del slices[0]["spec"]["sharedCounters"]
    result = explain_claim(_claim("1g"), slices=slices, classes=[CLASS])
    node = result.node(NODE)
    assert not node.allocatable
    assert any("invalid" in r and f"counter set {SET}" in r for r in node.reasons), node.reasons


def test_a_repeated_counter_set_makes_the_pool_invalid() -> None:
    slices = _slices("1.35")
    slices[1]["spec"]["sharedCounters"] = slices[0]["spec"]["sharedCounters"]
    result = explain_claim(_claim("1g"), slices=slices, classes=[CLASS])
    assert any("duplicate counter set" in r for r in result.node(NODE).reasons)
