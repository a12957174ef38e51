"""The local API server through the real ``kubernetes.aio`` client: CRUD and its errors."""

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client

from sandbox.apiserver import LocalApiServer, ThreadedApiServer

DRIVER = "gpu.nvidia.com"


def node_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def slice_body(
    node: str,
    *,
    name: str | None = None,
    node_uid: str | None = None,
    devices: int = 2,
    memory: str = "85520809984",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} if name else {"generateName": f"{node}-{DRIVER}-"}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"index": {"int": i}},
                    "capacity": {"memory": {"value": memory}},
                }
                for i in range(devices)
            ],
        },
    }


def claim_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "capacity": {"requests": {"memory": "1.5Gi"}},
                        },
                    }
                ]
            }
        },
    }


def typed_api(api_class: Any, api_client: Any) -> Any:
    """A client API object typed Any: tests pass plain dicts, which the client accepts."""
    return api_class(api_client)


def status_of(exc: client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(str(exc.body))
    return body


async def test_discovery_and_version(api_client: Any) -> None:
    version = await typed_api(client.VersionApi, api_client).get_code()
    assert (version.major, version.minor) == ("1", "34")
    groups = await typed_api(client.ApisApi, api_client).get_api_versions()
    names = {g.name: [v.version for v in g.versions] for g in groups.groups}
    assert names["resource.k8s.io"] == ["v1"] and names["coordination.k8s.io"] == ["v1"]
    resources = await typed_api(client.ResourceV1Api, api_client).get_api_resources()
    served = {r.name: r for r in resources.resources}
    assert set(served) >= {
        "resourceslices",
        "resourceclaims",
        "resourceclaims/status",
        "resourceclaimtemplates",
        "deviceclasses",
    }
    assert served["resourceslices"].namespaced is False
    assert served["resourceclaims"].namespaced is True
    core = await typed_api(client.CoreV1Api, api_client).get_api_resources()
    assert {"nodes", "pods", "namespaces"} <= {r.name for r in core.resources}


async def test_create_get_list_update_delete(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    created = await api.create_resource_slice(slice_body("n1"))
    name = created.metadata.name
    assert name.startswith(f"n1-{DRIVER}-") and len(name) == len(f"n1-{DRIVER}-") + 5
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.generation == 1
    got = await api.read_resource_slice(name)
    assert got.metadata.resource_version == created.metadata.resource_version
    got.spec.pool.generation = 2
    updated = await api.replace_resource_slice(name, got)
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    assert updated.metadata.generation == 2 and updated.metadata.uid == created.metadata.uid
    # An identical write is a no-op: same resourceVersion, as the real server does.
    again = await api.replace_resource_slice(name, updated)
    assert again.metadata.resource_version == updated.metadata.resource_version
    patched = await api.patch_resource_slice(name, {"metadata": {"labels": {"a": "b"}}})
    assert patched.metadata.labels == {"a": "b"} and patched.metadata.generation == 2
    listed = await api.list_resource_slice()
    assert [s.metadata.name for s in listed.items] == [name]
    assert int(listed.metadata.resource_version) >= int(patched.metadata.resource_version)
    deleted = await api.delete_resource_slice(name)
    assert deleted.metadata.name == name
    with pytest.raises(client.ApiException) as err:
        await api.read_resource_slice(name)
    assert err.value.status == 404
    assert status_of(err.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'resourceslices.resource.k8s.io "{name}" not found',
        "reason": "NotFound",
        "details": {"name": name, "group": "resource.k8s.io", "kind": "resourceslices"},
        "code": 404,
    }


async def test_already_exists_and_conflict(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    first = await api.create_resource_slice(slice_body("n1", name="s1"))
    with pytest.raises(client.ApiException) as err:
        await api.create_resource_slice(slice_body("n1", name="s1"))
    assert err.value.status == 409
    assert status_of(err.value)["reason"] == "AlreadyExists"
    assert status_of(err.value)["message"] == 'resourceslices.resource.k8s.io "s1" already exists'
    await api.patch_resource_slice("s1", {"metadata": {"labels": {"x": "1"}}})
    stale = slice_body("n1", name="s1")
    stale["metadata"]["resourceVersion"] = first.metadata.resource_version
    with pytest.raises(client.ApiException) as err:
        await api.replace_resource_slice("s1", stale)
    body = status_of(err.value)
    assert (err.value.status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )
    # A merge patch that carries a stale resourceVersion is a precondition too.
    with pytest.raises(client.ApiException) as err:
        await api.patch_resource_slice(
            "s1", {"metadata": {"resourceVersion": first.metadata.resource_version}}
        )
    assert err.value.status == 409


async def test_invalid_objects_get_422_and_nothing_is_stored(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    bad_type = slice_body("n1", name="bad")
    bad_type["spec"]["pool"]["generation"] = "one"
    # The client's own models refuse this body, so it goes over plain HTTP.
    async with aiohttp.ClientSession() as http:
        response = await http.post(
            f"{apiserver.url}/apis/resource.k8s.io/v1/resourceslices", json=bad_type
        )
        body = await response.json()
    assert (response.status, body["reason"], body["details"]["kind"]) == (
        422,
        "Invalid",
        "ResourceSlice",
    )
    assert body["message"].startswith('ResourceSlice.resource.k8s.io "bad" is invalid: ')
    assert body["details"]["causes"][0]["field"] == "spec.pool.generation"
    # Rules the schema does not carry (driver.common.limits): two node selections.
    both = slice_body("n1", name="both")
    both["spec"]["allNodes"] = True
    with pytest.raises(client.ApiException) as err:
        await api.create_resource_slice(both)
    assert err.value.status == 422
    bad_name = slice_body("n1", name="Not_A_Name")
    with pytest.raises(client.ApiException) as err:
        await api.create_resource_slice(bad_name)
    assert status_of(err.value)["details"]["causes"][0]["field"] == "metadata.name"
    bad_label = slice_body("n1", name="labelled")
    bad_label["metadata"]["labels"] = {"example.com/ok": "not ok!"}
    with pytest.raises(client.ApiException) as err:
        await api.create_resource_slice(bad_label)
    cause = status_of(err.value)["details"]["causes"][0]
    assert cause["field"] == "metadata.labels"
    assert cause["message"].startswith('Invalid value: "not ok!": a valid label must be')
    assert apiserver.objects("resourceslices") == []


async def test_immutable_slice_fields(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    await api.create_resource_slice(slice_body("n1", name="s1"))
    for field, value in (("driver", "other.example.com"), ("nodeName", "n2")):
        with pytest.raises(client.ApiException) as err:
            await api.patch_resource_slice("s1", {"spec": {field: value}})
        body = status_of(err.value)
        assert (err.value.status, body["reason"]) == (422, "Invalid")
        assert body["message"] == (
            f'ResourceSlice.resource.k8s.io "s1" is invalid: spec.{field}: Invalid value: '
            f'"{value}": field is immutable'
        )
    with pytest.raises(client.ApiException) as err:
        await api.patch_resource_slice("s1", {"spec": {"pool": {"name": "other"}}})
    assert status_of(err.value)["details"]["causes"][0]["field"] == "spec.pool.name"


async def test_unknown_fields_dropped_with_warning_or_rejected_when_strict(
    apiserver: LocalApiServer,
) -> None:
    # The client's models refuse unknown fields, so this goes over plain HTTP.
    body = slice_body("n1", name="s1")
    body["spec"]["bogus"] = 1
    url = f"{apiserver.url}/apis/resource.k8s.io/v1/resourceslices"
    async with aiohttp.ClientSession() as http:
        strict = await http.post(url, json=body, params={"fieldValidation": "Strict"})
        assert strict.status == 400
        assert 'unknown field "spec.bogus"' in (await strict.json())["message"]
        lenient = await http.post(url, json=body)
        assert lenient.status == 201
        assert lenient.headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
    assert "bogus" not in apiserver.objects("resourceslices")[0]["spec"]


async def test_quantities_are_canonicalized(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    created = await api.create_resource_slice(slice_body("n1", name="s1", memory="1.5Gi"))
    assert created.spec.devices[0].capacity["memory"].value == "1536Mi"
    plain = await api.create_resource_slice(slice_body("n2", name="s2", memory="2048000"))
    assert plain.spec.devices[0].capacity["memory"].value == "2048k"
    with pytest.raises(client.ApiException) as err:
        await api.create_resource_slice(slice_body("n3", name="s3", memory="12XB"))
    assert err.value.status == 400
    claims = typed_api(client.ResourceV1Api, api_client)
    claim = await claims.create_namespaced_resource_claim("default", claim_body("c1"))
    assert claim.spec.devices.requests[0].exactly.capacity.requests == {"memory": "1536Mi"}


async def test_create_with_a_resource_version_is_refused(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    body = slice_body("n1", name="s1")
    body["metadata"]["resourceVersion"] = "7"  # e.g. re-creating an object read earlier
    with pytest.raises(client.ApiException) as err:
        await typed_api(client.ResourceV1Api, api_client).create_resource_slice(body)
    assert (err.value.status, status_of(err.value)["reason"]) == (500, "InternalError")
    assert status_of(err.value)["message"] == (
        "Internal error occurred: resourceVersion should not be set on objects to be created"
    )
    assert apiserver.objects("resourceslices") == []


async def test_generate_name_and_namespaces(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    names = {(await api.create_resource_slice(slice_body("n1"))).metadata.name for _ in range(5)}
    assert len(names) == 5
    with pytest.raises(client.ApiException) as err:
        await api.create_namespaced_resource_claim("missing", claim_body("c1"))
    assert err.value.status == 404
    assert status_of(err.value)["message"] == 'namespaces "missing" not found'
    core = typed_api(client.CoreV1Api, api_client)
    await core.create_namespace({"metadata": {"name": "team"}})
    claim = await api.create_namespaced_resource_claim("team", claim_body("c1"))
    assert claim.metadata.namespace == "team"
    other = await api.list_resource_claim_for_all_namespaces()
    assert [(c.metadata.namespace, c.metadata.name) for c in other.items] == [("team", "c1")]


async def test_claim_status_subresource(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    claim = claim_body("c1")
    claim["status"] = {"allocation": {"devices": {"results": []}}}
    created = await api.create_namespaced_resource_claim("default", claim)
    assert created.status is None  # status is dropped on create
    allocation = {
        "devices": {
            "results": [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
        }
    }
    with_status = await api.patch_namespaced_resource_claim_status(
        "c1",
        "default",
        {"status": {"allocation": allocation}, "metadata": {"labels": {"ignored": "yes"}}},
    )
    assert with_status.status.allocation.devices.results[0].device == "gpu-0"
    assert with_status.metadata.labels is None  # status writes touch status only
    assert with_status.metadata.generation == 1
    # A main-resource write keeps the status it did not send.
    labelled = await api.patch_namespaced_resource_claim(
        "c1", "default", {"metadata": {"labels": {"a": "b"}}, "status": None}
    )
    assert labelled.status.allocation.devices.results[0].device == "gpu-0"
    # The claim spec is immutable.
    with pytest.raises(client.ApiException) as err:
        await api.patch_namespaced_resource_claim(
            "c1",
            "default",
            {
                "spec": {
                    "devices": {
                        "requests": [{"name": "other", "exactly": {"deviceClassName": "x"}}]
                    }
                }
            },
        )
    assert (err.value.status, status_of(err.value)["details"]["causes"][0]["field"]) == (
        422,
        "spec",
    )


async def test_delete_preconditions(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    created = await api.create_resource_slice(slice_body("n1", name="s1"))
    for pre in ({"uid": "not-the-uid"}, {"resourceVersion": "1"}):
        with pytest.raises(client.ApiException) as err:
            await api.delete_resource_slice("s1", body={"preconditions": pre})
        body = status_of(err.value)
        assert (err.value.status, body["reason"]) == (409, "Conflict")
        assert "Precondition failed" in body["message"]
    await api.delete_resource_slice(
        "s1",
        body={
            "preconditions": {
                "uid": created.metadata.uid,
                "resourceVersion": created.metadata.resource_version,
            }
        },
    )
    assert (await api.list_resource_slice()).items == []


async def test_delete_collection_by_field_selector(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    for node in ("n1", "n2"):
        await api.create_resource_slice(slice_body(node, name=f"{node}-a"))
    other_driver = slice_body("n1", name="n1-other")
    other_driver["spec"]["driver"] = "other.example.com"
    await api.create_resource_slice(other_driver)
    # What the kubelet sends when it wipes a driver's slices for its node.
    await api.delete_collection_resource_slice(
        field_selector=f"spec.nodeName=n1,spec.driver={DRIVER}"
    )
    left = sorted(o["metadata"]["name"] for o in apiserver.objects("resourceslices"))
    assert left == ["n1-other", "n2-a"]


async def test_selectors(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    for i, (node, tier) in enumerate((("n1", "a"), ("n2", "b"), ("n3", "c"))):
        body = slice_body(node, name=f"s{i}")
        body["metadata"]["labels"] = {"tier": tier} if tier != "c" else {"other": "x"}
        await api.create_resource_slice(body)

    async def names(**kwargs: str) -> list[str]:
        return [s.metadata.name for s in (await api.list_resource_slice(**kwargs)).items]

    assert await names(field_selector="spec.nodeName=n2") == ["s1"]
    assert await names(field_selector="spec.nodeName!=n2") == ["s0", "s2"]
    assert await names(field_selector=f"spec.driver={DRIVER},metadata.name=s2") == ["s2"]
    assert await names(label_selector="tier=a") == ["s0"]
    assert await names(label_selector="tier!=a") == ["s1", "s2"]
    assert await names(label_selector="tier in (a, b)") == ["s0", "s1"]
    assert await names(label_selector="tier notin (a)") == ["s1", "s2"]
    assert await names(label_selector="tier") == ["s0", "s1"]
    assert await names(label_selector="!tier") == ["s2"]
    with pytest.raises(client.ApiException) as err:
        await names(field_selector="spec.pool.name=n1")
    assert err.value.status == 400
    assert status_of(err.value)["message"] == "field label not supported: spec.pool.name"


async def test_list_pagination(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    for i in range(5):
        await api.create_resource_slice(slice_body("n1", name=f"s{i}"))
    first = await api.list_resource_slice(limit=2)
    assert [s.metadata.name for s in first.items] == ["s0", "s1"]
    assert first.metadata.remaining_item_count == 3
    rest = await api.list_resource_slice(limit=10, _continue=first.metadata._continue)
    assert [s.metadata.name for s in rest.items] == ["s2", "s3", "s4"]


async def test_node_deletion_collects_owned_slices(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    core, api = typed_api(client.CoreV1Api, api_client), typed_api(client.ResourceV1Api, api_client)
    n1 = await core.create_node(node_body("n1"))
    n2 = await core.create_node(node_body("n2"))
    await api.create_resource_slice(slice_body("n1", name="a", node_uid=n1.metadata.uid))
    await api.create_resource_slice(slice_body("n2", name="b", node_uid=n2.metadata.uid))
    await api.create_resource_slice(slice_body("n1", name="unowned"))
    await core.delete_node("n1")
    left = sorted(o["metadata"]["name"] for o in apiserver.objects("resourceslices"))
    assert left == ["b", "unowned"]


async def test_leases_and_pods(api_client: Any) -> None:
    coordination = typed_api(client.CoordinationV1Api, api_client)
    lease = await coordination.create_namespaced_lease(
        "kube-node-lease",
        {"metadata": {"name": "n1"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}},
    )
    lease.spec.holder_identity = "b"
    updated = await coordination.replace_namespaced_lease("n1", "kube-node-lease", lease)
    assert updated.spec.holder_identity == "b"
    lease.spec.holder_identity = "c"  # still carries the old resourceVersion
    with pytest.raises(client.ApiException) as err:
        await coordination.replace_namespaced_lease("n1", "kube-node-lease", lease)
    assert err.value.status == 409
    core = typed_api(client.CoreV1Api, api_client)
    pod = await core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "p"},
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": "c", "image": "x", "resources": {"requests": {"memory": "1073741824"}}}
                ],
            },
        },
    )
    assert pod.status.phase == "Pending"
    pods = await core.list_namespaced_pod("default", field_selector="spec.nodeName=n1")
    assert [p.metadata.name for p in pods.items] == ["p"]


async def test_json_patch(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    await api.create_resource_slice(slice_body("n1", name="s1", devices=3))
    patched = await api.patch_resource_slice(
        "s1",
        [
            {"op": "test", "path": "/spec/pool/generation", "value": 1},
            {"op": "replace", "path": "/spec/pool/generation", "value": 2},
            {"op": "remove", "path": "/spec/devices/1"},
        ],
    )
    assert patched.spec.pool.generation == 2
    assert [d.name for d in patched.spec.devices] == ["gpu-0", "gpu-2"]
    with pytest.raises(client.ApiException) as err:
        await api.patch_resource_slice(
            "s1", [{"op": "test", "path": "/spec/pool/generation", "value": 1}]
        )
    assert err.value.status == 422


async def test_dry_run_is_answered_or_refused_never_committed(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    answered = await api.create_resource_slice(slice_body("n1", name="s1"), dry_run="All")
    assert answered.metadata.name == "s1"
    assert apiserver.objects("resourceslices") == []
    await api.create_resource_slice(slice_body("n1", name="s1"))
    # Not served on delete: refused, since ignoring it would commit what was meant as a try.
    with pytest.raises(client.ApiException) as err:
        await api.delete_resource_slice("s1", dry_run="All")
    assert err.value.status == 400
    assert len(apiserver.objects("resourceslices")) == 1


async def test_finalizers_delay_deletion(api_client: Any, apiserver: LocalApiServer) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    claim = claim_body("c1")
    claim["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    await api.create_namespaced_resource_claim("default", claim)
    marked = await api.delete_namespaced_resource_claim("c1", "default")
    assert marked.metadata.deletion_timestamp is not None
    still = await api.read_namespaced_resource_claim("c1", "default")
    assert still.metadata.finalizers == ["resource.kubernetes.io/delete-protection"]
    await api.patch_namespaced_resource_claim("c1", "default", {"metadata": {"finalizers": None}})
    assert apiserver.objects("resourceclaims") == []


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_kubectl_accepts_the_kubeconfig(tmp_path: Path) -> None:
    with ThreadedApiServer() as api:
        api.put(slice_body("n1", name="s1", memory="1.5Gi"))
        config = api.write_kubeconfig(tmp_path / "kubeconfig")
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(config), "get", "resourceslices", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    items = json.loads(result.stdout)["items"]
    assert [i["metadata"]["name"] for i in items] == ["s1"]
