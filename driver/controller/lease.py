"""Which of two instances on one node publishes its slices: a per-node Lease.

During a surge upgrade of the DaemonSet the old and the new pod run side by side and
may disagree about the slices (a new version, a new layout). The rule that keeps
them from flapping: **an instance takes over a lease that was acquired before it
started**, so the newest process wins and an older one, finding a lease acquired
after its own start, stands by and stops writing. A holder that stops cleanly
releases the lease (clears ``holderIdentity``) so a standby can take over.

Nobody creates the lease until there is a rival: on a node whose pool nobody has
published yet, the slice names (fixed, one per index) already make the API server
refuse a second instance's create, and the 409 that loser gets is its evidence of a
rival. So a node's first publish costs one write (its slice), and the lease is created
only by an instance that finds slices it did not write (a newer pod during a surge
upgrade, a restarted one, or the loser of that race). An instance that finds no lease
and no rival publishes without one.

The holder does not renew: renewals would be writes on every node forever, and
the case they cover (a holder that died and was never restarted while an older
instance lives on) does not arise under a DaemonSet, which restarts a dead
container, and a restarted process is newer than every lease. Writers check the
lease (one GET) before each batch of slice writes, which are rare.

Verbs used on ``leases.coordination.k8s.io``: ``get``, ``create``, ``update``.
"""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from driver.kubeapi import Client, ConflictError, NotFoundError
from driver.logs import kv

LEASE_VERBS = ("get", "create", "update")
HOLDER_STARTED = "gpu-dra.io/holder-started"  # annotation: the holder process's start
_RESOURCE = "leases.coordination.k8s.io"
log = logging.getLogger(__name__)


class Decision(Enum):
    HOLD = "hold"  # we hold it
    CREATE = "create"  # nobody does: create it
    TAKE = "take"  # someone older (or nobody) holds it: update it to us
    YIELD = "yield"  # a newer instance holds it: stand by


@dataclass(frozen=True, slots=True)
class Candidate:
    identity: str
    started: datetime  # aware, UTC


def format_micro_time(moment: datetime) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def decide(lease: dict[str, Any] | None, me: Candidate) -> Decision:
    """The pure rule: what ``me`` does about ``lease`` (None: it doesn't exist)."""
    if lease is None:
        return Decision.CREATE
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if holder == me.identity:
        return Decision.HOLD
    if not holder:
        return Decision.TAKE
    # The holder's process start decides, not when it took the lease: two instances
    # that start together and race for the slices still end with the newer one.
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    started = parse_time(str(annotations.get(HOLDER_STARTED) or spec.get("acquireTime") or ""))
    if started is None or started < me.started:
        return Decision.TAKE
    return Decision.YIELD


class PublisherLease:
    """The Lease ``<namespace>/<name>`` as seen by one candidate."""

    def __init__(self, client: Client, *, namespace: str, name: str, me: Candidate) -> None:
        self._client = client
        self._namespace = namespace
        self._name = name
        self._me = me
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._held = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def held(self) -> bool:
        """Whether the last look at the lease found (or made) us the holder."""
        return self._held

    async def ensure(self, *, rival_seen: bool = True) -> bool:
        """Read the lease, take it if the rule says so; True when we may publish afterwards.

        Without ``rival_seen`` a missing lease is left missing: nobody else claims the
        node, and creating it would be a write on every node of the fleet for nothing.
        """
        for _ in range(3):
            lease = await self._get()
            if lease is None and not rival_seen:
                self._held = False
                return True
            decision = decide(lease, self._me)
            try:
                if decision is Decision.CREATE:
                    await self._client.request(
                        "POST",
                        self._collection,
                        verb="create",
                        resource=_RESOURCE,
                        body=self._new_body(),
                    )
                elif decision is Decision.TAKE:
                    assert lease is not None
                    await self._client.request(
                        "PUT",
                        f"{self._collection}/{self._name}",
                        verb="update",
                        resource=_RESOURCE,
                        body=self._taken(lease),
                    )
            except ConflictError:
                continue  # someone else wrote it in between: read and decide again
            if decision in (Decision.CREATE, Decision.TAKE):
                previous = (lease or {}).get("spec", {}).get("holderIdentity")
                log.info(
                    "took the publisher lease",
                    extra=kv(lease=self._name, identity=self._me.identity, previous=previous),
                )
            self._held = decision is not Decision.YIELD
            return self._held
        raise ConflictError(
            f"lease {self._namespace}/{self._name} kept changing while taking it",
            status=409,
            verb="update",
            resource=_RESOURCE,
        )

    async def release(self) -> None:
        """Clear ``holderIdentity`` if we still hold it, so a standby may take over."""
        lease = await self._get()
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self._me.identity:
            self._held = False
            return
        lease["spec"].pop("holderIdentity", None)
        await self._client.request(
            "PUT",
            f"{self._collection}/{self._name}",
            verb="update",
            resource=_RESOURCE,
            body=lease,
        )
        self._held = False
        log.info("released the publisher lease", extra=kv(lease=self._name))

    async def _get(self) -> dict[str, Any] | None:
        try:
            return await self._client.request(
                "GET", f"{self._collection}/{self._name}", verb="get", resource=_RESOURCE
            )
        except NotFoundError:
            return None

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
            leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
        )
        metadata = dict(lease.get("metadata") or {})
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            HOLDER_STARTED: format_micro_time(self._me.started),
        }
        return {**lease, "metadata": metadata, "spec": spec}
