"""The seam a device kind implements, and the records every kind shares, for every node
driver.

A kind says which devices of it a node has and what they publish, what a container of a
claim gets for them (CDI edits), and which side effects preparing them has (none for a full
GPU; a MIG instance, an MPS daemon, a node label for others), with how to undo them after an
unprepare or a crash. Everything else (the slice publisher, the claim fetch, the per-claim
records, the CDI spec file, the gRPC service) is shared and knows no kind.

The seam is generic over what a driver's discovery found (the inventory its kinds build
devices from) and over what its kinds are given of the node (a :class:`KindContext`, or a
driver's richer one): here it names neither. The GPU driver's kinds and their table are
``drivers.gpu.kinds``; the ComputeDomain driver's, ``drivers.computedomain.kinds``.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

InventoryT = TypeVar("InventoryT", contravariant=True)
ContextT = TypeVar("ContextT", contravariant=True)


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
    # Its kind's name; always given (a record of release 0.1.0, which names none, is read
    # as the GPU driver's full GPU by that driver's readers).
    kind: str = field(kw_only=True)
    identity: tuple[tuple[str, str], ...] = ()
    # What the claim's opaque config asks of the device (its model's ``sharing_settings``),
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
class KindContext:
    """What the claim state gives every kind of the node, once, before recovery; a driver
    whose kinds need more (tools, driver roots) extends it (``kubeletplugin.flavor``'s
    ``kind_context`` makes it)."""

    state_dir: Path  # the kind's own files (``<plugin dir>/kinds/<kind>``), made for it
    boot_id: str  # "" when unknown: the kind's records of an earlier boot are then kept


class DeviceKind(Protocol[InventoryT, ContextT]):
    """What a device kind implements, over its driver's inventory and context, and which
    methods touch the node:

    - pure, functions of their arguments and of what :meth:`attach` gave the kind:
      ``name``, ``identity_keys``, ``has_side_effects``, and ``devices`` and
      ``claim_edits`` for most kinds; a kind may read its own records there (the GPU
      driver's dynamic MIG reads which instances its claims made), or the node's ``/proc``
      (the ComputeDomain channels' device numbers);
    - I/O: ``attach`` (its state directory and the records in it), ``prepare``,
      ``unprepare`` and ``recover`` (they block: call them from a worker thread), and
      ``watch`` (restarts what a prepared claim lost, such as an MPS daemon).

    A kind's config checks run in the claim state's plan (the flavor's config rules, the
    same rules the chart's admission policy applies), not here."""

    @property
    def name(self) -> str:
        """Recorded with each prepared device (``gpu-dra.io/kind``); never change it."""

    @property
    def identity_keys(self) -> Sequence[str]:
        """The keys of :attr:`NodeDevice.identity` the record keeps."""

    def devices(self, inventory: InventoryT, *, node_name: str) -> Sequence[NodeDevice]:
        """This kind's devices on the node, in publishing order."""

    def claim_edits(self, devices: Sequence[NodeDevice], claim: PreparedClaim) -> Mapping[str, Any]:
        """CDI containerEdits for the whole claim, given its devices of this kind (and the
        claim, whose recorded settings may ask for more, such as an MPS pipe)."""

    def attach(self, context: ContextT) -> None:
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


# What the framework holds of any driver's kinds: it passes them only what it made for them.
AnyKind = DeviceKind[Any, Any]
