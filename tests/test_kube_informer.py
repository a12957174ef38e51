"""The informer against the local API server: a late answer to our own write does not bring
back an object the watch has already seen deleted."""

import asyncio
from typing import Any

from driver.common.wire import Obj
from driver.kube.informer import Informer
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
