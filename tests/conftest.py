"""Shared fixtures: a local API server per test and a real ``kubernetes.aio`` client for it,
and, for tests of a plugin process, its node's directories, a kubeconfig, and the processes
to kill after a failed test."""

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.kube.session import Session
from sandbox.apiserver import LocalApiServer
from tests.pluginharness import NodeDirs, PluginProcess
from tests.pluginharness import api_client as plugin_api_client


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
async def api_client(apiserver: LocalApiServer) -> AsyncIterator[Session]:
    """A session pointed at ``apiserver`` (no retries: tests count calls)."""
    from kubernetes.aio import client

    configuration = client.Configuration(host=apiserver.url)
    async with Session(configuration) as api:
        yield api


@pytest.fixture
def dirs() -> Iterator[NodeDirs]:
    """A node's directories under a short /tmp path (unix socket paths are short)."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="dra") as name:
        yield NodeDirs(Path(name))


@pytest.fixture
async def kube(apiserver: LocalApiServer, dirs: NodeDirs) -> AsyncIterator[tuple[Any, Path]]:
    """A client of ``apiserver`` and the kubeconfig a plugin process reads it from. A module
    whose plugin needs its Node overrides this with one that creates it."""
    kubeconfig = dirs.root / "kubeconfig"
    apiserver.write_kubeconfig(kubeconfig)
    api = await plugin_api_client(kubeconfig)
    try:
        yield api, kubeconfig
    finally:
        await api.close()


@pytest.fixture
def processes() -> Iterator[list[PluginProcess]]:
    """Plugin processes a test starts; whatever a failed test left running is killed."""
    started: list[PluginProcess] = []
    yield started
    for proc in started:
        proc.kill()
