"""Object storage with resourceVersions, indexes, a bounded event history and watch fan-out.

Every method runs on the server's event loop and never awaits, so each write is atomic.
Stored objects are never mutated in place: a write stores a new dict, so readers may hold
references (and serialize them) without copying.
"""

import asyncio
import copy
import secrets
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from driver.common.wire import Obj, format_time
from sandbox.apiserver import _gates as gates
from sandbox.apiserver import _status as status
from sandbox.apiserver import _validation as validation
from sandbox.apiserver._resources import BY_KIND, BY_PATH, RESOURCES, ResourceType
from sandbox.apiserver._selectors import FieldSelector
from sandbox.apiserver._status import ApiError
from sandbox.apiserver._table import Event, Key, Table, Watcher, encode_event

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # upstream SimpleNameGenerator's alphabet
_INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def _now() -> str:
    return format_time(datetime.now(UTC))


class Store:
    """All objects of the served types, one global resourceVersion counter."""

    def __init__(
        self,
        history_limit: int = 100_000,
        version: str = validation.DEFAULT_VERSION,
        disabled_gates: frozenset[str] = frozenset(),
    ) -> None:
        self.rv = 1
        self.version = version
        self.disabled_gates = disabled_gates
        self._tables = {rt: Table(rt, history_limit) for rt in RESOURCES}
        self._by_uid: dict[str, tuple[ResourceType, Key]] = {}
        self._dependents: dict[str, set[tuple[ResourceType, Key]]] = {}
        self.watches_changed = asyncio.Event()  # set whenever a watch opens or closes
        namespaces = BY_PATH[("", "v1", "namespaces")]
        for name in _INITIAL_NAMESPACES:
            self.create(namespaces, None, {"metadata": {"name": name}})

    # ---- reading -------------------------------------------------------------------------

    def table(self, rt: ResourceType) -> Table:
        return self._tables[rt]

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._tables[rt].objects.get((namespace or "", name))
        if obj is None:
            raise status.not_found(rt, name)
        return obj

    def select(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: Callable[[Mapping[str, str]], bool],
        fields: FieldSelector,
    ) -> list[Obj]:
        table = self._tables[rt]
        items = [
            obj
            for obj in table.candidates(namespace, fields)
            if labels(obj["metadata"].get("labels") or {}) and fields.matches(obj)
        ]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items

    # ---- writing -------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _commit(self, rt: ResourceType, event: Event) -> None:
        table = self._tables[rt]
        table.record(event)
        encoded: dict[str, bytes] = {}
        for watcher in table.watchers_for(event):
            self.deliver(watcher, event, encoded)

    @staticmethod
    def deliver(watcher: Watcher, event: Event, cache: dict[str, bytes] | None = None) -> None:
        """Send ``event`` to ``watcher`` as that watcher sees it through its selectors."""
        was = event.old is not None and watcher.matches(event.old)
        now = watcher.matches(event.new)
        if event.type == "DELETED":
            kind = "DELETED" if now or was else ""
        elif event.type == "ADDED":
            kind = "ADDED" if now else ""
        else:
            kind = ("MODIFIED" if was else "ADDED") if now else ("DELETED" if was else "")
        if not kind:
            return
        cache = {} if cache is None else cache
        if kind not in cache:
            cache[kind] = encode_event(kind, event.new)
        watcher.queue.put_nowait(cache[kind])

    def _check_namespace(self, rt: ResourceType, namespace: str | None) -> None:
        if rt.namespaced and not namespace:
            raise ApiError(400, "the server could not find the requested resource")
        if rt.namespaced:
            namespaces = BY_PATH[("", "v1", "namespaces")]
            if ("", namespace) not in self._tables[namespaces].objects:
                raise status.not_found(namespaces, namespace or "")

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Obj,
        *,
        field_validation: str = "Warn",
        dry_run: bool = False,
    ) -> tuple[Obj, list[str]]:
        """Store a new object; returns it and warnings (unknown fields dropped).

        ``dry_run``: every check and default, nothing stored (no resourceVersion).
        """
        self._check_namespace(rt, namespace)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        table = self._tables[rt]
        if not meta.get("name") and meta.get("generateName"):
            for _ in range(8):
                name = meta["generateName"] + "".join(
                    secrets.choice(_GENERATE_ALPHABET) for _ in range(5)
                )
                if (namespace or "", name) not in table.objects:
                    meta["name"] = name
                    break
        name = meta.get("name") or ""
        warnings = self._prepare(rt, obj, None, field_validation)
        if meta.get("resourceVersion"):
            # The storage layer refuses it; the client sees that as an internal error.
            why = "resourceVersion should not be set on objects to be created"
            raise ApiError(
                500, f"Internal error occurred: {why}", details={"causes": [{"message": why}]}
            )
        key = (namespace or "", name)
        if key in table.objects:
            raise status.already_exists(rt, name)
        for drop in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(drop, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        if rt.generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if rt.plural == "resourceclaims":
            obj.pop("status", None)
        elif rt.plural == "pods":
            obj["status"] = {"phase": "Pending"}
        elif rt.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        if dry_run:
            return obj, warnings
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        table.put(key, obj)
        self._index_owners(rt, key, None, obj)
        self._commit(rt, Event(rv, "ADDED", None, obj))
        return obj, warnings

    def _prepare(
        self, rt: ResourceType, obj: Obj, old: Obj | None, field_validation: str
    ) -> list[str]:
        """Defaults, canonical quantities and validation shared by create and update."""
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        name = obj["metadata"].get("name") or ""
        validation.canonicalize_quantities(rt, obj)
        if rt.plural == "resourceslices":
            gates.drop_disabled_fields(obj, self.disabled_gates)
        errors, unknown = validation.schema_errors(rt, obj, self.version)
        if unknown:
            if field_validation == "Strict":
                listed = ", ".join(f'unknown field "{u}"' for u in unknown)
                raise ApiError(400, f"strict decoding error: {listed}")
            validation.drop_fields(obj, unknown)
        errors += validation.label_errors(obj["metadata"].get("labels"))
        if old is None:
            errors = validation.name_errors(rt, name) + errors
        else:
            errors += validation.immutable_errors(rt, old, obj)
        if not errors:
            errors += validation.extra_errors(rt, obj, self.version)
            errors += validation.taint_effect_errors(rt, obj, self.version)
        if errors:
            raise status.invalid(rt, name, errors)
        return [f'unknown field "{u}"' for u in unknown]

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        subresource: str = "",
        field_validation: str = "Warn",
        dry_run: bool = False,
    ) -> tuple[Obj, list[str]]:
        table = self._tables[rt]
        key = (namespace or "", name)
        old = table.objects.get(key)
        if old is None:
            raise status.not_found(rt, name)
        obj = copy.deepcopy(body)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if meta.get("name", name) != name:
            raise ApiError(
                400,
                f"the name of the object ({meta.get('name')}) does not match the name on "
                f"the URL ({name})",
            )
        meta["name"] = name
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace "
                    "sent on the request",
                )
            meta["namespace"] = namespace
        old_meta = old["metadata"]
        wanted_rv = meta.get("resourceVersion") or ""
        if wanted_rv and wanted_rv != old_meta["resourceVersion"]:
            raise status.conflict(rt, name, status.MODIFIED)
        if not wanted_rv and not rt.unconditional_update:
            raise status.invalid(
                rt,
                name,
                [
                    (
                        "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise status.conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {old_meta['uid']}",
            )
        if subresource == "status":
            # A status write changes status only.
            merged = copy.deepcopy(old)
            if "status" in obj:
                merged["status"] = obj["status"]
            else:
                merged.pop("status", None)
            obj = merged
        elif rt.subresources and "status" in rt.subresources:
            # A main-resource write never changes status.
            if "status" in old:
                obj["status"] = copy.deepcopy(old["status"])
            else:
                obj.pop("status", None)
        meta = obj["metadata"]
        for kept in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
            if kept in old_meta:
                meta[kept] = old_meta[kept]
            else:
                meta.pop(kept, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        warnings = self._prepare(rt, obj, old, field_validation)
        if obj == old:
            return old, warnings  # a no-op write: no new resourceVersion, no event
        if rt.generation and _spec_changed(old, obj):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        if dry_run:
            return obj, warnings
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(rt, key, obj), warnings
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        table.put(key, obj)
        self._index_owners(rt, key, old, obj)
        self._commit(rt, Event(rv, "MODIFIED", old, obj))
        return obj, warnings

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        preconditions: Mapping[str, Any] | None = None,
        *,
        orphan: bool = False,
    ) -> Obj:
        table = self._tables[rt]
        key = (namespace or "", name)
        old = table.objects.get(key)
        if old is None:
            raise status.not_found(rt, name)
        meta = old["metadata"]
        pre = preconditions or {}
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise status.conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, "
                f"UID in object meta: {meta['uid']}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise status.conflict(
                rt,
                name,
                "Precondition failed: ResourceVersion in precondition: "
                f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return old
            obj = {
                **old,
                "metadata": {**meta, "deletionTimestamp": _now(), "deletionGracePeriodSeconds": 0},
            }
            rv = self._next_rv()
            obj["metadata"]["resourceVersion"] = str(rv)
            table.put(key, obj)
            self._commit(rt, Event(rv, "MODIFIED", old, obj))
            return obj
        return self._remove(rt, key, old, orphan=orphan)

    def _remove(self, rt: ResourceType, key: Key, last: Obj, *, orphan: bool = False) -> Obj:
        table = self._tables[rt]
        old = table.remove(key)
        rv = self._next_rv()
        gone = {**last, "metadata": {**last["metadata"], "resourceVersion": str(rv)}}
        uid = old["metadata"]["uid"]
        self._by_uid.pop(uid, None)
        self._index_owners(rt, key, old, None)
        self._commit(rt, Event(rv, "DELETED", old, gone))
        if rt.plural == "namespaces":
            for other in RESOURCES:
                if other.namespaced:
                    for victim in list(self._tables[other].by_namespace.get(key[1], {})):
                        self._remove(other, victim, self._tables[other].objects[victim])
        if not orphan:
            self._collect_garbage(uid)
        return gone

    def _index_owners(self, rt: ResourceType, key: Key, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self._by_uid[new["metadata"]["uid"]] = (rt, key)
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            for ref in obj["metadata"].get("ownerReferences") or ():
                uid = ref.get("uid")
                if not uid:
                    continue
                if add:
                    self._dependents.setdefault(uid, set()).add((rt, key))
                else:
                    bucket = self._dependents.get(uid)
                    if bucket is not None:
                        bucket.discard((rt, key))
                        if not bucket:
                            del self._dependents[uid]

    def _collect_garbage(self, owner_uid: str) -> None:
        """Delete objects whose owners are all gone, as the garbage collector would."""
        for rt, key in sorted(self._dependents.pop(owner_uid, set()), key=lambda d: d[1]):
            obj = self._tables[rt].objects.get(key)
            if obj is None:
                continue
            refs = obj["metadata"].get("ownerReferences") or ()
            if any(r.get("uid") in self._by_uid for r in refs):
                continue  # another owner is still alive
            self._remove(rt, key, obj)

    def put(self, obj: Obj, *, silent: bool = False) -> Obj:
        """Create or overwrite an object directly, bypassing validation (test setup).

        Quantities are still canonicalized, so seeded objects read back as the real
        server would return them. ``silent`` overwrites an existing object keeping its
        resourceVersion and tells no watcher: a change some client's watch missed.
        """
        rt = BY_KIND[(obj["apiVersion"], obj["kind"])]
        namespace = obj["metadata"].get("namespace") or ("default" if rt.namespaced else None)
        key = (namespace or "", obj["metadata"]["name"])
        table = self._tables[rt]
        old = table.objects.get(key)
        new = copy.deepcopy(obj)
        validation.canonicalize_quantities(rt, new)
        meta = new["metadata"]
        if rt.namespaced:
            meta["namespace"] = namespace
        meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        if rt.generation:
            meta.setdefault("generation", 1)
        if silent:
            if old is None:
                raise KeyError(f"no {rt.kind} {key[1]} to overwrite silently")
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            table.put(key, new)
            return new
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        table.put(key, new)
        self._index_owners(rt, key, old, new)
        self._commit(rt, Event(rv, "MODIFIED" if old else "ADDED", old, new))
        return new

    def compact(self) -> None:
        """Forget all history: any watch from an older resourceVersion now gets 410."""
        for table in self._tables.values():
            table.forget(self.rv)

    def events_since(self, rt: ResourceType, rv: int) -> list[Event]:
        """History after ``rv``; ApiError 410 when part of it has been compacted away."""
        table = self._tables[rt]
        if rv < table.compacted_rv:
            raise status.expired(f"too old resource version: {rv} ({table.compacted_rv})")
        return table.since(rv)

    def add_watcher(self, watcher: Watcher) -> None:
        self._tables[watcher.rt].add_watcher(watcher)
        self.watches_changed.set()

    def remove_watcher(self, watcher: Watcher) -> None:
        self._tables[watcher.rt].remove_watcher(watcher)
        self.watches_changed.set()

    def all_watchers(self) -> list[Watcher]:
        return [w for table in self._tables.values() for w in table.all_watchers()]


def _spec_changed(old: Obj, new: Obj) -> bool:
    skip = {"metadata", "status", "kind", "apiVersion"}
    keys = (set(old) | set(new)) - skip
    return any(old.get(k) != new.get(k) for k in keys)
