"""Run a LocalApiServer on its own event loop in a thread, for sync and subprocess tests."""

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from driver.common.wire import Obj
from sandbox.apiserver._faults import Faults, RequestLog
from sandbox.apiserver._server import LocalApiServer

T = TypeVar("T")


class ThreadedApiServer:
    """``with ThreadedApiServer() as api: ...``; every method is safe from any thread."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="local-apiserver", daemon=True
        )
        self.server: LocalApiServer | None = None

    def start(self, host: str = "127.0.0.1", port: int = 0) -> "ThreadedApiServer":
        self._thread.start()

        async def boot() -> LocalApiServer:
            server = LocalApiServer(**self._options)
            await server.start(host, port)
            return server

        self.server = asyncio.run_coroutine_threadsafe(boot(), self._loop).result(timeout=30)
        return self

    def stop(self) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> "ThreadedApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the server's loop and return its result."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller's thread
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=30)

    @property
    def _api(self) -> LocalApiServer:
        if self.server is None:
            raise RuntimeError("the server is not started")
        return self.server

    @property
    def url(self) -> str:
        return self._api.url

    @property
    def faults(self) -> Faults:
        return self._api.faults

    @property
    def requests(self) -> RequestLog:
        return self._api.requests

    def write_kubeconfig(self, path: str | Path) -> Path:
        return self._api.write_kubeconfig(path)

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        return self.call(self._api.objects, resource, namespace)

    def put(self, obj: Obj) -> Obj:
        return self.call(self._api.put, obj)

    def seed(self, *objs: Obj) -> list[Obj]:
        return self.call(self._api.seed, *objs)

    def delete(self, resource: str, name: str, namespace: str | None = None) -> None:
        self.call(self._api.delete, resource, name, namespace)

    def compact(self) -> None:
        self.call(self._api.compact)
