"""The seam a device kind implements, and the records every kind shares.

A kind (the full GPU; later MIG, shared GPUs, passthrough) says which devices of
it a node has and what they publish, what a container of a claim gets for them
(CDI edits), and which side effects preparing them has (none for a full GPU; a
MIG instance or an MPS daemon for later kinds), with how to undo them after an
unprepare or a crash. Everything else (the slice publisher, the claim fetch, the
per-claim records, the CDI spec file, the gRPC service) is shared and knows no
kind. Kinds are registered in :data:`driver.gpu.kinds.KINDS`.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from driver.gpu import nvidiasmi
from driver.gpu.inventory import Inventory
from driver.gpu.kinds.mpspod import MpsPods
from driver.gpu.nvidiasmi import NvidiaSmi


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """One device of a kind on this node, as discovery found it."""

    kind: str
    name: str  # the DRA device name, unique on the node across kinds
    published: Mapping[str, Any]  # the resource.k8s.io/v1 Device, JSON form
    edits: Mapping[str, Any]  # CDI containerEdits of a container that gets this device
    # Facts recorded with a prepared device and checked when the claim is prepared
    # again (a GPU's UUID: a swapped board under the same name is not the same device).
    identity: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim: what the kubelet is told and the record keeps."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    admin_access: bool = False
    kind: str = "gpu"
    identity: tuple[tuple[str, str], ...] = ()
    # What the claim's opaque config asks of the device (``GpuConfig.sharing_settings``),
    # kept in the side-effect record so an unprepare or a recovery knows what to undo.
    sharing: tuple[tuple[str, str], ...] = ()
    # A share of a device (consumable capacity): the result's consumedCapacity, which the
    # CDI edits may enforce (an MPS memory limit); not recorded, the spec holds the edits.
    consumed: tuple[tuple[str, str], ...] = ()

    @property
    def reservation(self) -> str:
        """The name of its reservation: the device, or one share of it."""
        return self.device_name if self.share_id is None else f"{self.device_name}#{self.share_id}"


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class HealthTarget:
    """Where a device's health comes from: NVML reports events per physical GPU."""

    gpu_uuid: str  # the physical GPU whose events are registered for the device
    key: str  # what its taints are kept by, in health.json too: stable across restarts
    # A part of its GPU (a MIG device): only events naming its instance, or none, hit it.
    part: bool = False
    # The GPU and compute instance the part is now; None: no instance (not made yet).
    gi: int | None = None
    ci: int | None = None


@dataclass(frozen=True, slots=True)
class KindContext:
    """What a kind with side effects is given of the node, once, before recovery."""

    state_dir: Path  # the kind's own files (``<plugin dir>/kinds/<kind>``), made for it
    boot_id: str  # "" when unknown: the kind's records of an earlier boot are then kept
    container_driver_root: Path
    nvidia_smi: Path | None = None  # None: under the driver root
    mps_control: Path | None = None  # nvidia-cuda-mps-control; None: under the driver root
    nvml_library: Path | None = None  # the driver root's libnvidia-ml, for the tools it runs
    # What makes and removes MIG instances (``driver.gpu.migmake.Maker`` over the node's NVML;
    # None where no NVML is loaded): for the dynamic MIG kind, which imports no NVML code.
    mig_maker: Any = None
    # The MPS control daemons as pods (``driver.gpu.kinds.mpspod.MpsPods``); None: each a
    # process of the plugin's own (a plugin run on the host: tests, e2e levels 1 and 2).
    mps_pods: MpsPods | None = None
    nvidia_driver_root: Path = Path("/")  # the host's, which a daemon pod mounts

    def nvidia_smi_tool(self) -> NvidiaSmi:
        """The driver root's nvidia-smi (or the one named), with the driver root's NVML."""
        path = self.nvidia_smi or nvidiasmi.default_path(self.container_driver_root)
        return NvidiaSmi(path, self.nvml_library)


class DeviceKind(Protocol):
    """What a device kind implements, and which methods touch the node:

    - pure, functions of their arguments and of what :meth:`attach` gave the kind:
      ``name``, ``identity_keys``, ``health_target``, ``has_side_effects``, and ``devices``
      and ``claim_edits`` for every kind but dynamic MIG, whose ``devices`` depends on which
      instances the driver's claims made (read from its records, which every plugin
      instance of the node shares: an instance no claim made blocks the placements it
      overlaps) and whose ``claim_edits`` reads the claim's record of what it made;
    - I/O: ``attach`` (its state directory and the records in it), ``prepare``,
      ``unprepare`` and ``recover`` (they block: call them from a worker thread), and
      ``watch`` (restarts what a prepared claim lost, such as an MPS daemon).

    A kind's config checks run in the claim state's plan (``api/config.py``, the same rules
    the chart's admission policy applies), not here: every kind of this driver takes the
    one ``GpuConfig``."""

    @property
    def name(self) -> str:
        """Recorded with each prepared device (``gpu-dra.io/kind``); never change it."""

    @property
    def identity_keys(self) -> Sequence[str]:
        """The keys of :attr:`NodeDevice.identity` the record keeps."""

    def devices(self, inventory: Inventory, *, node_name: str) -> Sequence[NodeDevice]:
        """This kind's devices on the node, in publishing order."""

    def health_target(self, device: NodeDevice, inventory: Inventory) -> HealthTarget | None:
        """The physical GPU whose NVML events concern ``device`` (one of this kind's, as
        :meth:`devices` built it from ``inventory``), and where on it; None: not watched
        (no GPU behind it, or a MIG device discovery no longer lists)."""

    def claim_edits(self, devices: Sequence[NodeDevice], claim: PreparedClaim) -> Mapping[str, Any]:
        """CDI containerEdits for the whole claim, given its devices of this kind (and the
        claim, whose recorded settings may ask for more, such as an MPS pipe)."""

    def attach(self, context: KindContext) -> None:
        """Called when the claim state opens, before recovery (no I/O beyond its dir)."""

    def has_side_effects(self, claim: PreparedClaim) -> bool:
        """True when :meth:`prepare` changes node state; a per-claim record is then
        written before it runs, so a crash leaves something to undo it from."""

    def prepare(self, claim: PreparedClaim) -> None:
        """The side effects of preparing ``claim``'s devices of this kind; idempotent."""

    def unprepare(self, claim: PreparedClaim) -> None:
        """Undo :meth:`prepare`; idempotent, also for a claim it never prepared."""

    def recover(self, claim: PreparedClaim) -> None:
        """After a crash between the per-claim record and the CDI spec: undo whatever
        :meth:`prepare` may have done (the kubelet prepares the claim again)."""

    def watch(self) -> None:
        """Called now and then while claims are prepared: bring back what a prepared claim
        relies on and that has gone away (an MPS daemon that died), reporting it."""
