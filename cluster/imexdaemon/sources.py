"""Peer sources that need no API server: a list in memory, and a ComputeDomainClique in a file.

The file holds a ComputeDomainClique object (JSON or YAML, its top-level ``daemons``), the
shape the API source (:mod:`cluster.imexdaemon.cliquesource`) reads, so a test or a person can
drive a daemon without an API server. The file is
looked at every ``interval`` seconds and a new list is yielded when its text changes; a file
that is missing or does not parse is logged once and the last good list stands.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import yaml

from cluster.imexdaemon.peers import Peer, peers_from_clique
from driver.common.errors import PermanentError
from driver.common.logs import kv

log = logging.getLogger(__name__)


class MemorySource:
    """Lists given by :meth:`publish`, yielded in order."""

    def __init__(self, initial: Iterable[Peer] | None = None) -> None:
        self._queue: asyncio.Queue[tuple[Peer, ...]] = asyncio.Queue()
        if initial is not None:
            self.publish(initial)

    def publish(self, peers: Iterable[Peer]) -> None:
        self._queue.put_nowait(tuple(peers))

    async def updates(self) -> AsyncIterator[tuple[Peer, ...]]:
        while True:
            yield await self._queue.get()


class FileSource:
    def __init__(self, path: Path, *, interval: float = 0.2) -> None:
        self._path = path
        self._interval = interval

    def _read(self) -> str | None:
        try:
            return self._path.read_text()
        except FileNotFoundError:
            return None

    async def updates(self) -> AsyncIterator[tuple[Peer, ...]]:
        last: str | None = None
        failing = ""
        while True:
            text = await asyncio.to_thread(self._read)
            if text is not None and text != last:
                try:
                    peers = _parse(text)
                except PermanentError as exc:
                    if str(exc) != failing:
                        log.error(
                            "peers file unusable: keeping the last list",
                            extra=kv(path=str(self._path), error=str(exc)),
                        )
                        failing = str(exc)
                else:
                    last, failing = text, ""
                    yield peers
            await asyncio.sleep(self._interval)


def _parse(text: str) -> tuple[Peer, ...]:
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PermanentError(f"not YAML or JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise PermanentError("expected a ComputeDomainClique object")
    return peers_from_clique(obj)
