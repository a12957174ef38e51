"""The informer against the local API server: a late answer to our own write does not bring
back an object the watch has already seen deleted; a watch list lists in one request; a caller
that lists when it decides (:meth:`Informer.relist`) gets the list's failures and the news
that its watch expired."""

import asyncio
from functools import partial
from typing import Any

import pytest

from driver.common.wire import Obj
from driver.kube import informer as informer_module
from driver.kube.informer import TOMBSTONE_TTL_S, Informer
from driver.kube.resources import PODS
from driver.kube.rest import Client, ForbiddenError
from sandbox.apiserver import LocalApiServer
from tests.pluginharness import wait_for


def _pod(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


async def test_an_answer_after_the_watch_saw_the_delete_is_not_remembered(
    apiserver: LocalApiServer, api_client: Any
) -> None:
    changes: list[tuple[str | None, str | None]] = []

    def name(obj: Obj | None) -> str | None:
        return None if obj is None else str(obj["metadata"]["name"])

    def changed(old: Obj | None, new: Obj | None) -> None:
        changes.append((name(old), name(new)))

    informer = Informer(Client(api_client), PODS, namespace="default", on_change=changed)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        (answer,) = apiserver.seed(_pod("p"))  # what our write's answer would say
        await wait_for(lambda: ("default", "p") in informer.items, "the pod seen")
        apiserver.delete("pods", "p", "default")
        await wait_for(lambda: ("default", "p") not in informer.items, "the delete seen")
        informer.remember(answer)  # the answer arrives late
        assert ("default", "p") not in informer.items
        # A new object of that name (a later version) is remembered as usual.
        (again,) = apiserver.seed(_pod("p"))
        informer.remember(again)
        assert informer.items[("default", "p")]["metadata"]["uid"] == again["metadata"]["uid"]
        assert changes == [(None, "p"), ("p", None), (None, "p")]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_tombstones_last_minutes_not_forever(
    apiserver: LocalApiServer, api_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pods come and go for months under one watch: each deleted name is kept only while a
    late answer could still arrive."""
    clock = [1000.0]
    monkeypatch.setattr(informer_module, "monotonic", lambda: clock[0])
    informer = Informer(Client(api_client), PODS, namespace="default", on_change=_ignore)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        answers = apiserver.seed(*(_pod(f"p{i}") for i in range(3)))
        await wait_for(lambda: len(informer.items) == 3, "the pods seen")
        for i in range(3):
            apiserver.delete("pods", f"p{i}", "default")
            await wait_for(partial(_gone, informer, f"p{i}"), f"p{i}'s delete seen")
            clock[0] += TOMBSTONE_TTL_S * 0.6
        # p0's tombstone outlived its time when p2's came: a late answer for p0 is believed.
        informer.remember(answers[2])
        informer.remember(answers[0])
        assert set(informer.items) == {("default", "p0")}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _requests(apiserver: LocalApiServer) -> list[tuple[str, bool, int]]:
    """(verb, whether a watch list, status code) of each request."""
    return [(r.verb, r.watch_list, r.code) for r in apiserver.requests]


async def test_a_watch_list_lists_in_one_request_until_the_server_refuses_one(
    apiserver: LocalApiServer, api_client: Any
) -> None:
    apiserver.seed(_pod("a"), _pod("b"))
    informer = Informer(
        Client(api_client), PODS, namespace="default", on_change=_ignore, watch_list=True
    )
    apiserver.requests.clear()
    try:
        await informer.relist()
        assert set(informer.items) == {("default", "a"), ("default", "b")}
        assert informer.synced.is_set()
        apiserver.seed(_pod("c"))  # the same stream goes on as the watch
        await wait_for(lambda: ("default", "c") in informer.items, "c seen")
        assert _requests(apiserver) == [("watch", True, 200)]
        # Kubernetes 1.33's default (the WatchList gate off) calls sendInitialEvents invalid:
        # a list instead, and from then on no watch list is tried.
        apiserver.faults.fail("watch", "pods", code=422, message="sendInitialEvents is forbidden")
        apiserver.delete("pods", "a", "default")
        await informer.relist()
        await informer.relist()
        assert set(informer.items) == {("default", "b"), ("default", "c")}
        lists = [r for r in _requests(apiserver) if r[0] == "list" or r[1]]
        assert lists == [
            ("watch", True, 200),
            ("watch", True, 422),
            ("list", False, 200),
            ("list", False, 200),  # remembered: no second try of a watch list
        ]
        apiserver.seed(_pod("d"))  # and it watches from the list
        await wait_for(lambda: ("default", "d") in informer.items, "d seen")
    finally:
        await informer.stop()


async def test_relist_raises_to_its_caller_and_an_expired_watch_is_reported(
    apiserver: LocalApiServer, api_client: Any
) -> None:
    expired: list[BaseException | None] = []
    informer = Informer(
        Client(api_client),
        PODS,
        namespace="default",
        on_change=_ignore,
        on_expired=expired.append,
    )
    try:
        apiserver.faults.forbid("list", "pods")
        with pytest.raises(ForbiddenError):
            await informer.relist()
        assert not informer.synced.is_set()
        apiserver.faults.clear()
        await informer.relist()
        # Move past what the informer saw, forget the history, end its watch: the resumed
        # watch gets 410, which only a new list can follow; the caller decides when.
        apiserver.seed(_pod("p"))
        apiserver.compact()
        apiserver.faults.drop_watches()
        await wait_for(lambda: expired == [None], "the expired watch reported")
        assert ("default", "p") not in informer.items
        await informer.relist()
        assert set(informer.items) == {("default", "p")}
    finally:
        await informer.stop()


def _ignore(old: Obj | None, new: Obj | None) -> None:
    pass


def _gone(informer: Informer, name: str) -> bool:
    return ("default", name) not in informer.items
