"""Dynamic MIG (the plugin's ``--dynamic-mig``): MIG devices made when a claim needs one.

A GPU in MIG mode is published as partitionable devices (KEP-4815): one counter set per
GPU, ``gpu-<minor>-counter-set``, with NVIDIA's counter names (``multiprocessors``,
``copy-engines``, ``decoders``, ``encoders``, ``jpeg-engines``, ``ofa-engines``,
``memory``, valued at the largest profile's, and ``memory-slice-<i>`` = 1 per memory
slice), and one device per GPU instance profile and placement NVML lists, named as a
static MIG device made there would be (``gpu-0-mig-3g40gb-9-4``), which consumes its
own capacities and exactly the memory slices of its placement. Two overlapping
placements then never fit together: the scheduler refuses them, not the node. NVIDIA's
driver has no compute-slice counter either; the multiprocessors counter stands in.

The GPU is published only as these (never as a whole GPU, nor as its static MIG
devices); a GPU not in MIG mode stays a whole GPU, one without MIG gets none. An
instance found on the GPU that no claim of this plugin made (created out of band) takes
every placement it overlaps out of the published set.

Which instances a claim made is read from the claims' records in the kind's state
directory each time the devices are built, never kept in the process: during a surge
upgrade two plugin instances share that directory, and each must count the other's
claims' instances as the driver's. A claim's record (``<uid>.json``) names its placements
before any instance is made there and, once the last is destroyed, becomes its tombstone
(``<uid>.gone``, one rename) naming the instances destroyed: a discovery that listed one
of them before it went, this instance's or the sibling's, still knows it for a claim's.
Tombstones go after a minute, far longer than a discovery takes.
"""

import contextlib
import json
import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from driver.common.errors import PermanentError
from driver.common.fsutil import ensure_dir, write_atomic
from driver.common.limits import is_uid
from driver.common.logs import kv
from driver.devicekind import NodeDevice, PreparedClaim, PreparedDevice
from drivers.gpu.kinds.base import GpuKindContext, GpuNode, HealthTarget, MigMaker
from drivers.gpu.kinds.files import PRIVATE
from drivers.gpu.kinds.gpu import CONTROL_NODES, physical_attributes
from drivers.gpu.kinds.mig import CAPS_DIR, VISIBLE_UUIDS_ENV, refuse_sharing
from drivers.gpu.model.inventory import Gpu, Inventory, MigDevice, MigPartition

log = logging.getLogger(__name__)

NAME = "dynamic-mig"
PARENT_KEY = "parent-uuid"
PROFILE_ID_KEY = "profile-id"
START_KEY = "placement-start"
SIZE_KEY = "placement-size"

# (capacity name as the devices publish it, counter name as NVIDIA's driver names it)
_COUNTED = (
    ("multiprocessors", "multiprocessors"),
    ("copyEngines", "copy-engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpeg-engines"),
    ("ofaEngines", "ofa-engines"),
    ("memory", "memory"),
)


def counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}-counter-set"


def device_name(gpu: Gpu, partition: MigPartition) -> str:
    profile = re.sub(r"[^a-z0-9-]", "-", partition.profile.lower().replace(".", "")).strip("-")
    return f"gpu-{gpu.minor}-mig-{profile}-{partition.profile_id}-{partition.placement_start}"


def _capacities(partition: MigPartition) -> dict[str, int]:
    return {
        "multiprocessors": partition.multiprocessors,
        "copyEngines": partition.copy_engines,
        "decoders": partition.decoders,
        "encoders": partition.encoders,
        "jpegEngines": partition.jpeg_engines,
        "ofaEngines": partition.ofa_engines,
        "memory": partition.memory_bytes,
    }


def _slices(partition: MigPartition) -> range:
    return range(partition.placement_start, partition.placement_start + partition.placement_size)


def counter_set(gpu: Gpu) -> dict[str, Any]:
    """The GPU's counters: each capacity at the largest any profile has (a counter valued
    0 is left out, as no device consumes it), and one per memory slice."""
    counters: dict[str, int] = {}
    for capacity, counter in _COUNTED:
        top = max(_capacities(p)[capacity] for p in gpu.mig_partitions)
        if top > 0:
            counters[counter] = top
    for i in range(max(p.placement_start + p.placement_size for p in gpu.mig_partitions)):
        counters[f"memory-slice-{i}"] = 1
    return {
        "name": counter_set_name(gpu),
        "counters": {k: {"value": str(v)} for k, v in counters.items()},
    }


def consumption(gpu: Gpu, partition: MigPartition) -> dict[str, Any]:
    counters = {
        counter: value
        for (capacity, counter) in _COUNTED
        if (value := _capacities(partition)[capacity]) > 0
    }
    counters.update({f"memory-slice-{i}": 1 for i in _slices(partition)})
    return {
        "counterSet": counter_set_name(gpu),
        "counters": {k: {"value": str(v)} for k, v in counters.items()},
    }


def build_device(gpu: Gpu, partition: MigPartition, inventory: Inventory) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "mig"},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": partition.profile},
        **physical_attributes(gpu, inventory),
    }
    capacity: dict[str, int] = dict(_capacities(partition))
    capacity.update({f"memorySlice{i}": 1 for i in _slices(partition)})
    return {
        "name": device_name(gpu, partition),
        "attributes": dict(sorted(attributes.items())),
        "capacity": {k: {"value": str(v)} for k, v in sorted(capacity.items())},
        "consumesCounters": [consumption(gpu, partition)],
    }


Placement = tuple[str, int, int]  # (parent GPU UUID, GPU instance profile ID, start)
RECORD_SUFFIX = ".json"
TOMBSTONE_SUFFIX = ".gone"
# How long a tombstone is kept: a discovery that listed its instances has long ended.
TOMBSTONE_S = 60.0


@dataclass(frozen=True, slots=True)
class Claimed:
    """What the driver's claims hold on the node, as their records say."""

    placements: frozenset[Placement] = frozenset()  # made, or being made
    destroyed: frozenset[str] = frozenset()  # MIG UUIDs of instances unprepared lately

    def made(self, gpu: Gpu, mig: MigDevice) -> bool:
        """Whether a claim made ``mig`` (one that an unprepare destroyed since it was
        discovered included)."""
        placement = (gpu.uuid, mig.profile_id, mig.placement_start)
        return placement in self.placements or mig.uuid in self.destroyed


def blocked_slices(gpu: Gpu, ours: Claimed) -> set[int]:
    """Memory slices of the GPU's instances that no claim of this plugin made."""
    out: set[int] = set()
    for mig in gpu.mig_devices:
        if not ours.made(gpu, mig):
            out.update(range(mig.placement_start, mig.placement_start + mig.placement_size))
    return out


def published_partitions(gpu: Gpu, ours: Claimed) -> list[MigPartition]:
    blocked = blocked_slices(gpu, ours)
    return [p for p in gpu.mig_partitions if blocked.isdisjoint(_slices(p))]


def counter_sets(inventory: Inventory) -> list[dict[str, Any]]:
    """One counter set per GPU published for dynamic MIG, by minor."""
    return [
        counter_set(gpu)
        for gpu in sorted(inventory.gpus, key=lambda g: g.minor)
        if gpu.mig_partitions
    ]


def edits_of(gpu: Gpu) -> Mapping[str, Any]:
    """What a container gets before the instance exists: the parent's node (the
    instance's cap nodes come from the claim's record, at prepare)."""
    return {"deviceNodes": [{"path": f"/dev/nvidia{gpu.minor}"}]}


def identity(gpu: Gpu, partition: MigPartition) -> dict[str, str]:
    return {
        PARENT_KEY: gpu.uuid,
        PROFILE_ID_KEY: str(partition.profile_id),
        START_KEY: str(partition.placement_start),
        SIZE_KEY: str(partition.placement_size),
    }


def partition_devices(inventory: Inventory, ours: Claimed) -> Sequence[tuple[Gpu, MigPartition]]:
    return [
        (gpu, partition)
        for gpu in sorted(inventory.gpus, key=lambda g: g.minor)
        if gpu.mig_partitions
        for partition in published_partitions(gpu, ours)
    ]


class DynamicMigError(PermanentError):
    """A dynamic MIG device could not be made (or removed) for a claim: the claim's error."""


class DynamicMigKind:
    """Partitions of GPUs in MIG mode, published only with ``--dynamic-mig``.

    Prepare makes each allocated partition's MIG device at exactly its placement (with
    the ``drivers.gpu.model.migmake.Maker`` given at attach), after the claim state wrote the
    claim's
    side-effect record. Its own record, ``<state dir>/<claim uid>.json``, names the placements
    before the first create and then what it made (UUID, GI and CI IDs, the cap nodes'
    minors), from which the claim's CDI edits are built; every plugin instance of the node
    reads these records to tell its claims' instances from those made out of band.
    Unprepare removes the instances and that file; recovery after a crash before the CDI
    spec does the same (the kubelet prepares the claim again), so an instance is never
    leaked nor handed to two claims: the device's reservation is the claim's alone.
    """

    name = NAME
    identity_keys = (PARENT_KEY, PROFILE_ID_KEY, START_KEY, SIZE_KEY)

    def __init__(self, node: GpuNode | None = None) -> None:
        self._dir: Path | None = None
        self._boot = ""
        self._maker: MigMaker | None = None  # given at attach

    def physical_gpu(self, identity: Mapping[str, str]) -> str:
        return identity.get(PARENT_KEY, "")

    def devices(self, inventory: Inventory, *, node_name: str) -> Sequence[NodeDevice]:
        ours = self.ours() if any(g.mig_devices for g in inventory.gpus) else Claimed()
        return [
            NodeDevice(
                kind=NAME,
                name=device_name(gpu, partition),
                published=build_device(gpu, partition, inventory),
                edits=edits_of(gpu),
                identity=identity(gpu, partition),
            )
            for gpu, partition in partition_devices(inventory, ours)
        ]

    def ours(self) -> Claimed:
        """What the driver's claims made, or are making, an instance at, whichever plugin
        instance of the node prepared them: those stay published, any other instance is
        out of band. Read from the records now (one listing and one small file per
        dynamic-MIG claim of the node, and per tombstone), since the sibling instance of a
        surge upgrade writes them too. A record that cannot be read counts for nothing: its
        instance then blocks its placements, the safe way to be wrong."""
        if self._dir is None:
            return Claimed()  # before attach: no claim can have been prepared through us
        placements: set[Placement] = set()
        destroyed: set[str] = set()
        try:
            paths = list(self._dir.iterdir())
        except FileNotFoundError:
            paths = []  # removed under us: no record, every instance out of band
        for path in paths:
            if path.name.startswith(".") or not path.name.endswith(
                (RECORD_SUFFIX, TOMBSTONE_SUFFIX)
            ):
                continue  # a temp file: the record it will be is not there yet
            try:
                if path.name.endswith(TOMBSTONE_SUFFIX) and self._expired(path):
                    path.unlink(missing_ok=True)
                    continue
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # renamed or removed since the listing, or damaged
            if not isinstance(record, dict) or (self._boot and record.get("boot") != self._boot):
                continue
            if path.name.endswith(RECORD_SUFFIX):
                placements.update(_placements_of(record.get("placements")))
            else:
                destroyed.update(_uuids_of(record.get("devices")))
        return Claimed(frozenset(placements), frozenset(destroyed))

    @staticmethod
    def _expired(tombstone: Path) -> bool:
        # The rename that made it a tombstone set its ctime (its mtime is the record's).
        return time.time() - tombstone.stat().st_ctime > TOMBSTONE_S

    def health_target(self, device: NodeDevice, inventory: Inventory) -> HealthTarget | None:
        """A placement of its GPU, kept by the placement (an instance made there changes
        UUID at every prepare, a taint must not); XIDs naming the instance made there, if
        any, hit it."""
        parent = device.identity.get(PARENT_KEY, "")
        profile_id = device.identity.get(PROFILE_ID_KEY, "")
        start = device.identity.get(START_KEY, "")
        if not parent or not profile_id or not start:
            return None
        key = f"{parent}/mig-{profile_id}-{start}"
        for gpu in inventory.gpus:
            if gpu.uuid != parent:
                continue
            for mig in gpu.mig_devices:
                if (str(mig.profile_id), str(mig.placement_start)) == (profile_id, start):
                    return HealthTarget(parent, key, part=True, gi=mig.gi_id, ci=mig.ci_id)
        return HealthTarget(parent, key, part=True)

    def claim_edits(self, devices: Sequence[NodeDevice], claim: PreparedClaim) -> Mapping[str, Any]:
        made = self._read(claim.uid)
        nodes = list(CONTROL_NODES)
        uuids = []
        for device in sorted(devices, key=lambda d: d.name):
            mine = made.get(device.name)
            if mine is None:
                continue  # not made yet: the spec is built again once it is
            uuids.append(mine["uuid"])
            nodes += [f"{CAPS_DIR}/nvidia-cap{mine['giMinor']}",
                      f"{CAPS_DIR}/nvidia-cap{mine['ciMinor']}"]  # fmt: skip
        edits: dict[str, Any] = {"deviceNodes": [{"path": path} for path in nodes]}
        if uuids:
            edits["env"] = ["NVIDIA_VISIBLE_DEVICES=void", f"{VISIBLE_UUIDS_ENV}={','.join(uuids)}"]
        return edits

    def attach(self, context: GpuKindContext) -> None:
        self._dir = context.state_dir
        ensure_dir(self._dir, PRIVATE)
        self._boot = context.boot_id
        self._maker = context.node.mig_maker
        if not self._boot:
            return
        for path in [*self._dir.glob(f"*{RECORD_SUFFIX}"), *self._dir.glob(f"*{TOMBSTONE_SUFFIX}")]:
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and record.get("boot") != self._boot:
                path.unlink(missing_ok=True)  # MIG devices do not outlive a reboot

    def has_side_effects(self, claim: PreparedClaim) -> bool:
        return any(d.kind == NAME for d in claim.devices)

    def prepare(self, claim: PreparedClaim) -> None:
        # Before anything is made: its MIG devices take no sharing, as static ones.
        refuse_sharing(claim, NAME)
        maker = self._ready()
        placements = [_placement(d) for d in _mine(claim)]
        # What an earlier prepare of the claim made stays recorded until it is made again
        # (the same instance, adopted): the claim's spec of then may still name it.
        made = dict(self._read(claim.uid))
        # Before any instance is made: from here on every plugin instance of the node reads
        # these placements as a claim's, never as an instance made out of band.
        self._write(claim.uid, placements, made)
        for device, (parent, profile_id, start, size) in zip(_mine(claim), placements, strict=True):
            try:
                mig = maker.make(parent, profile_id, start, size)
            except (pynvml.NVMLError, PermanentError) as exc:
                raise DynamicMigError(
                    f"claim {claim}: cannot create MIG device {device.device_name} "
                    f"(profile ID {profile_id} at memory slice {start} of GPU {parent}): {exc}"
                ) from exc
            made[device.device_name] = {
                "uuid": mig.uuid, "gi": mig.gi_id, "ci": mig.ci_id,
                "giMinor": mig.gi_access_minor, "ciMinor": mig.ci_access_minor,
            }  # fmt: skip
            log.info(
                "MIG device created",
                extra=kv(claim_uid=claim.uid, claim_namespace=claim.namespace,
                         claim_name=claim.name, device=device.device_name, mig_uuid=mig.uuid,
                         gpu_uuid=parent, gi=mig.gi_id, ci=mig.ci_id),
            )  # fmt: skip
        self._write(claim.uid, placements, made)

    def unprepare(self, claim: PreparedClaim) -> None:
        maker = self._ready()
        placements = [_placement(d) for d in _mine(claim)]
        for device, (parent, profile_id, start, _) in zip(_mine(claim), placements, strict=True):
            try:
                removed = maker.unmake(parent, profile_id, start)
            except (pynvml.NVMLError, PermanentError) as exc:
                raise DynamicMigError(
                    f"claim {claim}: cannot destroy MIG device {device.device_name} "
                    f"(profile ID {profile_id} at memory slice {start} of GPU {parent}): {exc}"
                ) from exc
            if removed:
                log.info(
                    "MIG device destroyed",
                    extra=kv(claim_uid=claim.uid, claim_namespace=claim.namespace,
                             claim_name=claim.name, device=device.device_name, gpu_uuid=parent),
                )  # fmt: skip
        # Only once every instance is gone: until then they are still the claim's. The
        # record becomes the tombstone of what it made, in one rename.
        path = self._path(claim.uid)
        with contextlib.suppress(FileNotFoundError):  # never prepared, or unprepared already
            path.replace(path.with_suffix(TOMBSTONE_SUFFIX))

    def recover(self, claim: PreparedClaim) -> None:
        self.unprepare(claim)  # the kubelet prepares it again, making a new instance

    def watch(self) -> None:
        pass

    def _ready(self) -> MigMaker:
        if self._dir is None or self._maker is None:
            raise DynamicMigError("dynamic MIG used before the claim state attached NVML")
        return self._maker

    def _path(self, uid: str) -> Path:
        if self._dir is None or not is_uid(uid):
            raise DynamicMigError(f"claim uid {uid!r} cannot name a record")
        return self._dir / f"{uid}{RECORD_SUFFIX}"

    def _write(
        self,
        uid: str,
        placements: Iterable[tuple[str, int, int, int]],
        made: Mapping[str, Mapping[str, Any]],
    ) -> None:
        record = {"boot": self._boot, "placements": [list(p[:3]) for p in placements],
                  "devices": dict(made)}  # fmt: skip
        write_atomic(self._path(uid), json.dumps(record, sort_keys=True) + "\n")

    def _read(self, uid: str) -> dict[str, dict[str, Any]]:
        if self._dir is None:
            return {}
        try:
            record = json.loads(self._path(uid).read_text())
        except (OSError, ValueError, DynamicMigError):
            return {}
        devices = record.get("devices")
        return devices if isinstance(devices, dict) else {}


def _placements_of(recorded: Any) -> set[Placement]:
    """The placements a record lists, each checked for its shape (a damaged entry is left
    out, which blocks its instance's placements rather than publishing them)."""
    out: set[Placement] = set()
    for entry in recorded if isinstance(recorded, list) else ():
        if (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in entry[1:])
        ):
            out.add((entry[0], entry[1], entry[2]))
    return out


def _uuids_of(devices: Any) -> set[str]:
    """The MIG UUIDs of what a record says it made."""
    if not isinstance(devices, dict):
        return set()
    return {
        made["uuid"]
        for made in devices.values()
        if isinstance(made, dict) and isinstance(made.get("uuid"), str)
    }


def _mine(claim: PreparedClaim) -> list[PreparedDevice]:
    return sorted((d for d in claim.devices if d.kind == NAME), key=lambda d: d.device_name)


def _placement(device: PreparedDevice) -> tuple[str, int, int, int]:
    ident = dict(device.identity)
    try:
        return (ident[PARENT_KEY], int(ident[PROFILE_ID_KEY]), int(ident[START_KEY]),
                int(ident[SIZE_KEY]))  # fmt: skip
    except (KeyError, ValueError) as exc:
        raise DynamicMigError(
            f"device {device.device_name}: its record lacks the placement ({exc})"
        ) from exc
