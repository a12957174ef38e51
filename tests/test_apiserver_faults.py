"""Fault injection, the request log, kubeconfig, the threaded runner and the module entry."""

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes
import pytest
from kubernetes.aio import client
from kubernetes.aio import config as aio_config

from driver.kube.session import Session
from sandbox.apiserver import LocalApiServer, ThreadedApiServer
from tests.test_apiserver import DRIVER, slice_body, status_of, typed_api

# The config loaders carry no annotations; bind them as Any once.
load_kube_config: Any = aio_config.load_kube_config
new_client_from_config: Any = kubernetes.config.new_client_from_config


async def test_next_n_requests_fail_with_a_status(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    apiserver.faults.fail("create", "resourceslices", code=500, times=2)
    for _ in range(2):
        with pytest.raises(client.ApiException) as err:
            await api.create_resource_slice(slice_body("n1", name="s1"))
        assert err.value.status == 500
        assert status_of(err.value)["reason"] == "InternalError"
    await api.create_resource_slice(slice_body("n1", name="s1"))  # the third one goes through
    assert [o["metadata"]["name"] for o in apiserver.objects("resourceslices")] == ["s1"]
    apiserver.faults.fail("get", "resource.k8s.io/resourceslices", "s1", code=429, retry_after=3)
    with pytest.raises(client.ApiException) as err:
        await api.read_resource_slice("s1")
    assert err.value.status == 429 and (err.value.headers or {})["Retry-After"] == "3"
    assert status_of(err.value)["details"] == {"retryAfterSeconds": 3}


async def test_latency(api_client: Any, apiserver: LocalApiServer) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    apiserver.faults.delay("list", "resourceslices", seconds=2.0, times=1)
    with pytest.raises(asyncio.TimeoutError):
        await api.list_resource_slice(_request_timeout=0.2)
    assert (await api.list_resource_slice(_request_timeout=5)).items == []


@pytest.mark.parametrize("mode", ["reset", "timeout"])
async def test_response_lost_after_commit(
    api_client: Any, apiserver: LocalApiServer, mode: str
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    apiserver.faults.drop_response("create", "resourceslices", mode=mode)
    with pytest.raises((aiohttp.ClientError, asyncio.TimeoutError)):
        await api.create_resource_slice(slice_body("n1"), _request_timeout=0.5)
    stored = apiserver.objects("resourceslices")
    assert len(stored) == 1  # the write committed even though the client never heard
    record = apiserver.requests.snapshot()[-1]
    assert (record.verb, record.dropped, record.name) == (
        "create",
        True,
        stored[0]["metadata"]["name"],
    )
    await api.create_resource_slice(slice_body("n1"))  # one drop only
    assert len(apiserver.objects("resourceslices")) == 2


async def test_resource_v1_not_served(api_client: Any, apiserver: LocalApiServer) -> None:
    apiserver.faults.serve_resource_v1 = False
    groups = await typed_api(client.ApisApi, api_client).get_api_versions()
    assert "resource.k8s.io" not in {g.name for g in groups.groups}
    with pytest.raises(client.ApiException) as err:
        await typed_api(client.ResourceV1Api, api_client).get_api_resources()
    assert err.value.status == 404
    with pytest.raises(client.ApiException) as err:
        await typed_api(client.ResourceV1Api, api_client).list_resource_slice()
    assert err.value.status == 404
    assert status_of(err.value)["message"] == "the server could not find the requested resource"
    apiserver.faults.clear()
    assert (await typed_api(client.ResourceV1Api, api_client).list_resource_slice()).items == []


async def test_a_1_33_server_lacks_resource_v1() -> None:
    server = LocalApiServer(version="1.33.4")
    await server.start()
    try:
        async with Session(client.Configuration(host=server.url)) as api_client:
            version = await typed_api(client.VersionApi, api_client).get_code()
            groups = await typed_api(client.ApisApi, api_client).get_api_versions()
            with pytest.raises(client.ApiException) as err:
                await typed_api(client.ResourceV1Api, api_client).list_resource_slice()
    finally:
        await server.stop()
    assert version.git_version == "v1.33.4"
    assert "resource.k8s.io" not in {g.name for g in groups.groups}
    assert err.value.status == 404


async def test_forbidden(api_client: Any, apiserver: LocalApiServer) -> None:
    apiserver.faults.forbid(
        "create", "resourceslices", user="system:serviceaccount:gpu:gpu-dra-driver"
    )
    with pytest.raises(client.ApiException) as err:
        await typed_api(client.ResourceV1Api, api_client).create_resource_slice(slice_body("n1"))
    body = status_of(err.value)
    assert (err.value.status, body["reason"]) == (403, "Forbidden")
    assert body["message"] == (
        "resourceslices.resource.k8s.io is forbidden: User "
        '"system:serviceaccount:gpu:gpu-dra-driver" cannot create resource "resourceslices" '
        'in API group "resource.k8s.io" at the cluster scope'
    )
    assert (await typed_api(client.ResourceV1Api, api_client).list_resource_slice()).items == []


async def test_request_log(api_client: Any, apiserver: LocalApiServer) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    apiserver.requests.clear()
    created = await api.create_resource_slice(slice_body("n1", name="s1"))
    await api.read_resource_slice("s1")
    await api.list_resource_slice(field_selector="spec.nodeName=n1")
    await api.patch_resource_slice("s1", {"metadata": {"labels": {"a": "b"}}})
    await api.delete_collection_resource_slice(field_selector=f"spec.driver={DRIVER}")
    await typed_api(client.ResourceV1Api, api_client).create_namespaced_resource_claim(
        "default", {"metadata": {"name": "c"}, "spec": {"devices": {"requests": []}}}
    )
    await api.patch_namespaced_resource_claim_status("c", "default", {"status": {}})
    with pytest.raises(client.ApiException):
        await api.read_resource_slice("missing")
    records = [(r.verb, r.resource, r.namespace, r.name, r.code) for r in apiserver.requests]
    assert records == [
        ("create", "resource.k8s.io/resourceslices", None, "s1", 201),
        ("get", "resource.k8s.io/resourceslices", None, "s1", 200),
        ("list", "resource.k8s.io/resourceslices", None, None, 200),
        ("patch", "resource.k8s.io/resourceslices", None, "s1", 200),
        ("deletecollection", "resource.k8s.io/resourceslices", None, None, 200),
        ("create", "resource.k8s.io/resourceclaims", "default", "c", 201),
        ("patch", "resource.k8s.io/resourceclaims/status", "default", "c", 200),
        ("get", "resource.k8s.io/resourceslices", None, "missing", 404),
    ]
    assert all(r.user_agent.startswith("OpenAPI-Generator/") for r in apiserver.requests)
    assert apiserver.requests.count("create") == 2
    assert apiserver.requests.count(resource="resourceslices") == 6
    assert apiserver.requests.count(resource="resourceclaims/status") == 1
    assert len(apiserver.requests.writes("resourceslices")) == 3
    assert apiserver.requests.permissions() == {
        ("resource.k8s.io", "resourceslices", verb)
        for verb in ("create", "get", "list", "patch", "deletecollection")
    } | {
        ("resource.k8s.io", "resourceclaims", "create"),
        ("resource.k8s.io", "resourceclaims/status", "patch"),
    }
    assert created.metadata.name == "s1"


async def test_kubeconfig_works_with_the_client_loader(
    apiserver: LocalApiServer, tmp_path: Path
) -> None:
    path = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = client.Configuration()
    await load_kube_config(config_file=str(path), client_configuration=configuration)
    assert configuration.host == apiserver.url
    async with Session(configuration) as api:
        await typed_api(client.CoreV1Api, api).create_node({"metadata": {"name": "n1"}})
    assert [o["metadata"]["name"] for o in apiserver.objects("nodes")] == ["n1"]


async def test_stopped_server_refuses_then_serves_the_same_objects(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    await api.create_resource_slice(slice_body("n1", name="s1"))
    port = apiserver.port
    await apiserver.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        await api.list_resource_slice(_request_timeout=2)
    await apiserver.start(port=port)
    listed = await api.list_resource_slice(_request_timeout=2)
    assert [s.metadata.name for s in listed.items] == ["s1"]


def test_threaded_runner_with_the_sync_client(tmp_path: Path) -> None:
    with ThreadedApiServer() as api:
        config = tmp_path / "kubeconfig"
        api.write_kubeconfig(config)
        sync_client = new_client_from_config(config_file=str(config))
        try:
            resource = typed_api(kubernetes.client.ResourceV1Api, sync_client)
            created = resource.create_resource_slice(slice_body("n1", name="s1"))
            assert created.spec.devices[0].capacity["memory"].value == "85520809984"
            api.faults.fail("get", "resourceslices", code=503)
            with pytest.raises(kubernetes.client.ApiException) as err:
                resource.read_resource_slice("s1")
            assert err.value.status == 503
        finally:
            sync_client.close()
        assert [o["metadata"]["name"] for o in api.objects("resourceslices")] == ["s1"]
        assert api.requests.count("create", "resourceslices") == 1
        assert threading.current_thread() is threading.main_thread()


def test_module_entry_prints_url_and_serves(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "sandbox.apiserver", "--port", "0", "--kubeconfig-out", str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        sync_client = new_client_from_config(config_file=str(config))
        try:
            version = typed_api(kubernetes.client.VersionApi, sync_client).get_code()
        finally:
            sync_client.close()
        assert version.git_version == "v1.34.0"
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
