"""CDI specs for prepared claims: a pure builder, an atomic writer, a reader.

One spec file per claim, ``<cdi_root>/k8s.gpu.nvidia.com-claim_<uid>.json``, kind
``k8s.gpu.nvidia.com/claim``, one CDI device ``<claimUID>-<device>`` per GPU. The
spec carries in annotations everything needed to rebuild the claim's checkpoint
entry (claim uid/namespace/name; per device its name, pool, requests and GPU UUID),
so a lost checkpoint never loses a live claim, and an owner marker tells our specs
apart from the NVIDIA driver's, which use the same kind and file names.

Containers get:
- the GPU device nodes ``/dev/nvidia<minor>`` (per device) and the control nodes;
- ``NVIDIA_VISIBLE_DEVICES=void``: on hosts where the NVIDIA container runtime is the
  default runtime, CUDA images set ``NVIDIA_VISIBLE_DEVICES=all`` and the runtime would
  otherwise inject every GPU of the node, whatever the claim says;
- ``GPU_DRA_VISIBLE_GPU_UUIDS``: comma-separated UUIDs of the claim's GPUs, in device
  name order, for workloads and tests that want to know what they got;
- the driver libraries and hooks of the host's container toolkit (``base_edits``).
"""

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from driver.inventory import Gpu
from kubeletplugin import dirs, names
from kubeletplugin.checkpoint import ClaimRecord, ClaimState, DeviceRecord, write_atomic

VENDOR = "k8s.gpu.nvidia.com"
CLAIM_CLASS = "claim"
KIND = f"{VENDOR}/{CLAIM_CLASS}"
VISIBLE_UUIDS_ENV = "GPU_DRA_VISIBLE_GPU_UUIDS"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

_ANNOTATION = "gpu-dra.io/"
OWNER_ANNOTATION = _ANNOTATION + "owner"
OWNER = "gpu-dra"
CLAIM_UID = _ANNOTATION + "claim-uid"
CLAIM_NAMESPACE = _ANNOTATION + "claim-namespace"
CLAIM_NAME = _ANNOTATION + "claim-name"
DEVICE_NAME = _ANNOTATION + "device"
GPU_UUID = _ANNOTATION + "gpu-uuid"
POOL = _ANNOTATION + "pool"
REQUESTS = _ANNOTATION + "requests"
ADMIN_ACCESS = _ANNOTATION + "admin-access"
SHARE_ID = _ANNOTATION + "share-id"
# The node boot the spec was written in: a spec that outlived a reboot (a CDI root on
# disk rather than tmpfs) describes no live claim, even if the checkpoint is lost.
BOOT_ID = _ANNOTATION + "boot-id"

_FILE_PREFIX = f"{VENDOR}-"
# Kinds whose files under our name, without our owner marker, belong to another driver.
_FOREIGN_KINDS = (f"{VENDOR}/", "nvidia.com/gpu")
_SPEC_SUFFIXES = (".json", ".yaml", ".yml")


def spec_path(cdi_root: Path, claim_uid: str) -> Path:
    return names.within(cdi_root, cdi_root / f"{VENDOR}-{CLAIM_CLASS}_{claim_uid}.json")


def cdi_device_id(claim_uid: str, device_name: str) -> str:
    """Fully qualified CDI name, as returned to the kubelet."""
    return f"{KIND}={claim_uid}-{device_name}"


def min_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion that allows every field the spec uses (CDI SPEC.md)."""
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    if any(e.get("netDevices") for e in edits):
        return "1.1.0"
    if any(e.get("intelRdt") or e.get("additionalGids") for e in edits):
        return "0.7.0"
    # Annotations (which we always write) need 0.6.0.
    return "0.6.0"


def _merge_edits(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {k: list(v) if isinstance(v, list) else v for k, v in base.items()}
    for key, values in extra.items():
        merged[key] = [*merged.get(key, []), *values]
    return {k: v for k, v in merged.items() if v not in ([], None)}


def build_claim_spec(
    claim: ClaimRecord,
    gpus: Mapping[str, Gpu],
    base_edits: Mapping[str, Any],
    *,
    boot_id: str = "",
) -> dict[str, Any]:
    """The claim's CDI spec. ``gpus`` maps device name to GPU for every device of the claim."""
    by_device: dict[str, list[DeviceRecord]] = {}
    for record in claim.devices:
        by_device.setdefault(record.device_name, []).append(record)
    devices = []
    uuids = []
    for device_name in sorted(by_device):
        records = by_device[device_name]
        gpu = gpus[device_name]
        uuids.append(gpu.uuid)
        requests = sorted({r for rec in records for r in rec.request_names})
        annotations = {
            DEVICE_NAME: device_name,
            GPU_UUID: gpu.uuid,
            POOL: records[0].pool_name,
            REQUESTS: ",".join(requests),
        }
        if any(rec.admin_access for rec in records):
            annotations[ADMIN_ACCESS] = "true"
        share_ids = sorted({rec.share_id for rec in records if rec.share_id})
        if share_ids:
            annotations[SHARE_ID] = ",".join(share_ids)
        devices.append(
            {
                "name": f"{claim.uid}-{device_name}",
                "annotations": annotations,
                "containerEdits": {
                    "deviceNodes": [{"path": f"/dev/nvidia{gpu.minor}"}],
                },
            }
        )
    own_edits = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void", f"{VISIBLE_UUIDS_ENV}={','.join(uuids)}"],
        "deviceNodes": [{"path": path} for path in CONTROL_NODES],
    }
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": KIND,
        "annotations": {
            OWNER_ANNOTATION: OWNER,
            CLAIM_UID: claim.uid,
            CLAIM_NAMESPACE: claim.namespace,
            CLAIM_NAME: claim.name,
            **({BOOT_ID: boot_id} if boot_id else {}),
        },
        "devices": devices,
        "containerEdits": _merge_edits(base_edits, own_edits),
    }
    spec["cdiVersion"] = min_version(spec)
    return spec


def write_spec(cdi_root: Path, claim_uid: str, spec: Mapping[str, Any]) -> Path:
    """Blocking (fsync): call through ``asyncio.to_thread``.

    No fsync of the directory: the checkpoint (whose directory is fsynced) is the
    record of what was prepared, and a spec lost with an unsynced rename is found
    missing and rewritten on the next prepare.
    """
    path = spec_path(cdi_root, claim_uid)
    content = json.dumps(spec, indent=1).encode() + b"\n"
    try:
        write_atomic(path, content, fsync_dir=False)
    except FileNotFoundError:  # someone removed the CDI root: make it again, once
        dirs.ensure_dir(cdi_root, dirs.CDI_ROOT)
        write_atomic(path, content, fsync_dir=False)
    return path


def remove_spec(cdi_root: Path, claim_uid: str) -> bool:
    """True when a spec was removed; absent is fine (idempotent unprepare)."""
    try:
        spec_path(cdi_root, claim_uid).unlink()
    except (FileNotFoundError, NotADirectoryError):  # no such file can exist there
        return False
    return True


@dataclass(frozen=True, slots=True)
class SpecScan:
    """What the CDI root holds, as far as we are concerned."""

    ours: Mapping[str, ClaimRecord]  # claim uid -> record rebuilt from the spec
    boot_ids: Mapping[str, str]  # claim uid -> boot the spec was written in ("" unknown)
    foreign: Sequence[Path]  # another driver's specs under our kind
    unreadable: Sequence[tuple[Path, str]]  # our file names we could not parse


def claim_from_spec(spec: Mapping[str, Any]) -> ClaimRecord:
    """Rebuild a checkpoint entry from one of our specs (raises KeyError/ValueError if not ours)."""
    annotations = spec["annotations"]
    uid = annotations[CLAIM_UID]
    devices = []
    for device in spec["devices"]:
        a = device["annotations"]
        device_name = a[DEVICE_NAME]
        share = a.get(SHARE_ID)
        devices.append(
            DeviceRecord(
                request_names=tuple(r for r in a.get(REQUESTS, "").split(",") if r),
                pool_name=a[POOL],
                device_name=device_name,
                gpu_uuid=a[GPU_UUID],
                cdi_device_ids=(cdi_device_id(uid, device_name),),
                share_id=share if share else None,
                admin_access=a.get(ADMIN_ACCESS) == "true",
            )
        )
    return ClaimRecord(
        uid=uid,
        namespace=annotations[CLAIM_NAMESPACE],
        name=annotations[CLAIM_NAME],
        state=ClaimState.PREPARE_COMPLETED,
        devices=tuple(devices),
    )


def _load(path: Path) -> Any:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _candidates(cdi_root: Path) -> Iterable[Path]:
    try:
        entries = list(os.scandir(cdi_root))
    except FileNotFoundError:
        return []
    return sorted(
        Path(e.path)
        for e in entries
        if e.is_file() and e.name.startswith(_FILE_PREFIX) and e.name.endswith(_SPEC_SUFFIXES)
    )


def scan(cdi_root: Path) -> SpecScan:
    """Read every spec file under our vendor prefix (blocking: use a worker thread)."""
    ours: dict[str, ClaimRecord] = {}
    boot_ids: dict[str, str] = {}
    foreign: list[Path] = []
    unreadable: list[tuple[Path, str]] = []
    for path in _candidates(cdi_root):
        try:
            spec = _load(path)
        except FileNotFoundError:
            continue  # removed while we scanned
        except (OSError, ValueError, yaml.YAMLError) as exc:
            unreadable.append((path, str(exc)))
            continue
        if not isinstance(spec, dict):
            unreadable.append((path, "not a mapping"))
            continue
        annotations = spec.get("annotations") or {}
        if annotations.get(OWNER_ANNOTATION) != OWNER:
            kind = str(spec.get("kind", ""))
            if kind.startswith(_FOREIGN_KINDS):
                foreign.append(path)
            continue
        try:
            record = claim_from_spec(spec)
        except (KeyError, TypeError, ValueError) as exc:
            unreadable.append((path, f"missing annotation {exc}"))
            continue
        ours[record.uid] = record
        boot_ids[record.uid] = str(annotations.get(BOOT_ID, ""))
    return SpecScan(ours=ours, boot_ids=boot_ids, foreign=foreign, unreadable=unreadable)


FOREIGN_MESSAGE = (
    "CDI specs of another DRA driver (the NVIDIA k8s-dra-driver-gpu uses the same kind "
    "{kind} and file names) found in {root}: {files}. Refusing to start so that no device "
    "it prepared is handed out twice. To migrate: drain the node's pods that use DRA claims, "
    "uninstall the other driver, delete those files and its checkpoint, then start this plugin."
)
