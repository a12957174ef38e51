"""Simulated hardware profiles: YAML data files in ``profiles/``, one per instance type.

A profile describes one node's GPUs; :meth:`Profile.gpus` turns it into the
concrete GPUs of one named node. Values that differ between real nodes (GPU
UUIDs, the fabric cluster UUID) derive deterministically from the node name, so
two simulated nodes of one type differ the way two real ones do.

Profile keys::

    instanceType: p5.48xlarge
    count: 8
    gpu: {name, brand, architecture, computeCapability: "9.0", memoryMiB,
          migCapable: false, migEnabled: false,   # brand: NVML_BRAND_<brand>,
          pciDeviceId: 0x233010DE,                # architecture: NVML_DEVICE_ARCH_<architecture>
          supportedEventTypes: 0x8}               # both optional: NVML's answers (defaults:
                                                  # the H100 SXM's ID; XID events only)
    pciBusIds: ["0000:53:00.0", ...]     # optional, one per GPU; generated otherwise
    pcieRoots: ["pci0000:44", ...]       # optional, one per GPU; derived from the bus otherwise
    numaNodes: [0, 0, 1, 1] | {spread: N} | omitted (all 0)
    nvlink: {topology: none | nvswitch | pairs | links, linksPerGpu: 18,
             links: [[0, 1], [1, 2]]}    # links: GPU positions joined by one NVLink each
    fabric: not-supported | none | zero | in-progress | {state: completed, cliqueId: 7}
    driverVersion: "580.95.05"           # optional
    cudaDriverVersion: "13.0"            # optional
    faults: {...}                        # optional, see driver.nvml.faults
    mig:                                 # optional; only with gpu.migCapable
      profiles:                          # the GPU instance profiles NVML reports, one row each:
        # [index, id, name, computeSlices, memorySlices, instances, multiprocessors,
        #  copyEngines, decoders, encoders, jpegEngines, ofaEngines, memoryMiB, [starts]]
        - [0, 19, 1g.5gb, 1, 1, 7, 14, 1, 0, 0, 0, 0, 4864, [0, 1, 2, 3, 4, 5, 6]]
      enabled: all | [0, 1]              # GPUs in MIG mode (default none)
      pending: [2]                       # GPUs whose MIG mode change waits for a reset
      instances:                         # GPU instances (each with one compute instance
        - {profile: 3g.20gb, start: 0}   # spanning it) on every GPU in MIG mode
    extends: p4d.24xlarge                # optional: this file's keys over a shipped profile's
"""

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pynvml
import yaml

from driver.nvml.faults import FABRIC_STATES, Faults, SimulationConfigError

DEFAULT_DRIVER_VERSION = "580.95.05"
DEFAULT_CUDA_DRIVER_VERSION = "13.0"
DEFAULT_PCI_DEVICE_ID = 0x233010DE
DEFAULT_EVENT_TYPES = pynvml.nvmlEventTypeXidCriticalError
_UUID_NAMESPACE = uuid.UUID("6f1b6c1e-9b1f-4a53-8d7e-3c2a3f0e5d11")
_TOPOLOGIES = frozenset({"none", "nvswitch", "pairs", "links"})


class UnknownProfileError(SimulationConfigError):
    """No profile of that name ships with the simulator."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile, as ``nvmlDeviceGetGpuInstanceProfileInfoV`` reports it."""

    index: int  # NVML_GPU_INSTANCE_PROFILE_*
    id: int  # the profile's unique ID, what placements and instances name
    name: str  # "1g.10gb"
    compute_slices: int
    memory_slices: int  # a placement's size
    instances: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int
    starts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SimMigInstance:
    """A GPU instance with the one compute instance that spans it."""

    gi_id: int
    ci_id: int
    profile: MigProfile
    start: int
    uuid: str  # "MIG-..."


@dataclass(frozen=True, slots=True)
class NvLink:
    """One active NVLink: to a GPU (by its upstream-form PCI bus ID) or to an NVSwitch."""

    remote_type: int  # pynvml.NVML_NVLINK_DEVICE_TYPE_*
    remote_pci_bus_id: str | None


@dataclass(frozen=True, slots=True)
class SimGpu:
    """One simulated GPU on one node, as NVML and sysfs will report it."""

    position: int  # order on the bus; the minor number too
    uuid: str
    name: str
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_bytes: int
    pci_bus_id: str  # upstream form: "0000:53:00.0"
    pcie_root: str  # "pci0000:44"
    numa_node: int
    mig_capable: bool
    mig_enabled: bool
    nvlinks: tuple[NvLink, ...]
    mig_pending: bool = False  # the mode after a reset; differs from mig_enabled when pending
    mig_instances: tuple[SimMigInstance, ...] = ()

    @property
    def minor(self) -> int:
        return self.position


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    count: int
    gpu_name: str
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_mib: int
    mig_capable: bool
    mig_enabled: bool
    pci_bus_ids: tuple[str, ...]
    pcie_roots: tuple[str, ...]
    numa_nodes: tuple[int, ...]
    nvlink_edges: tuple[tuple[int, int], ...]  # GPU positions joined directly
    nvswitch: bool
    links_per_gpu: int
    fabric: str  # a FabricState
    fabric_clique_id: int
    driver_version: str
    cuda_driver_version: str
    faults: Faults
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_enabled_gpus: frozenset[int] = frozenset()
    mig_pending_gpus: frozenset[int] = frozenset()
    mig_layout: tuple[tuple[MigProfile, int], ...] = ()  # (profile, start) per instance
    pci_device_id: int = DEFAULT_PCI_DEVICE_ID
    event_types: int = DEFAULT_EVENT_TYPES  # nvmlDeviceGetSupportedEventTypes

    def gpus(self, node_name: str) -> tuple[SimGpu, ...]:
        return tuple(self._gpu(i, node_name) for i in range(self.count))

    def fabric_cluster_uuid(self, seed: str) -> bytes:
        """The 16-byte fabric cluster UUID of the nodes that share ``seed``."""
        return uuid.uuid5(_UUID_NAMESPACE, f"fabric/{self.name}/{seed}").bytes

    def _gpu(self, i: int, node_name: str) -> SimGpu:
        gpu_uuid = uuid.uuid5(_UUID_NAMESPACE, f"{node_name}/{self.name}/{i}")
        enabled = self.mig_capable and (self.mig_enabled or i in self.mig_enabled_gpus)
        pending = enabled != (i in self.mig_pending_gpus)
        instances = tuple(
            SimMigInstance(
                gi_id=n + 1,
                ci_id=0,
                profile=profile,
                start=start,
                uuid=f"MIG-{uuid.uuid5(gpu_uuid, f'gi{n + 1}/ci0')}",
            )
            for n, (profile, start) in enumerate(self.mig_layout if enabled else ())
        )
        return SimGpu(
            position=i,
            uuid=f"GPU-{gpu_uuid}",
            name=self.gpu_name,
            brand=self.brand,
            architecture=self.architecture,
            compute_capability=self.compute_capability,
            memory_bytes=self.memory_mib * 1024 * 1024,
            pci_bus_id=self.pci_bus_ids[i],
            pcie_root=self.pcie_roots[i],
            numa_node=self.numa_nodes[i],
            mig_capable=self.mig_capable,
            mig_enabled=enabled,
            nvlinks=self._links(i),
            mig_pending=pending,
            mig_instances=instances,
        )

    def _links(self, i: int) -> tuple[NvLink, ...]:
        if self.nvswitch:
            switch = NvLink(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, None)
            return (switch,) * self.links_per_gpu
        links: list[NvLink] = []
        for a, b in self.nvlink_edges:
            if i in (a, b):
                peer = self.pci_bus_ids[b if i == a else a]
                links.extend(
                    [NvLink(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, peer)] * self.links_per_gpu
                )
        return tuple(links)


def profile_names() -> list[str]:
    """Names of the profiles that ship with the simulator."""
    folder = resources.files("driver.nvml") / "profiles"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (``p5.48xlarge``), or any profile file by path."""
    path = Path(name_or_path)
    if path.suffix == ".yaml" and path.is_file():
        return _parse(path.stem, path.read_text(), source=str(path))
    return _shipped(str(name_or_path))


@cache
def _shipped(name: str) -> Profile:
    resource = resources.files("driver.nvml") / "profiles" / f"{name}.yaml"
    if not resource.is_file():
        raise UnknownProfileError(
            f"unknown hardware profile {name!r}; known: {', '.join(profile_names())}"
        )
    return _parse(name, resource.read_text(), source=f"profile {name}")


def _parse(name: str, text: str, *, source: str) -> Profile:
    try:
        data = yaml.safe_load(text)
        if "extends" in data:
            base = _raw(str(data["extends"]))
            data = {**base, **{k: v for k, v in data.items() if k != "extends"}}
            data["mig"] = {**(base.get("mig") or {}), **(data.get("mig") or {})}
        return _build(name, data, source)
    except SimulationConfigError:
        raise
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SimulationConfigError(f"{source}: malformed profile: {exc!r}") from exc


def _raw(name: str) -> dict[str, Any]:
    resource = resources.files("driver.nvml") / "profiles" / f"{name}.yaml"
    if not resource.is_file():
        raise UnknownProfileError(f"extends: unknown hardware profile {name!r}")
    return dict(yaml.safe_load(resource.read_text()))


def _build(name: str, data: Mapping[str, Any], source: str) -> Profile:
    count = int(data["count"])
    if count < 0:
        raise SimulationConfigError(f"{source}: count must not be negative")
    gpu = data["gpu"]
    major, minor = (int(p) for p in str(gpu["computeCapability"]).split("."))
    bus_ids = _per_gpu(data.get("pciBusIds"), count, source, "pciBusIds") or _generated_bus_ids(
        count
    )
    bus_ids = tuple(b.lower() for b in bus_ids)
    roots = _per_gpu(data.get("pcieRoots"), count, source, "pcieRoots") or tuple(
        _derived_root(b) for b in bus_ids
    )
    nvlink = data.get("nvlink") or {"topology": "none"}
    topology = str(nvlink.get("topology", "none"))
    if topology not in _TOPOLOGIES:
        raise SimulationConfigError(f"{source}: nvlink topology {topology!r} unknown")
    edges: tuple[tuple[int, int], ...] = ()
    if topology == "pairs":
        edges = tuple((i, i + 1) for i in range(0, count - 1, 2))
    elif topology == "links":
        edges = tuple((int(a), int(b)) for a, b in nvlink["links"])
        if any(not (0 <= v < count) for edge in edges for v in edge):
            raise SimulationConfigError(f"{source}: nvlink links name GPUs outside 0..{count - 1}")
    fabric, clique = _fabric(data.get("fabric", "not-supported"), source)
    mig = data.get("mig") or {}
    mig_profiles = tuple(_mig_profile(row, source) for row in mig.get("profiles") or ())
    return Profile(
        name=str(data.get("instanceType", name)),
        count=count,
        gpu_name=str(gpu["name"]),
        brand=int(getattr(pynvml, f"NVML_BRAND_{gpu['brand']}")),
        architecture=int(getattr(pynvml, f"NVML_DEVICE_ARCH_{gpu['architecture']}")),
        compute_capability=(major, minor),
        memory_mib=int(gpu["memoryMiB"]),
        mig_capable=bool(gpu.get("migCapable", False)),
        mig_enabled=bool(gpu.get("migEnabled", False)),
        pci_bus_ids=bus_ids,
        pcie_roots=roots,
        numa_nodes=_numa(data.get("numaNodes"), count, source),
        nvlink_edges=edges,
        nvswitch=topology == "nvswitch",
        links_per_gpu=int(nvlink.get("linksPerGpu", 1 if topology != "none" else 0)),
        fabric=fabric,
        fabric_clique_id=clique,
        driver_version=str(data.get("driverVersion", DEFAULT_DRIVER_VERSION)),
        cuda_driver_version=str(data.get("cudaDriverVersion", DEFAULT_CUDA_DRIVER_VERSION)),
        faults=Faults.from_mapping(data.get("faults"), source=f"{source}: faults"),
        mig_profiles=mig_profiles,
        mig_enabled_gpus=_gpu_set(mig.get("enabled"), count),
        mig_pending_gpus=_gpu_set(mig.get("pending"), count),
        mig_layout=_mig_layout(mig.get("instances") or (), mig_profiles, source),
        pci_device_id=int(gpu.get("pciDeviceId", DEFAULT_PCI_DEVICE_ID)),
        event_types=_event_types(gpu.get("supportedEventTypes", DEFAULT_EVENT_TYPES), source),
    )


def _event_types(value: Any, source: str) -> int:
    mask = int(value)
    if not mask & pynvml.nvmlEventTypeXidCriticalError:  # the one event the library delivers
        raise SimulationConfigError(f"{source}: supportedEventTypes must include XID (0x8)")
    return mask


def _mig_profile(row: Any, source: str) -> MigProfile:
    if not isinstance(row, list) or len(row) != 14:
        raise SimulationConfigError(f"{source}: a MIG profile row needs 14 fields, got {row!r}")
    n = [int(v) for v in row[3:13]]
    return MigProfile(
        index=int(row[0]), id=int(row[1]), name=str(row[2]), compute_slices=n[0],
        memory_slices=n[1], instances=n[2], multiprocessors=n[3], copy_engines=n[4],
        decoders=n[5], encoders=n[6], jpeg_engines=n[7], ofa_engines=n[8], memory_mib=n[9],
        starts=tuple(int(s) for s in row[13]),
    )  # fmt: skip


def _gpu_set(value: Any, count: int) -> frozenset[int]:
    if value is None:
        return frozenset()
    if value == "all":
        return frozenset(range(count))
    return frozenset(int(v) for v in value)


def _mig_layout(
    items: Any, profiles: tuple[MigProfile, ...], source: str
) -> tuple[tuple[MigProfile, int], ...]:
    """The instances, checked as the driver would refuse them: a placement the profile
    lacks, overlapping memory slices, more compute slices than the GPU's seven."""
    by_name = {p.name: p for p in profiles}
    layout: list[tuple[MigProfile, int]] = []
    used: set[int] = set()
    for item in items:
        profile = by_name.get(str(item["profile"]))
        if profile is None:
            raise SimulationConfigError(f"{source}: MIG instance of unknown profile {item!r}")
        start = int(item["start"])
        if start not in profile.starts:
            raise SimulationConfigError(
                f"{source}: {profile.name} cannot start at memory slice {start} "
                f"(placements: {list(profile.starts)})"
            )
        slices = set(range(start, start + profile.memory_slices))
        if slices & used:
            raise SimulationConfigError(f"{source}: MIG instance {item!r} overlaps another")
        used |= slices
        layout.append((profile, start))
    if sum(p.compute_slices for p, _ in layout) > 7:
        raise SimulationConfigError(f"{source}: MIG instances use more than 7 compute slices")
    return tuple(layout)


def _per_gpu(value: Any, count: int, source: str, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != count:
        raise SimulationConfigError(f"{source}: {key} needs exactly {count} entries")
    return tuple(str(v) for v in value)


def _generated_bus_ids(count: int) -> tuple[str, ...]:
    # Buses 0x01..0xfe per PCI domain, like a large host with several segments.
    return tuple(f"{i // 254:04x}:{i % 254 + 1:02x}:00.0" for i in range(count))


def _derived_root(bus_id: str) -> str:
    domain, bus, _ = bus_id.split(":")
    return f"pci{domain}:{int(bus, 16) & 0xF0:02x}"


def _numa(value: Any, count: int, source: str) -> tuple[int, ...]:
    if value is None:
        return (0,) * count
    if isinstance(value, Mapping):
        spread = int(value["spread"])
        return tuple(i * spread // max(count, 1) for i in range(count))
    if not isinstance(value, list) or len(value) != count:
        raise SimulationConfigError(f"{source}: numaNodes needs exactly {count} entries")
    return tuple(int(v) for v in value)


def _fabric(value: Any, source: str) -> tuple[str, int]:
    if isinstance(value, Mapping):
        return str(value.get("state", "completed")), int(value.get("cliqueId", 0))
    if value not in FABRIC_STATES:
        raise SimulationConfigError(f"{source}: fabric {value!r} unknown")
    return str(value), 0
