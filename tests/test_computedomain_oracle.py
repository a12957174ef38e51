"""Our controller's pure plan against what NVIDIA's controller created (the recorded fixture,
tests/computedomain_oracle.py): the same objects on every field the oracle compares, except the
deliberate differences, each listed once with its reason. The e2e tier
(tests/e2e/test_computedomain_oracle.py) holds the running controller to the same fixture."""

import uuid
from typing import Any

import pytest

from cluster.computedomain import plan
from cluster.computedomain.objects import DaemonSettings
from driver.common.wire import Obj
from drivers.computedomain import names
from tests import computedomain_oracle as oracle

FIXTURE = oracle.load()
RECORDED = FIXTURE["header"]["inputs"]
SETTINGS = DaemonSettings(namespace=RECORDED["driverNamespace"], image=RECORDED["image"])


def _domain(namespace: str, name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.COMPUTE_DOMAIN_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "resourceVersion": "1",
        },
        "spec": spec,
    }


def _planned() -> dict[str, Obj]:
    """What one plan per new domain creates and sets, normalized and keyed as the fixture."""
    out: dict[str, Obj] = {}
    uids: dict[str, str] = {}
    for namespace, name, spec in oracle.DOMAINS:
        domain = _domain(namespace, name, spec)
        uids[name] = domain["metadata"]["uid"]
        writes = plan.plan(uids[name], plan.Observed(domain=domain), SETTINGS)
        for write in writes:
            if write.verb == "create":
                assert write.body is not None
                out[oracle.key(write.body)] = write.body
            elif write.resource == plan.DOMAIN:
                assert write.body is not None
                domain["metadata"]["finalizers"] = write.body["metadata"]["finalizers"]
            elif write.resource == plan.DOMAIN_STATUS:
                assert write.body is not None
                domain["status"] = write.body["status"]
        del domain["metadata"]["resourceVersion"]
        out[oracle.key(domain)] = domain
    return {
        oracle.key(n): n
        for n in (
            oracle.normalize(
                o, uids=uids, namespace=RECORDED["driverNamespace"], image=RECORDED["image"]
            )
            for o in out.values()
        )
    }


PLANNED = _planned()


def test_the_fixture_was_recorded_for_these_domains() -> None:
    recorded = [(d["namespace"], d["name"], d["spec"]) for d in RECORDED["domains"]]
    assert recorded == list(oracle.DOMAINS)


def test_the_plan_creates_exactly_the_objects_nvidias_controller_created() -> None:
    assert sorted(PLANNED) == sorted(FIXTURE["created"])


@pytest.mark.parametrize("key", sorted(FIXTURE["created"]))
def test_each_object_equals_nvidias_but_for_the_deliberate_differences(key: str) -> None:
    nvidia = FIXTURE["created"][key]
    assert oracle.compared(PLANNED[key]) == oracle.expected_ours(nvidia)


def test_every_deliberate_difference_is_one() -> None:
    """A table entry whose value NVIDIA's objects already have is stale: it would hide nothing
    and claim a difference there is not."""
    kinds = {o["kind"]: o for o in FIXTURE["created"].values()}
    for (kind, field), (ours, why) in oracle.DELIBERATE.items():
        theirs: Any = oracle.compared(kinds[kind]).get(field, oracle.ABSENT)
        assert theirs != ours, f"{kind} {field}: not a difference ({why})"
        assert why


def test_nvidias_deletion_left_nothing_of_any_domain() -> None:
    assert FIXTURE["afterDelete"] == {name: [] for _, name, _ in oracle.DOMAINS}
