"""The informer against the local API server: a late answer to our own write does not bring
back an object the watch has already seen deleted."""

import asyncio
from functools import partial
from typing import Any

import pytest

from driver.common.wire import Obj
from driver.kube import informer as informer_module
from driver.kube.informer import TOMBSTONE_TTL_S, Informer
from driver.kube.rest import Client
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

    informer = Informer(
        Client(api_client), "/api/v1/namespaces/default/pods", resource="pods", on_change=changed
    )
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
    informer = Informer(
        Client(api_client), "/api/v1/namespaces/default/pods", resource="pods", on_change=_ignore
    )
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


def _ignore(old: Obj | None, new: Obj | None) -> None:
    pass


def _gone(informer: Informer, name: str) -> bool:
    return ("default", name) not in informer.items
