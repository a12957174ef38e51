"""The claim says which device it got: ``status.devices`` of each prepared claim.

For every device of this driver a claim has prepared on this node, one entry of the claim's
``status.devices`` (resource.k8s.io/v1 ``AllocatedDeviceStatus``, GA in 1.37): ``data`` with
what a user debugging a pod needs (the device's kind, the attributes it is published with —
a GPU's UUID, product name and PCI bus ID; a MIG device's parent and profile —, the identity
the plugin recorded, its sharing settings and consumed capacity) and a ``Ready`` condition
that follows the device's health on the node's health board. Unprepare removes the entries.

The writer is a claim observer (``kubeletplugin.state.ClaimObserver``): prepare never waits
on it and never fails by it. It writes in the background, once per change and never at rest
(the desired entries are compared with what the claim holds; an unchanged condition keeps
its transition time), retrying a failed write with backoff; each failure is logged and
counted. Entries of other drivers, and of this driver's other pools, are left as they are.
A write refused for that claim alone (422, or 403 from an admission policy) is not retried
until the claim changes; a 403 from RBAC (the grant missing) turns the writer off.

Where the API server keeps no ``status.devices`` (the DRAResourceClaimDeviceStatus gate off,
before 1.37), the first write that reads back without its entries turns the writer off with
one log line, rather than rewriting on every change.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.common.logs import kv
from driver.devicekind import NodeDevice, PreparedClaim, PreparedDevice
from driver.kube.backoff import Backoff
from driver.kube.resources import RESOURCE_CLAIMS
from driver.kube.rest import (
    AdmissionRefusedError,
    ApiError,
    Client,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    RejectedError,
)
from kubeletplugin.healthstream import DeviceHealth, HealthBoard

log = logging.getLogger(__name__)

Obj = dict[str, Any]
READY = "Ready"
# Attribute values a user reads in `kubectl get -o yaml`; capacities and lists stay out.
_SCALARS = ("string", "int", "bool", "version")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def device_data(
    device: PreparedDevice, node_device: NodeDevice | None, more: Mapping[str, Any] | None = None
) -> Obj:
    """Pure: what the entry's ``data`` says of one prepared device (``more``: what its driver
    adds, such as a ComputeDomain channel's domain and clique)."""
    data: Obj = {"kind": device.kind}
    if node_device is not None:
        attributes = node_device.published.get("attributes", {})
        data["attributes"] = {
            name: next(iter(value.values()))
            for name, value in sorted(attributes.items())
            if isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in _SCALARS
        }
    for key, pairs in (
        ("identity", device.identity),
        ("sharing", device.sharing),
        ("consumedCapacity", device.consumed),
    ):
        if pairs:
            data[key] = dict(pairs)
    data.update(more or {})
    return data


def _condition(health: DeviceHealth | None, old: Obj | None, now: str) -> Obj:
    if health is not None and health.health == "Unhealthy":
        status, reason, message = "False", "Unhealthy", health.message or "the device is unhealthy"
    else:
        status, reason, message = "True", "Prepared", "prepared on the node"
    condition = {"type": READY, "status": status, "reason": reason, "message": message[:1024]}
    same = old is not None and all(old.get(k) == v for k, v in condition.items())
    condition["lastTransitionTime"] = old["lastTransitionTime"] if same and old else now
    return condition


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (entry["driver"], entry["pool"], entry["device"], entry.get("shareID") or "")


def desired_entries(
    claim: PreparedClaim,
    driver: str,
    devices: Mapping[str, NodeDevice],
    health: Mapping[tuple[str, str], DeviceHealth],
    existing: Iterable[Mapping[str, Any]],
    now: str,
    more: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Obj]:
    """Pure: this driver's entries for ``claim``, keeping unchanged conditions' times;
    ``more``: data the driver adds, by device reservation (``PreparedDevice.reservation``)."""
    old = {_key(e): e for e in existing}
    entries = []
    for device in claim.devices:
        entry: Obj = {"driver": driver, "pool": device.pool_name, "device": device.device_name}
        if device.share_id:
            entry["shareID"] = device.share_id
        before = old.get(_key(entry), {})
        old_ready = next((c for c in before.get("conditions", []) if c.get("type") == READY), None)
        state = health.get((device.pool_name, device.device_name))
        entry["conditions"] = [_condition(state, old_ready, now)]
        entry["data"] = device_data(
            device, devices.get(device.device_name), (more or {}).get(device.reservation)
        )
        entries.append(entry)
    return entries


def merged(existing: list[Obj], ours: list[Obj], driver: str, pool: str) -> list[Obj]:
    """Pure: ``existing`` with this driver's entries of ``pool`` replaced by ``ours``."""
    kept = [e for e in existing if (e.get("driver"), e.get("pool")) != (driver, pool)]
    return kept + ours


def _same(a: list[Obj], b: list[Obj]) -> bool:
    return sorted(a, key=_key) == sorted(b, key=_key)


Describe = Callable[[PreparedClaim, PreparedDevice], Awaitable[Mapping[str, Any]]]


@dataclass
class WriterStats:
    writes: int = 0
    failures: int = 0
    skipped_unchanged: int = 0


@dataclass
class _Claim:
    uid: str
    namespace: str
    name: str
    prepared: PreparedClaim | None  # None: unprepared, its entries to be removed

    def fields(self, **more: object) -> Mapping[str, object]:
        """The claim's log fields."""
        return kv(claim_uid=self.uid, claim_namespace=self.namespace, claim_name=self.name, **more)


@dataclass
class ClaimStatusWriter:
    """Keeps each prepared claim's ``status.devices`` entries of this driver and pool."""

    client: Client
    driver: str
    pool: str
    devices: Callable[[], Mapping[str, NodeDevice]]
    board: HealthBoard | None = None  # the node's device health, which conditions follow
    # What the driver adds to a device's data, looked up when its entry is written; raises
    # only ApiError (retried as a failed write).
    describe: Describe | None = None
    stats: WriterStats = field(default_factory=WriterStats)
    _claims: dict[str, _Claim] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _off: bool = False

    @property
    def enabled(self) -> bool:
        """False once the API server showed that no write can succeed (no grant, no field)."""
        return not self._off

    @property
    def pending(self) -> int:
        """Claims whose entries wait to be written."""
        return len(self._dirty)

    # ---- the claim state's observer: on the event loop, never blocks ---------------

    def prepared(self, claim: PreparedClaim) -> None:
        self._claims[claim.uid] = _Claim(claim.uid, claim.namespace, claim.name, claim)
        self._mark(claim.uid)

    def unprepared(self, uid: str) -> None:
        known = self._claims.get(uid)
        if known is not None:
            known.prepared = None
            self._mark(uid)

    def recorded(self, claims: Mapping[str, PreparedClaim]) -> None:
        for uid, claim in claims.items():
            known = self._claims.get(uid)
            if known is None or known.prepared != claim:
                self.prepared(claim)
        for uid in set(self._claims) - set(claims):
            self.unprepared(uid)

    def health_changed(self) -> None:
        """A device's health moved: every claim's condition is checked again."""
        for uid, known in self._claims.items():
            if known.prepared is not None:
                self._mark(uid)

    def _mark(self, uid: str) -> None:
        if not self._off:
            self._dirty.add(uid)
            self._wake.set()

    # ---- the background writer -------------------------------------------------------

    async def run(self) -> None:
        """Write what changed until cancelled; a failed claim is tried again with backoff."""
        backoff = Backoff(base=0.5, cap=30.0)
        while True:
            await self._wake.wait()
            self._wake.clear()
            failed = False
            for uid in sorted(self._dirty):
                self._dirty.discard(uid)
                known = self._claims.get(uid)
                if known is None or self._off:
                    continue
                try:
                    await self._write(known)
                except AdmissionRefusedError as error:
                    # A policy refused this claim's write, and the verb is granted: that says
                    # nothing of the other claims, which go on being written; this one waits
                    # for its next change, as a 422 does.
                    self.stats.failures += 1
                    log.warning(
                        "claim status refused by admission; written again at the claim's "
                        "next change",
                        extra=known.fields(error=error),
                    )
                    continue
                except ForbiddenError as error:  # no retry helps: the grant is missing
                    self._turn_off(known, error)
                    continue
                except ApiError as error:
                    self.stats.failures += 1
                    # A claim refused (422: allocated to another node, a value the server
                    # will not take) would be refused again: it waits for its next change.
                    retried = not isinstance(error, RejectedError)
                    if retried:
                        failed = True
                        self._dirty.add(uid)
                    log.warning(
                        "claim status not written; retried"
                        if retried
                        else "claim status refused; written again at the claim's next change",
                        extra=known.fields(error=error),
                    )
                    continue
                if known.prepared is None:
                    self._claims.pop(uid, None)
            if failed:
                await asyncio.sleep(backoff.next_delay())
                self._wake.set()
            else:
                backoff.reset()

    async def _write(self, known: _Claim) -> None:
        more: dict[str, Mapping[str, Any]] = {}
        if known.prepared is not None and self.describe is not None:
            for device in known.prepared.devices:
                more[device.reservation] = await self.describe(known.prepared, device)
        for _ in range(5):  # a conflict is another writer's change: read again and redo
            try:
                claim = await self.client.get(
                    RESOURCE_CLAIMS, known.name, namespace=known.namespace
                )
            except NotFoundError:
                return  # the claim is gone, and its status with it
            status = claim.setdefault("status", {})
            existing: list[Obj] = list(status.get("devices") or [])
            ours: list[Obj] = []
            if known.prepared is not None and claim["metadata"].get("uid") == known.prepared.uid:
                health = self.board.snapshot()[1] if self.board is not None else ()
                boards = {(h.pool, h.device): h for h in health}
                mine = [
                    e
                    for e in existing
                    if (e.get("driver"), e.get("pool")) == (self.driver, self.pool)
                ]
                ours = desired_entries(
                    known.prepared, self.driver, self.devices(), boards, mine, _now(), more
                )
            new = merged(existing, ours, self.driver, self.pool)
            if _same(new, existing):
                self.stats.skipped_unchanged += 1
                return
            status["devices"] = new or None
            try:
                written = await self.client.update(RESOURCE_CLAIMS, claim, subresource="status")
            except ConflictError:
                continue
            self.stats.writes += 1
            if ours and not (written.get("status") or {}).get("devices"):
                why = (
                    "the API server keeps no claim device status (DRAResourceClaimDeviceStatus off)"
                )
                self._turn_off(known, why)
            return
        resource = RESOURCE_CLAIMS.rbac("status")
        raise ConflictError(f"update {resource}: five conflicts in a row", status=409,
                            verb="update", resource=resource)  # fmt: skip

    def _turn_off(self, known: _Claim, why: object) -> None:
        self._off = True
        self._dirty.clear()
        log.warning("claim device status not written again", extra=known.fields(why=why))

    def start(self) -> "list[asyncio.Task[None]]":
        """The writer's background tasks, for the node driver to own and cancel."""
        return [
            asyncio.create_task(self.run(), name=f"claim-status-{self.driver}"),
            asyncio.create_task(self.follow_board(), name=f"claim-status-health-{self.driver}"),
        ]

    async def follow_board(self) -> None:
        """Check every claim's condition again whenever the health board moves."""
        if self.board is None:
            return
        version = self.board.snapshot()[0]
        while True:
            await self.board.wait_change(version, 3600.0)
            now = self.board.snapshot()[0]
            if now != version:
                version = now
                self.health_changed()


@contextlib.asynccontextmanager
async def running(writer: ClaimStatusWriter) -> AsyncIterator[ClaimStatusWriter]:
    """The writer and its board follower, for as long as the block runs."""
    tasks = writer.start()
    try:
        yield writer
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
