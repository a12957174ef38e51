"""Watch streams: initial state or replay from a resourceVersion, then live events."""

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from sandbox.apiserver._resources import ResourceType
from sandbox.apiserver._selectors import parse_field_selector, parse_label_selector
from sandbox.apiserver._status import ApiError
from sandbox.apiserver._store import Store
from sandbox.apiserver._table import Event, Watcher, encode_event

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def parse_rv(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise ApiError(400, f"invalid resource version: {text!r}") from exc


def bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return encode_event(
        "BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}
    )


def _flag(value: str | None) -> bool:
    return value in ("true", "1")


async def serve(
    request: web.Request,
    store: Store,
    rt: ResourceType,
    namespace: str | None,
    name: str | None,
    bookmark_interval: float,
) -> web.StreamResponse:
    """Stream events as the real server does: a 200 response of newline-separated JSON."""
    query = request.query
    selector = query.get("fieldSelector", "")
    if name is not None:  # a watch on one object: .../name?watch=true
        selector = ",".join(filter(None, [selector, f"metadata.name={name}"]))
    labels = parse_label_selector(query.get("labelSelector", ""))
    fields = parse_field_selector(selector, rt)
    bookmarks = _flag(query.get("allowWatchBookmarks"))
    initial_events = _flag(query.get("sendInitialEvents"))
    timeout = float(query.get("timeoutSeconds", "0") or 0)
    rv_text = query.get("resourceVersion", "")
    watcher = Watcher(rt, namespace, labels, fields)
    replay: Iterable[Event] = ()
    expired: ApiError | None = None
    # From here to add_watcher nothing awaits, so no event falls between replay and live.
    if rv_text in ("", "0") or initial_events:
        for obj in store.select(rt, namespace, labels, fields):
            watcher.queue.put_nowait(encode_event("ADDED", obj))
        if initial_events and bookmarks:
            watcher.queue.put_nowait(bookmark(rt, store.rv, initial_end=True))
    else:
        try:
            replay = store.events_since(rt, parse_rv(rv_text))
        except ApiError as err:
            expired = err
    for event in replay:
        Store.deliver(watcher, event)
    if expired is None:
        store.add_watcher(watcher)
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    try:
        # A client that goes away mid-stream is normal for a watch, not an error.
        with contextlib.suppress(ConnectionError):
            await response.prepare(request)
            if expired is not None:
                # A too-old resourceVersion is an ERROR event in a 200 stream, not an HTTP 410.
                await response.write(encode_event("ERROR", expired.body))
            else:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout if timeout > 0 else None
                await _pump(
                    request, response, store, watcher, bookmarks, deadline, bookmark_interval
                )
            await response.write_eof()
        return response
    finally:
        if expired is None:
            store.remove_watcher(watcher)


async def _pump(
    request: web.Request,
    response: web.StreamResponse,
    store: Store,
    watcher: Watcher,
    bookmarks: bool,
    deadline: float | None,
    bookmark_interval: float,
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        wait = bookmark_interval
        if deadline is not None:
            wait = min(wait, deadline - loop.time())
            if wait <= 0:
                return
        try:
            line = await asyncio.wait_for(watcher.queue.get(), wait)
        except TimeoutError:
            if request.transport is None or request.transport.is_closing():
                return  # the client went away
            if bookmarks:
                # Delivery is synchronous and the queue is empty: every event up to
                # store.rv has reached this watcher, so that is its progress.
                await response.write(bookmark(watcher.rt, store.rv))
            continue
        if line is None:
            return  # the server ends the stream (drop_watches or stop)
        await response.write(line)
