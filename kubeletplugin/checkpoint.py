"""The node's record of prepared claims: ``<plugin_dir>/checkpoint.json``.

Two halves. The format (pure): records, ``encode``/``decode``, a checksum over the
canonical JSON of the data, readers for older versions. The store (I/O): atomic
writes (temp file, fsync, rename; then an fsync of the directory where the caller
needs the change durable before it goes on), a cross-process ``flock`` so that two
plugin pods serving one node during a surge upgrade never interleave a
read-modify-write, and group commit: every update re-reads the file under the
lock (parsing it again only when its bytes differ from what this store last read
or wrote), and concurrent updates share one write and its fsyncs.

File format, version 2 (written as compact canonical JSON, keys sorted)::

    {"kind": "GpuDraCheckpoint", "version": 2, "checksum": "sha256:<hex>",
     "data": {"nodeBootID": "...",
              "claims": {"<uid>": {"namespace": ..., "name": ..., "state": "PrepareStarted",
                                   "devices": [{"requestNames": [...], "poolName": ...,
                                                "deviceName": ..., "gpuUUID": ...,
                                                "cdiDeviceIDs": [...], "shareID": ...,
                                                "adminAccess": false}]}}}}

Readers ignore fields they do not know, so a later version may add fields; the
checksum covers them all (it is computed over the data as read).
"""

import asyncio
import contextlib
import enum
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from driver.errors import PermanentError

KIND = "GpuDraCheckpoint"
VERSION = 2
FILE_NAME = "checkpoint.json"
LOCK_NAME = "checkpoint.lock"

T = TypeVar("T")


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    gpu_uuid: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[DeviceRecord, ...]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    # "" = unknown (read from a version that did not record it).
    boot_id: str
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)

    def with_claim(self, record: ClaimRecord) -> "Checkpoint":
        return replace(self, claims={**self.claims, record.uid: record})

    def without_claim(self, uid: str) -> "Checkpoint":
        if uid not in self.claims:
            return self
        return replace(self, claims={k: v for k, v in self.claims.items() if k != uid})


class CorruptCheckpointError(PermanentError):
    """The file exists but is not a readable checkpoint of ours (truncated, bad checksum)."""


class ForeignCheckpointError(PermanentError):
    """Another driver's checkpoint sits under our name; we must not touch it."""


# ---- format ---------------------------------------------------------------------------------


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest(canonical: bytes) -> str:
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def _checksum(data: Any) -> str:
    return _digest(_canonical(data))


def _device_to_json(device: DeviceRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "requestNames": list(device.request_names),
        "poolName": device.pool_name,
        "deviceName": device.device_name,
        "gpuUUID": device.gpu_uuid,
        "cdiDeviceIDs": list(device.cdi_device_ids),
    }
    if device.share_id is not None:
        out["shareID"] = device.share_id
    if device.admin_access:
        out["adminAccess"] = True
    return out


def encode(checkpoint: Checkpoint) -> bytes:
    data = {
        "nodeBootID": checkpoint.boot_id,
        "claims": {
            uid: {
                "namespace": claim.namespace,
                "name": claim.name,
                "state": claim.state.value,
                "devices": [_device_to_json(d) for d in claim.devices],
            }
            for uid, claim in checkpoint.claims.items()
        },
    }
    # The document is the canonical JSON of {checksum, data, kind, version}; built around
    # the canonical data so that it is serialized once, not twice (checksum, then file).
    canonical = _canonical(data)
    head = f'{{"checksum":"{_digest(canonical)}","data":'.encode()
    return head + canonical + f',"kind":"{KIND}","version":{VERSION}}}\n'.encode()


def _str(obj: Mapping[str, Any], key: str, *, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise CorruptCheckpointError(f"field {key!r}: expected a string, got {value!r}")
    return value


def _strs(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CorruptCheckpointError(f"field {key!r}: expected a list of strings, got {value!r}")
    return tuple(value)


def _device_from_json(obj: Any) -> DeviceRecord:
    if not isinstance(obj, dict):
        raise CorruptCheckpointError(f"device entry is not an object: {obj!r}")
    share_id = obj.get("shareID")
    return DeviceRecord(
        request_names=_strs(obj, "requestNames"),
        pool_name=_str(obj, "poolName"),
        device_name=_str(obj, "deviceName"),
        gpu_uuid=_str(obj, "gpuUUID"),
        cdi_device_ids=_strs(obj, "cdiDeviceIDs"),
        share_id=share_id if isinstance(share_id, str) else None,
        admin_access=obj.get("adminAccess") is True,
    )


def _claims_from_json(claims: Any, *, default_state: ClaimState | None) -> dict[str, ClaimRecord]:
    if not isinstance(claims, dict):
        raise CorruptCheckpointError(f"claims is not an object: {claims!r}")
    out: dict[str, ClaimRecord] = {}
    for uid, obj in claims.items():
        if not isinstance(obj, dict):
            raise CorruptCheckpointError(f"claim {uid}: not an object")
        raw_state = obj.get("state", default_state)
        try:
            state = ClaimState(str(raw_state))
        except ValueError as exc:
            raise CorruptCheckpointError(f"claim {uid}: unknown state {raw_state!r}") from exc
        devices = obj.get("devices", [])
        if not isinstance(devices, list):
            raise CorruptCheckpointError(f"claim {uid}: devices is not a list")
        out[uid] = ClaimRecord(
            uid=uid,
            namespace=_str(obj, "namespace"),
            name=_str(obj, "name"),
            state=state,
            devices=tuple(_device_from_json(d) for d in devices),
        )
    return out


def _read_v1(data: Mapping[str, Any]) -> Checkpoint:
    # Version 1 recorded completed claims only, under "preparedClaims", and no boot ID.
    claims = _claims_from_json(
        data.get("preparedClaims", {}), default_state=ClaimState.PREPARE_COMPLETED
    )
    return Checkpoint(boot_id="", claims=claims)


def _read_v2(data: Mapping[str, Any]) -> Checkpoint:
    return Checkpoint(
        boot_id=_str(data, "nodeBootID", default=""),
        claims=_claims_from_json(data.get("claims", {}), default_state=None),
    )


_READERS: dict[int, Callable[[Mapping[str, Any]], Checkpoint]] = {1: _read_v1, 2: _read_v2}

FOREIGN_MESSAGE = (
    "{path} holds a checkpoint written by another DRA driver (the NVIDIA k8s-dra-driver-gpu "
    "format) under the same driver name. Refusing to start so as not to hand out devices that "
    "driver may have prepared. To migrate: drain the node's pods that use DRA claims, uninstall "
    "the other driver, remove {path} and that driver's CDI specs (k8s.gpu.nvidia.com-*) from the "
    "CDI root, then start this plugin."
)


def decode(raw: bytes, *, path: Path | str = FILE_NAME) -> Checkpoint:
    """Parse a checkpoint file's bytes; older versions come back upgraded."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise CorruptCheckpointError(f"{path}: not a JSON object")
    if document.get("kind") != KIND:
        if "v1" in document or "v2" in document:
            raise ForeignCheckpointError(FOREIGN_MESSAGE.format(path=path))
        raise CorruptCheckpointError(f"{path}: kind is {document.get('kind')!r}, not {KIND}")
    version = document.get("version")
    data = document.get("data")
    if not isinstance(version, int) or not isinstance(data, dict):
        raise CorruptCheckpointError(f"{path}: missing version or data")
    if document.get("checksum") != _checksum(data):
        raise CorruptCheckpointError(f"{path}: checksum mismatch")
    # A newer writer only adds fields, so the newest reader we have reads it.
    reader = _READERS.get(version, _READERS[VERSION] if version > VERSION else None)
    if reader is None:
        raise CorruptCheckpointError(f"{path}: unknown version {version}")
    try:
        return reader(data)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{path}: {exc}") from exc


# ---- store ----------------------------------------------------------------------------------


def write_atomic(path: Path, content: bytes, *, fsync_dir: bool) -> None:
    """Temp file in the same directory, fsync, rename over ``path``.

    The temp name starts with a dot and does not end in .json, so nothing that scans
    the directory (a CDI registry, our own reconciler) mistakes it for a finished file.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if fsync_dir:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


Apply = Callable[[Checkpoint], tuple[Checkpoint, T]]


@dataclass
class _Pending(Generic[T]):
    apply: Apply[T]
    future: "asyncio.Future[T]"
    durable: bool
    before: Callable[[], object] | None
    after: Callable[[T], Apply[T] | None] | None


def _attempt(call: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    try:
        return True, call(*args)
    except Exception as exc:
        return False, exc


class CheckpointStore:
    """Serialized, crash-safe read-modify-write of the checkpoint file.

    ``on_corrupt`` is called (under the lock, in a worker thread) when the file
    cannot be read; it must move the file aside and return the rebuilt state.
    """

    def __init__(
        self,
        plugin_dir: Path,
        *,
        boot_id: str,
        on_corrupt: Callable[[CorruptCheckpointError], Checkpoint],
    ) -> None:
        self.path = plugin_dir / FILE_NAME
        self._lock_path = plugin_dir / LOCK_NAME
        self._boot_id = boot_id
        self._on_corrupt = on_corrupt
        self._queue: list[_Pending[Any]] = []
        self._flusher: asyncio.Task[None] | None = None
        # The file's bytes as we last read or wrote them, and what they decode to: under
        # the lock, unchanged bytes (no other writer since) need no re-parse.
        self._known: tuple[bytes, Checkpoint] | None = None

    # -- sync parts (worker threads) --

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The cross-process lock; blocking, so call it from a worker thread."""
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def read(self) -> Checkpoint | None:
        """The file's content; ``None`` when there is none. Raises on corrupt/foreign."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        known = self._known
        if known is not None and known[0] == raw:
            return known[1]
        checkpoint = decode(raw, path=self.path)
        self._known = (raw, checkpoint)
        return checkpoint

    def load(self) -> Checkpoint:
        """Like ``read`` but an absent or corrupt file yields a usable state."""
        try:
            checkpoint = self.read()
        except CorruptCheckpointError as exc:
            checkpoint = self._on_corrupt(exc)
            self.write(checkpoint)
        return checkpoint if checkpoint is not None else Checkpoint(boot_id=self._boot_id)

    def write(self, checkpoint: Checkpoint, *, durable: bool = True) -> None:
        """Atomic always; ``durable`` also fsyncs the directory, so the new content
        survives a power loss too, before this returns."""
        raw = encode(checkpoint)
        self._known = None  # the rename may fail half-way: re-read next time
        write_atomic(self.path, raw, fsync_dir=durable)
        self._known = (raw, checkpoint)

    def move_aside(self) -> Path:
        target = self.path.with_name(f"{FILE_NAME}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        n = 0
        while target.exists():
            n += 1
            target = target.with_name(f"{target.name.split('~')[0]}~{n}")
        self.path.replace(target)
        return target

    def _transact(self, batch: list[_Pending[Any]]) -> list[tuple[bool, Any]]:
        # One caller's failure (in before, apply or after) must not fail the batch.
        outcomes: list[tuple[bool, Any]] = [(True, None)] * len(batch)
        with self.locked():
            for i, pending in enumerate(batch):
                if pending.before is not None:
                    outcomes[i] = _attempt(pending.before)
            current = self.load()
            first = {i: (p.apply, p.durable) for i, p in enumerate(batch) if outcomes[i][0]}
            current = self._apply_all(current, first, outcomes)
            second: dict[int, tuple[Apply[Any], bool]] = {}
            for i in first:
                after = batch[i].after
                if after is None or not outcomes[i][0]:
                    continue
                ok, follow = _attempt(after, outcomes[i][1])
                if not ok:
                    outcomes[i] = (False, follow)
                elif follow is not None:
                    second[i] = (follow, False)
            self._apply_all(current, second, outcomes)
        return outcomes

    def _apply_all(
        self,
        current: Checkpoint,
        applies: Mapping[int, tuple[Apply[Any], bool]],
        outcomes: list[tuple[bool, Any]],
    ) -> Checkpoint:
        """One round of a batch: every apply in turn, then one write for them all."""
        original, durable = current, False
        for i, (apply, wants_durable) in applies.items():
            ok, value = _attempt(apply, current)
            if not ok:
                outcomes[i] = (False, value)
                continue
            changed, result = value
            durable = durable or (wants_durable and changed is not current)
            current = changed
            outcomes[i] = (True, result)
        if current is not original:
            self.write(current, durable=durable)
        return current

    # -- async API --

    async def update(
        self,
        apply: Apply[T],
        *,
        durable: bool = True,
        before: Callable[[], object] | None = None,
        after: Callable[[T], Apply[T] | None] | None = None,
    ) -> T:
        """Apply ``apply`` to the state re-read from disk and persist its result.

        ``apply`` is pure: it returns the new checkpoint (the same object when it changed
        nothing, which skips the write) and a value handed back to the caller; an
        exception it raises reaches the caller and leaves the file untouched by it.
        Cancelling the caller does not cancel the write: it is either done or not begun.

        The write is always atomic and visible to every process once this returns.
        ``durable=False`` leaves out the directory fsync: the change then survives a
        crash of any process but maybe not a power loss, which a caller may accept
        when a reboot makes the change moot anyway (the boot ID drops every claim).

        ``before`` and ``after`` are blocking side effects on other node state (CDI
        specs) that must be ordered with this change: run in the worker thread under
        the lock, ``before`` ahead of reading the file, ``after`` (given ``apply``'s
        value) once the new content is written, so no extra thread hop is spent on
        them. An exception in ``before`` skips ``apply``; one in ``after`` reaches the
        caller with the change already written, for the caller to undo. ``after`` may
        return a second apply, for the outcome of its side effect: it runs on the state
        as it then is and is written (not durably, group-committed with the batch's
        other second applies) before the caller gets its value instead of the first's.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(apply, future, durable, before, after))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # Nobody will read the outcome now; fetch it so asyncio does not warn.
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise

    async def snapshot(self) -> Checkpoint:
        return await self.update(lambda cp: (cp, cp))

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                outcomes = await asyncio.to_thread(self._transact, batch)
            except Exception as exc:  # the file could not be read or written
                outcomes = [(False, exc)] * len(batch)
            for pending, (ok, value) in zip(batch, outcomes, strict=True):
                if pending.future.done():
                    continue
                if ok:
                    pending.future.set_result(value)
                else:
                    pending.future.set_exception(value)
