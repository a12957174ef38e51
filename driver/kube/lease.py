"""Which of two instances on one node publishes its slices: a per-node Lease.

During a surge upgrade of the DaemonSet the old and the new pod run side by side and
may disagree about the slices (a new version, a new layout). The rule that keeps
them from flapping: **an instance takes over a live lease whose holder started before
it did**, so the newest process wins and an older one, finding a lease held by a
process that started after it, stands by and stops writing. A holder that stops
cleanly releases the lease (clears ``holderIdentity``) so a standby can take over.

Nobody creates the lease until there is a rival: on a node whose pool nobody has
published yet, the slice names (fixed, one per index) already make the API server
refuse a second instance's create, and the 409 that loser gets is its evidence of a
rival. So a node's first publish costs one write (its slice), and the lease is created
only by an instance that finds slices it did not write (a newer pod during a surge
upgrade, a restarted one, or the loser of that race). An instance that finds no lease
and no rival publishes without one; one that found the pool empty and has written
nothing yet does not even read it (a live holder keeps its slices published, and one
that publishes after us finds our slices or a 409: the evidence reaches both sides, and
every write round after our first reads the lease). A node that never had a rival
creates no lease.

A peer's word is believed only for a while. The holder renews the lease (one GET and
one PUT per third of ``leaseDurationSeconds``) and a lease not renewed within its
duration, or whose times lie in the future beyond :data:`CLOCK_SKEW`, counts as
expired: a holder that died, a lease left by an older release, or one written with
a far-future clock no longer keeps this node from publishing. A standby looks at the
lease as often as the holder renews it, so a lease released, deleted or expired lets
it publish without a restart. Who may write the lease at all is the admission
policy's business (only the node's own plugin: see the chart's lease policy).

Verbs used on ``leases.coordination.k8s.io``: ``get``, ``create``, ``update``.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from driver.common.errors import DriverError
from driver.common.logs import kv
from driver.common.wire import format_micro_time, parse_time
from driver.kube.resources import LEASES
from driver.kube.rest import Client, ConflictError, NotFoundError

LEASE_VERBS = ("get", "create", "update")
HOLDER_STARTED = "gpu-dra.io/holder-started"  # annotation: the holder process's start
# Long enough that renewals cost next to nothing (one write per node per 100 s, on nodes
# that ever had a rival); short enough that a dead or bogus holder blocks only minutes.
LEASE_DURATION = 300.0
# How far a peer's recorded times may run ahead of our clock (NTP keeps a node's pods
# within milliseconds; this only has to tell a skewed clock from a forged one).
CLOCK_SKEW = timedelta(seconds=30)
log = logging.getLogger(__name__)


class Decision(Enum):
    HOLD = "hold"  # we hold it
    CREATE = "create"  # nobody does: create it
    TAKE = "take"  # someone older (or nobody, or an expired holder) holds it: update it to us
    YIELD = "yield"  # a newer instance holds a live lease: stand by


@dataclass(frozen=True, slots=True)
class Candidate:
    identity: str
    started: datetime  # aware, UTC


def lease_name(driver_name: str, node_name: str) -> str:
    """The node's Lease; the chart's admission policy lets a node write only this one."""
    return f"{driver_name}-{node_name}"


def is_live(spec: dict[str, Any], *, now: datetime, max_duration: float) -> bool:
    """Whether the holder renewed within its duration (capped at ours) by a sane clock."""
    renewed = parse_time(str(spec.get("renewTime") or ""))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int) or isinstance(duration, bool):
        return False  # a lease of an older release, or garbage: nobody renews it
    if duration <= 0 or renewed > now + CLOCK_SKEW:
        return False
    return now - renewed <= timedelta(seconds=min(duration, max_duration))


def decide(
    lease: dict[str, Any] | None,
    me: Candidate,
    *,
    now: datetime,
    max_duration: float = LEASE_DURATION,
) -> Decision:
    """The pure rule: what ``me`` does about ``lease`` (None: it doesn't exist) at ``now``."""
    if lease is None:
        return Decision.CREATE
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if holder == me.identity:
        return Decision.HOLD
    if not holder or not is_live(spec, now=now, max_duration=max_duration):
        return Decision.TAKE
    # The holder's process start decides, not when it took the lease: two instances
    # that start together and race for the slices still end with the newer one. A start
    # in the future is a broken or forged clock: it would otherwise win every contest.
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    started = parse_time(str(annotations.get(HOLDER_STARTED) or spec.get("acquireTime") or ""))
    if started is None or started < me.started or started > now + CLOCK_SKEW:
        return Decision.TAKE
    return Decision.YIELD


class PublisherLease:
    """The Lease ``<namespace>/<name>`` as seen by one candidate.

    ``duration``: the ``leaseDurationSeconds`` it writes; renewals and a standby's
    looks come every third of it.
    """

    def __init__(
        self,
        client: Client,
        *,
        namespace: str,
        name: str,
        me: Candidate,
        duration: float = LEASE_DURATION,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._name = name
        self._me = me
        self._duration = duration
        self._held = False
        self._yielded = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def held(self) -> bool:
        """Whether the last look at the lease found (or made) us the holder."""
        return self._held

    def _decide(self, lease: dict[str, Any] | None) -> Decision:
        return decide(lease, self._me, now=datetime.now(UTC), max_duration=self._duration)

    async def ensure(self, *, rival_seen: bool = True) -> bool:
        """Read the lease, take it if the rule says so; True when we may publish afterwards.

        Without ``rival_seen`` a missing lease is left missing: nobody else claims the
        node, and creating it would be a write on every node of the fleet for nothing.
        """
        for _ in range(3):
            lease = await self._get()
            if lease is None and not rival_seen:
                self._held = self._yielded = False
                return True
            decision = self._decide(lease)
            try:
                if decision is Decision.CREATE:
                    await self._client.create(LEASES, self._new_body(), namespace=self._namespace)
                elif decision is Decision.TAKE:
                    assert lease is not None
                    await self._put(self._taken(lease))
            except ConflictError:
                continue  # someone else wrote it in between: read and decide again
            if decision in (Decision.CREATE, Decision.TAKE):
                previous = (lease or {}).get("spec", {}).get("holderIdentity")
                log.info(
                    "took the publisher lease",
                    extra=kv(lease=self._name, identity=self._me.identity, previous=previous),
                )
            self._held = decision is not Decision.YIELD
            self._yielded = decision is Decision.YIELD
            return self._held
        raise ConflictError(
            f"lease {self._namespace}/{self._name} kept changing while taking it",
            status=409,
            verb="update",
            resource=LEASES.rbac(),
        )

    async def maintain(self, on_free: Callable[[], None]) -> None:
        """Forever: renew the lease while we hold it; while we stand by, call ``on_free``
        once the lease no longer keeps us from publishing (released, deleted, expired).

        Does nothing (and sends nothing) while there is no lease to care about. Errors
        are logged and retried at the next period: the next write check decides anyway.
        """
        while True:
            await asyncio.sleep(self._duration / 3)
            try:
                if self._held:
                    await self._renew()
                elif self._yielded and self._decide(await self._get()) is not Decision.YIELD:
                    self._yielded = False
                    log.info("the publisher lease is free", extra=kv(lease=self._name))
                    on_free()
            except DriverError as exc:
                log.warning(
                    "publisher lease check failed; retrying",
                    extra=kv(lease=self._name, error=str(exc)),
                )

    async def _renew(self) -> None:
        lease = await self._get()
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self._me.identity:
            self._held = False  # taken or deleted: the next write check decides again
            return
        spec = dict(lease.get("spec") or {})
        spec.update(
            renewTime=format_micro_time(datetime.now(UTC)),
            leaseDurationSeconds=self._duration_seconds(),
        )
        with contextlib.suppress(ConflictError):  # changed in between: look again next period
            await self._put({**lease, "spec": spec})

    async def release(self) -> None:
        """Clear ``holderIdentity`` if we still hold it, so a standby may take over."""
        lease = await self._get()
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self._me.identity:
            self._held = False
            return
        lease["spec"].pop("holderIdentity", None)
        await self._put(lease)
        self._held = False
        log.info("released the publisher lease", extra=kv(lease=self._name))

    async def _get(self) -> dict[str, Any] | None:
        try:
            return await self._client.get(LEASES, self._name, namespace=self._namespace)
        except NotFoundError:
            return None

    async def _put(self, body: dict[str, Any]) -> None:
        await self._client.update(LEASES, body)

    def _duration_seconds(self) -> int:
        return max(1, round(self._duration))

    def _new_body(self) -> dict[str, Any]:
        now = format_micro_time(datetime.now(UTC))
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self._name,
                "namespace": self._namespace,
                "annotations": {HOLDER_STARTED: format_micro_time(self._me.started)},
            },
            "spec": {
                "holderIdentity": self._me.identity,
                "acquireTime": now,
                "renewTime": now,
                "leaseDurationSeconds": self._duration_seconds(),
                "leaseTransitions": 0,
            },
        }

    def _taken(self, lease: dict[str, Any]) -> dict[str, Any]:
        now = format_micro_time(datetime.now(UTC))
        spec = dict(lease.get("spec") or {})
        spec.update(
            holderIdentity=self._me.identity,
            acquireTime=now,
            renewTime=now,
            leaseDurationSeconds=self._duration_seconds(),
            leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
        )
        metadata = dict(lease.get("metadata") or {})
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            HOLDER_STARTED: format_micro_time(self._me.started),
        }
        return {**lease, "metadata": metadata, "spec": spec}
