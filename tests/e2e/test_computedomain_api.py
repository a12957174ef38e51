"""The chart's ComputeDomain CRDs on a real kube-apiserver (level 1: no node, no driver).

Installed as Helm installs crds/, they serve NVIDIA's manifests (their demo's domain, AWS's
P6e-GB200 one) with NVIDIA's defaults, refuse a changed spec with NVIDIA's message, validate
status writes through the subresource, print our columns, and give every case of
tests/computedomain_cases.py the verdict the table says, which ``gpu-dra validate`` gives
offline too (tests/test_validate_computedomain.py): so validate and the server agree.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from tests import computedomain_cases
from tests.computedomain_cases import CASES, aws_nvbandwidth, channel_injection
from tests.e2e import build
from tests.e2e.cluster import ControlPlane, collection_path, run_root
from tests.e2e.test_validate_oracle import same_field, server_fields
from tools.validation import Check, Severity, parse_version, validate_sources

MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
CRDS = Path(__file__).resolve().parents[2] / "charts" / "gpu-dra-driver" / "crds"
DOMAINS = "/apis/resource.nvidia.com/v1beta1/namespaces/default/computedomains"

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]


def _established(cp: ControlPlane, name: str) -> bool:
    crd = cp.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = crd.get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[ControlPlane]:
    async with ControlPlane(run_root() / f"gpu-dra-e2e-cdapi-{MINOR}", MINOR) as cp:
        crds = [yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))]
        assert len(crds) == 2
        for crd in crds:
            cp.create(crd)
        for crd in crds:
            name = crd["metadata"]["name"]
            await cp.wait_for(f"{name} established", lambda n=name: _established(cp, n), 60)
        # Established is the CRD's condition; the discovery of the new group follows it.
        await cp.wait_for("computedomains served", lambda: cp.get(DOMAINS)[0] == 200, 60)
        yield cp


def _body(raw: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(raw) if raw else {}
    return decoded


async def test_nvidias_and_aws_domains_are_created_with_nvidias_defaults(
    cluster: ControlPlane,
) -> None:
    created = cluster.create(channel_injection())
    assert created["spec"] == {
        "numNodes": 1,
        "channel": {
            "resourceClaimTemplate": {"name": "imex-channel-0"},
            "allocationMode": "Single",
        },
    }
    assert "status" not in created  # the controller writes it; nothing defaults it on create
    aws = cluster.create(aws_nvbandwidth())
    assert aws["spec"]["numNodes"] == 0 and aws["spec"]["channel"]["allocationMode"] == "Single"
    bare = channel_injection()
    bare["metadata"]["name"] = "bare"
    del bare["spec"]["numNodes"]
    bare["spec"]["channel"]["allocationMode"] = None
    defaulted = cluster.create(bare)["spec"]
    assert (defaulted["numNodes"], defaulted["channel"]["allocationMode"]) == (0, "Single")


async def test_the_spec_is_immutable_with_nvidias_message(cluster: ControlPlane) -> None:
    cd = channel_injection()
    cd["metadata"]["name"] = "immutable"
    stored = cluster.create(cd)
    path = f"{DOMAINS}/immutable"
    for field, value in (("numNodes", 2), ("channel", {"resourceClaimTemplate": {"name": "b"}})):
        changed = json.loads(json.dumps(stored))
        changed["spec"][field] = value
        code, raw = cluster.raw("PUT", path, changed)
        body = _body(raw)
        assert code == 422, body
        causes = body["details"]["causes"]
        assert [c["field"] for c in causes] == ["spec"]
        assert "A computeDomain.spec is immutable" in causes[0]["message"]
    # What is not the spec still changes: a label on the object, and its status.
    labelled = json.loads(json.dumps(stored))
    labelled["metadata"]["labels"] = {"team": "ml"}
    updated = cluster.call("PUT", path, labelled)
    assert updated["metadata"]["labels"] == {"team": "ml"}
    updated["status"] = {
        "status": "Ready",
        "nodes": [{"name": "gb200-1", "ipAddress": "10.0.0.1", "cliqueID": "u.0", "index": 0}],
    }
    status = cluster.call("PUT", f"{path}/status", updated)["status"]
    assert status["nodes"][0]["status"] == "NotReady"  # the per-node default
    assert status["status"] == "Ready"
    # The main resource ignores status, the subresource ignores spec.
    again = cluster.call("GET", path)
    again["status"]["status"] = "NotReady"
    assert cluster.call("PUT", path, again)["status"]["status"] == "Ready"


async def test_status_writes_are_validated(cluster: ControlPlane) -> None:
    cd = channel_injection()
    cd["metadata"]["name"] = "status-checks"
    stored = cluster.create(cd)
    path = f"{DOMAINS}/status-checks/status"
    node = {"name": "gb200-1", "ipAddress": "10.0.0.1", "cliqueID": "u.0"}
    for status, field in (
        ({"status": "Up"}, "status.status"),
        ({"status": "Ready", "nodes": [{"name": "gb200-1"}]}, "status.nodes[0].ipAddress"),
        ({"status": "Ready", "nodes": [node, node]}, "status.nodes[1]"),
    ):
        code, raw = cluster.raw("PUT", path, {**stored, "status": status})
        body = _body(raw)
        assert code == 422, body
        assert any(c["field"].startswith(field) for c in body["details"]["causes"]), body


def _table(cluster: ControlPlane, path: str) -> dict[str, Any]:
    request = urllib.request.Request(cluster.server + path)
    request.add_header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    context: ssl.SSLContext = cluster.ssl_context()
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        table: dict[str, Any] = json.loads(answer.read())
    return table


async def test_kubectl_get_shows_status_and_nodes(cluster: ControlPlane) -> None:
    cd = aws_nvbandwidth()
    cd["metadata"]["name"] = "printed"
    cd["spec"]["numNodes"] = 2
    stored = cluster.create(cd)
    stored["status"] = {"status": "NotReady", "nodes": []}
    cluster.call("PUT", f"{DOMAINS}/printed/status", stored)
    table = _table(cluster, f"{DOMAINS}/printed")
    columns = [(c["name"], c["priority"]) for c in table["columnDefinitions"]]
    assert columns == [
        ("Name", 0),
        ("Status", 0),
        ("NumNodes", 0),
        ("Channel", 0),
        ("Mode", 1),
        ("Age", 0),
    ]
    (row,) = table["rows"]
    assert row["cells"][:5] == [
        "printed",
        "NotReady",
        2,
        "nvbandwidth-test-compute-domain-channel",
        "Single",
    ]


async def test_an_invalid_domain_is_refused_with_its_field(cluster: ControlPlane) -> None:
    cd = channel_injection()
    cd["metadata"]["name"] = "negative"
    cd["spec"]["numNodes"] = -1
    code, raw = cluster.raw("POST", collection_path(cd), cd)
    body = _body(raw)
    assert code == 422, body
    assert [c["field"] for c in body["details"]["causes"]] == ["spec.numNodes"]
    assert cluster.get(f"{DOMAINS}/negative")[0] == 404


def _verdict(cluster: ControlPlane, doc: dict[str, Any]) -> tuple[int, tuple[str, ...], str]:
    # kubectl apply's create: a dry run with unknown fields refused.
    # In a namespace of their own: the other tests' domains share some cases' names.
    path = collection_path(doc, "oracle") + "?dryRun=All&fieldValidation=Strict"
    code, raw = cluster.raw("POST", path, doc)
    body = _body(raw)
    return code, server_fields(code, body), str(body.get("message", ""))[:300]


async def test_validate_and_the_server_agree_on_every_case(cluster: ControlPlane) -> None:
    version = parse_version(MINOR)
    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "oracle"}})
    disagreements = []
    for case in CASES:
        code, fields, message = _verdict(cluster, case.doc)
        found = validate_sources([("case.yaml", json.dumps(case.doc))], version=version)
        ours = [p.path for p in found if p.severity is Severity.ERROR and p.check is Check.API]
        server_ok = code == 201
        table_ok = case.refused_at is None
        if server_ok != table_ok:
            disagreements.append(f"{case.name}: server {code} {fields} {message}")
            continue
        if case.refused_at is not None:
            # The server names the table's field, and validate names it or a field within.
            named = any(computedomain_cases.within(f, case.refused_at) for f in fields)
            if fields and not named:
                disagreements.append(f"{case.name}: server names {fields}: {message}")
            if not any(same_field(p, f) for p in ours for f in fields or (case.refused_at,)):
                disagreements.append(f"{case.name}: validate {ours}, server {fields}")
        elif ours:
            disagreements.append(f"{case.name}: accepted by the server, validate says {ours}")
    assert disagreements == [], "\n".join(disagreements)
    refused = sum(1 for c in CASES if c.refused_at)
    assert refused >= 25 and len(CASES) - refused >= 15
    # Nothing was stored: every request was a dry run.
    stored = cluster.call("GET", DOMAINS.replace("/default/", "/oracle/"))
    assert stored["items"] == []
