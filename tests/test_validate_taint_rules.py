"""validate on an admin's DeviceTaintRule, from 1.34 to 1.38: which resource.k8s.io version
serves it, its gate (beta and off in 1.36, GA and on from 1.37) and its taint's effect."""

from typing import Any

import pytest

from tests.test_validate import check
from tools.validation import Severity


def rule(api_version: str = "resource.k8s.io/v1", effect: str = "NoSchedule") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {"name": "drain-gpu-3"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-3"},
            "taint": {"key": "example.com/maintenance", "value": "drain", "effect": effect},
        },
    }


@pytest.mark.parametrize("version", ["1.37", "1.38"])
def test_a_v1_rule_is_clean_where_the_gate_is_on(version: str) -> None:
    assert check(rule(), version=version) == []


def test_the_1_36_beta_is_off_by_default_and_serves_v1beta2_only() -> None:
    (problem,) = [p for p in check(rule(), version="1.36") if p.path == "apiVersion"]
    assert problem.severity is Severity.ERROR and "write resource.k8s.io/v1beta2" in problem.message
    warned = check(rule("resource.k8s.io/v1beta2"), version="1.36")
    assert [p.severity for p in warned] == [Severity.WARNING]
    assert "DRADeviceTaintRules, off by default in Kubernetes 1.36" in warned[0].message


def test_an_effect_the_version_does_not_know_is_an_error() -> None:
    problems = check(rule(effect="Evict"), version="1.37")
    assert [p.path for p in problems if p.severity is Severity.ERROR] == ["spec.taint.effect"]
    assert "NoExecute, NoSchedule, None" in problems[-1].message
