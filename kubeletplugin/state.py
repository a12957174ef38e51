"""Prepared-claim state of one node: prepare, unprepare, recovery, reconciliation.

A prepare is one straight line, :meth:`DeviceState._prepare`: fetch the claim, plan
(pure: which devices, with which identities; a spec of this boot that records the same
plan means the claim is prepared already), record (reserve each device), side effects
(only for kinds that have them, after a per-claim record), the CDI spec (built once, from
the kinds' edits asked after the side effects, off the event loop, once the device nodes
it names are on the host; it is the claim's durable record), complete. An unprepare runs it
backwards.
The records, their crash safety and their durability are ``kubeletplugin.records``;
startup recovery is ``kubeletplugin.recovery``.

Each claim is handled in its own task: calls for one claim are serialized, in this
process by an asyncio lock and across the node's plugin instances (two during a surge
upgrade) by the claim's file lock; distinct claims run in parallel and share no file
and no lock, and a call the kubelet gives up on (45 s timeout) finishes in the
background, so what it leaves on disk is always a whole step, never half of one.
File steps that need no fsync are a few syscalls and run on the event loop (the
claim's lock too: one non-blocking ``flock``); an fsync or a kind's side effect runs
in a worker thread.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from driver.common.crashpoints import crashpoint
from driver.common.errors import DriverError, RetryableError
from driver.common.fsutil import ensure_dir
from driver.common.logs import kv
from driver.common.supervise import OnFailure, supervised
from driver.devicekind import AnyKind, KindContext, NodeDevice, PreparedClaim, PreparedDevice
from driver.kube.session import Session
from kubeletplugin import cdi, dirs, recovery
from kubeletplugin.claims import (
    ClaimError,
    ClaimPlan,
    ClaimReader,
    ClaimRef,
    claim_is_gone,
    fetch_claim,
    plan_claim,
    share_problem,
)
from kubeletplugin.containertoolkit import DeviceNodesError, NodeCheck, missing_message
from kubeletplugin.flavor import Flavor
from kubeletplugin.records import (
    DeviceTakenError,
    Holder,
    RecordError,
    Records,
    parse_target,
    valid_uid,
)
from kubeletplugin.recovery import ForeignStateError

__all__ = [
    "ClaimBusyError",
    "ClaimObserver",
    "ClaimRef",
    "DeviceState",
    "ForeignStateError",
    "PreparePendingError",
    "PrepareResult",
    "PreparedDevice",
    "RecordError",
    "RollbackError",
    "StateConfig",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_GONE_CHECKS_IN_FLIGHT = 8
# How long a call waits for the claim's lock that another plugin instance holds (its
# prepare may make a MIG instance or start an MPS daemon: seconds), and the polls' span.
CLAIM_LOCK_WAIT_S = 30.0
_CLAIM_LOCK_POLL_S = (0.002, 0.05)


class ClaimBusyError(RetryableError):
    """Another plugin instance of the node is preparing or unpreparing the claim."""


class PreparePendingError(RetryableError):
    """Raised by a kind's ``prepare`` that has done what it can and waits for the cluster
    (a ComputeDomain's daemon to be ready on the node): what it did stays, with its record
    and reservations, so the kubelet's retry continues from there; an unprepare, the
    reconciler (the claim gone) or recovery undoes it. Rolling it back would undo the very
    change that is awaited (the node label that brings the daemon)."""


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class NodeDevices(Protocol):
    """The node's devices of the driver's kinds, as its last discovery found them (the
    publisher rediscovers; a prepare plans against what it found)."""

    @property
    def current(self) -> Mapping[str, NodeDevice]: ...


class HostEdits(Protocol):
    """What a driver's claim specs take from the host's driver install: the container
    toolkit's spec-wide edits (the driver's libraries, binaries and hooks) and where on the
    host the device nodes lie (``kubeletplugin.containertoolkit.Toolkit``)."""

    async def base_edits(self) -> Mapping[str, Any]:
        """Raises containertoolkit.ToolkitError when no usable edits can be had."""

    def check_nodes(self, paths: Sequence[str]) -> NodeCheck:
        """Blocking (stats): which of the device nodes ``paths`` (host paths) the host
        lacks, the host directory its device nodes are under now, and what of them there is."""

    async def create_nodes(self, paths: Sequence[str]) -> list[str]:
        """Make the missing nodes ``paths`` as the driver's tools do; what failed."""


class ClaimObserver(Protocol):
    """Told what is prepared on the node (the metrics, the claims' status writer): by every
    path that changes it, this process's and, at each reconcile, another instance's (its
    records are the node's)."""

    def prepared(self, claim: PreparedClaim) -> None: ...

    def unprepared(self, uid: str) -> None: ...

    def recorded(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Exactly ``claims`` are prepared, as the node's records say."""


@dataclass(frozen=True, slots=True)
class StateConfig:
    plugin_dir: Path  # <plugins-dir>/<driver>
    cdi_root: Path
    driver_name: str
    node_name: str
    # The node driver's names on disk, kinds, configs, and what its kinds are given.
    flavor: Flavor
    # The host's driver install the specs of the flavor's toolkit kinds start from; None:
    # none (no edits of the host's, device nodes under the host's /dev).
    host: HostEdits | None = None
    pod_uid: str | None = None
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    pool_name: str | None = None  # the ResourceSlice pool of this node; default node_name


class RollbackError(RetryableError):
    """A prepare failed and undoing it did not finish (a read-only mount, a tool that
    fails): a retry, once the cause is gone, finishes it."""


@dataclass(slots=True)
class _Outcome:
    """Set by a call that succeeded under the claim's lock: whether the claim has a spec or
    a side-effect record now, so releasing the lock need not look (None: it looks)."""

    records_left: bool | None = None


def _described(exc: Exception) -> str:
    return f"writing node state failed: {exc}" if isinstance(exc, OSError) else str(exc)


def _claim_kv(ref: ClaimRef | PreparedClaim | Holder) -> dict[str, Any]:
    return dict(kv(claim_uid=ref.uid, claim_namespace=ref.namespace, claim_name=ref.name))


def _read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        log.warning("cannot read the node boot ID; reboots go undetected", extra=kv(error=exc))
        return ""


def _device_names(claim: PreparedClaim) -> tuple[str, ...]:
    """Its reservations: a device, or a share of one."""
    return tuple(d.reservation for d in claim.devices)


def _attach_kinds(flavor: Flavor, records: Records) -> None:
    for kind in flavor.kinds.values():
        state_dir = records.kind_dir(kind.name)
        ensure_dir(state_dir, dirs.PRIVATE, ours=True)
        kind.attach(flavor.kind_context(KindContext(state_dir, records.boot_id)))


def _kinds_of(claim: PreparedClaim, flavor: Flavor) -> list[AnyKind]:
    kinds = flavor.kinds
    return [kinds[name] for name in sorted({d.kind for d in claim.devices})]


class DeviceState:
    """Use :meth:`open`; the constructor does no I/O and no recovery."""

    def __init__(
        self,
        config: StateConfig,
        api_client: Session,
        devices: NodeDevices,
        *,
        records: Records,
        base_edits: Mapping[str, Any],
        dev_root: str = "/",
        nodes_seen: frozenset[str] = frozenset(),
    ) -> None:
        self._config = config
        self._claims = ClaimReader(api_client)
        self._devices = devices
        self._pool = config.pool_name or config.node_name
        self._records = records
        self._base_edits = base_edits
        self._dev_root = dev_root
        # The host's device nodes when base_edits and dev_root were had: a prepare that
        # finds others has them again (a node made since is missing from them).
        self._nodes_seen = nodes_seen
        self._host_lock = asyncio.Lock()
        # Which devices each claim this process prepared or recovered holds: where an
        # unprepare releases, without reading the spec back (another instance's claim
        # is found by a look at every reservation).
        self._held: dict[str, tuple[str, ...]] = {}
        self._claim_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._observers: tuple[ClaimObserver, ...] = ()
        self._observed = 0  # claims told to the observer, for a resync racing them

    @classmethod
    async def open(
        cls, config: StateConfig, api_client: Session, devices: NodeDevices
    ) -> "DeviceState":
        """Check the node's state is ours, recover it, and get ready to serve.

        ``devices`` has been refreshed once. Raises ForeignStateError /
        ForeignCheckpointError (another driver's state), RecordError (a record of this
        boot this release cannot read) and containertoolkit.ToolkitError (no driver
        libraries to give containers): the node process reports these once and stays
        not ready.
        """
        boot_id = await asyncio.to_thread(_read_boot_id, config.boot_id_path)
        base_edits, dev_root, seen = await _host_view(config)
        records = Records(config.plugin_dir, config.cdi_root, boot_id=boot_id, flavor=config.flavor)
        await asyncio.to_thread(records.make_dirs)
        await asyncio.to_thread(_attach_kinds, config.flavor, records)
        claims = await asyncio.to_thread(recovery.recover, records)
        state = cls(
            config,
            api_client,
            devices,
            records=records,
            base_edits=base_edits,
            dev_root=dev_root,
            nodes_seen=seen,
        )
        state._held = {uid: _device_names(claim) for uid, claim in claims.items()}
        log.info(
            "device state ready",
            extra=kv(
                node=config.node_name,
                pod_uid=config.pod_uid or "",
                devices=len(devices.current),
                claims=len(claims),
            ),
        )
        return state

    # ---- public API -------------------------------------------------------------------

    @property
    def kinds(self) -> Mapping[str, AnyKind]:
        """The driver's kinds this claim state holds (its flavor's table), attached."""
        return self._config.flavor.kinds

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """One result per claim uid; a claim's failure never affects the others."""
        results = await self._each(self._prepare_one, claims)
        return {ref.uid: result for ref, result in zip(claims, results, strict=True)}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """uid -> error ("" = ok). Works from local state alone; an unknown claim is ok."""
        results = await self._each(self._unprepare_one, claims)
        return {ref.uid: error for ref, error in zip(claims, results, strict=True)}

    async def run_reconciler(self, period: float = 600.0) -> None:
        """Reconcile now and then every ``period`` seconds, until cancelled."""
        await _every(period, self.reconcile, "claim reconciler")

    async def run_watchdog(self, period: float = 5.0) -> None:
        """:meth:`watch` every ``period`` seconds, until cancelled."""
        await _every(period, self.watch, "side-effect watchdog")

    async def watch(self) -> None:
        """One round: each kind brings back what its prepared claims lost (an MPS daemon)."""
        for kind in self._config.flavor.kinds.values():
            await asyncio.to_thread(kind.watch)

    async def reconcile(self) -> None:
        """One round: unprepare the claims recorded here that are gone from the API server."""
        holders = await asyncio.to_thread(self._recorded_claims)
        limit = asyncio.Semaphore(_GONE_CHECKS_IN_FLIGHT)

        async def check(holder: Holder) -> None:
            ref = ClaimRef(uid=holder.uid, namespace=holder.namespace, name=holder.name)
            async with limit:
                gone = await claim_is_gone(self._claims, ref)
            if gone:
                log.info("claim is gone from the API server; unpreparing", extra=_claim_kv(ref))
                await self._detached(self._unprepare_one(ref))

        await asyncio.gather(*(check(h) for h in holders))
        await self._resync_observer()

    # ---- per-claim work ---------------------------------------------------------------

    async def _each(
        self, work: Callable[[ClaimRef], Coroutine[Any, Any, T]], claims: Sequence[ClaimRef]
    ) -> list[T]:
        """``work`` of every claim, side by side, each run to its end (see _detached)."""
        if len(claims) == 1:  # the kubelet's usual call: no gather around one task
            return [await self._detached(work(claims[0]))]
        return list(await asyncio.gather(*(self._detached(work(ref)) for ref in claims)))

    async def _detached(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` to completion even if the caller is cancelled."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return await asyncio.shield(task)

    @contextlib.asynccontextmanager
    async def _claim_lock(self, uid: str) -> AsyncIterator[None]:
        lock, users = self._claim_locks.get(uid, (asyncio.Lock(), 0))
        self._claim_locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._claim_locks[uid]
            if users == 1:
                del self._claim_locks[uid]
            else:
                self._claim_locks[uid] = (lock, users - 1)

    @contextlib.asynccontextmanager
    async def _node_claim_lock(self, ref: ClaimRef) -> AsyncIterator[_Outcome]:
        """The claim's lock that every instance of the node takes (records.try_lock_claim),
        held for the whole call. Polled, never waited on in a thread: a wait that cannot
        be bounded would tie up a worker thread for as long as the other instance takes.
        The call says in what it yields whether it left records (see _Outcome)."""
        outcome = _Outcome()
        if not valid_uid(ref.uid):
            yield outcome  # no record can be named after it: nothing to keep apart
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLAIM_LOCK_WAIT_S
        pause, longest = _CLAIM_LOCK_POLL_S
        while (fd := self._records.try_lock_claim(ref.uid)) is None:
            if loop.time() > deadline:
                raise ClaimBusyError(
                    f"claim {ref}: another plugin instance of this node has been preparing or "
                    f"unpreparing it for over {CLAIM_LOCK_WAIT_S:g}s"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)
        try:
            yield outcome
        finally:
            self._records.unlock_claim(ref.uid, fd, records_left=outcome.records_left)

    async def _file_step(self, step: Callable[..., T], *args: Any) -> T:
        """A record write: inline when it is a few syscalls, in a thread when it fsyncs."""
        if self._records.fsync:
            return await asyncio.to_thread(step, *args)
        return step(*args)

    async def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        started = time.perf_counter()
        outcome, result = "error", PrepareResult()
        async with self._claim_lock(ref.uid):
            try:
                async with self._node_claim_lock(ref) as held:
                    outcome, claim = await self._prepare(ref)
                    held.records_left = True  # its spec, at least
                result = PrepareResult(devices=claim.devices)
            except DriverError as exc:
                result = PrepareResult(error=str(exc))
            except OSError as exc:  # disk full, read-only mount, …: a retry may succeed
                log.error("prepare failed: node state I/O", extra={**_claim_kv(ref), "error": exc})
                result = PrepareResult(error=f"claim {ref}: writing node state failed: {exc}")
            except Exception as exc:
                log.exception("prepare failed unexpectedly", extra=_claim_kv(ref))
                result = PrepareResult(error=f"internal error preparing claim {ref}: {exc!r}")
            if not result.error:
                self._tell(lambda o: o.prepared(claim))
        log.info(
            "prepare",
            extra={
                **_claim_kv(ref),
                "outcome": outcome,
                "ms": round((time.perf_counter() - started) * 1e3, 2),
                "devices": ",".join(d.device_name for d in result.devices),
                **({"error": result.error} if result.error else {}),
            },
        )
        return result

    async def _prepare(self, ref: ClaimRef) -> tuple[str, PreparedClaim]:
        """Fetch, plan, record, side effects, CDI, complete; returns (outcome, claim)."""
        if not valid_uid(ref.uid):
            raise ClaimError(f"claim {ref}: uid {ref.uid!r} is not a Kubernetes UID")
        # Fetch.
        obj = await fetch_claim(self._claims, ref)
        # Plan: pure, against the node's devices as last discovered.
        devices = self._devices.current
        plan = plan_claim(
            obj,
            ref,
            driver_name=self._config.driver_name,
            pool_name=self._pool,
            rules=self._config.flavor.configs,
        )
        claim = self._prepared_claim(plan, devices)
        if not claim.devices:
            # The kubelet asks us only for claims with results of our driver; none in this
            # node's pool means the claim was allocated for another node. An empty success
            # would start the container without the GPUs it asked for.
            raise ClaimError(
                f"claim {ref} has no device of driver {self._config.driver_name} in pool "
                f"{self._pool}: it is allocated for another node"
            )
        existing = self._records.read_spec(ref.uid)
        if existing is not None and self._same_plan(ref, existing, claim):
            return "already-prepared", claim
        if existing is not None:
            self._check_same_devices(ref, existing, devices)
        # Record: reserve each device (one symlink each; no lock, no shared file).
        try:
            self._records.reserve(
                claim,
                shareable=[
                    d.device_name
                    for d in claim.devices
                    if devices[d.device_name].published.get("allowMultipleAllocations")
                ],
            )
        except DeviceTakenError as exc:
            if self._config.flavor.device_taken_is_retryable:
                raise ClaimBusyError(str(exc)) from exc
            raise ClaimError(str(exc)) from exc
        crashpoint("after-reserve")
        try:
            # Side effects, after a record of what to undo (full GPUs have none).
            kinds = [k for k in _kinds_of(claim, self._config.flavor) if k.has_side_effects(claim)]
            if kinds:
                await self._file_step(self._records.write_claim_record, claim)
                crashpoint("after-claim-record")
                for kind in kinds:
                    await asyncio.to_thread(kind.prepare, claim)
                crashpoint("after-side-effects")
            # One build, after the side effects: what they made (a MIG instance's device
            # nodes) is in the kinds' edits, which may read the kinds' files.
            edits = await asyncio.to_thread(self._kind_edits, claim, devices)
            spec = cdi.encode(await self._spec_on_host(ref, claim, devices, edits))
            # CDI: the spec is the claim's record; once it is in place the claim is prepared.
            await self._file_step(self._records.write_spec, ref.uid, spec)
        except PreparePendingError:
            # Kept as it stands (see PreparePendingError); the kubelet retries.
            self._held[ref.uid] = _device_names(claim)
            raise
        except BaseException as exc:
            if existing is not None:
                # The claim was prepared before this call, and a pod may run with it: undoing
                # it would stop its MPS daemon or destroy its MIG instance under the pod and
                # hand its devices to the next claim. The old spec, its side effects and its
                # reservations stay; the kubelet's retry rewrites the spec.
                self._held[ref.uid] = _device_names(claim)
                log.error(
                    "prepare of a prepared claim failed; it stays prepared as it was",
                    extra={**_claim_kv(ref), "error": repr(exc)},
                )
                raise
            problems = await self._roll_back(claim)
            if problems and isinstance(exc, Exception):
                raise RollbackError(
                    f"claim {ref}: prepare failed ({_described(exc)}) and undoing it did not "
                    f"finish ({'; '.join(problems)}); what is left stays recorded and reserved "
                    "until the kubelet's retry or an unprepare finishes it"
                ) from exc
            raise
        crashpoint("after-cdi-write")
        # Complete.
        self._held[ref.uid] = _device_names(claim)
        return ("repaired" if existing is not None else "prepared"), claim

    async def _spec_on_host(
        self,
        ref: ClaimRef,
        claim: PreparedClaim,
        devices: Mapping[str, NodeDevice],
        edits: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Any]:
        """The claim's spec, once every device node it names is on the host: the missing
        ones made as NVIDIA's tools make them, and the host's edits had again when its nodes
        differ from those they were had with. A fresh node's first claim (no NVIDIA client
        has run: NVIDIA's issue 1380) otherwise gets a spec that starts no container with
        a GPU while its prepare succeeds. Raises DeviceNodesError (retryable)."""
        host = self._config.host
        tried: list[str] | None = None  # what making the missing nodes said, once tried
        check: NodeCheck | None = None
        for _ in range(4):  # at most: make them, then the edits and dev root they change
            spec = cdi.build_claim_spec(
                claim,
                devices,
                self._base_edits,
                edits,
                boot_id=self._records.boot_id,
                dev_root=self._dev_root,
                flavor=self._config.flavor,
            )
            if host is None:
                return spec
            check = await asyncio.to_thread(host.check_nodes, cdi.host_device_nodes(spec))
            if check.seen != self._nodes_seen or check.dev_root != self._dev_root:
                await self._refresh_host_view()
                continue
            if not check.missing:
                return spec
            if tried is not None:
                break
            log.warning(
                "device nodes of the claim's spec are missing on the host; making them",
                extra={**_claim_kv(ref), "missing": ",".join(check.missing)},
            )
            tried = await host.create_nodes(check.missing)
        missing = check.missing if check is not None and check.missing else ()
        raise DeviceNodesError(
            f"claim {ref}: "
            + (
                missing_message(missing, tried or [])
                if missing
                else "the host's device nodes kept changing while its spec was written"
            )
        )

    async def _refresh_host_view(self) -> None:
        """The host's edits, dev root and nodes had again; one at a time, since having the
        toolkit's edits again runs it."""
        async with self._host_lock:
            self._base_edits, self._dev_root, self._nodes_seen = await _host_view(self._config)

    def _prepared_claim(self, plan: ClaimPlan, devices: Mapping[str, NodeDevice]) -> PreparedClaim:
        """Pure: the claim as it will be recorded, each device checked to exist here."""
        ref = plan.ref
        prepared = []
        shares: set[str] = set()
        for planned in plan.devices:
            device = devices.get(planned.device_name)
            if device is None:
                raise ClaimError(
                    f"claim {ref}: device {planned.device_name} (pool {planned.pool_name}) "
                    f"does not exist on node {self._config.node_name}"
                )
            if planned.share_id is not None:
                problem = share_problem(device.published, dict(planned.consumed))
                if problem is None and planned.share_id in shares:
                    problem = f'field "shareID": {planned.share_id} is used by two results'
                if problem is not None:
                    raise ClaimError(
                        f"claim {ref}: the share of device {planned.device_name}: {problem}"
                    )
                shares.add(planned.share_id)
            prepared.append(
                PreparedDevice(
                    request_names=(planned.base_request,),
                    pool_name=planned.pool_name,
                    device_name=planned.device_name,
                    cdi_device_ids=(
                        cdi.cdi_device_id(
                            ref.uid, planned.device_name, planned.share_id, self._config.flavor
                        ),
                    ),
                    share_id=planned.share_id,
                    admin_access=planned.admin_access,
                    kind=device.kind,
                    identity=tuple(sorted(device.identity.items())),
                    sharing=planned.config.sharing_settings(),
                    consumed=planned.consumed,
                )
            )
        return PreparedClaim(ref.uid, ref.namespace, ref.name, tuple(prepared))

    def _kind_edits(
        self, claim: PreparedClaim, devices: Mapping[str, NodeDevice]
    ) -> dict[str, Mapping[str, Any]]:
        """Each of the claim's kinds' claim-wide edits (blocking: a kind may read its files)."""
        kinds = self._config.flavor.kinds
        return {
            name: kinds[name].claim_edits(of_kind, claim)
            for name, of_kind in cdi.kinds_of(claim, devices).items()
        }

    def _same_plan(self, ref: ClaimRef, existing: bytes, claim: PreparedClaim) -> bool:
        """Whether the claim's spec on disk, in this release's layout and of this boot,
        records exactly ``claim``'s plan: then it is prepared, and its side effects stand."""
        flavor = self._config.flavor
        recorded = cdi.current_claim(
            existing,
            Path(cdi.spec_name(ref.uid, flavor)),
            flavor=flavor,
            boot_id=self._records.boot_id,
        )
        kinds = flavor.kinds
        return recorded is not None and cdi.plan_of(recorded, kinds) == cdi.plan_of(claim, kinds)

    def _check_same_devices(
        self, ref: ClaimRef, existing: bytes, devices: Mapping[str, NodeDevice]
    ) -> None:
        """A spec that differs from the one we would write: a swapped device is refused;
        anything else (tampered, damaged, another release's layout) is rewritten."""
        try:
            flavor = self._config.flavor
            recorded = cdi.claim_from_spec(
                cdi.parse(existing, Path(cdi.spec_name(ref.uid, flavor))), flavor
            )
        except (ValueError, cdi.SpecError):
            log.warning("CDI spec of a prepared claim was damaged; rewriting", extra=_claim_kv(ref))
            return
        if recorded.uid != ref.uid:
            return
        mismatch = cdi.identity_mismatch(recorded, devices)
        if mismatch:
            raise ClaimError(f"claim {ref}: {mismatch}")
        log.warning("CDI spec of a prepared claim differed; rewriting", extra=_claim_kv(ref))

    async def _roll_back(self, claim: PreparedClaim) -> list[str]:
        """Undo a prepare of a claim that was not prepared before the call (e.g. on a full
        disk). Each step runs whatever became of the others, except where running it would
        leave a worse state than stopping: returns what could not be undone, [] when
        nothing of the prepare is left.

        Order matters across the steps, not their success: a spec that stays is a prepared
        claim, so its side effects and devices stay with it; a side-effect record is the
        only way the unprepare or recovery finds a side effect still standing, and the
        reservation keeps its device from the next claim until then (recovering a stale
        record would destroy a MIG instance at a placement another claim was given).
        """
        problems: list[str] = []
        ref = _claim_kv(claim)

        def failed(step: str, exc: BaseException) -> None:
            log.error("rollback step failed", extra={**ref, "step": step, "error": repr(exc)})
            problems.append(f"{step}: {exc}")

        try:
            self._records.remove_spec(claim.uid)
        except OSError as exc:
            # A read-only mount refuses the unlink even of a name that is not there (the
            # kernel checks the mount first); only a spec that is there must stop us.
            try:
                stays = self._records.read_spec(claim.uid) is not None
            except OSError:
                stays = True  # unreadable: assume the worst, it may be served
            if stays:
                failed("removing the CDI spec", exc)
                return problems
            log.warning(
                "removing the CDI spec failed, but there is none; rolling back the rest",
                extra={**ref, "error": repr(exc)},
            )
        undone = True
        for kind in [k for k in _kinds_of(claim, self._config.flavor) if k.has_side_effects(claim)]:
            try:
                await asyncio.to_thread(kind.unprepare, claim)
            except Exception as exc:  # the other kinds are still undone
                failed(f"undoing the {kind.name} side effects", exc)
                undone = False
        if not undone:
            return problems
        try:
            self._records.remove_claim_record(claim.uid)
        except OSError as exc:
            failed("removing the side-effect record", exc)
            return problems
        try:
            self._records.release(claim.uid, _device_names(claim))
        except OSError as exc:
            failed("releasing the devices", exc)
        return problems

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        started = time.perf_counter()
        async with self._claim_lock(ref.uid):
            try:
                async with self._node_claim_lock(ref) as held:
                    outcome = await self._unprepare(ref)
                    held.records_left = False  # spec and side-effect record removed
                error = ""
            except DriverError as exc:
                outcome, error = "error", str(exc)
            except OSError as exc:
                log.error(
                    "unprepare failed: node state I/O", extra={**_claim_kv(ref), "error": exc}
                )
                outcome, error = "error", f"claim {ref}: writing node state failed: {exc}"
            except Exception as exc:
                log.exception("unprepare failed unexpectedly", extra=_claim_kv(ref))
                outcome, error = "error", f"internal error unpreparing claim {ref}: {exc!r}"
            if not error:
                self._tell(lambda o: o.unprepared(ref.uid))
        log.info(
            "unprepare",
            extra={
                **_claim_kv(ref),
                "outcome": outcome,
                "ms": round((time.perf_counter() - started) * 1e3, 2),
                **({"error": error} if error else {}),
            },
        )
        return error

    async def _unprepare(self, ref: ClaimRef) -> str:
        """The prepare backwards: spec, side effects, their record, the reservations."""
        if not valid_uid(ref.uid):
            return "nothing-to-do"  # no such name can be one of our records
        with_effects = self._records.read_claim_record(ref.uid)
        # The spec first: from here on no new container gets the devices.
        removed = self._records.remove_spec(ref.uid)
        crashpoint("after-spec-removed")
        if with_effects is not None:
            for kind in _kinds_of(with_effects, self._config.flavor):
                await asyncio.to_thread(kind.unprepare, with_effects)
            self._records.remove_claim_record(ref.uid)
            crashpoint("after-side-effects-undone")
        released = self._records.release(ref.uid, self._held.pop(ref.uid, None))
        return "unprepared" if removed or released or with_effects else "nothing-to-do"

    # ---- the observer (metrics): told what is prepared -------------------------------

    async def observe(self, *observers: ClaimObserver) -> None:
        """From now on tell ``observers`` what is prepared, starting with what is now
        (the claims recovery found, and any other instance's)."""
        self._observers = observers
        await self._resync_observer()

    def _tell(self, news: Callable[[ClaimObserver], None]) -> None:
        if not self._observers:
            return
        self._observed += 1
        for observer in self._observers:
            try:
                news(observer)
            except Exception:  # an observer must never fail a prepare that succeeded
                log.exception("claim observer failed", extra=kv(observer=type(observer).__name__))

    async def _resync_observer(self) -> None:
        if not self._observers:
            return
        told = self._observed
        claims = await asyncio.to_thread(self._prepared_on_disk)
        # A claim told meanwhile may be missing from what was read: the next round resyncs.
        if told == self._observed:
            self._tell(lambda o: o.recorded(claims))

    def _prepared_on_disk(self) -> dict[str, PreparedClaim]:
        """The node's prepared claims: our CDI specs, whichever instance wrote them."""
        found: dict[str, PreparedClaim] = {}
        for path in self._records.spec_files():
            try:
                spec = cdi.parse(path.read_bytes(), path)
                if cdi.is_ours(spec):
                    claim = cdi.claim_from_spec(spec, self._config.flavor)
                    found[claim.uid] = claim
            except (OSError, ValueError, cdi.SpecError):
                continue  # judged at the next start, not here
        return found

    # ---- reconciliation (worker thread) -----------------------------------------------

    def _recorded_claims(self) -> list[Holder]:
        """Every claim some record of this node names: specs, reservations, side effects."""
        found: dict[str, Holder] = {}
        for target in self._records.reservations().values():
            holder = parse_target(target)
            if holder is not None:
                found[holder.uid] = holder
        for claim in self._prepared_on_disk().values():
            found.setdefault(claim.uid, Holder(claim.uid, claim.namespace, claim.name))
        for path in self._records.claim_record_files():
            with contextlib.suppress(OSError, RecordError):
                effects = self._records.read_claim_record(path.stem)
                if effects is not None:
                    found.setdefault(
                        effects.uid, Holder(effects.uid, effects.namespace, effects.name)
                    )
        return list(found.values())


async def _host_view(config: StateConfig) -> tuple[Mapping[str, Any], str, frozenset[str]]:
    """What specs take from the host's install now: its edits, its dev root and the device
    nodes they were had with (seen first: a node made meanwhile makes the next look differ)."""
    host = config.host
    if host is None:
        return {}, "/", frozenset()
    check = await asyncio.to_thread(host.check_nodes, ())
    base_edits: Mapping[str, Any] = {}
    if config.flavor.toolkit_kinds is None or config.flavor.toolkit_kinds:
        base_edits = await host.base_edits()
    return base_edits, check.dev_root, check.seen


async def _every(period: float, work: Callable[[], Awaitable[None]], name: str) -> None:
    """``work`` now and then every ``period`` seconds, until cancelled; a failed round is
    logged (once while it repeats) and the next one may succeed."""

    async def round_() -> None:
        await work()
        await asyncio.sleep(period)

    # A failed round waits the period too (supervised's pause), as a successful one does.
    await supervised(name, round_, OnFailure.CONTINUE, pause=period)
