"""Run a plugin process with its named calls timed, for bench_prepare_steps.

``python -m tests.bench.steptimer OUT {ours,floor} MODULE ARG...`` runs MODULE's ``main()``
with ARG... as its arguments, after wrapping the named calls of one prepare and one
unprepare (:data:`OURS` or :data:`FLOOR`) and every DRA servicer method the process
registers. Each servicer call (the handler, from the request decoded to the response
built) collects the time of every named call made within it, its tasks included; on
SIGUSR1 the process writes the calls so far to OUT as JSON: a list, one entry per
handler call, ``{"rpc": method, "total": ns, "steps": {name: ns}}``.
"""

import contextvars
import functools
import importlib
import inspect
import json
import signal
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

_calls: list[dict[str, Any]] = []
_current: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "steptimer", default=None
)

# (module, attribute path, step name). Each is a leaf of the handler: no named call runs
# within another, so their times add up (the handler's own code is total minus them).
OURS = (
    ("kubeletplugin.names", "claim_error", "check the claim reference"),
    ("kubeletplugin.draservice", "DraService._count_prepare", "metrics"),
    ("kubeletplugin.records", "Records.try_lock_claim", "claim lock file: take"),
    ("kubeletplugin.records", "Records.unlock_claim", "claim lock file: release"),
    ("kubernetes.aio.client", "ApiClient.param_serialize", "GET: kubernetes param_serialize"),
    ("kubernetes.aio.client", "ApiClient.call_api", "GET: kubernetes call_api (the HTTP call)"),
    ("aiohttp", "ClientResponse.read", "GET: read the body"),
    ("driver.kube.rest", "json.loads", "GET: json.loads"),
    ("kubeletplugin.state", "plan_claim", "plan_claim"),
    ("kubeletplugin.state", "DeviceState._prepared_claim", "_prepared_claim"),
    ("kubeletplugin.cdi", "build_claim_spec", "cdi.build_claim_spec"),
    ("kubeletplugin.cdi", "encode", "cdi.encode"),
    ("kubeletplugin.records", "Records.read_spec", "read_spec (already prepared?)"),
    ("kubeletplugin.records", "Records.reserve", "write: reserve (symlink)"),
    ("kubeletplugin.records", "Records.write_spec", "write: CDI spec (atomic)"),
    ("kubeletplugin.records", "Records.read_claim_record", "read_claim_record"),
    ("kubeletplugin.records", "Records.remove_spec", "write: remove the spec"),
    ("kubeletplugin.records", "Records.release", "write: release (unlink)"),
    ("kubeletplugin.state", "log.info", "INFO log line"),
    ("kubeletplugin.state", "DeviceState._tell", "claim observer (metrics)"),
)
# Calls that named ones run within: each gets its own time (see _timed).
OURS_NESTED = (
    ("kubeletplugin.draservice", "DraService._prepare", "DraService: requests, responses"),
    ("kubeletplugin.draservice", "DraService._unprepare", "DraService: requests, responses"),
    (
        "kubeletplugin.state",
        "DeviceState._detached",
        "claim's own task: create_task, shield, the loop's hops",
    ),
    ("kubeletplugin.state", "DeviceState._prepare_one", "_prepare_one: locks, log fields"),
    ("kubeletplugin.state", "DeviceState._unprepare_one", "_unprepare_one: locks, log fields"),
    ("kubeletplugin.state", "DeviceState._prepare", "_prepare: the steps' glue"),
    ("kubeletplugin.state", "DeviceState._unprepare", "_unprepare: the steps' glue"),
    ("driver.kube.rest", "Client._request", "GET: driver.kube.rest"),
)
FLOOR = (
    ("tests.bench.stackfloor", "json.loads", "GET: json.loads"),
    ("aiohttp", "ClientResponse.read", "GET: read the body"),
    ("tests.bench.stackfloor", "_Files.prepare", "writes"),
    ("tests.bench.stackfloor", "_Files.unprepare", "writes"),
)


def _timed(name: str, call: Callable[..., Any], nested: bool = False) -> Callable[..., Any]:
    """``call`` timed as step ``name``; ``nested``: a call that others named run within,
    which gets its own time only (its time less theirs), so that the steps still add up."""

    def add(started: int, inner_before: int) -> None:
        steps = _current.get()
        if steps is not None:
            spent = time.perf_counter_ns() - started
            if nested:
                spent -= sum(steps.values()) - inner_before
            steps[name] = steps.get(name, 0) + spent

    def inner() -> int:
        steps = _current.get()
        return sum(steps.values()) if nested and steps is not None else 0

    if inspect.iscoroutinefunction(call):

        @functools.wraps(call)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            before, started = inner(), time.perf_counter_ns()
            try:
                return await call(*args, **kwargs)
            finally:
                add(started, before)

        return timed_async

    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        before, started = inner(), time.perf_counter_ns()
        try:
            return call(*args, **kwargs)
        finally:
            add(started, before)

    return timed


def _handler(rpc: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def timed(request: Any, context: Any) -> Any:
        steps: dict[str, int] = {}
        token = _current.set(steps)
        started = time.perf_counter_ns()
        try:
            return await method(request, context)
        finally:
            _calls.append({"rpc": rpc, "total": time.perf_counter_ns() - started, "steps": steps})
            _current.reset(token)

    return timed


def _wrap(module_name: str, path: str, name: str, nested: bool = False) -> None:
    owner: Any = importlib.import_module(module_name)
    *parents, attr = path.split(".")
    for parent in parents:
        found = getattr(owner, parent)
        if isinstance(found, types.ModuleType) and parent == "json":
            # A module's own name for json: give that module alone a timed loads.
            shim = types.SimpleNamespace(**vars(found))
            setattr(owner, parent, shim)
            found = shim
        owner = found
    setattr(owner, attr, _timed(name, getattr(owner, attr), nested))


def _wrap_servicers() -> None:
    from api.gen import dra_v1_pb2_grpc

    register = dra_v1_pb2_grpc.add_DRAPluginServicer_to_server

    def add(servicer: Any, server: Any) -> None:
        for rpc in ("NodePrepareResources", "NodeUnprepareResources"):
            setattr(servicer, rpc, _handler(rpc, getattr(servicer, rpc)))
        register(servicer, server)

    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server = add


def main() -> None:
    out, which, module, *args = sys.argv[1:]
    for module_name, path, name in OURS if which == "ours" else FLOOR:
        _wrap(module_name, path, name)
    for module_name, path, name in OURS_NESTED if which == "ours" else ():
        _wrap(module_name, path, name, nested=True)
    _wrap_servicers()

    def dump(signum: int, frame: object) -> None:
        # Renamed into place: the bench reads it once the name exists.
        Path(f"{out}.tmp").write_text(json.dumps(_calls))
        Path(f"{out}.tmp").rename(out)

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = [module, *args]
    # Its main() on the module imported (and wrapped) here, not a second copy run as __main__.
    sys.exit(importlib.import_module(module).main())


if __name__ == "__main__":
    main()
