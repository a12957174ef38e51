"""The daemon's peers from the API server: its ComputeDomainClique, kept with its own entry.

The I/O around :mod:`cluster.imexdaemon.membership`. Two informers, each on one object by
``metadata.name`` (the clique, and this daemon's pod), wake one loop; the loop creates the
clique or brings this daemon's entry up to date (its address, and its status from the pod's
readiness), then yields the clique's peers whenever they differ from the last list it gave.
Writes are a create or an update at the read's resourceVersion: a conflict with another
daemon's write is read again and retried, so two daemons joining at once both end up listed.
Nothing is polled: with nothing changing there is no request after the two watches.
"""

import asyncio
import logging
from collections.abc import AsyncIterator

from cluster.imexdaemon.membership import Member, joined, left, new_clique, pod_ready
from cluster.imexdaemon.peers import Peer, peers_from_clique
from driver.common.errors import PermanentError, RetryableError
from driver.common.logs import kv
from driver.common.wire import Obj
from driver.kube.backoff import Backoff
from driver.kube.informer import Informer
from driver.kube.resources import PODS
from driver.kube.rest import ApiError, Client, ConflictError, NotFoundError
from drivers.computedomain import names

log = logging.getLogger(__name__)

LEAVE_TIMEOUT = 10.0  # NVIDIA's bound on removing its entry at stop


async def label_pod(client: Client, member: Member) -> None:
    """The clique label on this daemon's own pod (an empty value on a node without a clique),
    which the controller reads to tell fabric daemons from the others; retried until done."""
    body = {"metadata": {"labels": {names.CLIQUE_LABEL: member.clique_id}}}
    backoff = Backoff(cap=10.0)
    while True:
        try:
            await client.patch(PODS, member.pod_name, body, namespace=member.namespace)
        except ApiError as exc:
            log.warning(
                "cannot label this daemon's pod with its clique: retrying",
                extra=kv(pod=member.pod_name, namespace=member.namespace, error=str(exc)),
            )
            await asyncio.sleep(backoff.next_delay())
            continue
        log.info(
            "pod labelled with its clique",
            extra=kv(pod=member.pod_name, clique_id=member.clique_id or '""'),
        )
        return


class CliqueSource:
    """A :class:`~cluster.imexdaemon.peers.PeerSource` that also keeps this daemon listed."""

    def __init__(self, client: Client, member: Member) -> None:
        self._client = client
        self.member = member
        self._wake = asyncio.Event()
        self._cliques = Informer(
            client,
            names.CLIQUES_API,
            namespace=member.namespace,
            on_change=self._changed,
            field_selector=f"metadata.name={member.clique_name}",
        )
        self._pods = Informer(
            client,
            PODS,
            namespace=member.namespace,
            on_change=self._changed,
            field_selector=f"metadata.name={member.pod_name}",
        )

    def _changed(self, old: Obj | None, new: Obj | None) -> None:
        self._wake.set()

    @property
    def clique(self) -> Obj | None:
        return self._cliques.items.get((self.member.namespace, self.member.clique_name))

    @property
    def ready(self) -> bool:
        return pod_ready(self._pods.items.get((self.member.namespace, self.member.pod_name)))

    async def updates(self) -> AsyncIterator[tuple[Peer, ...]]:
        watches = [
            asyncio.create_task(self._cliques.run(), name="clique-watch"),
            asyncio.create_task(self._pods.run(), name="pod-watch"),
        ]
        try:
            await asyncio.gather(self._cliques.synced.wait(), self._pods.synced.wait())
            last: tuple[Peer, ...] | None = None
            backoff = Backoff(cap=10.0)
            while True:
                self._wake.clear()
                try:
                    await self._sync()
                except (ApiError, RetryableError) as exc:
                    log.warning(
                        "clique entry not written: retrying",
                        extra=kv(clique=self.member.clique_name, error=str(exc)),
                    )
                    await asyncio.sleep(backoff.next_delay())
                    self._wake.set()
                    continue
                backoff.reset()
                peers = self._peers()
                if peers != last:
                    last = peers
                    yield peers
                await self._wake.wait()
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)

    def _peers(self) -> tuple[Peer, ...]:
        clique = self.clique
        try:
            return peers_from_clique(clique) if clique is not None else ()
        except PermanentError as exc:
            # The CRD's schema makes this unlikely; the daemon keeps its last mapping.
            log.error("clique unusable: ignored", extra=kv(error=str(exc)))
            return ()

    async def _sync(self) -> None:
        clique, ready = self.clique, self.ready
        if clique is None:
            wanted = new_clique(self.member, ready)
            try:
                made = await self._client.create(
                    names.CLIQUES_API, wanted, namespace=self.member.namespace
                )
            except ConflictError:  # another daemon created it first: its event follows
                await self._reread()
                return
            self._written(made, "clique created")
            return
        wanted_or_none = joined(clique, self.member, ready)
        if wanted_or_none is None:
            return
        try:
            made = await self._client.update(names.CLIQUES_API, wanted_or_none)
        except ConflictError:
            await self._reread()
            return
        except NotFoundError:
            self._cliques.forget(clique)  # deleted under us: create it on the next round
            self._wake.set()
            return
        self._written(made, "clique entry written")

    async def _get_clique(self) -> Obj:
        return await self._client.get(
            names.CLIQUES_API, self.member.clique_name, namespace=self.member.namespace
        )

    async def _reread(self) -> None:
        """After a conflict: the server's copy now, not the watch's later echo of it."""
        try:
            current = await self._get_clique()
        except NotFoundError:
            pass
        else:
            self._cliques.remember(current)
        self._wake.set()

    def _written(self, made: Obj, what: str) -> None:
        self._cliques.remember(made)
        mine: Obj = next(
            (d for d in made.get("daemons") or () if d.get("nodeName") == self.member.node_name),
            {},
        )
        log.info(
            what,
            extra=kv(
                clique=self.member.clique_name,
                node=self.member.node_name,
                ip=self.member.pod_ip,
                index=mine.get("index", ""),
                status=mine.get("status", ""),
                daemons=len(made.get("daemons") or ()),
            ),
        )

    async def leave(self) -> None:
        """Remove this daemon's entries from the clique (at stop), within LEAVE_TIMEOUT
        seconds; what is left then, the controller removes once the pod is gone."""
        try:
            await asyncio.wait_for(self._leave(), LEAVE_TIMEOUT)
        except TimeoutError:
            log.warning(
                "clique entry not removed in time: the controller removes it",
                extra=kv(clique=self.member.clique_name, timeout_s=LEAVE_TIMEOUT),
            )

    async def _leave(self) -> None:
        backoff = Backoff(cap=2.0)
        while True:
            try:
                clique = await self._get_clique()
                wanted = left(clique, self.member)
                if wanted is not None:
                    await self._client.update(names.CLIQUES_API, wanted)
                    log.info(
                        "clique entry removed",
                        extra=kv(clique=self.member.clique_name, ip=self.member.pod_ip),
                    )
                return
            except NotFoundError:
                return
            except ApiError as exc:
                log.debug("clique entry removal failed: retrying", extra=kv(error=str(exc)))
                await asyncio.sleep(backoff.next_delay())
