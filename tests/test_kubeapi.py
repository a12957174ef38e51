"""The one API client: each answer of a real HTTP API server becomes one error class."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes.aio import client as k8s

from driver.common.errors import PermanentError, RetryableError
from driver.kube.rest import (
    COMPACT,
    ApiError,
    Client,
    ConflictError,
    ForbiddenError,
    GoneError,
    NotFoundError,
    RejectedError,
    ServerError,
    UnauthorizedError,
    UnavailableError,
)
from sandbox.apiserver import LocalApiServer
from tests.test_apiserver import slice_body

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.mark.parametrize(
    ("code", "cls", "retryable", "slow"),
    [
        (400, RejectedError, False, True),
        (401, UnauthorizedError, False, True),
        (403, ForbiddenError, False, True),
        (404, NotFoundError, False, False),
        (409, ConflictError, True, False),
        (410, GoneError, True, False),
        (418, RejectedError, False, True),
        (422, RejectedError, False, True),
        (429, ServerError, True, False),
        (500, ServerError, True, False),
        (503, ServerError, True, False),
    ],
)
async def test_every_status_has_one_class(
    api_client: Any,
    apiserver: LocalApiServer,
    code: int,
    cls: type[ApiError],
    retryable: bool,
    slow: bool,
) -> None:
    apiserver.faults.fail("list", "resourceslices", code=code, message=f"injected {code}")
    with pytest.raises(ApiError) as err:
        await Client(api_client).get_json(SLICES, resource="resourceslices")
    assert type(err.value) is cls
    assert isinstance(err.value, RetryableError) is retryable
    assert isinstance(err.value, PermanentError) is not retryable
    assert err.value.slow is slow
    assert err.value.status == code
    assert err.value.status_object["code"] == code  # the server's Status, for callers to read


async def test_no_answer_is_unavailable_and_chained(apiserver: LocalApiServer) -> None:
    url = apiserver.url
    await apiserver.stop()
    async with k8s.ApiClient(k8s.Configuration(host=url)) as api:
        with pytest.raises(UnavailableError) as err:
            await Client(api, request_timeout=2.0).get_json(SLICES, resource="resourceslices")
    assert err.value.status == 0
    assert "no answer from the API server" in str(err.value)
    assert err.value.__cause__ is not None


async def test_list_all_follows_continue_tokens(api_client: Any, apiserver: LocalApiServer) -> None:
    for index in range(7):
        apiserver.seed(slice_body("n1", name=f"s{index}"))
    items = await Client(api_client).list_all(SLICES, resource="resourceslices", limit=3)
    assert sorted(i["metadata"]["name"] for i in items) == [f"s{i}" for i in range(7)]
    assert apiserver.requests.count("list", "resourceslices") == 3


@pytest.fixture
async def small_pool(apiserver: LocalApiServer) -> AsyncIterator[Any]:
    """A client whose pool holds two connections."""
    configuration = k8s.Configuration(host=apiserver.url)
    configuration.connection_pool_maxsize = 2
    async with k8s.ApiClient(configuration) as api:
        yield api


async def test_budget_starts_when_a_connection_is_free(
    small_pool: Any, apiserver: LocalApiServer
) -> None:
    """Ten calls on a pool of two, each answered in 0.3 s with a budget of 1 s: the last
    ones wait 1.2 s for a connection, which must not count against their budget."""
    apiserver.seed(slice_body("n1", name="s"))
    apiserver.faults.delay("get", "resourceslices", seconds=0.3)
    api = Client(small_pool, request_timeout=1.0)
    results = await asyncio.gather(
        *(api.get_json(f"{SLICES}/s", resource="resourceslices") for _ in range(10)),
        return_exceptions=True,
    )
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == []
    assert apiserver.requests.count("get", "resourceslices") == 10


async def test_a_compact_body_goes_as_go_clients_send_it() -> None:
    """The API server keeps an opaque config's parameters as the bytes sent and compares them
    byte for byte; kubernetes.aio spaces every JSON body, so COMPACT must bypass it."""
    seen: list[tuple[str, bytes]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((request.content_type, await request.read()))
        return web.json_response({"kind": "ResourceClaimTemplate"}, status=201)

    app = web.Application()
    app.router.add_post("/t", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    body = {"spec": {"parameters": {"kind": "K", "apiVersion": "a/v1", "domainID": "d"}}}
    try:
        async with k8s.ApiClient(k8s.Configuration(host=f"http://127.0.0.1:{port}")) as api:
            client = Client(api)
            await client.request("POST", "/t", verb="create", resource="t", body=body)
            await client.request(
                "POST", "/t", verb="create", resource="t", body=body, content_type=COMPACT
            )
    finally:
        await runner.cleanup()
    spaced, compact = seen
    assert spaced == ("application/json", json.dumps(body).encode())  # what a patch can't keep
    assert compact == (
        "application/yaml",
        b'{"spec":{"parameters":{"apiVersion":"a/v1","domainID":"d","kind":"K"}}}',
    )
