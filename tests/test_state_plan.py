"""plan_claim, pure: which results are ours, which opaque config applies to each."""

from typing import Any

import pytest

from drivers.gpu.flavor import GPU_CONFIGS
from kubeletplugin.claims import ClaimError, ClaimRef, plan_claim

DRIVER = "gpu.nvidia.com"
POOL = "node-a"
REF = ClaimRef(uid="u-1", namespace="ns", name="c")
PLAIN = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
# A strategy that parses and is refused, so the refusal shows which config applied.
SHARED = {**PLAIN, "sharing": {"strategy": "Fabric"}}


def _claim(results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None) -> Any:
    devices: dict[str, Any] = {"results": results}
    if config is not None:
        devices["config"] = config
    return {"metadata": {"uid": "u-1"}, "status": {"allocation": {"devices": devices}}}


def _result(request: str, device: str, **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": POOL, "device": device, **extra}


def _opaque(params: Any, source: str = "FromClaim", requests: list[str] | None = None) -> Any:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": DRIVER, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def _plan(claim: Any) -> Any:
    return plan_claim(claim, REF, driver_name=DRIVER, pool_name=POOL, rules=GPU_CONFIGS)


def test_claim_config_overrides_class_config_for_matching_requests() -> None:
    # Listed claim-first on purpose: class configs still come first, whatever the order.
    config = [_opaque(PLAIN, requests=["gpu"]), _opaque(SHARED, source="FromClass")]
    plan = _plan(_claim([_result("gpu", "gpu-0")], config))
    assert plan.devices[0].config.sharing is None
    # The class config alone applies, and its sharing setting is refused, naming it.
    with pytest.raises(ClaimError, match=r"opaque config #1 \(from class, all requests\)"):
        _plan(_claim([_result("other", "gpu-1"), _result("gpu", "gpu-0")], config))


def test_subrequests_match_by_full_or_base_name() -> None:
    by_base = [_opaque(SHARED, requests=["big"])]
    with pytest.raises(ClaimError, match="unknown GPU sharing strategy Fabric"):
        _plan(_claim([_result("big/h100", "gpu-0")], by_base))
    by_full = [_opaque(SHARED, requests=["big/h100"])]
    with pytest.raises(ClaimError, match="unknown GPU sharing strategy Fabric"):
        _plan(_claim([_result("big/h100", "gpu-0")], by_full))
    other_sub = [_opaque(SHARED, requests=["big/a100"])]
    plan = _plan(_claim([_result("big/h100", "gpu-0")], other_sub))
    assert plan.devices[0].request == "big/h100"
    assert plan.devices[0].base_request == "big"


def test_malformed_config_is_reported_even_when_overridden() -> None:
    config = [_opaque({**PLAIN, "bogus": 1}, source="FromClass"), _opaque(PLAIN)]
    with pytest.raises(ClaimError, match='field "bogus"'):
        _plan(_claim([_result("gpu", "gpu-0")], config))


def test_only_our_driver_and_pool() -> None:
    results = [
        _result("gpu", "gpu-0", adminAccess=True, shareID="6f1d2c3b-0a4e-4b7c-9d8e-1f2a3b4c5d6e"),
        {**_result("gpu", "gpu-1"), "driver": "other.example.com"},
        {**_result("gpu", "gpu-2"), "pool": "node-b"},
    ]
    other_config = [{"source": "FromClaim", "opaque": {"driver": "x.io", "parameters": [1]}}]
    plan = _plan(_claim(results, other_config))
    assert [(d.device_name, d.admin_access, d.share_id) for d in plan.devices] == [
        ("gpu-0", True, "6f1d2c3b-0a4e-4b7c-9d8e-1f2a3b4c5d6e")
    ]


def test_unallocated_and_replaced_claims() -> None:
    with pytest.raises(ClaimError, match="claim ns/c not allocated"):
        _plan({"metadata": {"uid": "u-1"}, "status": {}})
    with pytest.raises(ClaimError, match="claim ns/c got replaced"):
        _plan({"metadata": {"uid": "u-2"}, "status": {}})
