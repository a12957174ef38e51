"""What the real API server refused in the e2e tier, the local one refuses too (422)."""

from typing import Any

import pytest

from driver.kube import client as kubeclient
from driver.kube.rest import ApiError, Client
from sandbox.apiserver import LocalApiServer

CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def _claim(exactly: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": exactly}]}},
    }


def _class(name: str, expression: str | None = None) -> dict[str, Any]:
    spec = {"selectors": [{"cel": {"expression": expression}}]} if expression else {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


CASES = {
    "a class named nvidia.com/gpu": (CLASSES, _class("nvidia.com/gpu"), "metadata.name"),
    "a request of count 0": (
        CLAIMS,
        _claim({"deviceClassName": "gpu.nvidia.com", "count": 0}),
        "spec.devices.requests[0].exactly.count",
    ),
    "a selector that does not compile": (
        CLASSES,
        _class("bad", 'device.attributes["gpu.nvidia.com"].x == '),
        "spec.selectors[0].cel.expression",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_refused_like_the_real_server(case: str, tmp_path: Any) -> None:
    path, body, field = CASES[case]
    async with LocalApiServer() as server:
        api = await kubeclient.api_client(server.write_kubeconfig(tmp_path / "kc"), component="t")
        try:
            with pytest.raises(ApiError) as caught:
                await Client(api).request("POST", path, verb="create", resource="x", body=body)
        finally:
            await kubeclient.close(api)
    assert caught.value.status == 422
    assert field in str(caught.value.status_object.get("message", ""))


async def test_selectors_it_compiles_and_kubernetes_only_syntax_are_taken(tmp_path: Any) -> None:
    async with LocalApiServer() as server:
        api = await kubeclient.api_client(server.write_kubeconfig(tmp_path / "kc"), component="t")
        try:
            for name, expression in (
                ("ok", 'device.driver == "gpu.nvidia.com"'),
                ("optional", 'device.attributes["gpu.nvidia.com"].?productName.orValue("") != ""'),
            ):
                body = _class(name, expression)
                await Client(api).request("POST", CLASSES, verb="create", resource="x", body=body)
        finally:
            await kubeclient.close(api)
