"""The ComputeDomain stack's admission policies, evaluated with the official CEL runtime as
tests/test_chart_policy.py does the plugin's: the IMEX daemon DeviceClass only from the driver's
namespace, and the IMEX daemons' own pod and clique entry as all a daemon may write."""

from typing import Any

import pytest
from cel_expr_python import cel

from cluster.computedomain.objects import daemon_template, workload_template
from drivers.computedomain import names
from tests.chart_render import NAMESPACE, render
from tests.computedomains import SETTINGS, domain

UID = "3b1c6a4e-8f2d-4c1a-9e7b-5d0f2a6c8e11"
_ENV = cel.NewEnv(
    variables={name: cel.Type.DYN for name in ("request", "object", "oldObject", "variables")}
)


def policy(suffix: str) -> dict[str, Any]:
    (found,) = [
        o
        for o in render((), ("computeDomains.enabled=true",))
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith(suffix)
    ]
    spec: dict[str, Any] = found["spec"]
    return spec


def evaluate(
    spec: dict[str, Any],
    *,
    operation: str,
    resource: str,
    namespace: str,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    user: str = "system:serviceaccount:team-b:default",
    extra: dict[str, list[str]] | None = None,
) -> list[str]:
    """The denials of one request as the API server's admission plugin would give them;
    [] when admitted or not matched (the match constraints' resources are checked too)."""
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(resource in r["resources"] and operation in r["operations"] for r in rules):
        return []
    data: dict[str, Any] = {
        "request": {
            "operation": operation,
            "namespace": namespace,
            "name": str(((obj or old or {}).get("metadata") or {}).get("name", "")),
            "resource": {"resource": resource},
            "userInfo": {"username": user, "extra": extra or {}},
        },
        "object": obj,
        "oldObject": old,
        "variables": {},
    }

    def run(expression: str) -> Any:
        return _ENV.compile(expression).eval(data=data).plain_value()

    for variable in spec.get("variables", ()):
        data["variables"][variable["name"]] = run(variable["expression"])
    if not all(run(c["expression"]) for c in spec.get("matchConditions", ())):
        return []
    return [
        str(run(v["messageExpression"]))
        if "messageExpression" in v
        else " ".join(v["message"].split())
        for v in spec["validations"]
        if run(v["expression"]) is not True
    ]


# -- the IMEX daemon DeviceClass ---------------------------------------------------------


@pytest.fixture(scope="module")
def daemon_class() -> dict[str, Any]:
    return policy("-compute-domain-daemon-class")


def _in(template: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**template, "metadata": {**template["metadata"], "namespace": namespace}}


def _claim(request: dict[str, Any], namespace: str = "team-b") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "steal", "namespace": namespace},
        "spec": {"devices": {"requests": [request]}},
    }


def _class_denials(spec: dict[str, Any], obj: dict[str, Any], resource: str) -> list[str]:
    return evaluate(
        spec, operation="CREATE", resource=resource, namespace=obj["metadata"]["namespace"], obj=obj
    )


def test_the_controllers_daemon_template_and_claims_are_admitted(
    daemon_class: dict[str, Any],
) -> None:
    cd = domain(uid=UID)
    template = _in(daemon_template(cd, SETTINGS), NAMESPACE)
    assert _class_denials(daemon_class, template, "resourceclaimtemplates") == []
    claim = _claim(
        {"name": "daemon", "exactly": {"deviceClassName": names.DAEMON_CLASS}}, NAMESPACE
    )
    assert _class_denials(daemon_class, claim, "resourceclaims") == []
    # A workload's channel template, in the domain's namespace, is none of this policy's.
    assert _class_denials(daemon_class, workload_template(cd), "resourceclaimtemplates") == []


def test_a_tenants_claim_or_template_for_the_daemon_class_is_denied(
    daemon_class: dict[str, Any],
) -> None:
    cd = domain(uid=UID)
    message = (
        f"the DeviceClass {names.DAEMON_CLASS} is the IMEX daemons' own: only a claim in the "
        f"driver's namespace ({NAMESPACE}) may request it, not one in team-b"
    )
    template = _in(daemon_template(cd, SETTINGS), "team-b")
    assert _class_denials(daemon_class, template, "resourceclaimtemplates") == [message]
    exactly = {"name": "d", "exactly": {"deviceClassName": names.DAEMON_CLASS}}
    assert _class_denials(daemon_class, _claim(exactly), "resourceclaims") == [message]
    # Hidden among a request's alternatives.
    first = {
        "name": "d",
        "firstAvailable": [
            {"name": "gpu", "deviceClassName": "gpu.nvidia.com"},
            {"name": "imex", "deviceClassName": names.DAEMON_CLASS},
        ],
    }
    assert _class_denials(daemon_class, _claim(first), "resourceclaims") == [message]
    channel = {"name": "c", "exactly": {"deviceClassName": names.DEFAULT_CHANNEL_CLASS}}
    assert _class_denials(daemon_class, _claim(channel), "resourceclaims") == []
