"""The asyncio shell around :func:`cluster.computedomain.plan.plan`: one per cluster, leading
among its replicas by a Lease.

While it leads, six watches (:class:`driver.kube.informer.Informer`) keep its view current:
every ComputeDomain; and, by the domain label, the DaemonSets, daemon pods and cliques in the
driver's namespace, the ResourceClaimTemplates in every namespace, and the Nodes. Every
change marks the domain UID it concerns (an object's label, a domain's own UID) and a
single reconcile loop plans each marked UID from that view and sends its writes, each landing
in the view at once; it plans again until the plan is empty. Nothing is polled: at rest the
controller holds its watches open and sends nothing.

A failed write leaves its UID marked with a backoff (capped; ten times longer for the errors
that wait on a person: RBAC, a rejected object); the watches bring whatever the failure was
about (a conflict, an object that exists after a lost answer), and the next plan starts from
there. Every object has a fixed name, every update carries the version it was planned from
and every delete its preconditions, so a plan from a stale view fails instead of doing harm,
and a controller killed between two writes finds the first one in its next list and goes on
from the second.

A UID whose plan keeps producing writes that succeed (a rewrite loop: the server normalising a
field the plan sets) is put off after :data:`MAX_ROUNDS` rounds with one log line, instead of
writing forever.
"""

import asyncio
import collections
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cluster.computedomain import plan as planning
from cluster.computedomain.objects import DaemonSettings
from cluster.computedomain.plan import Observed, Write
from driver.common.crashpoints import crashpoint
from driver.common.errors import RetryableError
from driver.common.logs import kv
from driver.common.wire import Obj
from driver.kube.backoff import Backoff
from driver.kube.informer import Informer, Key, key_of, version_of
from driver.kube.leader import LeaderElection
from driver.kube.resources import (
    DAEMON_SETS,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    Resource,
)
from driver.kube.rest import (
    ApiError,
    Client,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    RejectedError,
)
from driver.kube.session import Session
from drivers.computedomain import names

log = logging.getLogger(__name__)

MAX_ROUNDS = 16  # plans in a row for one UID whose writes all succeed; a domain needs 8 at most
LEASE_NAME = "compute-domain-controller"
_RESOURCES = {  # a plan's resource -> the API's
    planning.DOMAIN: names.COMPUTE_DOMAINS_API,
    planning.DAEMON_SETS: DAEMON_SETS,
    planning.TEMPLATES: RESOURCE_CLAIM_TEMPLATES,
    planning.CLIQUES: names.CLIQUES_API,
    planning.NODES: NODES,
    "pods": PODS,
}


@dataclass
class WriteStats:
    """Writes sent, by verb, and failed writes, by error class: both fixed sets, for metrics."""

    writes: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)


class ComputeDomainController:
    """Keeps every ComputeDomain's objects and status as :mod:`~cluster.computedomain.plan`
    wants them.

    ``api_client``: a configured client (the caller owns and closes it). ``settings``: the
    DaemonSets' shared settings, among them the driver's namespace (the Lease's too).
    ``identity``: this replica's name in the Lease. ``leader_elect=False`` works without a
    Lease (one replica only). ``run()`` works until cancelled; cancelling releases the Lease.
    """

    def __init__(
        self,
        api_client: Session,
        *,
        settings: DaemonSettings,
        identity: str,
        leader_elect: bool = True,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        request_timeout: float = 30.0,
        backoff_cap: float = 30.0,
    ) -> None:
        self._client = Client(api_client, request_timeout=request_timeout)
        self.settings = settings
        self._backoff_cap = backoff_cap
        self.stats = WriteStats()
        self.election = (
            LeaderElection(
                self._client,
                namespace=settings.namespace,
                name=LEASE_NAME,
                identity=identity,
                lease_duration=lease_duration,
                renew_deadline=renew_deadline,
                retry_period=retry_period,
            )
            if leader_elect
            else None
        )
        self.synced = asyncio.Event()  # the watches have listed once, since leading
        self._informers: dict[str, Informer] = {}
        self._index: dict[str, dict[str, dict[Key, Obj]]] = {}
        self._dirty: set[str] = set()
        self._not_before: dict[str, float] = {}
        self._backoffs: dict[str, Backoff] = {}
        self._wake = asyncio.Event()
        self._reported: set[str] = set()
        self._channel_problems: dict[str, tuple[str, str]] = {}  # uid -> (reason, message)
        self._passes = asyncio.Condition()
        self._pods_behind = 0  # the pod watch's progress when _pods_progressed last looked

    # -- public ---------------------------------------------------------------------------

    async def run(self) -> None:
        if self.election is None:
            await self._lead()
        else:
            await self.election.run(self._lead)

    @property
    def leading(self) -> bool:
        return self.election.leading if self.election is not None else bool(self._informers)

    def domains_by_status(self) -> Mapping[str, int]:
        """Domains in the view by ``status.status``; one without a status yet is NotReady (the
        CRD's default)."""
        counts = dict.fromkeys(names.STATUSES, 0)
        informer = self._informers.get(planning.DOMAIN)
        for domain in informer.items.values() if informer is not None else ():
            value = (domain.get("status") or {}).get("status")
            counts[value if value in counts else names.NOT_READY] += 1
        return counts

    async def settled(self, check: Callable[[], bool] = lambda: True) -> None:
        """Wait until ``check()`` holds with the view listed and no UID marked: it is looked at
        after every pass of the reconcile loop, which every change it could concern causes."""
        async with self._passes:
            await self._passes.wait_for(
                lambda: self.synced.is_set() and not self._dirty and check()
            )

    # -- leading --------------------------------------------------------------------------

    async def _lead(self) -> None:
        self._start_view()
        try:
            async with asyncio.TaskGroup() as tasks:
                for informer in self._informers.values():
                    tasks.create_task(informer.run(), name=f"watch-{informer.resource}")
                await asyncio.gather(*(i.synced.wait() for i in self._informers.values()))
                log.info(
                    "watching ComputeDomains",
                    extra=kv(
                        domains=len(self._informers[planning.DOMAIN].items),
                        namespace=self.settings.namespace,
                    ),
                )
                self.synced.set()
                self._mark(*{uid for index in self._index.values() for uid in index})
                tasks.create_task(self._reconcile_loop(), name="computedomain-reconcile")
        finally:
            self.synced.clear()
            self._pods_behind = 0
            self._informers = {}
            self._index = {}
            self._dirty.clear()

    def _start_view(self) -> None:
        ns = self.settings.namespace
        selector = names.COMPUTE_DOMAIN_LABEL
        watched = {  # kind -> (namespace, label selector); "" is all namespaces
            planning.DOMAIN: ("", ""),
            planning.DAEMON_SETS: (ns, selector),
            planning.TEMPLATES: ("", selector),
            "pods": (ns, selector),
            planning.CLIQUES: (ns, selector),
            planning.NODES: ("", selector),
        }
        self._index = {kind: {} for kind in watched}
        self._informers = {
            kind: Informer(
                self._client,
                _RESOURCES[kind],
                namespace=namespace,
                label_selector=labels,
                on_change=self._changed(kind),
                on_progress=self._pods_progressed if kind == "pods" else None,
                backoff_cap=self._backoff_cap,
            )
            for kind, (namespace, labels) in watched.items()
        }

    def _changed(self, kind: str) -> Callable[[Obj | None, Obj | None], None]:
        index = self._index[kind]

        def uid(obj: Obj) -> str:
            meta = obj.get("metadata") or {}
            if kind == planning.DOMAIN:
                return str(meta.get("uid") or "")
            return str((meta.get("labels") or {}).get(names.COMPUTE_DOMAIN_LABEL) or "")

        def changed(old: Obj | None, new: Obj | None) -> None:
            if old is not None and (was := uid(old)):
                index.get(was, {}).pop(key_of(old), None)
                if not index.get(was):
                    index.pop(was, None)
                self._mark(was)
            if new is not None and (now := uid(new)):
                index.setdefault(now, {})[key_of(new)] = new
                self._mark(now)

        return changed

    def _pods_progressed(self, seen: int) -> None:
        """The pod watch has seen further: a clique entry it had been behind may now be found
        dead (:func:`~cluster.computedomain.status.stale_daemons`), so plan its domain again."""
        for uid, cliques in self._index.get(planning.CLIQUES, {}).items():
            if any(self._pods_behind < version_of(c) <= seen for c in cliques.values()):
                self._mark(uid)
        self._pods_behind = seen

    def _mark(self, *uids: str) -> None:
        self._dirty.update(uids)
        self._wake.set()

    def _observed(self, uid: str) -> Observed:
        def of(kind: str) -> tuple[Obj, ...]:
            return tuple(self._index[kind].get(uid, {}).values())

        domains = of(planning.DOMAIN)
        return Observed(
            domain=domains[0] if domains else None,
            daemon_sets=of(planning.DAEMON_SETS),
            templates=of(planning.TEMPLATES),
            pods=of("pods"),
            cliques=of(planning.CLIQUES),
            nodes=of(planning.NODES),
            pods_seen=self._informers["pods"].seen,
            channel_problem=self._channel_problems.get(uid),
        )

    # -- reconcile --------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            now = loop.time()
            for uid in sorted(u for u in self._dirty if self._not_before.get(u, 0.0) <= now):
                self._dirty.discard(uid)
                await self._sync(uid)
            waiting = [self._not_before[u] for u in self._dirty if u in self._not_before]
            if waiting:
                loop.call_at(min(waiting), self._wake.set)
            async with self._passes:
                self._passes.notify_all()

    async def _sync(self, uid: str) -> None:
        for _ in range(MAX_ROUNDS):
            writes = planning.plan(uid, self._observed(uid), self.settings)
            if not writes:
                if self._observed(uid).domain is None:
                    self._channel_problems.pop(uid, None)
                self._not_before.pop(uid, None)
                self._backoffs.pop(uid, None)
                self._reported.discard(uid)
                return
            write = writes[0]
            try:
                for write in writes:
                    await self._send(write)
                    if _is_channel_create(write):
                        self._channel_problems.pop(uid, None)
            except (ApiError, RetryableError) as exc:
                if _is_channel_create(write) and isinstance(exc, (ConflictError, RejectedError)):
                    self._channel_problems[uid] = _channel_problem(write, exc)
                self._report(uid, exc)
                self._retry_later(uid, slow=isinstance(exc, ApiError) and exc.slow)
                return
        if uid not in self._reported:
            self._reported.add(uid)
            log.error(
                "the plan for a ComputeDomain keeps changing; putting it off",
                extra=kv(domain_uid=uid, rounds=MAX_ROUNDS),
            )
        self._retry_later(uid, slow=True)

    def _retry_later(self, uid: str, *, slow: bool) -> None:
        backoff = self._backoffs.setdefault(uid, Backoff(cap=self._backoff_cap))
        delay = backoff.next_delay() * (10 if slow else 1)
        self._not_before[uid] = asyncio.get_running_loop().time() + delay
        self._dirty.add(uid)

    def _report(self, uid: str, exc: Exception) -> None:
        """One line per domain and problem, not one per retry."""
        key = f"{uid} {type(exc).__name__}"
        if key in self._reported:
            return
        self._reported.add(key)
        if isinstance(exc, ForbiddenError):
            log.error(str(exc), extra=kv(domain_uid=uid))
        else:
            log.warning(
                "ComputeDomain write failed; retrying", extra=kv(domain_uid=uid, error=str(exc))
            )

    async def _send(self, write: Write) -> None:
        kind, _, subresource = write.resource.partition("/")
        api, informer = _RESOURCES[kind], self._informers[kind]
        try:
            if write.verb == "create":
                assert write.body is not None
                answer = await self._client.create(api, write.body, namespace=write.namespace)
                informer.remember(answer)
            elif write.verb == "patch":
                assert write.body is not None
                try:
                    answer = await self._client.patch(
                        api,
                        write.name,
                        write.body,
                        namespace=write.namespace,
                        subresource=subresource,
                    )
                except NotFoundError:
                    # Gone before the watch said so: the next plan works from that.
                    cached = informer.items.get((write.namespace, write.name))
                    if cached is not None:
                        informer.forget(cached)
                    raise
                informer.remember(answer)
            else:
                await self._delete(informer, api, write)
        except ApiError as exc:
            self.stats.failures[type(exc).__name__] += 1
            raise
        self.stats.writes[write.verb] += 1
        log.info(
            "ComputeDomain write",
            extra=kv(
                verb=write.verb,
                resource=write.resource,
                namespace=write.namespace,
                object=write.name,
                why=write.why,
            ),
        )
        crashpoint(f"computedomain-write-{sum(self.stats.writes.values())}")

    async def _delete(self, informer: Informer, api: Resource, write: Write) -> None:
        cached = informer.items.get((write.namespace, write.name))
        try:
            answer = await self._client.delete(
                api,
                write.name,
                namespace=write.namespace,
                # Background: the DaemonSet's pods (and through them their claims and cliques)
                # go after it, so a domain's deletion never waits on a node that is down.
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "propagationPolicy": "Background",
                    "preconditions": write.preconditions,
                },
            )
        except NotFoundError:
            answer = {}  # gone already: what we wanted
        if answer.get("kind") not in (None, "Status") and (answer.get("metadata") or {}).get(
            "finalizers"
        ):
            informer.remember(answer)  # still there, being deleted: its finalizers hold it
        else:
            informer.forget(answer if answer.get("metadata", {}).get("name") else cached or {})


def _is_channel_create(write: Write) -> bool:
    labels = ((write.body or {}).get("metadata") or {}).get("labels") or {}
    return (
        write.verb == "create"
        and write.resource == planning.TEMPLATES
        and labels.get(names.TARGET_LABEL) == names.TARGET_WORKLOAD
    )


def _channel_problem(write: Write, exc: ApiError) -> tuple[str, str]:
    """The reason and message the domain's status gives for its channel template's create
    that failed with ``exc``: a name taken (409), or a template the server refuses (422)."""
    where = f"ResourceClaimTemplate {write.namespace}/{write.name}"
    if isinstance(exc, ConflictError):
        return (
            "NameTaken",
            f"{where} exists and is not this domain's (it lacks the label "
            f"{names.COMPUTE_DOMAIN_LABEL}): delete it, or make the domain again under "
            "another spec.channel.resourceClaimTemplate.name",
        )
    return "Rejected", f"the API server refused {where}: {exc}"
