"""The asyncio shell around :func:`driver.slices.plan.plan`: one per node.

Three loops share one event loop and a little state:

* **discovery** runs ``discover()`` at start, every ``resync_period`` and on
  :meth:`SliceController.trigger`; a success replaces the desired slices, a failure
  backs off and keeps the old ones (published slices are never removed because NVML
  hiccuped);
* **watch** keeps ``observed`` (this node's slices of this driver) current: a
  :class:`~driver.kube.informer.Informer` with the field selector upstream uses, listing
  by a watch list where the server streams one; it reconnects from the last
  resourceVersion and asks for a relist on 410 Gone;
* **reconcile** plans and sends the writes whenever either side changed.

Two instances for one node (a surge upgrade) are arbitrated by a per-node Lease,
created only once an instance sees slices it did not write: see
:mod:`driver.kube.lease`. A node's first publish is one write.

Correctness rests on one rule: *after any failure or doubt, relist before planning
again.* A create whose response got lost may have committed; a fresh list (a
quorum read, issued after the failure) shows it, so the controller never creates a
second slice for the same index. Successful writes go into ``observed`` at once (the
informer's mutation cache, as upstream's), and watch events older than what is cached
are ignored, so an echo never looks like a missing slice; a delete's tombstone lasts
until the next event for the name (five minutes at most): slice names are fixed, so a
deleted name is re-used, and its later events count.

Every error class of :mod:`driver.kube.rest` is retried with a backoff; those that wait
on a person (``ApiError.slow``: 401, 403, 400/422) with a ten times longer cap.

When the Node is gone (a create finds no owner), its slices are not re-created; a
GET of the Node, backing off, notices the Node coming back (a new UID) and
republishes at once rather than at the next resync.
"""

import asyncio
import collections
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from driver.common.errors import DriverError, PermanentError, RetryableError
from driver.common.logs import kv
from driver.common.wire import Obj as _Obj
from driver.kube.backoff import Backoff
from driver.kube.informer import Informer
from driver.kube.lease import LEASE_DURATION, Candidate, PublisherLease, lease_name
from driver.kube.resources import NODES, RESOURCE_SLICES
from driver.kube.rest import (
    ApiError,
    Client,
    ForbiddenError,
    NotFoundError,
    ServerError,
    UnavailableError,
)
from driver.kube.session import Session
from driver.slices.capabilities import CapabilityGuard
from driver.slices.model import build_slices, counters_apart_for
from driver.slices.plan import InvalidPoolError, Plan, plan

log = logging.getLogger(__name__)

_GROUP = RESOURCE_SLICES.group


class ApiVersionMissingError(PermanentError):
    """The API server does not serve resource.k8s.io/v1."""


class NodeNotFoundError(PermanentError):
    """The Node this controller publishes for does not exist."""


@dataclass
class PublishStats:
    """What the publisher sent, for the metrics: writes by verb (create, update,
    delete) and failed writes by error class; both label sets are fixed."""

    writes: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)


class SliceController:
    """Keeps one node's ResourceSlices equal to what discovery finds.

    ``api_client`` is a :class:`~driver.kube.session.Session` (the caller owns
    and closes it); ``devices`` is the source of desired devices (every device kind's,
    rediscovered on each call, ``kubeletplugin.devices.NodeDevices.published``) and may
    raise (``RetryableError`` for "not yet"); ``counter_sets`` (called right after it,
    ``NodeDevices.counter_sets``) the shared counters those devices consume, whose layout
    follows the server's version; the slices are built from them by
    :func:`driver.slices.model.build_slices`, and the
    :class:`~driver.slices.capabilities.CapabilityGuard` fits them to what the server
    keeps.

    ``run()`` works until cancelled, which leaves the slices in place (the kubelet
    removes a dead driver's slices itself) and releases the publisher lease. It raises
    :class:`ApiVersionMissingError` or :class:`NodeNotFoundError` at start when
    publishing cannot work.

    ``published`` (readiness waits for it) is set the first time a reconcile ends with
    the node's slices as desired: the plan needed no writes, or every write it sent
    succeeded (not waiting for the watch to show them); or when a newer instance holds
    the Lease and this one stands by. It is never cleared: it says the node's slices
    were published once, not that they are current now. A pool the plan refuses
    (``InvalidPoolError``) does not set it. ``trigger()`` asks for a rediscovery;
    ``resync()`` also waits for its result to be reconciled.

    ``resync_period``: seconds between rediscoveries. ``identity``: this instance's
    name in the publisher Lease (default: host name plus a random suffix);
    ``namespace``: the Lease's namespace (default ``$POD_NAMESPACE``, else
    ``default``); ``lease_duration`` its ``leaseDurationSeconds``. ``request_timeout``
    bounds each API call; ``backoff_cap`` the delay between retries. ``node_uid``: the
    Node's UID where the caller has just read it (the node daemon's device-plugin
    guard), saving the controller its own read at start.
    """

    def __init__(
        self,
        api_client: Session,
        *,
        node_name: str,
        driver_name: str,
        devices: Callable[[], Awaitable[list[dict[str, Any]]]],
        counter_sets: Callable[[], list[dict[str, Any]]] | None = None,
        resync_period: float = 60.0,
        identity: str | None = None,
        namespace: str | None = None,
        request_timeout: float = 30.0,
        backoff_cap: float = 30.0,
        lease_duration: float = LEASE_DURATION,
        node_uid: str = "",
    ) -> None:
        self._client = Client(api_client, request_timeout=request_timeout)
        self._node = node_name
        self._driver = driver_name
        self._devices = devices
        self._counter_sets = counter_sets
        self._guard = CapabilityGuard(self._client, driver_name=driver_name, node_name=node_name)
        self._resync_period = resync_period
        self._backoff_cap = backoff_cap
        self._slices = Informer(
            self._client,
            RESOURCE_SLICES,
            field_selector=f"spec.driver={driver_name},spec.nodeName={node_name}",
            backoff_cap=backoff_cap,
            watch_list=True,
            on_change=self._changed,
            on_reconnect=self._reconnected,
            on_error=lambda exc: self._report(exc, what="watch slices"),
            on_expired=self._expired,
        )
        self._lease = PublisherLease(
            self._client,
            namespace=namespace or os.environ.get("POD_NAMESPACE") or "default",
            name=lease_name(driver_name, node_name),
            me=Candidate(
                identity=identity or f"{socket.gethostname()}_{uuid.uuid4()}",
                started=datetime.now(UTC),
            ),
            duration=lease_duration,
        )
        self.published = asyncio.Event()
        self.stats = PublishStats()
        self._node_uid = node_uid
        self._node_gone = False
        self._desired: list[_Obj] | None = None
        self._stale = True  # observed must be (re)listed before planning
        # While we write or relist: what changes observed then is no news to reconcile.
        self._quiet = False
        self._node_waiter: asyncio.Task[None] | None = None
        self._dirty = asyncio.Event()
        self._wake_discovery = asyncio.Event()
        self._lease_recheck = True
        self._standby = False
        # Slice names this instance wrote; a listed slice outside it means another
        # publisher (or a lost create response): from then on, arbitrate by Lease.
        self._written: set[str] = set()
        self._creating: set[str] = set()  # names of our creates still awaiting an answer
        self._rival_seen = False
        self._reported: set[str] = set()
        # Resync bookkeeping: requested -> discovered -> reconciled.
        self._requested = 0
        self._desired_seq = 0
        self._done_seq = 0
        self._progress = asyncio.Condition()
        # After a create with an unknown outcome: a request the server still holds is
        # assumed dead after twice the client's timeout (it got one already).
        self._settle = request_timeout
        self._settle_until = 0.0

    # -- public ---------------------------------------------------------------

    def trigger(self, *, relist: bool = False) -> None:
        """Rediscover now (SIGHUP, health events); returns at once.

        ``relist``: also plan from a fresh list rather than the watched state, for when
        someone doubts it (an operator's SIGHUP); it costs one list.
        """
        if relist:
            self._stale = True
        self._requested += 1
        self._wake_discovery.set()

    async def resync(self) -> None:
        """Rediscover now and wait until the result has been reconciled."""
        self.trigger()
        target = self._requested
        async with self._progress:
            await self._progress.wait_for(lambda: self._done_seq >= target)

    @property
    def standby(self) -> bool:
        """True while a newer instance for this node publishes instead of this one."""
        return self._standby

    async def run(self) -> None:
        try:
            # The node's owner reference and the first list at once: a node joining the
            # cluster waits on its first publish, which needs both and nothing else.
            self._node_uid = await _both(
                self._node_uid_or_fail(), self._retrying(self._first_list, "list slices")
            )
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._discovery_loop(), name="slice-discovery")
                tasks.create_task(self._reconcile_loop(), name="slice-reconcile")
                tasks.create_task(self._lease.maintain(self._lease_freed), name="slice-lease")
        finally:
            await self._slices.stop()
            await _stopped(self._node_waiter)
            await self._release_lease()

    # -- start-up checks --------------------------------------------------------

    async def _retrying(self, call: Callable[[], Awaitable[_Obj]], what: str) -> _Obj:
        backoff = Backoff(cap=self._backoff_cap)
        slow = Backoff(cap=10 * self._backoff_cap)
        while True:
            try:
                return await call()
            except (ApiError, RetryableError) as exc:
                self._report(exc, what=what)
                delay = slow if isinstance(exc, ApiError) and exc.slow else backoff
                await asyncio.sleep(delay.next_delay())

    async def _first_list(self) -> _Obj:
        """The first list of this node's slices (which starts the watch); on a server
        without resource.k8s.io/v1, :class:`ApiVersionMissingError` naming what it serves."""
        try:
            await self._relist()
        except NotFoundError as exc:
            raise await self._missing_api() from exc
        return {}

    async def _missing_api(self) -> ApiVersionMissingError:
        # Only after a 404: a server that serves the group costs no discovery request.
        async def group() -> _Obj:
            try:
                return await self._client.get_json(f"/apis/{_GROUP}", resource=f"/apis/{_GROUP}")
            except NotFoundError:
                return {}

        found = await self._retrying(group, "API discovery")
        versions = [v.get("version") for v in found.get("versions") or ()]
        served = ", ".join(f"{_GROUP}/{v}" for v in versions if v) or "none"
        return ApiVersionMissingError(
            f"the API server does not serve {_GROUP}/v1 (Kubernetes 1.34 or later is "
            f"required for DRA); it serves: {served}"
        )

    async def _node_uid_or_fail(self) -> str:
        if self._node_uid:  # given by the caller, who read the Node already
            return self._node_uid

        async def node() -> _Obj:
            try:
                return await self._client.get(NODES, self._node)
            except NotFoundError as exc:
                raise NodeNotFoundError(
                    f"node {self._node!r} does not exist; --node-name (NODE_NAME) must name "
                    "this node as the API server knows it"
                ) from exc

        found = await self._retrying(node, "read node")
        uid: str = found["metadata"]["uid"]
        return uid

    # -- discovery ----------------------------------------------------------------

    async def _discovery_loop(self) -> None:

        backoff = Backoff(cap=min(self._backoff_cap, self._resync_period))
        while True:
            seq = self._requested
            self._wake_discovery.clear()
            try:
                devices = await self._devices()
            except (DriverError, OSError) as exc:
                log.warning(
                    "discovery failed; keeping the published slices",
                    extra=kv(
                        node=self._node, error=str(exc), retryable=isinstance(exc, RetryableError)
                    ),
                )
                await self._wait_discovery(backoff.next_delay())
                continue
            sets = self._counter_sets() if self._counter_sets is not None else []
            try:
                apart = True
                if sets:  # where counters go depends on the server's version
                    apart = counters_apart_for((await self._guard.learn()).version)
                desired = build_slices(
                    devices,
                    driver_name=self._driver,
                    node_name=self._node,
                    counter_sets=sets,
                    counters_apart=apart,
                )
                desired = await self._guard.fit(desired)
            except (ApiError, RetryableError) as exc:
                self._report(exc, what="learn the API server's capabilities")
                await self._wait_discovery(backoff.next_delay())
                continue
            backoff.reset()
            if desired != self._desired:
                log.info(
                    "discovered devices",
                    extra=kv(node=self._node, devices=len(devices), slices=len(desired)),
                )
            self._desired = desired
            self._desired_seq = max(self._desired_seq, seq)
            self._lease_recheck = True
            self._dirty.set()
            await self._wait_discovery(self._resync_period)

    async def _wait_discovery(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake_discovery.wait(), delay)

    # -- reconcile ----------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        backoff = Backoff(cap=self._backoff_cap)
        # For what waits on a person (RBAC, a rejected object): retried, but seldom.
        slow = Backoff(cap=10 * self._backoff_cap)
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            seq = self._desired_seq
            try:
                await self._reconcile()
            except InvalidPoolError as exc:
                # Upstream reports and does not retry: the next discovery brings a new pool.
                log.error("not publishing an invalid pool", extra=kv(error=str(exc)))
                await self._done(seq)
            except (ApiError, RetryableError) as exc:
                self._stale = True
                self._report(exc, what="publish slices")
                delay = slow if isinstance(exc, ApiError) and exc.slow else backoff
                await asyncio.sleep(delay.next_delay())
                self._dirty.set()
            else:
                backoff.reset()
                slow.reset()
                await self._done(seq)

    async def _done(self, seq: int) -> None:
        async with self._progress:
            self._done_seq = max(self._done_seq, seq)
            self._progress.notify_all()

    async def _reconcile(self) -> None:
        if self._stale:
            settle = self._settle_until - asyncio.get_running_loop().time()
            if settle > 0:
                await asyncio.sleep(settle)
            await self._relist()
        if self._desired is None:
            return
        todo = plan(
            self._desired,
            list(self._slices.items.values()),
            driver_name=self._driver,
            node_name=self._node,
            node_uid=self._node_uid,
        )
        if todo.writes:
            if self._standby and not self._lease_recheck:
                return  # a newer instance publishes; look again at the next resync
            self._lease_recheck = False
            # A node's first publish onto an empty pool reads no lease: a live holder keeps
            # its slices published, so an empty pool has none, or one whose create will 409
            # against ours (rival evidence both ways); any round after our first write reads
            # it. Nothing written and no rival seen is that case: any slice a list found that
            # we did not write is a rival's. It keeps a new node's join to three requests.
            first = not self._written and not self._rival_seen
            if not first and not await self._lease.ensure(rival_seen=self._rival_seen):
                if not self._standby:
                    log.info(
                        "a newer instance publishes this node's slices; standing by",
                        extra=kv(node=self._node, lease=self._lease.name),
                    )
                self._standby = True
                self.published.set()
                return
            self._standby = False
            if todo.creates and self.published.is_set():
                todo = await self._recheck_node(todo)
            await self._apply(todo)
        self._reported.clear()
        if not self.published.is_set():
            log.info(
                "slices published",
                extra=kv(node=self._node, slices=len(self._desired), pools=todo.generations),
            )
        self.published.set()

    async def _recheck_node(self, todo: Plan) -> Plan:
        """Before re-creating slices, make sure their owner still exists.

        Deleting the Node garbage-collects its slices; re-creating them would only feed
        the garbage collector. A Node re-created under the same name gets a new UID,
        which the new slices must own.
        """
        try:
            node = await self._client.get(NODES, self._node)
        except NotFoundError:
            if not self._node_gone:
                log.warning("node deleted; not re-creating its slices", extra=kv(node=self._node))
            self._node_gone = True
            if self._node_waiter is None or self._node_waiter.done():
                self._node_waiter = asyncio.create_task(self._wait_for_node(), name="node-wait")
            return Plan(todo.deletes, todo.updates, (), todo.generations)
        self._node_gone = False
        uid = str(node["metadata"]["uid"])
        if uid == self._node_uid:
            return todo
        self._node_uid = uid
        assert self._desired is not None
        return plan(
            self._desired,
            list(self._slices.items.values()),
            driver_name=self._driver,
            node_name=self._node,
            node_uid=uid,
        )

    async def _wait_for_node(self) -> None:
        """Poll the deleted Node until it is back, then reconcile (it gets its slices).

        A GET while the Node is gone, not a watch: it needs no permission beyond ``get``
        and costs nothing while the Node exists.
        """
        backoff = Backoff(cap=self._backoff_cap)
        while True:
            await asyncio.sleep(backoff.next_delay())
            try:
                await self._client.get(NODES, self._node)
            except (ApiError, RetryableError):
                continue  # still gone, or the server is away: look again later
            log.info("node is back; publishing its slices", extra=kv(node=self._node))
            self._dirty.set()
            return

    async def _apply(self, todo: Plan) -> None:
        try:
            await self._write(todo)
        except ApiError as exc:
            self.stats.failures[type(exc).__name__] += 1
            raise

    async def _write(self, todo: Plan) -> None:
        for obj in todo.deletes:
            meta = obj["metadata"]
            deleted: _Obj = {}
            with contextlib.suppress(NotFoundError):  # already gone: what we wanted
                deleted = await self._client.delete(
                    RESOURCE_SLICES,
                    meta["name"],
                    body={
                        "apiVersion": "v1",
                        "kind": "DeleteOptions",
                        "preconditions": {
                            "uid": meta["uid"],
                            "resourceVersion": meta["resourceVersion"],
                        },
                    },
                )
            self.stats.writes["delete"] += 1
            # The answer is the object as deleted; its version is that of the delete.
            with self._quietly():
                self._slices.forget(deleted if deleted.get("metadata", {}).get("name") else obj)
        for body in todo.updates:
            stored = await self._client.update(RESOURCE_SLICES, body)
            self.stats.writes["update"] += 1
            self._remember(stored)
        for body in todo.creates:
            name = body["metadata"].get("name", "")
            self._creating.add(name)
            try:
                stored = await self._client.create(RESOURCE_SLICES, body)
            except (UnavailableError, ServerError):
                # It may still commit on the server; don't list (and re-create) too early.
                self._settle_until = asyncio.get_running_loop().time() + self._settle
                raise
            finally:
                self._creating.discard(name)
            self.stats.writes["create"] += 1
            self._remember(stored)
        log.info(
            "slices written",
            extra=kv(
                node=self._node,
                # Not "created": LogRecord has that attribute.
                slices_deleted=len(todo.deletes),
                slices_updated=len(todo.updates),
                slices_created=len(todo.creates),
                generations=todo.generations,
            ),
        )

    def _report(self, exc: Exception, *, what: str) -> None:
        """One line per distinct problem, not one per retry."""
        key = str(exc) if isinstance(exc, ForbiddenError) else type(exc).__name__ + what
        if key in self._reported:
            return
        self._reported.add(key)
        if isinstance(exc, ForbiddenError):
            log.error(str(exc))
        else:
            log.warning(f"{what} failed; retrying", extra=kv(node=self._node, error=str(exc)))

    # -- observed state -----------------------------------------------------------

    async def _relist(self) -> None:
        self._stale = False  # first: a watch that ends while we list marks it again
        try:
            with self._quietly():
                await self._slices.relist()
        except BaseException:
            self._stale = True
            raise
        if not {name for _, name in self._slices.items} <= self._written:
            self._rival_seen = True  # a listed slice no write of ours made

    def _changed(self, old: _Obj | None, new: _Obj | None) -> None:
        if self._quiet:
            return
        name = (new or {}).get("metadata", {}).get("name", "")
        if new is not None and name not in self._written and name not in self._creating:
            # A slice of this node that no write of ours made, seen after the list: another
            # instance's (a surge). The same evidence a list gives (_relist), or a create's
            # 409 would have given had its slice come a moment later.
            self._rival_seen = True
        self._dirty.set()

    async def _reconnected(self) -> None:
        # What the slices may use depends on the server's version, which an upgrade
        # changes; the upgrade ends the watch.
        if await self._guard.recheck():
            self.trigger()

    def _expired(self, exc: BaseException | None) -> None:
        """A watch that stops by itself (410, or a bug) leaves observed unknown: relist."""
        if exc is None:
            log.info("watch expired; relisting", extra=kv(node=self._node))
        else:
            log.error("slice watch failed; relisting", extra=kv(node=self._node, error=repr(exc)))
        self._stale = True
        self._dirty.set()

    def _remember(self, obj: _Obj) -> None:
        self._written.add(obj["metadata"]["name"])
        with self._quietly():
            self._slices.remember(obj)

    @contextlib.contextmanager
    def _quietly(self) -> Iterator[None]:
        self._quiet = True
        try:
            yield
        finally:
            self._quiet = False

    def _lease_freed(self) -> None:
        self._lease_recheck = True
        self._dirty.set()

    async def _release_lease(self) -> None:
        if not self._lease.held:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._lease.release()), 5.0)
        except (DriverError, TimeoutError, asyncio.CancelledError) as exc:
            log.warning("could not release the publisher lease", extra=kv(error=repr(exc)))


async def _both(first: Awaitable[str], second: Awaitable[object]) -> str:
    """``first``'s result once both are done; the first failure cancels the other."""
    tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            exc = task.exception()
            if exc is not None:
                raise exc
        return str(tasks[0].result())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)


async def _stopped(task: "asyncio.Task[None] | None") -> None:
    if task is not None and not task.done():
        task.cancel()
        await asyncio.wait([task])
