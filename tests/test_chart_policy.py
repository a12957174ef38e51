"""The rendered ValidatingAdmissionPolicy, evaluated with the official CEL runtime.

cel-expr-python (the C++ CEL implementation) compiles and runs the policy's own expressions
the way the API server's admission plugin does: variables in order, then the match condition,
then every validation. Request and objects are dynamic maps, as the API server presents them.
"""

from dataclasses import dataclass
from typing import Any

import pytest
from cel_expr_python import cel

from tests.chart_render import render

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"

_ENV = cel.NewEnv(
    variables={name: cel.Type.DYN for name in ("request", "object", "oldObject", "variables")}
)


def _eval(expression: str, data: dict[str, Any]) -> Any:
    return _ENV.compile(expression).eval(data=data).plain_value()


@dataclass(frozen=True)
class Policy:
    spec: dict[str, Any]
    plugin_user: str  # the username of the chart's service account


@pytest.fixture(scope="module")
def policy() -> Policy:
    objects = render()
    (found,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    return Policy(found["spec"], f"system:serviceaccount:{meta['namespace']}:{meta['name']}")


def admit(
    policy: Policy,
    *,
    operation: str,
    slice_node: str | None,
    user_node: str | None,
    driver: str = "gpu.nvidia.com",
    user: str | None = None,
) -> list[str]:
    """The denial messages for one request; [] when admitted (or when the policy does not match)."""
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": "p"}}
    if slice_node is not None:
        spec["nodeName"] = slice_node
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}
    extra = {NODE_NAME_KEY: [user_node]} if user_node is not None else {}
    data: dict[str, Any] = {
        "request": {
            "operation": operation,
            "userInfo": {"username": user or policy.plugin_user, "extra": extra},
        },
        "object": None if operation == "DELETE" else obj,
        "oldObject": obj if operation in ("DELETE", "UPDATE") else None,
        "variables": {},
    }
    spec_ = policy.spec
    for variable in spec_["variables"]:
        data["variables"][variable["name"]] = _eval(variable["expression"], data)
    if not all(_eval(c["expression"], data) for c in spec_["matchConditions"]):
        return []
    denials = []
    for validation in spec_["validations"]:
        if _eval(validation["expression"], data) is not True:
            if "messageExpression" in validation:
                denials.append(str(_eval(validation["messageExpression"], data)))
            else:
                denials.append(" ".join(validation["message"].split()))
    return denials


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_own_node_is_admitted(policy: Policy, operation: str) -> None:
    assert admit(policy, operation=operation, slice_node="node-a", user_node="node-a") == []


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_other_node_is_denied(policy: Policy, operation: str) -> None:
    assert admit(policy, operation=operation, slice_node="node-b", user_node="node-a") == [
        "the kubelet plugin on node node-a may not modify ResourceSlices of node node-b"
    ]


def test_cluster_scoped_slice_is_denied(policy: Policy) -> None:
    (denial,) = admit(policy, operation="CREATE", slice_node=None, user_node="node-a")
    assert "ResourceSlices without spec.nodeName" in denial


def test_other_driver_is_denied(policy: Policy) -> None:
    denials = admit(
        policy, operation="CREATE", slice_node="node-a", user_node="node-a", driver="x.example.com"
    )
    assert denials == [
        "the kubelet plugin of gpu.nvidia.com may not modify ResourceSlices of driver x.example.com"
    ]


def test_token_without_node_is_denied(policy: Policy) -> None:
    denials = admit(policy, operation="CREATE", slice_node="node-a", user_node=None)
    assert denials[0].startswith("the service account token carries no node name")


def test_other_users_are_not_matched(policy: Policy) -> None:
    # The kubelet itself deletes a node's slices when the plugin is gone: not our business.
    assert (
        admit(
            policy,
            operation="DELETE",
            slice_node="node-b",
            user_node="node-a",
            user="system:node:node-a",
        )
        == []
    )
