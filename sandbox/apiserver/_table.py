"""One resource's objects with their indexes, event history and open watches."""

import asyncio
import bisect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.common.wire import Obj
from sandbox.apiserver._resources import ResourceType
from sandbox.apiserver._selectors import FieldSelector

Key = tuple[str, str]  # (namespace or "", name)

_NODE_FIELD = "spec.nodeName"


def _node_of(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec")
    return (spec.get("nodeName") or "") if isinstance(spec, dict) else ""


@dataclass
class Event:
    rv: int
    type: str  # ADDED, MODIFIED or DELETED
    old: Obj | None
    new: Obj


@dataclass(eq=False)
class Watcher:
    """One open watch stream; the server drains ``queue`` (None ends the stream)."""

    rt: ResourceType
    namespace: str | None
    labels: Callable[[Mapping[str, str]], bool]
    fields: FieldSelector
    queue: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    node: str | None = None  # the spec.nodeName it is pinned to, for cheap fan-out
    name: str | None = None  # the metadata.name it is pinned to

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels(meta.get("labels") or {}) and self.fields.matches(obj)


@dataclass(eq=False)
class Table:
    rt: ResourceType
    history_limit: int
    objects: dict[Key, Obj] = field(default_factory=dict)
    by_namespace: dict[str, dict[Key, Obj]] = field(default_factory=dict)
    by_node: dict[str, dict[Key, Obj]] = field(default_factory=dict)
    # Events in resourceVersion order; entries before ``history_start`` are forgotten.
    history: list[Event] = field(default_factory=list)
    history_start: int = 0
    compacted_rv: int = 0  # watches from an older resourceVersion get 410 Expired
    watchers_by_node: dict[str, set[Watcher]] = field(default_factory=dict)
    watchers_by_name: dict[str, set[Watcher]] = field(default_factory=dict)
    watchers: set[Watcher] = field(default_factory=set)  # not pinned to a node or a name

    def __post_init__(self) -> None:
        self.indexed = _NODE_FIELD in self.rt.selectable

    def put(self, key: Key, obj: Obj) -> Obj | None:
        old = self.objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self.objects[key] = obj
        self.by_namespace.setdefault(key[0], {})[key] = obj
        if self.indexed:
            self.by_node.setdefault(_node_of(obj), {})[key] = obj
        return old

    def remove(self, key: Key) -> Obj:
        old = self.objects.pop(key)
        self._unindex(key, old)
        return old

    def _unindex(self, key: Key, old: Obj) -> None:
        bucket = self.by_namespace.get(key[0])
        if bucket is not None:
            bucket.pop(key, None)
            if not bucket:
                del self.by_namespace[key[0]]
        if self.indexed:
            node_bucket = self.by_node.get(_node_of(old))
            if node_bucket is not None:
                node_bucket.pop(key, None)
                if not node_bucket:
                    del self.by_node[_node_of(old)]

    def record(self, event: Event) -> None:
        self.history.append(event)
        if len(self.history) - self.history_start > self.history_limit:
            self.compacted_rv = self.history[self.history_start].rv
            self.history_start += 1
            if self.history_start >= self.history_limit:  # trim in batches: amortized O(1)
                del self.history[: self.history_start]
                self.history_start = 0

    def since(self, rv: int) -> list[Event]:
        start = bisect.bisect_right(self.history, rv, lo=self.history_start, key=_event_rv)
        return self.history[start:]

    def forget(self, rv: int) -> None:
        self.history.clear()
        self.history_start = 0
        self.compacted_rv = rv

    def candidates(self, namespace: str | None, fields: FieldSelector) -> Iterable[Obj]:
        name = fields.exact("metadata.name")
        if name is not None and (namespace is not None or not self.rt.namespaced):
            found = self.objects.get((namespace or "", name))
            return [found] if found is not None else []
        node = fields.exact(_NODE_FIELD) if self.indexed else None
        if node is not None:
            pool: Mapping[Key, Obj] = self.by_node.get(node, {})
            if namespace is None:
                return pool.values()
            return (o for k, o in pool.items() if k[0] == namespace)
        if namespace is not None:
            return self.by_namespace.get(namespace, {}).values()
        return self.objects.values()

    def watchers_for(self, event: Event) -> Iterator[Watcher]:
        yield from self.watchers
        yield from self.watchers_by_name.get(event.new["metadata"]["name"], ())
        if self.indexed:
            nodes = {_node_of(event.new)}
            if event.old is not None:
                nodes.add(_node_of(event.old))
            for node in nodes:
                yield from self.watchers_by_node.get(node, ())

    def _buckets(self, watcher: Watcher) -> set[Watcher]:
        if watcher.node is not None:
            return self.watchers_by_node.setdefault(watcher.node, set())
        if watcher.name is not None:
            return self.watchers_by_name.setdefault(watcher.name, set())
        return self.watchers

    def add_watcher(self, watcher: Watcher) -> None:
        watcher.node = watcher.fields.exact(_NODE_FIELD) if self.indexed else None
        watcher.name = watcher.fields.exact("metadata.name")
        self._buckets(watcher).add(watcher)

    def remove_watcher(self, watcher: Watcher) -> None:
        bucket = self._buckets(watcher)
        bucket.discard(watcher)
        if not bucket and bucket is not self.watchers:
            if watcher.node is not None:
                del self.watchers_by_node[watcher.node]
            elif watcher.name is not None:
                del self.watchers_by_name[watcher.name]

    def all_watchers(self) -> Iterator[Watcher]:
        yield from self.watchers
        for buckets in (self.watchers_by_node, self.watchers_by_name):
            for bucket in buckets.values():
                yield from bucket


def _event_rv(event: Event) -> int:
    return event.rv


def encode_event(kind: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"
