"""The allocator with consumable capacity (KEP-5075): shares of one GPU's memory.

Expected outcomes follow the incubating allocator of
k8s.io/dynamic-resource-allocation/structured (consumable_capacity.go and
``allocateDevice``); tests/oracles/test_allocator_oracle.py compares random cases.
"""

import uuid
from typing import Any

import pytest

from drivers.gpu.kinds.capacity import shareable
from tests.test_allocator import CLASS, DRIVER, slice_
from tools.allocation import Explanation, explain_claim

GIB = 1 << 30
CLASSES = [
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    },
]


def gpu(name: str, gib: int = 80, *, shared: bool = True) -> dict[str, Any]:
    device = {"name": name, "capacity": {"memory": {"value": str(gib * GIB)}}}
    return shareable(device) if shared else device


def claim(name: str, *memory: str | None, uid: str | None = None) -> dict[str, Any]:
    requests = []
    for i, amount in enumerate(memory):
        exactly: dict[str, Any] = {"deviceClassName": CLASS}
        if amount is not None:
            exactly["capacity"] = {"requests": {"memory": amount}}
        requests.append({"name": f"r{i}", "exactly": exactly})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid or name},
        "spec": {"devices": {"requests": requests}},
    }


def explain(
    c: dict[str, Any], slices: list[dict[str, Any]], *allocated: dict[str, Any]
) -> Explanation:
    return explain_claim(c, slices=slices, classes=CLASSES, allocated=allocated)


def allocate(
    c: dict[str, Any], slices: list[dict[str, Any]], *allocated: dict[str, Any]
) -> dict[str, Any]:
    """``c`` with the status the scheduler would write on node-a."""
    entry = explain(c, slices, *allocated).node("node-a")
    assert entry.allocatable, entry.reasons
    return {**c, "status": {"allocation": entry.allocation}}


def test_two_20gi_claims_share_one_gpu_and_a_48gi_third_does_not_fit() -> None:
    slices = [slice_("node-a", gpu("gpu-0"))]
    a = allocate(claim("a", "20Gi"), slices)
    b = allocate(claim("b", "20Gi"), slices, a)
    for held in (a, b):
        (result,) = held["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0"
        assert result["consumedCapacity"] == {"memory": "20Gi"}
        uuid.UUID(result["shareID"])  # the UUID form the API server requires
    assert a["status"] != b["status"]  # distinct share IDs
    third = explain(claim("c", "48Gi"), slices, a, b).node("node-a")
    assert not third.allocatable
    assert (
        "request r0: needs 48Gi of memory, 40Gi free on gpu-0, used by claims default/a, "
        "default/b" in third.reasons
    )
    assert explain(claim("c", "40Gi"), slices, a, b).node("node-a").allocatable


@pytest.mark.parametrize(
    ("asked", "taken"), [("20.5Gi", "21Gi"), ("500Mi", "1Gi"), ("1", "1Gi"), ("80Gi", "80Gi")]
)
def test_a_request_is_rounded_up_to_the_policy_step(asked: str, taken: str) -> None:
    entry = explain(claim("a", asked), [slice_("node-a", gpu("gpu-0"))]).node("node-a")
    assert entry.results[0].consumed_capacity == {"memory": taken}


def test_more_than_the_policy_allows_never_fits() -> None:
    entry = explain(claim("a", "81Gi"), [slice_("node-a", gpu("gpu-0"))]).node("node-a")
    assert not entry.allocatable
    assert "request r0: needs 81Gi of memory, more than the request policy of gpu-0 allows" in (
        entry.reasons
    )


def test_a_claim_asking_for_no_memory_takes_the_whole_gpu() -> None:
    slices = [slice_("node-a", gpu("gpu-0"))]
    plain = allocate(claim("plain", None), slices)
    (result,) = plain["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": "80Gi"}
    entry = explain(claim("small", "1Gi"), slices, plain).node("node-a")
    assert "request r0: needs 1Gi of memory, 0 free on gpu-0, used by claims default/plain" in (
        entry.reasons
    )


def test_two_requests_of_one_claim_may_share_a_gpu() -> None:
    entry = explain(claim("a", "30Gi", "30Gi"), [slice_("node-a", gpu("gpu-0"))]).node("node-a")
    assert [r.device for r in entry.results] == ["gpu-0", "gpu-0"]
    over = explain(claim("a", "50Gi", "40Gi"), [slice_("node-a", gpu("gpu-0"))]).node("node-a")
    assert not over.allocatable


def test_shares_go_to_the_first_gpu_with_room() -> None:
    slices = [slice_("node-a", gpu("gpu-0"), gpu("gpu-1"))]
    a = allocate(claim("a", "60Gi"), slices)
    entry = explain(claim("b", "30Gi"), slices, a).node("node-a")
    assert [r.device for r in entry.results] == ["gpu-1"]


def test_a_gpu_of_one_claim_is_a_floor_for_a_capacity_request() -> None:
    slices = [slice_("node-a", gpu("gpu-0", 48, shared=False), gpu("gpu-1", 80, shared=False))]
    entry = explain(claim("a", "60Gi"), slices).node("node-a")
    assert [r.device for r in entry.results] == ["gpu-1"]
    assert entry.results[0].consumed_capacity is None
    assert entry.allocation is not None
    assert "shareID" not in entry.allocation["devices"]["results"][0]
    taken = allocate(claim("a", "60Gi"), slices)  # gpu-1 whole
    assert [r.device for r in explain(claim("b", "1Gi"), slices, taken).node("node-a").results] == [
        "gpu-0"
    ]


def test_a_capacity_the_device_lacks_never_fits() -> None:
    c = claim("a", "1Gi")
    c["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] = {"cores": "2"}
    entry = explain(c, [slice_("node-a", gpu("gpu-0"))]).node("node-a")
    assert "request r0: device gpu-0 has no capacity cores" in entry.reasons


def test_a_malformed_request_names_the_field() -> None:
    found = explain(claim("a", "twenty"), [slice_("node-a", gpu("gpu-0"))])
    assert found.problems and "request r0: capacity.requests.memory" in found.problems[0]
