"""CDI specs for prepared claims: a pure builder and a pure reader.

One spec file per claim, ``<cdi_root>/<vendor>-claim_<uid>.json``, kind ``<vendor>/claim``
(the driver's :class:`~kubeletplugin.flavor.Flavor`; the GPU driver's vendor is
``k8s.gpu.nvidia.com``), one CDI device ``<claimUID>-<device>`` per device. The
spec is also the claim's durable record (``kubeletplugin.records``): its annotations
carry the claim's uid, namespace and name, the boot it was written in, the record
version and, per device, its name, kind, pool, requests and identity (a GPU's UUID),
so :func:`claim_from_spec` rebuilds exactly what was prepared. An owner marker tells
our specs apart from the NVIDIA driver's, which use the same kind and file names.

Containers get each device's edits and its kind's claim-wide edits (see
``driver.devicekind``; on the kind's devices where they have none of their own, since CDI
refuses a device without edits), and the driver libraries and hooks of the host's container
toolkit (``base_edits``).
"""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from driver.common.errors import PermanentError
from driver.devicekind import NodeDevice, PreparedClaim, PreparedDevice
from kubeletplugin import names
from kubeletplugin.flavor import Flavor

# The vendor, and so the kind and file names, is the driver's (Flavor.cdi_vendor).
CLAIM_CLASS = "claim"
SPEC_SUFFIXES = (".json", ".yaml", ".yml")

_ANNOTATION = "gpu-dra.io/"
OWNER_ANNOTATION = _ANNOTATION + "owner"
OWNER = "gpu-dra"
CLAIM_UID = _ANNOTATION + "claim-uid"
CLAIM_NAMESPACE = _ANNOTATION + "claim-namespace"
CLAIM_NAME = _ANNOTATION + "claim-name"
# The node boot the spec was written in: a spec that outlived a reboot (a CDI root on
# disk rather than tmpfs) describes no live claim.
BOOT_ID = _ANNOTATION + "boot-id"
# 1 (absent): release 0.1.0, GPUs only; 2: devices carry their kind.
RECORD_VERSION = _ANNOTATION + "record-version"
VERSION = 2
DEVICE_NAME = _ANNOTATION + "device"
DEVICE_KIND = _ANNOTATION + "kind"
GPU_UUID = _ANNOTATION + "gpu-uuid"
POOL = _ANNOTATION + "pool"
REQUESTS = _ANNOTATION + "requests"
ADMIN_ACCESS = _ANNOTATION + "admin-access"
SHARE_ID = _ANNOTATION + "share-id"


class SpecError(PermanentError):
    """A spec under our owner marker that this release cannot read."""


def spec_name(claim_uid: str, flavor: Flavor) -> str:
    return f"{flavor.cdi_vendor}-{CLAIM_CLASS}_{claim_uid}.json"


def spec_path(cdi_root: Path, claim_uid: str, flavor: Flavor) -> Path:
    return names.within(cdi_root, cdi_root / spec_name(claim_uid, flavor))


def device_name_of(claim_uid: str, device_name: str, share_id: str | None = None) -> str:
    """The CDI device of one device of a claim, or of one share of it: two shares of one
    device (two requests of the claim) are two CDI devices."""
    base = f"{claim_uid}-{device_name}"
    return base if share_id is None else f"{base}-{share_id}"


def cdi_device_id(claim_uid: str, device_name: str, share_id: str | None, flavor: Flavor) -> str:
    """Fully qualified CDI name, as returned to the kubelet."""
    return f"{flavor.cdi_kind}={device_name_of(claim_uid, device_name, share_id)}"


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


def _merge_edits(base: Mapping[str, Any], *extras: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {k: list(v) if isinstance(v, list) else v for k, v in base.items()}
    for extra in extras:
        for key, values in extra.items():
            # Two kinds of one claim (a GPU and a MIG device) both ask for the control nodes.
            have = merged.get(key, [])
            merged[key] = [*have, *(v for v in values if v not in have)]
    return {k: v for k, v in merged.items() if v not in ([], None)}


def build_claim_spec(
    claim: PreparedClaim,
    devices: Mapping[str, NodeDevice],
    base_edits: Mapping[str, Any],
    edits_by_kind: Mapping[str, Mapping[str, Any]],
    *,
    flavor: Flavor,
    boot_id: str = "",
    dev_root: str = "/",
) -> dict[str, Any]:
    """Pure: the claim's CDI spec. ``devices`` maps device name to the node's device for
    every device of the claim; ``edits_by_kind`` is each of its kinds' claim-wide edits
    (:func:`kinds_of`, then ``claim_edits``, which the caller asks once, after the side
    effects they describe); device nodes are found under ``dev_root`` on the host
    (``kubeletplugin.containertoolkit.dev_root``)."""
    by_device: dict[tuple[str, str], list[PreparedDevice]] = {}
    for record in claim.devices:
        by_device.setdefault((record.device_name, record.share_id or ""), []).append(record)
    spec_devices: list[dict[str, Any]] = []
    of_kind: dict[str, dict[str, NodeDevice]] = {}
    for device_name, share_id in sorted(by_device):
        records = by_device[(device_name, share_id)]
        node_device = devices[device_name]
        of_kind.setdefault(node_device.kind, {})[device_name] = node_device
        requests = sorted({r for rec in records for r in rec.request_names})
        annotations = {
            DEVICE_NAME: device_name,
            DEVICE_KIND: node_device.kind,
            **{_ANNOTATION + k: v for k, v in sorted(node_device.identity.items())},
            POOL: records[0].pool_name,
            REQUESTS: ",".join(requests),
        }
        if any(rec.admin_access for rec in records):
            annotations[ADMIN_ACCESS] = "true"
        if share_id:
            annotations[SHARE_ID] = share_id
        spec_devices.append(
            {
                "name": device_name_of(claim.uid, device_name, share_id or None),
                "annotations": annotations,
                "containerEdits": dict(node_device.edits),
            }
        )
    kind_edits = []
    for name in sorted(of_kind):
        edits = edits_by_kind[name]
        if any(node.edits for node in of_kind[name].values()):
            kind_edits.append(edits)
            continue
        # Devices with no edits of their own (a ComputeDomain channel or daemon) carry their
        # kind's: the CDI library refuses a device with empty edits, and with it the whole
        # spec ("invalid device, empty device edits"), as NVIDIA's plugin puts them too.
        for device in spec_devices:
            if device["annotations"][DEVICE_KIND] == name:
                device["containerEdits"] = dict(edits)
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": flavor.cdi_kind,
        "annotations": {
            OWNER_ANNOTATION: OWNER,
            RECORD_VERSION: str(VERSION),
            CLAIM_UID: claim.uid,
            CLAIM_NAMESPACE: claim.namespace,
            CLAIM_NAME: claim.name,
            **({BOOT_ID: boot_id} if boot_id else {}),
        },
        "devices": spec_devices,
        "containerEdits": _merge_edits(
            base_edits if flavor.starts_from_toolkit(of_kind) else {}, *kind_edits
        ),
    }
    if dev_root != "/":
        spec = _device_nodes_under(spec, dev_root)
    spec["cdiVersion"] = min_version(spec)
    return spec


def kinds_of(
    claim: PreparedClaim, devices: Mapping[str, NodeDevice]
) -> dict[str, list[NodeDevice]]:
    """The claim's node devices by kind, each kind's in name order: what each kind's
    ``claim_edits`` is asked with."""
    out: dict[str, dict[str, NodeDevice]] = {}
    for record in claim.devices:
        node_device = devices[record.device_name]
        out.setdefault(node_device.kind, {})[record.device_name] = node_device
    return {kind: [named[n] for n in sorted(named)] for kind, named in sorted(out.items())}


def plan_of(claim: PreparedClaim, kinds: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a prepare decided, as a spec records it: per CDI device (a device, or a share
    of it), its pool, kind, the identity its kind records, its requests and admin access.
    A spec read back (:func:`claim_from_spec`) and a new plan of the claim compare equal
    exactly when they prepare the same devices the same way."""
    by_device: dict[tuple[str, str], list[PreparedDevice]] = {}
    for d in claim.devices:
        by_device.setdefault((d.device_name, d.share_id or ""), []).append(d)
    devices = []
    for key in sorted(by_device):
        records = by_device[key]
        first = records[0]
        identity = dict(first.identity)
        keys = getattr(kinds.get(first.kind), "identity_keys", sorted(identity))
        devices.append(
            (
                key,
                first.pool_name,
                first.kind,
                tuple((k, identity.get(k)) for k in keys),
                tuple(sorted({r for rec in records for r in rec.request_names})),
                any(rec.admin_access for rec in records),
            )
        )
    return (claim.uid, claim.namespace, claim.name, tuple(devices))


def current_claim(raw: bytes, path: Path, *, flavor: Flavor, boot_id: str) -> PreparedClaim | None:
    """The claim a spec of ours records, when it is in this release's layout and of this
    boot; None for any other spec (damaged, another layout or boot, another driver's)."""
    try:
        spec = parse(raw, path)
        if not is_ours(spec) or boot_of(spec) != boot_id:
            return None
        if int(spec["annotations"].get(RECORD_VERSION, "1")) != VERSION:
            return None
        return claim_from_spec(spec, flavor)
    except (ValueError, TypeError, KeyError, AttributeError, SpecError):
        return None


def _device_nodes_under(spec: dict[str, Any], root: str) -> dict[str, Any]:
    def edits(e: Mapping[str, Any]) -> dict[str, Any]:
        nodes = [
            n if "hostPath" in n else {**n, "hostPath": root.rstrip("/") + n["path"]}
            for n in e.get("deviceNodes", [])
        ]
        return {**e, "deviceNodes": nodes} if nodes else dict(e)

    devices = [{**d, "containerEdits": edits(d["containerEdits"])} for d in spec["devices"]]
    return {**spec, "devices": devices, "containerEdits": edits(spec["containerEdits"])}


def host_device_nodes(spec: Mapping[str, Any]) -> list[str]:
    """Pure: the host paths of the device nodes the spec names that the runtime must find on
    the host, in spec order, once each. A node given with its type and major (an IMEX
    channel) is made in the container from those and needs none (CDI's fillMissingInfo)."""
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    paths: dict[str, None] = {}
    for e in edits:
        for node in e.get("deviceNodes") or ():
            if node.get("type") and (node.get("major") or node.get("type") == "p"):
                continue
            paths[str(node.get("hostPath") or node.get("path", ""))] = None
    return [p for p in paths if p]


def encode(spec: Mapping[str, Any]) -> bytes:
    """The file's bytes: deterministic, so an unchanged spec compares equal. Compact:
    an ``indent`` would take json off its C encoder (a tenth of a millisecond a spec)."""
    return json.dumps(spec, separators=(",", ":")).encode() + b"\n"


def is_ours(spec: Any) -> bool:
    return isinstance(spec, dict) and (spec.get("annotations") or {}).get(OWNER_ANNOTATION) == OWNER


def is_foreign(spec: Any, flavor: Flavor) -> bool:
    """Another DRA driver's spec under our kind and file names."""
    return (
        isinstance(spec, dict)
        and not is_ours(spec)
        and str(spec.get("kind", "")).startswith(flavor.foreign_kinds or (flavor.cdi_kind,))
    )


def boot_of(spec: Mapping[str, Any]) -> str:
    """The boot a spec of ours was written in; "" when it does not say."""
    value = (spec.get("annotations") or {}).get(BOOT_ID, "")
    return value if isinstance(value, str) else ""


def _text(obj: Mapping[str, Any], key: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is not a string")
    return value


def claim_from_spec(spec: Mapping[str, Any], flavor: Flavor) -> PreparedClaim:
    """What one of our specs records. Raises SpecError when this release cannot read it
    (a newer record version, an unknown device kind, a missing or mistyped field)."""
    try:
        annotations = spec["annotations"]
        version = int(annotations.get(RECORD_VERSION, "1"))
        if version > VERSION:
            raise SpecError(f"record version {version} is newer than this release's ({VERSION})")
        uid = _text(annotations, CLAIM_UID)
        kinds = flavor.kinds
        devices = []
        for device in spec["devices"]:
            a = device["annotations"]
            device_name = _text(a, DEVICE_NAME)
            kind_name = a.get(DEVICE_KIND, "gpu") if version >= 2 else "gpu"
            kind = kinds.get(kind_name)
            if kind is None:
                raise SpecError(f"device {device_name} is of unknown kind {kind_name!r}")
            share = a.get(SHARE_ID)
            devices.append(
                PreparedDevice(
                    request_names=tuple(r for r in a.get(REQUESTS, "").split(",") if r),
                    pool_name=_text(a, POOL),
                    device_name=device_name,
                    cdi_device_ids=(cdi_device_id(uid, device_name, share or None, flavor),),
                    share_id=share if share else None,
                    admin_access=a.get(ADMIN_ACCESS) == "true",
                    kind=kind_name,
                    identity=tuple((k, _text(a, _ANNOTATION + k)) for k in kind.identity_keys),
                )
            )
        return PreparedClaim(
            uid=uid,
            namespace=_text(annotations, CLAIM_NAMESPACE),
            name=_text(annotations, CLAIM_NAME),
            devices=tuple(devices),
        )
    except SpecError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SpecError(f"unexpected layout: {exc!r}") from exc


def identity_mismatch(claim: PreparedClaim, devices: Mapping[str, NodeDevice]) -> str:
    """ "" when every recorded device is still the same device on the node; else why not."""
    for device in claim.devices:
        node_device = devices.get(device.device_name)
        now = dict(node_device.identity) if node_device is not None else {}
        for key, value in device.identity:
            if now.get(key) != value:
                return (
                    f"device {device.device_name} was prepared with {key} {value} but is now "
                    f"{now.get(key, 'none')}; unprepare the claim (delete the pod) and prepare "
                    "it again"
                )
    return ""


def parse(raw: bytes, path: Path) -> Any:
    """A spec file's content (JSON, or YAML for another driver's .yaml files)."""
    if path.suffix == ".json":
        return json.loads(raw)
    import yaml  # only a foreign driver writes YAML specs here

    return yaml.safe_load(raw)


FOREIGN_MESSAGE = (
    "CDI specs of another DRA driver (the NVIDIA k8s-dra-driver-gpu uses the same kind "
    "{kind} and file names) found in {root}: {files}. Refusing to start so that no device "
    "it prepared is handed out twice. To migrate: drain the node's pods that use DRA claims, "
    "uninstall the other driver, delete those files and its checkpoint, then start this plugin."
)


def file_names(paths: Sequence[Path]) -> str:
    return ", ".join(p.name for p in paths)
