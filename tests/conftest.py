"""Shared fixtures: a local API server per test and a real ``kubernetes.aio`` client for it."""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandbox.apiserver import LocalApiServer


@pytest.fixture
async def apiserver() -> AsyncIterator[LocalApiServer]:
    """A started LocalApiServer on a free port; bookmarks every 0.2 s to keep tests quick."""
    server = LocalApiServer(bookmark_interval=0.2)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def api_client(apiserver: LocalApiServer) -> AsyncIterator[Any]:
    """A ``kubernetes.aio`` ApiClient pointed at ``apiserver`` (no retries: tests count calls)."""
    from kubernetes.aio import client

    configuration = client.Configuration(host=apiserver.url)
    async with client.ApiClient(configuration) as api:
        yield api
