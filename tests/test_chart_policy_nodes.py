"""The Node label policy of computeDomains.enabled, evaluated with the official CEL runtime
(as tests/test_chart_policy.py does the slice and Lease policies): the kubelet plugin may set
and remove the ComputeDomain and GPU clique labels of its own Node, and change nothing else of
any Node."""

from typing import Any

import pytest

from drivers.computedomain import names
from tests.chart_render import render
from tests.test_chart_policy import Policy, evaluate

NODE = "gb-a"
UID = "3b1c6a4e-8f2d-4c1a-9e7b-5d0f2a6c8e11"
CLIQUE = "00000000-0000-0000-0000-000000000001.0"


@pytest.fixture(scope="module")
def policy() -> Policy:
    objects = render(set_values=["computeDomains.enabled=true"])
    (found,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
        and o["metadata"]["name"].endswith("-node-labels")  # not the controller's
    ]
    (account,) = [
        o
        for o in objects
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-kubelet-plugin")
    ]
    meta = account["metadata"]
    return Policy(found["spec"], f"system:serviceaccount:{meta['namespace']}:{meta['name']}")


def _node(name: str = NODE, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"providerID": "aws:///us-east-1a/i-1"},
    }


def update(policy: Policy, old: dict[str, Any], new: dict[str, Any], **kw: Any) -> list[str]:
    """The denials of an UPDATE from ``old`` to ``new``, by the plugin on node ``NODE``
    unless ``user_node`` says otherwise."""
    user_node = kw.pop("user_node", NODE)
    return evaluate(policy, operation="UPDATE", obj=new, old=old, user_node=user_node, **kw)


def test_its_own_nodes_domain_label_is_set_and_removed(policy: Policy) -> None:
    label = {names.COMPUTE_DOMAIN_LABEL: UID}
    assert update(policy, _node(), _node(**label)) == []
    assert update(policy, _node(**label), _node()) == []


def test_its_own_nodes_clique_label_is_set_changed_and_removed(policy: Policy) -> None:
    label = {names.GPU_CLIQUE_NODE_LABEL: CLIQUE}
    assert update(policy, _node(), _node(**label)) == []
    changed = {names.GPU_CLIQUE_NODE_LABEL: CLIQUE.replace(".0", ".7")}
    assert update(policy, _node(**label), _node(**changed)) == []
    assert update(policy, _node(**label), _node()) == []
    # With the domain label beside it, in one write.
    both = {**label, names.COMPUTE_DOMAIN_LABEL: UID}
    assert update(policy, _node(), _node(**both)) == []
    denied = update(policy, _node("gb-b"), _node("gb-b", **label))
    assert denied == ["the kubelet plugin on node gb-a may not modify node gb-b"]


def test_another_node_is_denied(policy: Policy) -> None:
    label = {names.COMPUTE_DOMAIN_LABEL: UID}
    denials = update(policy, _node("gb-b"), _node("gb-b", **label))
    assert denials == ["the kubelet plugin on node gb-a may not modify node gb-b"]
    assert update(policy, _node(), _node(**label), user_node=None)  # no node in the token


def test_any_other_change_is_denied(policy: Policy) -> None:
    other = _node(**{"team": "ml"})
    assert update(policy, _node(), other) == [
        "the kubelet plugin may change only the labels resource.nvidia.com/computeDomain and "
        "nvidia.com/gpu.clique of a Node"
    ]
    # A key next to the two is not one of them.
    assert update(policy, _node(), _node(**{"nvidia.com/gpu.clique.extra": "x"}))
    relabelled = _node()
    relabelled["metadata"]["labels"]["kubernetes.io/hostname"] = "x"
    assert update(policy, _node(), relabelled)
    tainted = _node()
    tainted["spec"]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    assert update(policy, _node(), tainted)
    annotated = _node()
    annotated["metadata"]["annotations"] = {"a": "b"}
    assert update(policy, _node(), annotated)


def test_other_users_are_not_matched(policy: Policy) -> None:
    assert update(policy, _node(), _node(team="ml"), user="system:node:gb-a") == []
