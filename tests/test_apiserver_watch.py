"""Watch streams from the local API server, read by the real ``kubernetes.aio`` Watch."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client, watch

from sandbox.apiserver import LocalApiServer
from tests.test_apiserver import DRIVER, slice_body, typed_api

Watch: Any = watch.Watch  # the client's Watch carries no annotations
WAIT = 5.0  # seconds: an upper bound on waiting for a condition, never a sleep


async def next_event(
    events: AsyncIterator[dict[str, Any]], *, skip_bookmarks: bool = True
) -> dict[str, Any]:
    while True:
        event = await asyncio.wait_for(anext(events), WAIT)
        if not (skip_bookmarks and event["type"] == "BOOKMARK"):
            return event


async def test_list_then_watch_sees_each_change_once_filtered(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    await api.create_resource_slice(slice_body("n1", name="before"))
    listed = await api.list_resource_slice(field_selector="spec.nodeName=n1")
    w = Watch()
    events = w.stream(
        api.list_resource_slice,
        field_selector=f"spec.nodeName=n1,spec.driver={DRIVER}",
        resource_version=listed.metadata.resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=30,
    )
    try:
        await api.create_resource_slice(slice_body("n2", name="elsewhere"))
        await api.create_resource_slice(slice_body("n1", name="after"))
        await api.patch_resource_slice("after", {"metadata": {"labels": {"x": "1"}}})
        await api.delete_resource_slice("before")
        seen = [await next_event(events) for _ in range(3)]
    finally:
        await w.close()
    assert [(e["type"], e["object"].metadata.name) for e in seen] == [
        ("ADDED", "after"),
        ("MODIFIED", "after"),
        ("DELETED", "before"),
    ]
    assert seen[1]["object"].metadata.labels == {"x": "1"}
    rvs = [int(e["object"].metadata.resource_version) for e in seen]
    assert rvs == sorted(rvs) and rvs[0] > int(listed.metadata.resource_version)


async def test_watch_without_resource_version_starts_with_current_objects(
    api_client: Any,
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    await api.create_resource_slice(slice_body("n1", name="a"))
    w = Watch()
    events = w.stream(api.list_resource_slice, timeout_seconds=30)
    try:
        first = await next_event(events)
    finally:
        await w.close()
    assert (first["type"], first["object"].metadata.name) == ("ADDED", "a")


async def test_bookmarks_carry_progress_past_filtered_events(api_client: Any) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    listed = await api.list_resource_slice()
    w = Watch()
    events = w.stream(
        api.list_resource_slice,
        field_selector="spec.nodeName=n1",
        resource_version=listed.metadata.resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=30,
    )
    try:
        await api.create_resource_slice(slice_body("n1", name="a"))
        added = await next_event(events)
        other = await api.create_resource_slice(slice_body("n2", name="b"))
        while True:  # bookmarks until one covers the change this watcher does not see
            bookmark = await next_event(events, skip_bookmarks=False)
            assert bookmark["type"] == "BOOKMARK"
            progress = int(bookmark["raw_object"]["metadata"]["resourceVersion"])
            if progress >= int(other.metadata.resource_version):
                break
    finally:
        await w.close()
    assert bookmark["raw_object"]["kind"] == "ResourceSlice"
    assert progress > int(added["object"].metadata.resource_version)


async def test_label_change_out_of_selector_is_a_delete_for_that_watcher(
    api_client: Any,
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    body = slice_body("n1", name="a")
    body["metadata"]["labels"] = {"team": "x"}
    await api.create_resource_slice(body)
    listed = await api.list_resource_slice(label_selector="team=x")
    w = Watch()
    events = w.stream(
        api.list_resource_slice,
        label_selector="team=x",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=30,
    )
    try:
        await api.patch_resource_slice("a", {"metadata": {"labels": {"team": "y"}}})
        await api.patch_resource_slice("a", {"metadata": {"labels": {"team": "x"}}})
        seen = [(await next_event(events))["type"] for _ in range(2)]
    finally:
        await w.close()
    assert seen == ["DELETED", "ADDED"]


async def test_too_old_resource_version_is_410_expired(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    listed = await api.list_resource_slice()
    await api.create_resource_slice(slice_body("n1", name="a"))
    apiserver.compact()
    w = Watch()
    events = w.stream(
        api.list_resource_slice,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=30,
    )
    with pytest.raises(client.ApiException) as err:
        await next_event(events)
    await w.close()
    assert err.value.status == 410
    assert err.value.reason.startswith("Expired: too old resource version: ")


async def test_bounded_history_expires_old_versions() -> None:
    server = LocalApiServer(history_limit=3)
    await server.start()
    try:
        start = server.store.rv
        for i in range(5):
            server.put(slice_body("n1", name=f"s{i}"))
        url = f"{server.url}/apis/resource.k8s.io/v1/resourceslices"
        async with aiohttp.ClientSession() as http:
            response = await http.get(
                url, params={"watch": "true", "resourceVersion": str(start), "timeoutSeconds": "5"}
            )
            line = await asyncio.wait_for(response.content.readline(), WAIT)
    finally:
        await server.stop()
    event = json.loads(line)
    assert event["type"] == "ERROR"
    assert event["object"] == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {start} ({start + 2})",
        "reason": "Expired",
        "code": 410,
    }


async def test_initial_events_end_bookmark(apiserver: LocalApiServer) -> None:
    apiserver.put(slice_body("n1", name="a"))
    url = f"{apiserver.url}/apis/resource.k8s.io/v1/resourceslices"
    params = {
        "watch": "true",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan",
        "timeoutSeconds": "5",
    }
    async with aiohttp.ClientSession() as http:
        response = await http.get(url, params=params)
        lines = [await asyncio.wait_for(response.content.readline(), WAIT) for _ in range(2)]
    added, bookmark = (json.loads(line) for line in lines)
    assert added["type"] == "ADDED"
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_dropped_watches_end_and_the_client_can_resume(
    api_client: Any, apiserver: LocalApiServer
) -> None:
    api = typed_api(client.ResourceV1Api, api_client)
    listed = await api.list_resource_slice()
    w = Watch()
    events = w.stream(
        api.list_resource_slice,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=60,
    )
    await api.create_resource_slice(slice_body("n1", name="a"))
    first = await next_event(events)
    apiserver.faults.drop_watches()
    with pytest.raises(StopAsyncIteration):
        await next_event(events)  # the server ended the stream long before 60 s
    await w.close()
    assert apiserver.open_watches() == 0
    # Resuming from the last seen resourceVersion loses nothing.
    await api.create_resource_slice(slice_body("n1", name="b"))
    w = Watch()
    events = w.stream(
        api.list_resource_slice,
        resource_version=first["object"].metadata.resource_version,
        timeout_seconds=30,
    )
    try:
        resumed = await next_event(events)
    finally:
        await w.close()
    assert resumed["object"].metadata.name == "b"


async def test_watch_of_one_object(apiserver: LocalApiServer) -> None:
    apiserver.put(slice_body("n1", name="a"))
    apiserver.put(slice_body("n1", name="b"))
    url = f"{apiserver.url}/apis/resource.k8s.io/v1/resourceslices/b"
    async with aiohttp.ClientSession() as http:
        response = await http.get(url, params={"watch": "true", "timeoutSeconds": "5"})
        line = await asyncio.wait_for(response.content.readline(), WAIT)
    event = json.loads(line)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "b")
    assert apiserver.requests.snapshot()[-1].verb == "watch"


async def test_a_client_that_goes_away_releases_its_watch(apiserver: LocalApiServer) -> None:
    url = f"{apiserver.url}/apis/resource.k8s.io/v1/resourceslices"
    async with aiohttp.ClientSession() as http:
        response = await http.get(url, params={"watch": "true"})
        async with asyncio.timeout(WAIT):
            await apiserver.wait_for_watches(1)
        response.close()
    async with asyncio.timeout(WAIT):
        await apiserver.wait_for_watches(0)  # noticed at the next bookmark tick
    apiserver.put(slice_body("n1", name="a"))  # fan-out to nobody; nothing breaks
