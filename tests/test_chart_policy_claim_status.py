"""The claim status policy, evaluated with the official CEL runtime (as tests/test_chart_policy.py
does the slice and Lease policies): the kubelet plugin may write the status.devices entries of
its own drivers in its own node's pool, and nothing else of a claim's status; other users are
not matched. (From 1.36 the API server checks node and driver itself; this holds before it.)"""

import copy
from typing import Any

import pytest

from tests.test_chart_policy import Policy, _policy, evaluate

NODE = "node-a"
DRIVER = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def policy() -> Policy:
    return _policy("resourceclaims/status")


def _entry(device: str, pool: str = NODE, driver: str = DRIVER) -> dict[str, Any]:
    return {"driver": driver, "pool": pool, "device": device, "data": {"kind": "gpu"}}


def _claim(*entries: dict[str, Any], reserved: str = "pod-uid-1") -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    status: dict[str, Any] = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": reserved}],
    }
    if entries:
        status["devices"] = list(entries)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team"},
        "status": status,
    }


def update(
    policy: Policy, old: dict[str, Any], new: dict[str, Any], node: str | None = NODE
) -> list[str]:
    return evaluate(policy, operation="UPDATE", obj=new, old=old, user_node=node)


def test_its_own_entries_come_change_and_go(policy: Policy) -> None:
    nic = _entry("nic-0", driver="nic.example.com")
    assert update(policy, _claim(nic), _claim(nic, _entry("gpu-0"))) == []
    changed = _entry("gpu-0")
    changed["data"] = {"kind": "gpu", "sharing": {"strategy": "MPS"}}
    assert update(policy, _claim(_entry("gpu-0")), _claim(changed)) == []
    assert update(policy, _claim(nic, _entry("gpu-0")), _claim(nic)) == []
    assert update(policy, _claim(), _claim(_entry("gpu-0"))) == []  # no devices before


def test_another_pools_or_drivers_entries_are_denied(policy: Policy) -> None:
    why = (
        f"the kubelet plugin on node {NODE} may write only status.devices entries of {DRIVER} "
        f"in pool {NODE}"
    )
    assert update(policy, _claim(), _claim(_entry("gpu-0", pool="node-b"))) == [why]
    other = _entry("nic-0", driver="nic.example.com")
    assert update(policy, _claim(other), _claim()) == [why]
    moved = copy.deepcopy(other)
    moved["data"] = {"x": 1}
    assert update(policy, _claim(other), _claim(moved)) == [why]


def test_the_schedulers_fields_are_denied(policy: Policy) -> None:
    why = (
        f"the kubelet plugin on node {NODE} may change only status.devices of a ResourceClaim, "
        "not its allocation or reservedFor"
    )
    assert update(policy, _claim(), _claim(reserved="pod-uid-2")) == [why]
    unallocated = _claim()
    del unallocated["status"]["allocation"]
    assert update(policy, _claim(), unallocated) == [why]
    assert update(policy, unallocated, _claim()) == [why]


def test_a_token_without_a_node_and_other_users(policy: Policy) -> None:
    assert update(policy, _claim(), _claim(_entry("gpu-0")), node=None)
    scheduler = evaluate(
        policy,
        operation="UPDATE",
        obj=_claim(reserved="other"),
        old=_claim(),
        user_node=None,
        user="system:kube-scheduler",
    )
    assert scheduler == []
