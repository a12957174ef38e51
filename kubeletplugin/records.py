"""The node's durable record of prepared claims: one record per claim, no shared file.

Layout (``plugin_dir`` is ``<plugins-dir>/<driver>``):

- ``<cdi_root>/k8s.gpu.nvidia.com-claim_<uid>.json``: a prepared claim's CDI spec *is*
  its record (``kubeletplugin.cdi``: claim uid, namespace, name, devices, boot ID).
  Present = prepared; written last in a prepare, removed first in an unprepare.
- ``plugin_dir/devices/<device>``: a symlink to ``<uid>:<namespace>:<name>``, the
  device's reservation; ``devices/<device>#<share ID>`` reserves one share of a device
  several claims share (consumable capacity), so a share ID is never prepared twice.
  ``symlink(2)`` fails when the name exists, so two claims (or two plugin instances
  of one node, during a surge upgrade) can never both reserve a device: that is the
  only cross-process exclusion prepare needs, and it is per device. A symlink's target
  is written with its inode, so it is never torn.
- ``plugin_dir/claims/<uid>.json``: for a claim whose preparation has side effects
  (a device kind's ``prepare``), what to undo, written before the side effect.
- ``plugin_dir/locks/<uid>.lock``: the claim's lock, an ``flock`` that every plugin
  instance of the node (two during a surge upgrade) holds for the whole of a prepare
  or unprepare of that claim, and that recovery holds while it judges the claim's
  records: the per-device symlinks keep two claims apart, this keeps two instances
  apart on one claim. Its file is removed by the last holder once the claim has no
  record left (see :meth:`Records.try_lock_claim` for why that cannot race).
- ``plugin_dir/kinds/<kind>/``: a device kind's own state (dynamic MIG's per-claim record
  of the instances it made, the time-slice and MPS holders); a kind keeps it.
- ``plugin_dir/boot_id``: the boot these records belong to, written once per boot at
  startup. ``plugin_dir/checkpoint.json``: release 0.1.0's node checkpoint, which
  startup migrates, replaced by a marker that 0.1.0 reads as "rebuild from the CDI
  specs" (``kubeletplugin.checkpoint``).

A prepare: reserve each device (one ``symlink`` each, skipped for adminAccess), the
per-claim record if there are side effects, the side effects, the spec (temp file,
rename). An unprepare: remove the spec, undo the side effects, remove the per-claim
record, release the devices. Both under the claim's lock. Distinct claims touch no
common file and share no lock.

Durability. Everything is atomic (a rename or a ``symlink``), so a crash of the
process leaves each record whole: what it wrote is in the page cache and survives.
Only a power loss (or kernel crash) can lose or tear a write, and a power loss
changes the boot ID: every record of an earlier boot is void anyway (its claims are
prepared again by the kubelet, its side effects, MIG instances or MPS daemons, do
not outlive the boot), and at the first start of a boot a record that cannot be read
is taken for a torn one of the earlier boot and removed. So where the boot ID can be
read, nothing is fsynced. Where it cannot, reboots go unnoticed and every record
stays live: each record file is fsynced before its rename, so none can be torn (a
record that cannot be read is then refused, never guessed at); directory entries
are not fsynced, since losing one loses a prepare the kubelet repeats after the
reboot, or brings back an unprepared claim that holds its devices until the
reconciler sees the claim gone. Per prepare: no fsync (one without a boot ID), one
rename, one ``symlink`` per device, one uncontended ``flock``; per unprepare: one
``unlink`` per file.
"""

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.common.errors import PermanentError
from driver.common.fsutil import TEMP_SUFFIX, ensure_dir, write_atomic
from driver.devicekind import PreparedClaim, PreparedDevice
from kubeletplugin import cdi, dirs, names
from kubeletplugin.flavor import Flavor

DEVICES_DIR = "devices"
CLAIMS_DIR = "claims"
BOOT_FILE = "boot_id"
STARTUP_LOCK = "startup.lock"
LOCKS_DIR = "locks"
KINDS_DIR = "kinds"
LOCK_SUFFIX = ".lock"
LOCK_MODE = 0o600
CLAIM_RECORD_VERSION = 1
_PATHS_KEPT = 1024

# A DRA device name is a DNS label: it can name a file.
_DEVICE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# devices/<device>#<share ID>: one share of a device with allowMultipleAllocations.
SHARE_SEPARATOR = "#"
# The claim uid in the name of a temp file of write_atomic: ".<...uid>.json.<hex>.tmp".
_TEMP_UID = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.json\.")


class RecordError(PermanentError):
    """A record of the current boot that this release cannot read: not serving."""


class DeviceTakenError(PermanentError):
    """The device is reserved for another claim."""


def valid_uid(uid: str) -> bool:
    """A claim UID as Kubernetes writes it; nothing else becomes a path."""
    return names.is_claim_uid(uid)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who a device reservation is for."""

    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"


def _target(claim: PreparedClaim) -> str:
    return f"{claim.uid}:{claim.namespace}:{claim.name}"


def parse_target(target: str) -> Holder | None:
    parts = target.split(":")
    if len(parts) != 3 or not valid_uid(parts[0]):
        return None
    return Holder(*parts)


def _encode_device(device: PreparedDevice) -> dict[str, Any]:
    return {
        "requestNames": list(device.request_names),
        "poolName": device.pool_name,
        "deviceName": device.device_name,
        "cdiDeviceIDs": list(device.cdi_device_ids),
        "shareID": device.share_id,
        "adminAccess": device.admin_access,
        "kind": device.kind,
        "identity": dict(device.identity),
        **({"sharing": dict(device.sharing)} if device.sharing else {}),
    }


def encode_claim_record(claim: PreparedClaim, *, boot_id: str, record_kind: str) -> bytes:
    return (
        json.dumps(
            {
                "kind": record_kind,
                "version": CLAIM_RECORD_VERSION,
                "bootID": boot_id,
                "uid": claim.uid,
                "namespace": claim.namespace,
                "name": claim.name,
                "devices": [_encode_device(d) for d in claim.devices],
            },
            sort_keys=True,
        ).encode()
        + b"\n"
    )


def decode_claim_record(raw: bytes, record_kind: str) -> tuple[str, PreparedClaim]:
    """(boot ID, claim); raises RecordError for anything else."""
    try:
        doc = json.loads(raw)
        if doc["kind"] != record_kind or doc["version"] != CLAIM_RECORD_VERSION:
            raise RecordError(f"kind {doc['kind']!r} version {doc['version']!r} unknown")
        devices = tuple(
            PreparedDevice(
                request_names=tuple(str(r) for r in d["requestNames"]),
                pool_name=str(d["poolName"]),
                device_name=str(d["deviceName"]),
                cdi_device_ids=tuple(str(i) for i in d["cdiDeviceIDs"]),
                share_id=d["shareID"],
                admin_access=d["adminAccess"] is True,
                kind=str(d["kind"]),
                identity=tuple(sorted((str(k), str(v)) for k, v in d["identity"].items())),
                sharing=tuple(sorted((str(k), str(v)) for k, v in d.get("sharing", {}).items())),
            )
            for d in doc["devices"]
        )
        claim = PreparedClaim(str(doc["uid"]), str(doc["namespace"]), str(doc["name"]), devices)
        return str(doc["bootID"]), claim
    except RecordError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RecordError(f"unexpected layout: {exc!r}") from exc


class Records:
    """The record files of one node (blocking calls: worker thread or quick syscalls)."""

    def __init__(self, plugin_dir: Path, cdi_root: Path, *, boot_id: str, flavor: Flavor) -> None:
        self.flavor = flavor
        self.plugin_dir = plugin_dir
        self.cdi_root = cdi_root
        self.devices_dir = plugin_dir / DEVICES_DIR
        self.claims_dir = plugin_dir / CLAIMS_DIR
        self.locks_dir = plugin_dir / LOCKS_DIR
        self.boot_id = boot_id
        # Without a boot ID a power loss goes unnoticed: records must never be torn.
        self.fsync = not boot_id
        # A claim's spec and lock paths, each named several times per call: made once.
        self._paths: dict[tuple[str, str], Path] = {}

    def make_dirs(self) -> None:
        # Each missing directory gets its mode, whatever the umask (kubeletplugin.dirs).
        for directory in (self.plugin_dir, self.devices_dir, self.claims_dir, self.locks_dir):
            ensure_dir(directory, dirs.PRIVATE, ours=True)
        ensure_dir(self.cdi_root, dirs.CDI_ROOT)

    @contextlib.contextmanager
    def startup_lock(self) -> Iterator[None]:
        """Held while one instance recovers, so a second one starting never judges
        records the first is rewriting. Never held while serving."""
        fd = os.open(self.plugin_dir / STARTUP_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- the claim's lock, shared by every plugin instance of the node --

    def _path(self, what: str, uid: str) -> Path:
        path = self._paths.get((what, uid))
        if path is None:
            if len(self._paths) >= _PATHS_KEPT:  # bounded: claims come and go
                self._paths.clear()
            if what == "spec":
                path = cdi.spec_path(self.cdi_root, uid, self.flavor)
            elif valid_uid(uid):  # nothing else becomes a path under the plugin dir
                path = self.locks_dir / f"{uid}{LOCK_SUFFIX}"
            else:
                raise RecordError(f"claim uid {uid!r} is not a Kubernetes UID: no lock file for it")
            self._paths[(what, uid)] = path
        return path

    def lock_path(self, uid: str) -> Path:
        return self._path("lock", uid)

    def try_lock_claim(self, uid: str) -> int | None:
        """Take ``uid``'s lock without waiting: the descriptor that holds it, or None when
        another open file holds it (another instance, or recovery). A few syscalls.

        The holder that finds the claim gone removes the file while it still holds the
        lock (:meth:`unlock_claim`). One that opened the old file meanwhile then gets a
        lock on a name that no longer leads to it, so after locking the name is checked
        to still be the locked inode, and otherwise opened again: two holders can never
        hold two different files of one claim.
        """
        path = self.lock_path(uid)
        while True:
            try:
                # O_NOFOLLOW: a symlink planted at the name is refused, never followed.
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_MODE)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise RecordError(f"{path} is a symlink, not a claim lock: refused") from exc
                raise
            try:
                opened = os.fstat(fd)
                if not stat.S_ISREG(opened.st_mode) or opened.st_uid != os.geteuid():
                    raise RecordError(f"{path} is not a lock file of this driver: refused")
                if stat.S_IMODE(opened.st_mode) != LOCK_MODE:  # the umask narrows a create
                    os.fchmod(fd, LOCK_MODE)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return None
                try:
                    named = path.lstat()
                except FileNotFoundError:
                    named = None
            except BaseException:
                os.close(fd)
                raise
            if named is not None and (named.st_dev, named.st_ino) == (
                opened.st_dev,
                opened.st_ino,
            ):
                return fd
            os.close(fd)  # its last holder removed it after we opened it: lock the new one

    def unlock_claim(self, uid: str, fd: int, *, records_left: bool | None = None) -> None:
        """Release ``uid``'s lock; its file goes too once the claim has no spec and no
        side-effect record (a reservation left by a failed release does not keep it:
        removing the file is safe whenever it happens, see :meth:`try_lock_claim`, so
        unlocking reads two names, never every reservation of the node).

        ``records_left``: whether the holder's call, which just succeeded, left a spec or
        a record (a prepare) or removed both (an unprepare); None looks. Either way a
        mistaken answer costs an inode or a lock file made again, never correctness."""
        try:
            # A lock file left behind costs an inode, never correctness: no error here.
            with contextlib.suppress(OSError):
                if records_left is None:
                    records_left = (
                        self.spec_path(uid).exists() or self.claim_record_path(uid).exists()
                    )
                if not records_left:
                    self.lock_path(uid).unlink()
        finally:
            os.close(fd)

    # -- the spec: the record of a prepared claim --

    def spec_path(self, uid: str) -> Path:
        return self._path("spec", uid)

    def read_spec(self, uid: str) -> bytes | None:
        try:
            return self.spec_path(uid).read_bytes()
        except FileNotFoundError:
            return None

    def write_spec(self, uid: str, content: bytes) -> None:
        path = self.spec_path(uid)
        try:
            write_atomic(path, content, fsync=self.fsync)
        except FileNotFoundError:  # someone removed the CDI root: make it again, once
            self.cdi_root.mkdir(parents=True, exist_ok=True)
            write_atomic(path, content, fsync=self.fsync)

    def remove_spec(self, uid: str) -> bool:
        """True when a spec was removed; absent is fine (idempotent unprepare)."""
        try:
            self.spec_path(uid).unlink()
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    # -- device reservations --

    def reserve(self, claim: PreparedClaim, shareable: Iterable[str] = ()) -> None:
        """Reserve every device of ``claim`` that needs it to itself (not adminAccess);
        of the ``shareable`` devices (published for consumable capacity), a share or the
        whole device, never both.

        Raises DeviceTakenError naming the holder; what this call reserved is then
        released again, what the claim held before stays.
        """
        made: list[str] = []
        target = _target(claim)
        wanted = sorted({d.reservation for d in claim.devices if not d.admin_access})
        # A device taken whole excludes its shares and the other way round; the scheduler
        # never allocates both, so this only catches a hand-written allocation. Only a
        # shareable device can have shares: nothing to list for the others.
        shared = set(shareable) & {n.partition(SHARE_SEPARATOR)[0] for n in wanted}
        others = {
            name: t
            for name, t in (self.reservations() if shared else {}).items()
            if t.split(":", 1)[0] != claim.uid
        }
        try:
            for name in wanted:
                device, share_sep, share = name.partition(SHARE_SEPARATOR)
                clash = [
                    other
                    for other in others
                    if other.partition(SHARE_SEPARATOR)[0] == device
                    and bool(share_sep) != bool(other.partition(SHARE_SEPARATOR)[1])
                ]
                if clash:
                    holder = parse_target(others[clash[0]])
                    whole = "shares of it are" if not share_sep else "it is"
                    raise DeviceTakenError(
                        f"claim {claim}: device {device}: {whole} already prepared for claim "
                        f"{holder if holder is not None else '(unreadable reservation)'}"
                    )
                path = self.devices_dir / name
                try:
                    path.symlink_to(target)
                    made.append(name)
                except FileExistsError:
                    holder = self.holder(name)
                    if holder is None or holder.uid != claim.uid:
                        what = (
                            f"share {share} of device {device}" if share_sep else f"device {name}"
                        )
                        raise DeviceTakenError(
                            f"claim {claim}: {what} is already prepared for claim "
                            f"{holder if holder is not None else '(unreadable reservation)'}"
                            + ("; a share ID is never used twice" if share_sep else "")
                        ) from None
        except BaseException:
            self.release(claim.uid, made)
            raise

    def holder(self, device_name: str) -> Holder | None:
        try:
            return parse_target(str((self.devices_dir / device_name).readlink()))
        except (FileNotFoundError, OSError):
            return None

    def reservations(self) -> dict[str, str]:
        """device name -> raw symlink target ("" when the entry is not a symlink)."""
        out: dict[str, str] = {}
        try:
            entries = list(os.scandir(self.devices_dir))
        except FileNotFoundError:
            return out
        for entry in entries:
            if entry.name.endswith(TEMP_SUFFIX):
                continue
            try:
                out[entry.name] = str(Path(entry.path).readlink())
            except FileNotFoundError:
                continue  # released since the listing (another instance serves the node)
            except OSError:
                out[entry.name] = ""
        return out

    def release(self, uid: str, device_names: Iterable[str] | None = None) -> int:
        """Drop ``uid``'s reservations (of ``device_names``, or all); returns how many."""
        if device_names is None:
            device_names = [
                name
                for name, target in self.reservations().items()
                if target.split(":", 1)[0] == uid
            ]
        released = 0
        for name in device_names:
            holder = self.holder(name)
            if holder is not None and holder.uid == uid:
                with contextlib.suppress(FileNotFoundError):
                    (self.devices_dir / name).unlink()
                    released += 1
        return released

    def restore_reservation(self, device_name: str, holder: Holder) -> None:
        """Recovery only: reserve ``device_name`` for ``holder``; FileExistsError when
        it is reserved already (another instance may serve meanwhile)."""
        (self.devices_dir / device_name).symlink_to(
            f"{holder.uid}:{holder.namespace}:{holder.name}"
        )

    def remove_reservation(self, device_name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.devices_dir / device_name).unlink()

    # -- per-claim records of side effects --

    def claim_record_path(self, uid: str) -> Path:
        return self.claims_dir / f"{uid}.json"

    def write_claim_record(self, claim: PreparedClaim) -> None:
        content = encode_claim_record(
            claim, boot_id=self.boot_id, record_kind=self.flavor.record_kind
        )
        write_atomic(self.claim_record_path(claim.uid), content, fsync=self.fsync)

    def read_claim_record(self, uid: str) -> PreparedClaim | None:
        """The record of ``uid``'s side effects; None without one. Raises RecordError."""
        try:
            raw = self.claim_record_path(uid).read_bytes()
        except FileNotFoundError:
            return None
        return decode_claim_record(raw, self.flavor.record_kind)[1]

    def remove_claim_record(self, uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.claim_record_path(uid).unlink()

    def claim_record_files(self) -> list[Path]:
        try:
            return sorted(p for p in self.claims_dir.iterdir() if not p.name.startswith("."))
        except FileNotFoundError:
            return []

    # -- scanning --

    def spec_files(self) -> list[Path]:
        try:
            entries = list(os.scandir(self.cdi_root))
        except FileNotFoundError:
            return []
        return sorted(
            Path(e.path)
            for e in entries
            if e.is_file()
            and e.name.startswith(self.flavor.file_prefix)
            and e.name.endswith(cdi.SPEC_SUFFIXES)
        )

    def sweep_temp_files(self) -> int:
        """Temp files a killed write left behind (ours only); returns how many.

        Besides the records', each kind's state directory (``kinds/<kind>/``, top level:
        dynamic MIG's per-claim records). A temp file of a claim whose lock another plugin
        instance holds is that instance's write in flight (a surge upgrade): left to it,
        as removing it would fail its rename and so its prepare."""
        swept = 0
        kind_dirs = sorted(p for p in self._kinds_dir().glob("*") if p.is_dir())
        for directory, prefix in (
            (self.cdi_root, f".{self.flavor.file_prefix}"),
            (self.claims_dir, "."),
            (self.plugin_dir, "."),
            *((d, ".") for d in kind_dirs),
        ):
            try:
                entries = list(os.scandir(directory))
            except FileNotFoundError:
                continue
            for entry in entries:
                if not (entry.name.startswith(prefix) and entry.name.endswith(TEMP_SUFFIX)):
                    continue
                if entry.is_dir(follow_symlinks=False) or self._written_by_another(entry.name):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    Path(entry.path).unlink()
                    swept += 1
        return swept

    def kind_dir(self, kind: str) -> Path:
        """A device kind's own state directory."""
        return self._kinds_dir() / kind

    def _kinds_dir(self) -> Path:
        return self.plugin_dir / KINDS_DIR

    def _written_by_another(self, temp_name: str) -> bool:
        """Whether the claim a temp file is of (``.<name with its uid>.json.<hex>.tmp``) is
        locked by another instance; False for a temp file of no claim."""
        found = _TEMP_UID.search(temp_name)
        if found is None or not valid_uid(found.group(1)):
            return False
        try:
            fd = self.try_lock_claim(found.group(1))
        except (RecordError, OSError):
            return True  # a lock that cannot be taken (planted, unwritable): leave it be
        if fd is None:
            return True
        self.unlock_claim(found.group(1), fd)
        return False

    # -- the boot these records belong to --

    def recorded_boot(self) -> str:
        try:
            return (self.plugin_dir / BOOT_FILE).read_text().strip()
        except (FileNotFoundError, UnicodeDecodeError):
            return ""

    def record_boot(self) -> None:
        # Not fsynced: losing it means a power loss, after which it must differ anyway.
        write_atomic(self.plugin_dir / BOOT_FILE, f"{self.boot_id}\n".encode(), fsync=False)
