"""One collection of the API server kept current in memory: list, then watch from there.

What client-go's reflector, store, indexer and mutation cache do for a controller, in one
asyncio task: :meth:`Informer.run` lists (page by page, one snapshot), then watches from the
list's resourceVersion, reconnecting from the last version seen; a 410 Gone, or a watch that
cannot be resumed, lists again, and the difference from what was known is reported as changes.
Nothing is polled: after the first list, each change costs one watch event.

The caller's own writes go in at once (:meth:`remember`, :meth:`forget`), so a plan made right
after a write sees it; the watch's echo of it, or any older news, is ignored by comparing
resourceVersions (integers in etcd, one counter across resources, as client-go's mutation
cache also assumes). A deleted name is tombstoned with the delete's version until the next
event for it, so neither the echo of our delete nor the late answer to a write that deleted
the object (its last finalizer removed) brings it back; for a few minutes at most, far longer
than any answer takes, so a watch that sees names come and go for months keeps no list of
every name it ever saw deleted.

``on_change(old, new)`` is called for every change (``old`` None: added; ``new`` None: gone),
and ``on_progress(seen)`` whenever :attr:`Informer.seen` grows (a bookmark among them), from
the informer's task; neither may block.
"""

import asyncio
import logging
import random
from collections.abc import Callable
from time import monotonic

from driver.common.errors import RetryableError
from driver.common.logs import kv
from driver.common.wire import Obj
from driver.kube.backoff import Backoff
from driver.kube.rest import WATCH_TIMEOUT_SECONDS, ApiError, Client, GoneError

log = logging.getLogger(__name__)
# How long a deleted name stays tombstoned: ten times the client's default request timeout.
TOMBSTONE_TTL_S = 300.0

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
OnChange = Callable[[Obj | None, Obj | None], None]


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def version_of(obj: Obj) -> int:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else -1


class Informer:
    """``path`` (a collection URL), narrowed by ``label_selector`` and ``field_selector``
    (``metadata.name=...`` follows one object); ``resource`` names it in
    errors and RBAC messages. ``items`` is the current view; ``synced`` is set after the first
    list; ``seen`` is the highest resourceVersion the view reflects (lists, events, bookmarks).
    """

    def __init__(
        self,
        client: Client,
        path: str,
        *,
        resource: str,
        on_change: OnChange,
        on_progress: Callable[[int], None] | None = None,
        label_selector: str = "",
        field_selector: str = "",
        page_size: int = 500,
        backoff_cap: float = 30.0,
    ) -> None:
        self._client = client
        self._path = path
        self.resource = resource
        self._on_change = on_change
        self._on_progress = on_progress
        self._selector = [("labelSelector", label_selector)] if label_selector else []
        if field_selector:
            self._selector.append(("fieldSelector", field_selector))
        self._page = page_size
        self._backoff_cap = backoff_cap
        self.items: dict[Key, Obj] = {}
        self.synced = asyncio.Event()
        self.seen = 0
        # Key -> (the delete's version, when), oldest first.
        self._tombstones: dict[Key, tuple[int, float]] = {}
        self._resume = ""  # the resourceVersion to watch from; empty: list first
        self._reported = ""

    async def run(self) -> None:
        """List and watch until cancelled; every failure is retried with a backoff."""
        backoff = Backoff(cap=self._backoff_cap)
        self._resume = ""
        while True:
            try:
                if not self._resume:
                    self._resume = await self._list()
                await self._watch()
                backoff.reset()
            except GoneError:
                log.info("watch expired; listing again", extra=kv(resource=self.resource))
                self._resume = ""
            except (ApiError, RetryableError) as exc:
                self._report(exc)
                await asyncio.sleep(backoff.next_delay())

    async def _list(self) -> str:
        listed: dict[Key, Obj] = {}
        token, version = "", ""
        while True:
            query = [*self._selector, ("limit", str(self._page))]
            if token:
                query.append(("continue", token))
            page = await self._client.request(
                "GET", self._path, verb="list", resource=self.resource, query=query
            )
            for obj in page.get("items") or ():
                listed[key_of(obj)] = obj
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            token = str(meta.get("continue") or "")
            if not token:
                break
        old, self.items = self.items, listed
        self._tombstones.clear()  # the list is newer than every delete before it
        self._progress(int(version) if version.isdigit() else 0)
        for key in old.keys() | listed.keys():
            before, after = old.get(key), listed.get(key)
            if before != after:
                self._on_change(before, after)
        self.synced.set()
        self._reported = ""
        return version

    async def _watch(self) -> None:
        """Watch from the last version seen until the server ends the stream; a broken stream
        resumes from the last event it delivered."""
        # Like client-go: a random 5-10 minutes, so a fleet doesn't reconnect in step.
        seconds = random.randint(WATCH_TIMEOUT_SECONDS, 2 * WATCH_TIMEOUT_SECONDS)
        query = [
            *self._selector,
            ("resourceVersion", self._resume),
            ("timeoutSeconds", str(seconds)),
        ]
        async for event in self._client.watch(
            self._path, resource=self.resource, query=query, read_timeout=seconds + 30
        ):
            obj = event.get("object") or {}
            found = version_of(obj)
            if event.get("type") != "BOOKMARK":
                self._apply(str(event.get("type")), obj)
            if found >= 0:
                self._resume = str(found)
                self._progress(found)

    def _progress(self, version: int) -> None:
        if version > self.seen:
            self.seen = version
            if self._on_progress is not None:
                self._on_progress(version)

    def _apply(self, kind: str, obj: Obj) -> None:
        key = key_of(obj)
        deleted = self._tombstones.pop(key, None)
        if deleted is not None and 0 <= version_of(obj) <= deleted[0]:
            return  # the echo of our own delete
        cached = self.items.get(key)
        if kind == "DELETED":
            # Kept until the next event of that name or the next list: an answer to our own
            # write that arrives after this event must not bring the object back.
            self._tombstone(key, max(version_of(obj), version_of(cached or {})))
            if cached is not None:
                del self.items[key]
                self._on_change(cached, None)
            return
        if cached is not None and version_of(cached) >= version_of(obj):
            return  # our own write, already cached, or older news
        self.items[key] = obj
        self._on_change(cached, obj)

    def remember(self, obj: Obj) -> None:
        """The answer to our own write: the object as the server now has it, unless the watch
        has already seen it deleted (removing its last finalizer deletes it, and the watch's
        DELETED event can come before the answer)."""
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.forget(obj)  # the write removed its last finalizer: the server deleted it
            return
        key = key_of(obj)
        deleted = self._tombstones.get(key)
        if deleted is not None and 0 <= version_of(obj) <= deleted[0]:
            return
        self._tombstones.pop(key, None)
        self._apply("MODIFIED", obj)

    def forget(self, obj: Obj) -> None:
        """The answer to our own delete that removed the object (``obj``: as deleted)."""
        key = key_of(obj)
        cached = self.items.pop(key, None)
        self._tombstone(key, max(version_of(obj), version_of(cached or {})))
        if cached is not None:
            self._on_change(cached, None)

    def _tombstone(self, key: Key, version: int) -> None:
        now = monotonic()
        self._tombstones.pop(key, None)  # to the end: the dict stays oldest first
        self._tombstones[key] = (version, now)
        while next(iter(self._tombstones.values()))[1] < now - TOMBSTONE_TTL_S:
            del self._tombstones[next(iter(self._tombstones))]

    def _report(self, exc: Exception) -> None:
        """One line per distinct problem, not one per retry."""
        text = f"{type(exc).__name__}: {exc}"
        if text != self._reported:
            self._reported = text
            log.warning(
                "list or watch failed; retrying", extra=kv(resource=self.resource, error=str(exc))
            )
