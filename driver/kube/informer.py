"""One collection of the API server kept current in memory: list, then watch from there.

What client-go's reflector, store, indexer and mutation cache do for a controller: a list
(page by page, one snapshot), or with ``watch_list`` one watch that streams the current
objects first (KEP-3157: ``sendInitialEvents``, ended by the ``k8s.io/initial-events-end``
bookmark; one request instead of two); then a watch from there, reconnecting from the last
version seen. A 410 Gone, or a watch that cannot be resumed, needs a new list, and the
difference from what was known is reported as changes. Nothing is polled: after the first
list, each change costs one watch event.

Two ways to drive it. :meth:`Informer.run` lists and watches until cancelled, listing again
by itself after a 410. A caller with its own rule for when to list (the slice controller
lists again after any failed write, before planning) calls :meth:`Informer.relist`, which
lists from the caller's task and raises what failed, and is told by ``on_expired`` when
the watch it started has ended and only a new list can bring the view up to date.

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
from collections.abc import Awaitable, Callable
from time import monotonic

from driver.common.errors import RetryableError
from driver.common.logs import kv
from driver.common.wire import Obj
from driver.kube.backoff import Backoff
from driver.kube.resources import Resource
from driver.kube.rest import (
    WATCH_TIMEOUT_SECONDS,
    ApiError,
    Client,
    GoneError,
    RejectedError,
    UnavailableError,
)

log = logging.getLogger(__name__)
# How long a deleted name stays tombstoned: ten times the client's default request timeout.
TOMBSTONE_TTL_S = 300.0
# The bookmark that ends a watch list's initial events (KEP-3157, client-go's reflector).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
OnChange = Callable[[Obj | None, Obj | None], None]
# ValueError: a stream that is not JSON. Every one of these is retried.
_FAILURES = (ApiError, RetryableError, ValueError)


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def version_of(obj: Obj) -> int:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else -1


class Informer:
    """The objects of ``kind`` (in ``namespace``, or all), narrowed by ``label_selector`` and
    ``field_selector`` (``metadata.name=...`` follows one object). ``items`` is the current
    view; ``synced`` is set after the first list; ``seen`` is the highest resourceVersion the
    view reflects (lists, events, bookmarks).

    ``watch_list``: list by a watch's initial events, until the server refuses them (a 422:
    the WatchList feature gate is off, as in 1.33); any other failure of one falls back to a
    list that time. ``on_reconnect`` is awaited before each watch that resumes a stream (not
    the first after a list); what it raises counts as the watch's failure. ``on_error`` is
    told of each failure the watch retries, instead of the informer's own warning.
    ``on_expired(exc)`` is told when a watch started by :meth:`relist` ends for good (a 410,
    ``exc`` None; or a bug, ``exc`` what it raised): only a new list brings the view up to date.
    """

    def __init__(
        self,
        client: Client,
        kind: Resource,
        *,
        namespace: str = "",
        on_change: OnChange,
        on_progress: Callable[[int], None] | None = None,
        label_selector: str = "",
        field_selector: str = "",
        page_size: int = 500,
        backoff_cap: float = 30.0,
        watch_list: bool = False,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        on_expired: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        self._client = client
        self._kind, self._namespace = kind, namespace
        self._path = kind.path(namespace=namespace)
        self.resource = kind.rbac()
        self._on_change = on_change
        self._on_progress = on_progress
        self._selector = [("labelSelector", label_selector)] if label_selector else []
        if field_selector:
            self._selector.append(("fieldSelector", field_selector))
        self._page = page_size
        self._backoff_cap = backoff_cap
        self._watch_list = watch_list
        self._on_reconnect = on_reconnect
        self._on_error = on_error or self._report
        self._on_expired = on_expired
        self.items: dict[Key, Obj] = {}
        self.synced = asyncio.Event()
        self.seen = 0
        # Key -> (the delete's version, when), oldest first.
        self._tombstones: dict[Key, tuple[int, float]] = {}
        self._resume = ""  # the resourceVersion the watch goes on from
        self._watcher: asyncio.Task[None] | None = None
        self._reported = ""

    async def run(self) -> None:
        """List and watch until cancelled; every failure is retried with a backoff."""
        backoff = Backoff(cap=self._backoff_cap)
        try:
            while True:
                try:
                    await self.relist()
                except _FAILURES as exc:
                    self._on_error(exc)
                    await asyncio.sleep(backoff.next_delay())
                    continue
                backoff.reset()
                watcher = self._watcher
                assert watcher is not None
                # It ends by itself only where a list must follow (410); a bug raises here.
                await watcher
                log.info("watch expired; listing again", extra=kv(resource=self.resource))
        finally:
            await self.stop()

    async def relist(self) -> None:
        """Replace the view with a fresh list (a quorum read, so newer than any write that
        failed before it), then watch from there; raises what the list raised, leaving the
        view as it was and nothing watching."""
        await self.stop()
        if self._watch_list:
            synced: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._start(synced)
            try:
                await synced
                return
            except _FAILURES as exc:
                # Any failure of the watch list falls back to a list, as client-go's
                # reflector does: a server whose watches fail may still answer lists.
                if isinstance(exc, RejectedError) and exc.status == 422:
                    # The WatchList gate is off (1.33's default; on from 1.34): the
                    # server calls sendInitialEvents invalid. From now on list and watch.
                    log.info(
                        "the API server does not stream lists; listing instead",
                        extra=kv(resource=self.resource, error=str(exc)),
                    )
                    self._watch_list = False
            finally:
                if not synced.done() or synced.cancelled() or synced.exception() is not None:
                    await self.stop()
        self._resume = await self._list()
        self._start(None)

    async def stop(self) -> None:
        """Stop watching (the view stays as it is)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
            # wait() rather than await: the watcher's cancellation is not ours to raise.
            await asyncio.wait([watcher])

    def _start(self, synced: "asyncio.Future[None] | None") -> None:
        self._watcher = asyncio.create_task(self._watch(synced), name=f"watch-{self.resource}")
        self._watcher.add_done_callback(lambda watcher: self._ended(watcher, synced))

    def _ended(self, watcher: "asyncio.Task[None]", synced: "asyncio.Future[None] | None") -> None:
        if synced is not None and not synced.done():
            # It ended before its initial events did (a cancel, a bug): whoever waits on
            # ``synced`` must not be left waiting.
            if watcher.cancelled():
                synced.cancel()
            else:
                synced.set_exception(watcher.exception() or RuntimeError("watch list ended"))
            return
        if synced is not None and (synced.cancelled() or synced.exception() is not None):
            return  # a failed watch list: relist() lists instead
        if watcher.cancelled() or watcher is not self._watcher or self._on_expired is None:
            return  # stopped on purpose, or run() is waiting on it
        self._on_expired(watcher.exception())

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
        self._replace(listed, int(version) if version.isdigit() else 0)
        return version

    def _replace(self, listed: dict[Key, Obj], version: int) -> None:
        """The view is ``listed``, as fresh as a list (a list, or a watch's initial events)."""
        old, self.items = self.items, listed
        self._tombstones.clear()  # the list is newer than every delete before it
        self._progress(version)
        for key in old.keys() | listed.keys():
            before, after = old.get(key), listed.get(key)
            if before != after:
                self._on_change(before, after)
        self.synced.set()
        self._reported = ""

    async def _watch(self, synced: "asyncio.Future[None] | None") -> None:
        """Keep the view current from ``_resume`` on, reconnecting after failures, until a
        410; with ``synced``, first stream the current objects (a watch list), then resolve
        ``synced`` (or fail it with what broke the stream before that)."""
        backoff = Backoff(cap=self._backoff_cap)
        reconnect = synced is not None
        while True:
            try:
                if synced is not None and not synced.done():
                    await self._stream(synced)
                    continue
                if reconnect and self._on_reconnect is not None:
                    await self._on_reconnect()
                reconnect = True
                await self._stream(None)
                backoff.reset()
            except _FAILURES as exc:
                if synced is not None and not synced.done():
                    synced.set_exception(exc)
                    return
                if isinstance(exc, GoneError):
                    return  # nothing to resume from: only a list can follow
                self._on_error(exc)
                await asyncio.sleep(backoff.next_delay())

    async def _stream(self, synced: "asyncio.Future[None] | None") -> None:
        """One watch request until the server ends it; with ``synced``, a watch list whose
        initial events replace the view at their end bookmark."""
        # Like client-go: a random 5-10 minutes, so a fleet doesn't reconnect in step.
        seconds = random.randint(WATCH_TIMEOUT_SECONDS, 2 * WATCH_TIMEOUT_SECONDS)
        query = [*self._selector, ("timeoutSeconds", str(seconds))]
        if synced is None:
            query.append(("resourceVersion", self._resume))
        else:
            # A consistent read, as a list without resourceVersion is (the API's rule for
            # sendInitialEvents with NotOlderThan and no resourceVersion).
            query += [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
        initial: dict[Key, Obj] | None = None if synced is None else {}
        async for event in self._client.watch(
            self._kind, namespace=self._namespace, query=query, read_timeout=seconds + 30
        ):
            obj = event.get("object") or {}
            found = version_of(obj)
            kind = event.get("type")
            if initial is not None:
                if kind == "ADDED":
                    initial[key_of(obj)] = obj
                if kind != "BOOKMARK" or not _ends_initial_events(obj):
                    continue
                assert synced is not None
                self._replace(initial, max(found, 0))
                initial = None
                synced.set_result(None)
            elif kind != "BOOKMARK":
                self._apply(str(kind), obj)
            if found >= 0:
                self._resume = str(found)
                self._progress(found)
        if initial is not None:
            raise UnavailableError(
                f"watch {self.resource}: the stream ended before its initial events did",
                status=0,
                verb="watch",
                resource=self.resource,
            )

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


def _ends_initial_events(bookmark: Obj) -> bool:
    annotations = (bookmark.get("metadata") or {}).get("annotations") or {}
    return annotations.get(INITIAL_EVENTS_END) == "true"
