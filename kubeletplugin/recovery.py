"""Startup recovery of the per-claim records: judge each against the boot, migrate, clean.

Run once per process start, before serving, under the records' startup lock (so a
second plugin instance starting meanwhile waits). What it decides, per record:

- a CDI spec of ours: of an earlier boot (its boot-id annotation) it is void and
  removed; otherwise it is a prepared claim, and its devices are reserved for it;
- a record that cannot be understood (garbage, a torn write, a newer record version,
  an unknown device kind, an unexpected layout): at the first start of a boot it is
  taken for a torn record of the earlier boot (only a power loss tears a write, and a
  power loss changes the boot ID) and removed; later in the same boot it is refused:
  :class:`RecordError`, one line, the node stays not ready; it is never read as "no
  claim", which would hand its devices out twice;
- a per-claim record of side effects with no spec: an interrupted prepare or
  unprepare, unless another plugin instance (a surge upgrade) holds the claim's lock:
  then it is that instance's prepare or unprepare in flight, and left to it; otherwise
  its kind's ``recover`` undoes the side effects, under the claim's lock; the devices
  stay reserved until the kubelet prepares or unprepares the claim again, or the
  reconciler sees the claim gone; a ``recover`` that fails (the claim's GPU is bad)
  keeps the record for those to finish and fails that claim alone, never the node;
- device reservations: void at the first start of a boot; otherwise kept (a
  reservation without a spec is an interrupted prepare, as above); a prepared claim's
  missing one is made again (under the claim's lock, while its spec is still there);
  a device reserved for another claim than the spec that names it is refused like an
  unreadable record;
- release 0.1.0's checkpoint: migrated (its claims are the truth, as 0.1.0 held them),
  then replaced by the marker a rollback to 0.1.0 understands (``kubeletplugin.checkpoint``).
"""

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

import yaml

from driver.common.errors import DriverError, PermanentError
from driver.common.fsutil import write_atomic
from driver.common.logs import kv
from driver.devicekind import AnyKind, PreparedClaim, PreparedDevice
from kubeletplugin import cdi, checkpoint
from kubeletplugin.records import (
    Holder,
    RecordError,
    Records,
    decode_claim_record,
    parse_target,
)

log = logging.getLogger(__name__)


class ForeignStateError(PermanentError):
    """Another driver's state (checkpoint or CDI specs) sits under our names."""


def _claim_kv(claim: PreparedClaim | Holder) -> Mapping[str, str]:
    return kv(claim_uid=claim.uid, claim_namespace=claim.namespace, claim_name=claim.name)


def _refuse(path: Path, problem: str) -> RecordError:
    return RecordError(
        f"{path} is a record of the current boot that this release cannot read ({problem}): "
        "not serving, so as not to hand out its devices twice; check the file, then remove "
        "it (its claim is prepared again by the kubelet) or run the release that wrote it"
    )


def _from_legacy(record: checkpoint.ClaimRecord) -> PreparedClaim:
    return PreparedClaim(
        uid=record.uid,
        namespace=record.namespace,
        name=record.name,
        devices=tuple(
            PreparedDevice(
                request_names=d.request_names,
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=d.cdi_device_ids,
                share_id=d.share_id,
                admin_access=d.admin_access,
                kind="gpu",
                identity=(("gpu-uuid", d.gpu_uuid),),
            )
            for d in record.devices
        ),
    )


def _remove(path: Path, why: str) -> None:
    """Remove a void record; one that cannot be removed is reported and skipped: it is
    void whatever happens to it, and it must not keep the node from serving."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("cannot remove a void record; skipped", extra=kv(path=path, why=why, error=exc))
        return
    log.warning("removed a void record", extra=kv(path=path, why=why))


def _read_legacy(records: Records) -> checkpoint.Checkpoint | None:
    """0.1.0's checkpoint, if one is to be migrated. Raises what must stop us."""
    path = records.plugin_dir / checkpoint.FILE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if checkpoint.is_marker(raw):
        return None
    try:
        return checkpoint.decode(raw, path=path)  # Foreign/Unknown: refused, raised
    except checkpoint.CorruptCheckpointError as exc:
        # 0.1.0's own answer to a corrupt checkpoint: its CDI specs are the record.
        aside = path.with_name(f"{path.name}.corrupt")
        path.replace(aside)
        log.error(
            "0.1.0 checkpoint is corrupt: moved aside, the CDI specs are the record",
            extra=kv(error=str(exc), moved_to=str(aside)),
        )
        return None


def recover(records: Records) -> dict[str, PreparedClaim]:
    """Recover the node's records; returns the prepared claims by uid."""
    with records.startup_lock():
        return _recover(records)


def _recover(records: Records) -> dict[str, PreparedClaim]:
    boot = records.boot_id
    legacy = _read_legacy(records)
    recorded = records.recorded_boot()
    fresh = bool(boot) and recorded != boot and not (legacy is not None and legacy.boot_id == boot)
    live = _judge_specs(records, fresh=fresh)
    pending: dict[str, PreparedClaim] = {}
    if legacy is not None:
        pending = _migrate(records, legacy, live)
    # A claim whose side effects could not be undone keeps its devices, as one interrupted
    # before any side effect does.
    pending = {**pending, **_judge_claim_records(records, live, fresh=fresh)}
    _reserve(records, live, pending, reset=fresh or legacy is not None)
    swept = records.sweep_temp_files()
    if swept:
        log.warning("removed temp files an interrupted write left", extra=kv(files=swept))
    marker = records.plugin_dir / checkpoint.FILE_NAME
    if legacy is not None or not marker.exists():
        write_atomic(marker, checkpoint.marker(), fsync=records.fsync)
    if boot and recorded != boot:
        records.record_boot()
    return live


def _judge_specs(records: Records, *, fresh: bool) -> dict[str, PreparedClaim]:
    boot = records.boot_id
    live: dict[str, PreparedClaim] = {}
    foreign: list[Path] = []
    for path in records.spec_files():
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            continue
        spec_boot = ""
        try:
            spec = cdi.parse(raw, path)
            if cdi.is_foreign(spec, records.flavor):
                foreign.append(path)
                continue
            if not cdi.is_ours(spec):
                if isinstance(spec, dict):
                    continue  # someone else's file under a name like ours: not ours to judge
                raise cdi.SpecError("not a CDI spec")
            spec_boot = cdi.boot_of(spec)
            if boot and spec_boot and spec_boot != boot:
                _remove(path, "the CDI spec of a claim of an earlier boot")
                continue
            claim = cdi.claim_from_spec(spec, records.flavor)
            if path.name != cdi.spec_name(claim.uid, records.flavor):
                raise cdi.SpecError(f"it names claim {claim.uid}, not the one of its file name")
        except (ValueError, yaml.YAMLError, cdi.SpecError) as exc:
            if fresh or (boot and spec_boot and spec_boot != boot):
                _remove(path, f"an unreadable record left by an earlier boot ({exc})")
                continue
            raise _refuse(path, str(exc)) from exc
        live[claim.uid] = claim
    if foreign:
        raise ForeignStateError(
            cdi.FOREIGN_MESSAGE.format(
                kind=records.flavor.cdi_kind, root=records.cdi_root, files=cdi.file_names(foreign)
            )
        )
    return live


def _migrate(
    records: Records, legacy: checkpoint.Checkpoint, live: dict[str, PreparedClaim]
) -> dict[str, PreparedClaim]:
    """0.1.0's checkpoint is the truth of what it prepared: specs it does not list are
    orphans, a PrepareStarted claim was interrupted (spec removed, devices reserved).
    Returns the claims whose devices stay reserved without a spec."""
    boot = records.boot_id
    if boot and legacy.boot_id and legacy.boot_id != boot:
        claims: Mapping[str, checkpoint.ClaimRecord] = {}
        log.warning("0.1.0 checkpoint of an earlier boot: its claims are void")
    else:
        claims = legacy.claims
    for uid in [u for u in live if u not in claims]:
        records.remove_spec(uid)
        log.warning(
            "removed a CDI spec the 0.1.0 checkpoint does not list", extra=_claim_kv(live.pop(uid))
        )
    pending: dict[str, PreparedClaim] = {}
    for uid, record in claims.items():
        claim = _from_legacy(record)
        if record.state is checkpoint.ClaimState.PREPARE_STARTED:
            records.remove_spec(uid)
            live.pop(uid, None)
            pending[uid] = claim
        elif uid not in live:
            pending[uid] = claim  # its spec is gone: prepared again by the kubelet's retry
    log.info(
        "migrated the 0.1.0 checkpoint to per-claim records",
        extra=kv(claims=len(live), interrupted=len(pending)),
    )
    return pending


def _judge_claim_records(
    records: Records, live: Mapping[str, PreparedClaim], *, fresh: bool
) -> dict[str, PreparedClaim]:
    """Undo the side effects of each interrupted claim; returns those it could not undo
    now (their records stay)."""
    boot = records.boot_id
    kinds = records.flavor.kinds
    unrecovered: dict[str, PreparedClaim] = {}
    for path in records.claim_record_files():
        if path.name.endswith(".tmp"):
            continue
        try:
            record_boot, claim = decode_claim_record(path.read_bytes(), records.flavor.record_kind)
        except FileNotFoundError:
            continue  # removed since the listing: another instance finished its unprepare
        except RecordError as exc:
            if fresh:
                _remove(path, f"an unreadable record left by an earlier boot ({exc})")
                continue
            raise _refuse(path, str(exc)) from exc
        if boot and record_boot != boot:  # its side effects did not outlive that boot
            _remove(path, "the side-effect record of a claim of an earlier boot")
            continue
        if claim.uid in live:
            continue
        unknown = sorted({d.kind for d in claim.devices} - kinds.keys())
        if unknown:
            raise _refuse(path, f"unknown device kind {unknown[0]!r}")
        # A record without a spec is an interrupted call only if no instance is in the
        # middle of it: during a surge upgrade the other instance may be between the
        # record and the spec of a prepare (or the spec and the record of an unprepare).
        with _claim_locked(records, claim) as ours:
            if not ours:
                continue
            if records.spec_path(claim.uid).exists():
                continue  # its prepare finished since the specs were read: prepared
            if not _recovered(claim, kinds):
                unrecovered[claim.uid] = claim
                continue
            path.unlink(missing_ok=True)
        log.warning(
            "interrupted prepare rolled back: side effects undone, devices stay reserved until "
            "the kubelet retries or the claim is gone",
            extra=_claim_kv(claim),
        )
    return unrecovered


def _recovered(claim: PreparedClaim, kinds: Mapping[str, AnyKind]) -> bool:
    """Each of the claim's kinds undoes its side effects; False (logged) when one cannot.

    One claim's failure is that claim's: its GPU's nvidia-smi failing (a GPU lost after an
    XID 79 fails it for good) or NVML refusing a MIG change must not keep the node from
    serving claims on its other GPUs. The record stays, so the claim's next prepare or
    unprepare, or the reconciler once the claim is gone, does what this could not, and
    reports it to the claim.
    """
    for name in sorted({d.kind for d in claim.devices}):
        try:
            kinds[name].recover(claim)
        except Exception as exc:
            log.error(
                "interrupted prepare not rolled back: its record stays for the claim's next "
                "prepare or unprepare; the node serves its other claims",
                exc_info=not isinstance(exc, DriverError | OSError),
                extra={**_claim_kv(claim), "kind": name, "error": str(exc)},
            )
            return False
    return True


@contextlib.contextmanager
def _claim_locked(records: Records, claim: PreparedClaim | Holder) -> Iterator[bool]:
    """Hold ``claim``'s lock if no other instance holds it; yields whether it is ours.
    Never waits: a holder is a live instance (a lock dies with its process), and it
    finishes the claim itself."""
    fd = records.try_lock_claim(claim.uid)
    if fd is None:
        log.info(
            "claim is being prepared or unprepared by another plugin instance; left to it",
            extra=_claim_kv(claim),
        )
        yield False
        return
    try:
        yield True
    finally:
        records.unlock_claim(claim.uid, fd)


def _reserve(
    records: Records,
    live: Mapping[str, PreparedClaim],
    pending: Mapping[str, PreparedClaim],
    *,
    reset: bool,
) -> None:
    current = records.reservations()
    if reset:
        for name in current:
            records.remove_reservation(name)
        current = {}
    for name, target in current.items():
        if parse_target(target) is None:
            raise _refuse(records.devices_dir / name, f"not a reservation: {target!r}")
    for claim in pending.values():
        _hold(records, claim)
    for claim in live.values():
        if reset:  # no instance serves at a boot's first start, nor beside 0.1.0's records
            _hold(records, claim)
            continue
        # Another instance may serve the node: it may have unprepared the claim since its
        # spec was read (and given the device to the next claim), or be doing so now.
        with _claim_locked(records, claim) as ours:
            if ours and records.spec_path(claim.uid).exists():
                _hold(records, claim)


def _hold(records: Records, claim: PreparedClaim) -> None:
    """Reserve each device of a prepared claim for it; one reserved for another claim is
    a record-integrity failure like an unreadable record: refused, never served twice."""
    holder = Holder(claim.uid, claim.namespace, claim.name)
    for device in claim.devices:
        if device.admin_access:
            continue
        held = records.holder(device.reservation)
        if held is None:
            try:
                records.restore_reservation(device.reservation, holder)
                continue
            except FileExistsError:  # reserved in between: by whom?
                held = records.holder(device.reservation)
        if held is None or held.uid != claim.uid:
            raise _refuse(
                records.devices_dir / device.reservation,
                f"device {device.reservation} is reserved for claim "
                f"{held if held is not None else '(unreadable reservation)'}, and the CDI "
                f"spec of claim {holder} says it is prepared with it",
            )
