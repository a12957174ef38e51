"""Peer sources without an API server: a file holding a ComputeDomainClique, taken when its
text changes, a bad file logged once with the last good list kept; and a list in memory."""

import asyncio
import logging
from pathlib import Path

import pytest

from cluster.imexdaemon.peers import Peer
from cluster.imexdaemon.sources import FileSource, MemorySource
from tests.imexharness import CLIQUE, clique, wait_for, write_peers


async def test_the_file_is_taken_when_its_text_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "clique.json"
    seen: list[tuple[Peer, ...]] = []

    async def follow() -> None:
        # One at a time, as the daemon takes them: the test looks between two.
        async for peers in FileSource(path, interval=0.01).updates():
            seen.append(peers)  # noqa: PERF401

    task = asyncio.create_task(follow())
    try:
        write_peers(path, clique([("a", "10.0.0.1", 0)]))
        await wait_for(lambda: len(seen) == 1, "the first list")
        assert seen[0] == (Peer("a", "10.0.0.1", CLIQUE, 0),)
        write_peers(path, "daemons: [unclosed")
        write_peers(path, "daemons: [unclosed")  # the same bad text: logged once
        await wait_for(
            lambda: any("peers file unusable" in r.getMessage() for r in caplog.records),
            "the error",
        )
        write_peers(path, clique([("a", "10.0.0.1", 0), ("b", "10.0.0.2", 1)]))
        await wait_for(lambda: len(seen) == 2, "the second list")
        assert len(seen[1]) == 2
        unusable = [r for r in caplog.records if "peers file unusable" in r.getMessage()]
        assert len(unusable) == 1 and unusable[0].levelno == logging.ERROR
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_memory_lists_come_in_order() -> None:
    source = MemorySource([Peer("a", "10.0.0.1", CLIQUE, 0)])
    source.publish([])
    updates = source.updates()
    assert len(await anext(updates)) == 1
    assert await anext(updates) == ()
