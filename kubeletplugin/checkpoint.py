"""Release 0.1.0's node checkpoint, ``<plugin_dir>/checkpoint.json``: read to migrate.

Release 0.1.0 kept every prepared claim in this one checksummed file; the records
are now per claim (``kubeletplugin.records``). Startup reads a 0.1.0 checkpoint once
(:func:`decode`), migrates its claims, and leaves :func:`marker` in its place: a
document of 0.1.0's kind whose checksum 0.1.0 cannot match, so a rollback to 0.1.0
takes it for a corrupt checkpoint, moves it aside and rebuilds its state from the CDI
specs, which carry every prepared claim (0.1.0's own recovery). What 0.1.0 writes then
is migrated again by the next start of this release.

A document that is well formed but not understood (a newer version, claims under
another key) raises :class:`UnknownCheckpointError`: it is refused, never read as
"no claims".

File format, version 2 (written as compact canonical JSON, keys sorted)::

    {"kind": "GpuDraCheckpoint", "version": 2, "checksum": "sha256:<hex>",
     "data": {"nodeBootID": "...",
              "claims": {"<uid>": {"namespace": ..., "name": ..., "state": "PrepareStarted",
                                   "devices": [{"requestNames": [...], "poolName": ...,
                                                "deviceName": ..., "gpuUUID": ...,
                                                "cdiDeviceIDs": [...], "shareID": ...,
                                                "adminAccess": false}]}}}}

Readers ignore fields they do not know; the checksum covers them all (it is computed
over the data as read).
"""

import enum
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from driver.common.errors import PermanentError

KIND = "GpuDraCheckpoint"
VERSION = 2
FILE_NAME = "checkpoint.json"
# The marker's version: above every version 0.1.0 wrote, so no reader takes it for data.
MARKER_VERSION = 3
_MARKER_DATA = {"records": "per claim: the CDI specs of the claims, see the project README"}


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


class UnknownCheckpointError(PermanentError):
    """A checkpoint of ours this release does not understand (newer version, other layout)."""


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
        raise UnknownCheckpointError(f"claims is not an object: {claims!r}")
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
        data.get("preparedClaims"), default_state=ClaimState.PREPARE_COMPLETED
    )
    return Checkpoint(boot_id="", claims=claims)


def _read_v2(data: Mapping[str, Any]) -> Checkpoint:
    return Checkpoint(
        boot_id=_str(data, "nodeBootID", default=""),
        claims=_claims_from_json(data.get("claims"), default_state=None),
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
    reader = _READERS.get(version)
    if reader is None:
        raise UnknownCheckpointError(f"{path}: version {version}, newer than this release reads")
    try:
        return reader(data)
    except (CorruptCheckpointError, UnknownCheckpointError) as exc:
        # The checksum matched: the bytes are as written, in a layout we do not know.
        raise UnknownCheckpointError(f"{path}: unexpected layout: {exc}") from exc


def marker() -> bytes:
    """What stays in place of a migrated checkpoint (see the module docstring)."""
    head = f'{{"checksum":"none","data":{_canonical(_MARKER_DATA).decode()},'
    return f'{head}"kind":"{KIND}","version":{MARKER_VERSION}}}\n'.encode()


def is_marker(raw: bytes) -> bool:
    return raw == marker()
