"""The HTTP face of the local API server: routing, discovery, CRUD, watch and faults."""

import asyncio
import base64
import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from driver.common.logs import kv
from driver.common.wire import Obj
from sandbox.apiserver import _discovery, _gates, _watch
from sandbox.apiserver import _patch as patching
from sandbox.apiserver import _status as status
from sandbox.apiserver import _validation as validation
from sandbox.apiserver._faults import Faults, Injected, RequestLog, RequestRecord
from sandbox.apiserver._resources import BY_PATH, RESOURCE_GROUP, RESOURCES, ResourceType
from sandbox.apiserver._selectors import parse_field_selector, parse_label_selector
from sandbox.apiserver._status import ApiError
from sandbox.apiserver._store import Store

log = logging.getLogger(__name__)

_JSON = "application/json"
_CREATED = web.RequestKey("created_name", str)


@dataclass(frozen=True)
class _Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str
    verb: str

    @property
    def log_resource(self) -> str:
        return self.rt.log_name + (f"/{self.subresource}" if self.subresource else "")


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _json_response(
    obj: Any, code: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(body=_dumps(obj), status=code, content_type=_JSON, headers=headers)


def _list_item(obj: Obj) -> Obj:
    # The real server leaves kind/apiVersion off typed list items.
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


class LocalApiServer:
    """An in-process Kubernetes API server for the resources this project uses.

    ``await start()``, point a client at ``url`` (or ``write_kubeconfig``), ``await stop()``.
    Objects survive stop/start on the same instance, so a test can take the server away
    (connection refused) and bring it back on the same port.
    """

    def __init__(
        self,
        *,
        version: str = "1.34.0",
        history_limit: int = 100_000,
        bookmark_interval: float = 1.0,
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        self.version = version
        # Gates not named are on: every field is kept unless a test switches its gate off.
        self.store = Store(
            history_limit=history_limit,
            version=version,
            disabled_gates=_gates.disabled_gates(feature_gates),
        )
        # resource.k8s.io/v1 arrived in Kubernetes 1.34; an older server does not serve it.
        self.faults = Faults(serve_resource_v1=validation.release(version) >= (1, 34))
        self.requests = RequestLog()
        self.bookmark_interval = bookmark_interval
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port = 0
        self._hanging: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        validation.warm_up(RESOURCES, version)

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port or self._port)
        await site.start()
        self._host, self._port = host, int(self._runner.addresses[0][1])
        self._loop = asyncio.get_running_loop()
        self.faults.set_drop_hook(self._drop_hook)

    async def stop(self) -> None:
        """Stop listening and end open streams; the stored objects stay."""
        self.faults.set_drop_hook(None)
        self._end_watches()
        for task in list(self._hanging):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self, *, version: str | None = None) -> None:
        """Stop and serve again on the same port, objects kept; with ``version``, as that
        version from then on (a control-plane upgrade or rollback)."""
        await self.stop()
        if version is not None:
            self.version = self.store.version = version
            validation.warm_up(RESOURCES, version)
        await self.start(self._host, self._port)

    async def __aenter__(self) -> "LocalApiServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """A kubeconfig (http, no credentials) that the client libraries and kubectl accept."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.url}}],
            "users": [{"name": "local", "user": {}}],
            "contexts": [
                {
                    "name": "local",
                    "context": {"cluster": "local", "user": "local", "namespace": namespace},
                }
            ],
            "current-context": "local",
            "preferences": {},
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(config, sort_keys=False))
        return target

    # ---- direct access for tests -----------------------------------------------------------

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """Copies of the stored objects of ``resource`` (plural, e.g. ``resourceslices``)."""
        rt = _resource_type(resource)
        table = self.store.table(rt)
        found = (o for k, o in table.objects.items() if namespace is None or k[0] == namespace)
        return copy.deepcopy(sorted(found, key=_sort_key))

    def put(self, obj: Obj, *, silent: bool = False) -> Obj:
        """Create or overwrite an object without validation (watchers see the change).

        ``silent``: overwrite an existing object at its resourceVersion, with no event,
        as if every watch had missed the change (the real server never does this; a
        client's cache goes just as wrong through a bug or a lost update of its own).
        """
        return copy.deepcopy(self.store.put(obj, silent=silent))

    def seed(self, *objs: Obj) -> list[Obj]:
        return [self.put(o) for o in objs]

    def delete(self, resource: str, name: str, namespace: str | None = None) -> None:
        """Delete as a client would (garbage collection included)."""
        self.store.delete(_resource_type(resource), namespace, name)

    def compact(self) -> None:
        """Drop the event history: older resourceVersions now get 410 Expired."""
        self.store.compact()

    def open_watches(self) -> int:
        return len(self.store.all_watchers())

    async def wait_for_watches(self, count: int) -> None:
        """Wait until exactly ``count`` watch streams are open; bound it with asyncio.timeout."""
        while self.open_watches() != count:
            self.store.watches_changed.clear()
            await self.store.watches_changed.wait()

    # ---- routing ---------------------------------------------------------------------------

    def _route(self, request: web.Request) -> _Route | None:
        parts = [p for p in request.path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        if group == RESOURCE_GROUP and not self.faults.serve_resource_v1:
            raise status.not_served()
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            return None
        rt = BY_PATH.get((group, version, rest[0]))
        if rt is None or (namespace is not None and not rt.namespaced):
            raise status.not_served()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if sub and sub not in rt.subresources:
            raise status.not_served()
        method = request.method
        watching = request.query.get("watch") in ("true", "1")
        if name is None:
            verb = {
                "GET": "watch" if watching else "list",
                "POST": "create",
                "DELETE": "deletecollection",
            }.get(method, "")
        else:
            verb = {
                "GET": "watch" if watching and not sub else "get",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete",
            }.get(method, "")
            if sub and verb == "delete":
                verb = ""
        if not verb:
            raise ApiError(
                405,
                "the server does not allow this method on the requested resource",
                "MethodNotAllowed",
                details={},
            )
        return _Route(rt, namespace, name, sub, verb)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        agent = request.headers.get("User-Agent", "")
        route: _Route | None = None
        try:
            discovery = _discovery.document(
                request.path,
                version=self.version,
                address=f"{self._host}:{self._port}",
                serve_resource_v1=self.faults.serve_resource_v1,
            )
            if discovery is not None:
                self.requests.append(RequestRecord("get", request.path, None, None, 200, agent))
                return _json_response(discovery)
            route = self._route(request)
            if route is None:
                raise status.not_served()
            injected = self.faults.decide(route.verb, route.log_resource, route.name)
            if injected.delay:
                await asyncio.sleep(injected.delay)
            if injected.forbidden_user:  # RBAC's 403; a 403 of fail() is its message's
                raise status.forbidden(
                    route.rt, route.verb, route.namespace, route.name, injected.forbidden_user
                )
            if injected.code:
                headers = (
                    {"Retry-After": str(injected.retry_after)}
                    if injected.retry_after is not None
                    else None
                )
                details = (
                    {"retryAfterSeconds": injected.retry_after}
                    if injected.retry_after is not None
                    else None
                )
                raise ApiError(injected.code, injected.message, details=details, headers=headers)
            if route.verb == "watch":
                return await self._watch(request, route, agent)
            response = await self._dispatch(request, route)
        except ApiError as err:
            self._record(route, request, err.code, agent)
            return _json_response(err.body, err.code, err.headers)
        except Exception as exc:  # a bug here must reach the client as the real server's 500
            log.exception("request failed", extra=kv(method=request.method, path=request.path))
            error = ApiError(500, f"Internal error occurred: {exc}")
            self._record(route, request, 500, agent)
            return _json_response(error.body, 500)
        if injected.drop == "late":
            await asyncio.sleep(self.faults.late_seconds)
        elif injected.drop:
            self._record(route, request, response.status, agent, dropped=True)
            return await self._drop(request, injected)
        self._record(route, request, response.status, agent)
        return response

    def _record(
        self,
        route: _Route | None,
        request: web.Request,
        code: int,
        agent: str,
        dropped: bool = False,
    ) -> None:
        if route is None:
            self.requests.append(
                RequestRecord(request.method.lower(), request.path, None, None, code, agent)
            )
            return
        self.requests.append(
            RequestRecord(
                route.verb,
                route.log_resource,
                route.namespace,
                route.name or request.get(_CREATED),
                code,
                agent,
                dropped,
                dry_run="dryRun" in request.query,
                watch_list=route.verb == "watch"
                and request.query.get("sendInitialEvents") in ("true", "1"),
            )
        )

    async def _drop(self, request: web.Request, injected: Injected) -> web.StreamResponse:
        transport = request.transport
        if injected.drop == "timeout":
            task = asyncio.current_task()
            if task is not None:
                self._hanging.add(task)
            try:
                await asyncio.sleep(self.faults.hold_seconds)
            finally:
                if task is not None:
                    self._hanging.discard(task)
        if transport is not None:
            transport.abort()
        raise asyncio.CancelledError  # nothing more goes to this client

    # ---- verbs -----------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"couldn't get version/kind; json parse error: {exc}") from exc

    async def _object_body(self, request: web.Request, rt: ResourceType) -> Obj:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise ApiError(400, f"the body of the request must be a {rt.kind} object")
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if (kind and kind != rt.kind) or (api_version and api_version != rt.api_version):
            raise ApiError(
                400,
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({rt.api_version})"
                if api_version != rt.api_version
                else f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})",
            )
        return body

    async def _dispatch(self, request: web.Request, route: _Route) -> web.Response:
        store, rt, ns = self.store, route.rt, route.namespace
        query = request.query
        field_validation = query.get("fieldValidation", "Warn")
        dry_run = _dry_run(query.getall("dryRun", []), route.verb)
        if route.verb == "get":
            assert route.name is not None
            return _json_response(store.get(rt, ns, route.name))
        if route.verb == "list":
            return self._list(route, query)
        if route.verb == "create":
            obj, warnings = store.create(
                rt,
                ns,
                await self._object_body(request, rt),
                field_validation=field_validation,
                dry_run=dry_run,
            )
            if not dry_run:
                request[_CREATED] = obj["metadata"]["name"]
            return _json_response(obj, 201, _warning_headers(warnings))
        if route.verb == "update":
            assert route.name is not None
            obj, warnings = store.update(
                rt,
                ns,
                route.name,
                await self._object_body(request, rt),
                subresource=route.subresource,
                field_validation=field_validation,
                dry_run=dry_run,
            )
            return _json_response(obj, 200, _warning_headers(warnings))
        if route.verb == "patch":
            assert route.name is not None
            patched = await self._patched(request, route)
            obj, warnings = store.update(
                rt,
                ns,
                route.name,
                patched,
                subresource=route.subresource,
                field_validation=field_validation,
            )
            return _json_response(obj, 200, _warning_headers(warnings))
        options = await self._body(request) or {}
        if not isinstance(options, dict):
            raise ApiError(400, "the body of a delete request must be DeleteOptions")
        orphan = (options.get("propagationPolicy") or query.get("propagationPolicy")) == "Orphan"
        if route.verb == "delete":
            assert route.name is not None
            return _json_response(
                store.delete(rt, ns, route.name, options.get("preconditions"), orphan=orphan)
            )
        # deletecollection
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), rt)
        deleted = [
            store.delete(rt, ns, o["metadata"]["name"], orphan=orphan)
            for o in store.select(rt, ns, labels, fields)
        ]
        return _json_response(
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(store.rv)},
                "items": [_list_item(o) for o in deleted],
            }
        )

    async def _patched(self, request: web.Request, route: _Route) -> Obj:
        assert route.name is not None
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type not in patching.TYPES:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(patching.TYPES)}",
            )
        patch = await self._body(request)
        # No await from here to the store write: a patch applies to the latest object.
        current = self.store.get(route.rt, route.namespace, route.name)
        if content_type == patching.JSON_PATCH:
            result = patching.json_patch(current, patch)
        else:
            if not isinstance(patch, dict):
                raise ApiError(400, "a merge patch must be a JSON object")
            result = patching.merge_patch(
                current, patch, strategic=content_type == patching.STRATEGIC
            )
        if not isinstance(result, dict):
            raise ApiError(422, "the patch did not produce an object", "Invalid")
        return result

    def _list(self, route: _Route, query: Mapping[str, str]) -> web.Response:
        store, rt = self.store, route.rt
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), rt)
        rv_text = query.get("resourceVersion", "")
        if rv_text:
            rv = _watch.parse_rv(rv_text)
            if rv > store.rv:
                raise ApiError(
                    504,
                    f"Too large resource version: {rv}, current: {store.rv}",
                    "Timeout",
                    details={
                        "causes": [
                            {
                                "reason": "ResourceVersionTooLarge",
                                "message": "Too large resource version",
                            }
                        ],
                        "retryAfterSeconds": 1,
                    },
                )
            if query.get("resourceVersionMatch") == "Exact" and rv != store.rv:
                raise status.expired(f"too old resource version: {rv} ({store.rv})")
        items = store.select(rt, route.namespace, labels, fields)
        meta: dict[str, Any] = {"resourceVersion": str(store.rv)}
        token = query.get("continue", "")
        if token:
            start, list_rv = _decode_continue(token)
            if list_rv < store.table(rt).compacted_rv:
                raise status.expired(
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter."
                )
            items = [o for o in items if _sort_key(o) > start]
        limit_text = query.get("limit", "") or "0"
        if not limit_text.isdigit():
            raise ApiError(400, f"limit must be a non-negative integer: {limit_text!r}")
        limit = int(limit_text)
        if limit > 0 and len(items) > limit:
            remaining = len(items) - limit
            items = items[:limit]
            meta["continue"] = _encode_continue(_sort_key(items[-1]), store.rv)
            meta["remainingItemCount"] = remaining
        return _json_response(
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": meta,
                "items": [_list_item(o) for o in items],
            }
        )

    # ---- watch -----------------------------------------------------------------------------

    async def _watch(self, request: web.Request, route: _Route, agent: str) -> web.StreamResponse:
        self._record(route, request, 200, agent)
        return await _watch.serve(
            request, self.store, route.rt, route.namespace, route.name, self.bookmark_interval
        )

    def _end_watches(self) -> None:
        for watcher in self.store.all_watchers():
            watcher.queue.put_nowait(None)

    def _drop_hook(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._end_watches()
        else:
            loop.call_soon_threadsafe(self._end_watches)
        log.info("dropped watches", extra=kv(count=len(self.store.all_watchers())))


def _warning_headers(warnings: list[str]) -> dict[str, str] | None:
    if not warnings:
        return None
    return {"Warning": ", ".join('299 - "' + w.replace('"', '\\"') + '"' for w in warnings)}


def _sort_key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _dry_run(values: list[str], verb: str) -> bool:
    """``dryRun=All`` on create and update; anything else that asks for it is refused."""
    if not values:
        return False
    if any(v != "All" for v in values):
        raise ApiError(400, f'dryRun: Unsupported value: "{values[0]}": supported values: "All"')
    if verb not in ("create", "update"):
        # Refused rather than ignored: ignoring it would commit what the client meant to try.
        raise ApiError(400, f"dryRun on {verb} is not supported by the local API server")
    return True


def _encode_continue(key: tuple[str, str], rv: int) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(key)})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_continue(token: str) -> tuple[tuple[str, str], int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return (data["start"][0], data["start"][1]), int(data["rv"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ApiError(400, f"continue key is not valid: {exc}") from exc


def _resource_type(resource: str) -> ResourceType:
    plural = resource.rsplit("/", 1)[-1]
    for rt in RESOURCES:
        if rt.plural == plural:
            return rt
    raise KeyError(f"not a served resource: {resource}")
