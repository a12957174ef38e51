"""Leader election over a Lease, with client-go's rules: one replica of a Deployment works, the
others stand by.

The per-node publisher lease (:mod:`driver.kube.lease`) lets the newest process take over a live
lease, which a surge upgrade of the node's DaemonSet needs. A controller's replicas want the
opposite, as client-go's ``leaderelection`` (and so NVIDIA's ComputeDomain controller) does: a
standby never preempts a live leader, so a restarted replica does not make two leaders for a
renewal period.

* A candidate takes the lease when nobody holds it, its holder released it, or its record
  (holder, renew time, version) has not changed for ``leaseDurationSeconds`` by the
  candidate's own monotonic clock: no clock of another host is trusted.
* The leader renews every ``retry_period``; when no renewal has succeeded for
  ``renew_deadline`` (shorter than the lease duration, so it stops before anyone may take
  over), or someone else holds the lease, it has lost: its work is cancelled and it becomes
  a candidate again. The deadline counts from the start of the last renewal that succeeded
  (the others cannot have seen it earlier), and an attempt still unanswered when it passes is
  abandoned, as client-go bounds each by the renew deadline: a renewal the API server holds
  back must not keep a deposed leader at work while another takes the lease.
* A leader that stops cleanly releases the lease (empty holder), so a standby takes over at
  its next look instead of after the lease expires.

Verbs used on ``leases.coordination.k8s.io``: ``get``, ``create``, ``update``.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from driver.common.errors import DriverError
from driver.common.logs import kv
from driver.common.wire import Obj, format_micro_time
from driver.kube.resources import LEASES
from driver.kube.rest import Client, ConflictError, NotFoundError

log = logging.getLogger(__name__)


class LeaderElection:
    """The Lease ``namespace``/``name``, contested under ``identity`` (unique per process).

    Durations in seconds, client-go's defaults: ``renew_deadline`` < ``lease_duration``.
    """

    def __init__(
        self,
        client: Client,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration"
            )
        self._client = client
        self._namespace = namespace
        self.name = name
        self.identity = identity
        self._duration = lease_duration
        self._deadline = renew_deadline
        self._period = retry_period
        self._clock = clock
        # The other holder's record as last seen, and when (our clock) it last changed.
        self._observed: tuple[object, ...] = ()
        self._observed_at = 0.0
        self._held_by_other = False
        self.leading = False
        self.transitions = 0  # times this process became the leader
        self.lost = asyncio.Event()  # set when leadership was lost, until it is won again
        self._reported = ""

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Forever: wait to lead, then run ``lead()`` while leading; cancelled when leadership
        is lost (and started again when it is won back). Returns when ``lead`` does; raises
        what it raises. Cancelling ``run`` releases the lease."""
        try:
            while True:
                renewed = await self._acquire()
                self.leading = True
                self.lost.clear()
                self.transitions += 1
                log.info("became the leader", extra=kv(lease=self.name, identity=self.identity))
                work = asyncio.create_task(lead(), name="leader-work")
                renewing = asyncio.create_task(self._renew_until_lost(renewed), name="leader-renew")
                try:
                    await asyncio.wait([work, renewing], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (work, renewing):
                        task.cancel()
                    await asyncio.wait([work, renewing])
                self.leading = False
                self.lost.set()
                if work.done() and not work.cancelled():
                    work.result()  # lead() returned or raised by itself: so do we
                    return
                log.warning(
                    "lost the leadership; standing by",
                    extra=kv(lease=self.name, identity=self.identity),
                )
        finally:
            if self.leading:
                self.leading = False
                with contextlib.suppress(DriverError, TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(self._release()), 5.0)

    async def _acquire(self) -> float:
        """When (our clock) the look that took the lease started."""
        # A look every period is the protocol itself (the lease is another host's state).
        while True:
            started = self._clock()
            if await self._bounded_try(self._deadline):
                return started
            await asyncio.sleep(self._period)

    async def _renew_until_lost(self, renewed: float) -> None:
        while True:
            await asyncio.sleep(self._period)
            started = self._clock()
            left = self._deadline - (started - renewed)
            if left > 0 and await self._bounded_try(left):
                renewed = started
            elif self._held_by_other or self._clock() - renewed >= self._deadline:
                return

    async def _bounded_try(self, seconds: float) -> bool:
        try:
            return await asyncio.wait_for(self._try(), seconds)
        except TimeoutError:
            log.warning(
                "leader lease check unanswered within the renew deadline",
                extra=kv(lease=self.name, identity=self.identity, seconds=round(seconds, 3)),
            )
            return False

    async def _try(self) -> bool:
        """One look: take or renew the lease if the rules allow; True when we hold it now."""
        self._held_by_other = False
        try:
            lease = await self._get()
            now = format_micro_time(datetime.now(UTC))
            if lease is None:
                await self._client.create(LEASES, self._new(now), namespace=self._namespace)
                return True
            spec = dict(lease.get("spec") or {})
            holder = spec.get("holderIdentity") or ""
            if holder and holder != self.identity:
                record = (holder, spec.get("renewTime"), lease["metadata"].get("resourceVersion"))
                if record != self._observed:
                    self._observed, self._observed_at = record, self._clock()
                duration = spec.get("leaseDurationSeconds")
                if not isinstance(duration, int) or duration <= 0:
                    duration = round(self._duration)
                if self._clock() < self._observed_at + duration:
                    self._held_by_other = True
                    return False
            if holder != self.identity:
                spec["acquireTime"] = now
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec.update(
                holderIdentity=self.identity,
                renewTime=now,
                leaseDurationSeconds=max(1, round(self._duration)),
            )
            await self._put({**lease, "spec": spec})
            self._reported = ""
            return True
        except ConflictError:
            return False  # someone wrote it in between: look again next period
        except DriverError as exc:
            text = str(exc)
            if text != self._reported:
                self._reported = text
                log.warning("leader lease check failed", extra=kv(lease=self.name, error=text))
            return False

    async def _release(self) -> None:
        lease = await self._get()
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        spec = dict(lease["spec"])
        spec.update(holderIdentity="", leaseDurationSeconds=1)
        await self._put({**lease, "spec": spec})
        log.info("released the leader lease", extra=kv(lease=self.name, identity=self.identity))

    async def _get(self) -> Obj | None:
        try:
            return await self._client.get(LEASES, self.name, namespace=self._namespace)
        except NotFoundError:
            return None

    async def _put(self, body: Obj) -> None:
        await self._client.update(LEASES, body)

    def _new(self, now: str) -> Obj:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self._namespace},
            "spec": {
                "holderIdentity": self.identity,
                "acquireTime": now,
                "renewTime": now,
                "leaseDurationSeconds": max(1, round(self._duration)),
                "leaseTransitions": 0,
            },
        }
