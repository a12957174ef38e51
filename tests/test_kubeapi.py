"""The one API client: each answer of a real HTTP API server becomes one error class."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from driver.common.errors import PermanentError, RetryableError
from driver.kube.resources import RESOURCE_SLICES
from driver.kube.rest import (
    ERROR_CLASSES,
    AdmissionRefusedError,
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
from driver.kube.session import Session
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


@pytest.mark.parametrize(
    "message",
    [
        "resourceclaims.resource.k8s.io \"c\" is forbidden: ValidatingAdmissionPolicy 'p' with "
        "binding 'b' denied request: only this node's devices",
        'admission webhook "check.example.com" denied the request: no',
    ],
)
async def test_an_admission_refusal_is_its_own_forbidden_class(
    api_client: Any, apiserver: LocalApiServer, message: str
) -> None:
    """RBAC and admission both answer 403; only the message tells them apart, and a caller
    that writes many objects must: a grant missing stops them all, a refusal only this one."""
    apiserver.faults.fail("list", "resourceslices", code=403, message=message)
    with pytest.raises(AdmissionRefusedError) as err:
        await Client(api_client).get_json(SLICES, resource="resourceslices")
    assert isinstance(err.value, ForbiddenError) and err.value.slow
    assert str(err.value) == f"refused by admission: cannot get resourceslices: {message}"
    apiserver.faults.fail("list", "resourceslices", code=403, message="no RBAC rule")
    with pytest.raises(ForbiddenError) as rbac:
        await Client(api_client).get_json(SLICES, resource="resourceslices")
    assert type(rbac.value) is ForbiddenError
    assert "grant the ClusterRole of this driver the verb 'get'" in str(rbac.value)
    assert {"AdmissionRefusedError", "ForbiddenError"} <= set(ERROR_CLASSES)


async def test_no_answer_is_unavailable_and_chained(apiserver: LocalApiServer) -> None:
    url = apiserver.url
    await apiserver.stop()
    async with Session(k8s.Configuration(host=url)) as api:
        with pytest.raises(UnavailableError) as err:
            await Client(api, request_timeout=2.0).get_json(SLICES, resource="resourceslices")
    assert err.value.status == 0
    assert "no answer from the API server" in str(err.value)
    assert err.value.__cause__ is not None


async def test_list_all_follows_continue_tokens(api_client: Any, apiserver: LocalApiServer) -> None:
    for index in range(7):
        apiserver.seed(slice_body("n1", name=f"s{index}"))
    items = await Client(api_client).list_all(RESOURCE_SLICES, limit=3)
    assert sorted(i["metadata"]["name"] for i in items) == [f"s{i}" for i in range(7)]
    assert apiserver.requests.count("list", "resourceslices") == 3


@pytest.fixture
async def small_pool(apiserver: LocalApiServer) -> AsyncIterator[Any]:
    """A client whose pool holds two connections."""
    configuration = k8s.Configuration(host=apiserver.url)
    configuration.connection_pool_maxsize = 2
    async with Session(configuration) as api:
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
