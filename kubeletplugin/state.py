"""Prepared-claim state of one node: prepare, unprepare, recovery, reconciliation.

The checkpoint is the record: a claim is written ``PrepareStarted`` (which reserves its
devices) before its CDI spec exists and ``PrepareCompleted`` after; unprepare removes
the spec before it drops the entry. So on disk there is never a spec of ours without
an entry, except after a crash between those steps, which recovery cleans up. Every
read-modify-write re-reads the file under a cross-process lock, so two plugin pods
serving the node during a surge upgrade never hand out one device twice.

Durability, per prepare + unprepare: four atomic writes (temp, fsync, rename), and one
directory fsync, five fsyncs in all. Only PrepareStarted is made durable (file and
directory fsynced) before the next step, because it must be on disk before the CDI
spec it accounts for can be. The CDI spec, PrepareCompleted and the unprepare's write
are atomic (so no reader, nor a reboot, ever sees half a file) but not waited on to
be durable: a crash of the process keeps them (they are in the page cache), and what
would lose them, a power loss, also changes the boot ID, which drops every claim of
the previous boot; the kubelet prepares them again. Without a boot ID the worst case
is a claim unprepared just before a power loss that holds its devices until the
reconciler sees the claim gone.

The blocking work runs in worker threads, under the lock, through the checkpoint
store's group commit, one thread hop per call: prepare writes PrepareStarted, then
the CDI spec, then PrepareCompleted; unprepare removes the spec, then the entry.
Claims prepared at the same time share their checkpoint writes.

Each claim is handled in its own task: calls for one claim are serialized, distinct
claims run in parallel, and a call the kubelet gives up on (45 s timeout) finishes in
the background, so what it leaves on disk is always a whole step, never half of one.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from kubernetes.aio.client import ApiClient

from driver.errors import DriverError, PermanentError, RetryableError
from driver.inventory import Inventory
from driver.logs import kv
from kubeletplugin import cdi, containertoolkit, dirs
from kubeletplugin.checkpoint import (
    Apply,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    CorruptCheckpointError,
    DeviceRecord,
)
from kubeletplugin.claims import (
    ClaimError,
    ClaimPlan,
    ClaimRef,
    claim_is_gone,
    fetch_claim,
    plan_claim,
)
from kubeletplugin.crashpoints import crashpoint

__all__ = [
    "ClaimRef",
    "DeviceState",
    "ForeignStateError",
    "PrepareResult",
    "PreparedDevice",
    "StateConfig",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_GONE_CHECKS_IN_FLIGHT = 8

# A prepare step's outcome ("started", "restarted" or "completed") and the claim's entry.
_Step = tuple[str, ClaimRecord]


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class StateConfig:
    plugin_dir: Path  # <plugins-dir>/<driver>
    cdi_root: Path
    driver_name: str
    node_name: str
    nvidia_driver_root: Path = Path("/")
    container_driver_root: Path = Path("/driver-root")
    pod_uid: str | None = None
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    # "system": CDI specs need the host's container toolkit; "simulated": they do without.
    nvml_mode: Literal["system", "simulated"] = "system"
    pool_name: str | None = None  # the ResourceSlice pool of this node; default node_name


class ForeignStateError(PermanentError):
    """Another driver's state (checkpoint or CDI specs) sits under our names."""


def _claim_kv(ref: ClaimRef | ClaimRecord) -> Mapping[str, Any]:
    return kv(claim_uid=ref.uid, claim_namespace=ref.namespace, claim_name=ref.name)


def _prepared(record: ClaimRecord) -> tuple[PreparedDevice, ...]:
    return tuple(
        PreparedDevice(
            request_names=d.request_names,
            pool_name=d.pool_name,
            device_name=d.device_name,
            cdi_device_ids=d.cdi_device_ids,
            share_id=d.share_id,
        )
        for d in record.devices
    )


def _read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        log.warning("cannot read the node boot ID; reboots go undetected", extra=kv(error=exc))
        return ""


class DeviceState:
    """Use :meth:`open`; the constructor does no I/O and no recovery."""

    def __init__(
        self,
        config: StateConfig,
        api_client: ApiClient,
        inventory: Inventory,
        *,
        boot_id: str,
        base_edits: Mapping[str, Any],
    ) -> None:
        self._config = config
        self._api = api_client
        self._gpus = inventory.by_device_name()
        self._pool = config.pool_name or config.node_name
        self._boot_id = boot_id
        self._base_edits = base_edits
        self._store = CheckpointStore(
            config.plugin_dir, boot_id=boot_id, on_corrupt=self._rebuild_from_specs
        )
        self._claim_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._background: set[asyncio.Task[Any]] = set()

    @classmethod
    async def open(
        cls, config: StateConfig, api_client: ApiClient, inventory: Inventory
    ) -> "DeviceState":
        """Check the node's state is ours, recover it, and get ready to serve.

        Raises ForeignStateError / ForeignCheckpointError (another driver's state) and
        containertoolkit.ToolkitError (no driver libraries to give containers): the node
        process reports these once and stays not ready.
        """
        boot_id = await asyncio.to_thread(_read_boot_id, config.boot_id_path)
        base_edits = await containertoolkit.base_edits(
            config.nvml_mode,
            container_root=config.container_driver_root,
            host_root=config.nvidia_driver_root,
        )
        await asyncio.to_thread(dirs.ensure_dir, config.plugin_dir, dirs.PRIVATE, ours=True)
        await asyncio.to_thread(dirs.ensure_dir, config.cdi_root, dirs.CDI_ROOT)
        state = cls(
            config,
            api_client,
            inventory,
            boot_id=boot_id,
            base_edits=base_edits,
        )
        await asyncio.to_thread(state._recover)
        log.info(
            "device state ready",
            extra=kv(node=config.node_name, pod_uid=config.pod_uid or "", gpus=len(state._gpus)),
        )
        return state

    # ---- public API -------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """One result per claim uid; a claim's failure never affects the others."""
        results = await asyncio.gather(*(self._detached(self._prepare_one(ref)) for ref in claims))
        return {ref.uid: result for ref, result in zip(claims, results, strict=True)}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """uid -> error ("" = ok). Works from local state alone; an unknown claim is ok."""
        results = await asyncio.gather(
            *(self._detached(self._unprepare_one(ref)) for ref in claims)
        )
        return {ref.uid: error for ref, error in zip(claims, results, strict=True)}

    async def run_reconciler(self, period: float = 600.0) -> None:
        """Reconcile now and then every ``period`` seconds, until cancelled."""
        while True:
            try:
                await self.reconcile()
            except Exception:  # keep the loop alive; the next round may succeed
                log.exception("reconciliation failed")
            await asyncio.sleep(period)

    async def reconcile(self) -> None:
        """One round: drop entries of claims that are gone, then orphaned CDI specs."""
        checkpoint = await self._store.snapshot()
        limit = asyncio.Semaphore(_GONE_CHECKS_IN_FLIGHT)

        async def check(record: ClaimRecord) -> None:
            ref = ClaimRef(uid=record.uid, namespace=record.namespace, name=record.name)
            async with limit:
                gone = await claim_is_gone(self._api, ref)
            if gone:
                log.info("claim is gone from the API server; unpreparing", extra=_claim_kv(ref))
                await self._detached(self._unprepare_one(ref))

        await asyncio.gather(*(check(r) for r in checkpoint.claims.values()))
        await asyncio.to_thread(self._sweep_orphan_specs)

    # ---- per-claim work ---------------------------------------------------------------

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

    async def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        async with self._claim_lock(ref.uid):
            try:
                record = await self._prepare_locked(ref)
            except DriverError as exc:
                log.warning("prepare failed", extra={**_claim_kv(ref), "error": str(exc)})
                return PrepareResult(error=str(exc))
            except OSError as exc:  # disk full, read-only mount, …: a retry may succeed
                log.error("prepare failed: node state I/O", extra={**_claim_kv(ref), "error": exc})
                return PrepareResult(error=f"claim {ref}: writing node state failed: {exc}")
            except Exception as exc:
                log.exception("prepare failed unexpectedly", extra=_claim_kv(ref))
                return PrepareResult(error=f"internal error preparing claim {ref}: {exc!r}")
        return PrepareResult(devices=_prepared(record))

    async def _prepare_locked(self, ref: ClaimRef) -> ClaimRecord:
        claim = await fetch_claim(self._api, ref)
        plan = plan_claim(claim, ref, driver_name=self._config.driver_name, pool_name=self._pool)
        reserved: list[ClaimRecord] = []
        spec_error: list[Exception] = []

        def write_spec(step: _Step) -> Apply[_Step] | None:
            # In the store's worker thread, under the lock, once PrepareStarted is durable
            # (the spec must never be on disk without its entry). What it returns is
            # written next, group-committed with other claims' completions.
            outcome, record = step
            if outcome == "completed":
                return None
            reserved.append(record)
            crashpoint("after-prepare-started")
            try:
                # A claim with nothing on this node gets no spec (CDI wants a device).
                if record.devices:
                    spec = cdi.build_claim_spec(
                        record, self._gpus, self._base_edits, boot_id=self._boot_id
                    )
                    cdi.write_spec(self._config.cdi_root, ref.uid, spec)
            except Exception as exc:  # e.g. disk full: the reservation goes right away
                spec_error.append(exc)
                return lambda cp: (self._drop_started(cp, record.uid), step)
            crashpoint("after-cdi-write")
            return lambda cp: self._complete(cp, step)

        try:
            outcome, record = await self._store.update(
                lambda cp: self._reserve(cp, plan), after=write_spec
            )
        except Exception:
            # Not on cancellation: the store's worker finishes the steps regardless.
            if reserved:  # the spec may be on disk without a completed entry
                await self._roll_back(reserved[0])
            raise
        if spec_error:
            raise spec_error[0]
        if outcome == "completed":
            await self._check_completed(record)
            log.info("claim already prepared", extra=_claim_kv(ref))
            return record
        if outcome == "restarted":
            log.warning("rolled back an interrupted prepare", extra=_claim_kv(ref))
        crashpoint("after-prepare-completed")
        log.info(
            "prepared claim",
            extra={**_claim_kv(ref), "devices": ",".join(d.device_name for d in record.devices)},
        )
        return record

    def _reserve(self, checkpoint: Checkpoint, plan: ClaimPlan) -> tuple[Checkpoint, _Step]:
        """Pure check-and-reserve, applied to the state as re-read under the lock."""
        ref = plan.ref
        existing = checkpoint.claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            return checkpoint, ("completed", existing)
        devices = []
        for planned in plan.devices:
            gpu = self._gpus.get(planned.device_name)
            if gpu is None:
                raise ClaimError(
                    f"claim {ref}: device {planned.device_name} (pool {planned.pool_name}) "
                    f"does not exist on node {self._config.node_name}"
                )
            if not planned.admin_access:
                self._check_free(checkpoint, ref, planned.device_name)
            devices.append(
                DeviceRecord(
                    request_names=(planned.base_request,),
                    pool_name=planned.pool_name,
                    device_name=planned.device_name,
                    gpu_uuid=gpu.uuid,
                    cdi_device_ids=(cdi.cdi_device_id(ref.uid, planned.device_name),),
                    share_id=planned.share_id,
                    admin_access=planned.admin_access,
                )
            )
        record = ClaimRecord(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=ClaimState.PREPARE_STARTED,
            devices=tuple(devices),
        )
        outcome = "restarted" if existing is not None else "started"
        return checkpoint.with_claim(record), (outcome, record)

    @staticmethod
    def _check_free(checkpoint: Checkpoint, ref: ClaimRef, device_name: str) -> None:
        for other in checkpoint.claims.values():
            if other.uid == ref.uid:
                continue
            for device in other.devices:
                if device.device_name == device_name and not device.admin_access:
                    raise ClaimError(
                        f"claim {ref}: device {device_name} is already prepared for claim "
                        f"{other.namespace}/{other.name} (uid {other.uid})"
                    )

    @staticmethod
    def _complete(checkpoint: Checkpoint, step: _Step) -> tuple[Checkpoint, _Step]:
        outcome, record = step
        current = checkpoint.claims.get(record.uid)
        if current is None or current.devices != record.devices:
            raise RetryableError(
                f"claim {record.namespace}/{record.name} was unprepared while being prepared"
            )
        done = ClaimRecord(
            uid=record.uid,
            namespace=record.namespace,
            name=record.name,
            state=ClaimState.PREPARE_COMPLETED,
            devices=record.devices,
        )
        return checkpoint.with_claim(done), (outcome, done)

    @staticmethod
    def _drop_started(checkpoint: Checkpoint, uid: str) -> Checkpoint:
        current = checkpoint.claims.get(uid)
        if current is not None and current.state is ClaimState.PREPARE_STARTED:
            return checkpoint.without_claim(uid)
        return checkpoint

    async def _check_completed(self, record: ClaimRecord) -> None:
        """Before answering from the checkpoint: same GPUs, spec still in place."""
        for device in record.devices:
            gpu = self._gpus.get(device.device_name)
            now = gpu.uuid if gpu is not None else "none"
            if now != device.gpu_uuid:
                raise ClaimError(
                    f"claim {record.namespace}/{record.name}: device {device.device_name} was "
                    f"prepared with GPU {device.gpu_uuid} but is now {now}; unprepare the claim "
                    "(delete the pod) and prepare it again"
                )
        path = cdi.spec_path(self._config.cdi_root, record.uid)
        if record.devices and not await asyncio.to_thread(path.exists):
            log.warning(
                "CDI spec of a prepared claim was missing; rewriting", extra=_claim_kv(record)
            )
            spec = cdi.build_claim_spec(record, self._gpus, self._base_edits, boot_id=self._boot_id)
            await asyncio.to_thread(cdi.write_spec, self._config.cdi_root, record.uid, spec)

    async def _roll_back(self, record: ClaimRecord) -> None:
        try:
            await self._store.update(
                lambda cp: (self._drop_started(cp, record.uid), None),
                durable=False,
                before=lambda: cdi.remove_spec(self._config.cdi_root, record.uid),
            )
        except Exception:  # the entry stays PrepareStarted; the next prepare rolls it back
            log.exception("rollback of a failed prepare failed", extra=_claim_kv(record))

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        async with self._claim_lock(ref.uid):
            removed: list[bool] = []
            try:
                # Spec first, entry second: a crash in between leaves an entry without a
                # spec (harmless, the kubelet retries), never a spec nobody accounts for.
                known = await self._store.update(
                    lambda cp: (cp.without_claim(ref.uid), ref.uid in cp.claims),
                    durable=False,
                    before=lambda: removed.append(cdi.remove_spec(self._config.cdi_root, ref.uid)),
                )
            except DriverError as exc:
                log.warning("unprepare failed", extra={**_claim_kv(ref), "error": str(exc)})
                return str(exc)
            except OSError as exc:
                log.error(
                    "unprepare failed: node state I/O", extra={**_claim_kv(ref), "error": exc}
                )
                return f"claim {ref}: writing node state failed: {exc}"
            except Exception as exc:
                log.exception("unprepare failed unexpectedly", extra=_claim_kv(ref))
                return f"internal error unpreparing claim {ref}: {exc!r}"
        if known or any(removed):
            log.info("unprepared claim", extra=_claim_kv(ref))
        else:
            log.info("unprepare of a claim not prepared here: nothing to do", extra=_claim_kv(ref))
        return ""

    # ---- recovery (worker thread, under the file lock) ---------------------------------

    def _rebuild_from_specs(self, error: CorruptCheckpointError) -> Checkpoint:
        aside = self._store.move_aside()
        scan = cdi.scan(self._config.cdi_root)
        # A spec from an earlier boot explains no live claim; recovery then removes it.
        # A spec without the annotation (an older release wrote it) is kept: reserving
        # a device too long is safe, handing it out twice is not.
        live = {
            uid: record
            for uid, record in scan.ours.items()
            if scan.boot_ids.get(uid, "") in ("", self._boot_id)
        }
        log.error(
            "checkpoint is corrupt: moved aside, state rebuilt from CDI specs",
            extra=kv(
                error=str(error),
                moved_to=str(aside),
                claims=len(live),
                earlier_boot=len(scan.ours) - len(live),
            ),
        )
        return Checkpoint(boot_id=self._boot_id, claims=live)

    def _recover(self) -> None:
        root = self._config.cdi_root
        with self._store.locked():
            scan = cdi.scan(root)
            if scan.foreign:
                raise ForeignStateError(
                    cdi.FOREIGN_MESSAGE.format(
                        kind=cdi.KIND, root=root, files=", ".join(p.name for p in scan.foreign)
                    )
                )
            for path, problem in scan.unreadable:
                log.error(
                    "unreadable CDI spec of ours left in place", extra=kv(path=path, error=problem)
                )
            original = checkpoint = self._store.load()
            if checkpoint.boot_id and self._boot_id and checkpoint.boot_id != self._boot_id:
                log.warning(
                    "node rebooted since the checkpoint was written: dropping prepared claims",
                    extra=kv(claims=len(checkpoint.claims)),
                )
                checkpoint = Checkpoint(boot_id=self._boot_id)
            elif checkpoint.boot_id != self._boot_id:
                checkpoint = Checkpoint(boot_id=self._boot_id, claims=checkpoint.claims)
            for record in checkpoint.claims.values():
                if record.state is ClaimState.PREPARE_STARTED and cdi.remove_spec(root, record.uid):
                    log.warning(
                        "interrupted prepare rolled back: CDI spec removed, devices stay "
                        "reserved until the kubelet retries or the claim is gone",
                        extra=_claim_kv(record),
                    )
            self._remove_orphans(scan, checkpoint)
            if checkpoint is not original:
                self._store.write(checkpoint)

    def _remove_orphans(self, scan: cdi.SpecScan, checkpoint: Checkpoint) -> None:
        for uid, record in scan.ours.items():
            if uid not in checkpoint.claims:
                cdi.remove_spec(self._config.cdi_root, uid)
                log.warning(
                    "removed a CDI spec no prepared claim explains", extra=_claim_kv(record)
                )

    def _sweep_orphan_specs(self) -> None:
        with self._store.locked():
            checkpoint = self._store.load()
            self._remove_orphans(cdi.scan(self._config.cdi_root), checkpoint)
