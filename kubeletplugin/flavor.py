"""What makes one node driver itself to the shared framework: its CDI vendor, the kind of
its side-effect records, its table of device kinds and what they are attached with.

Records, recovery, the CDI writer and the claim state take a :class:`Flavor`, always given:
each node driver (``drivers/gpu/flavor.py``, ``drivers/computedomain/kinds.py``) passes its
own, so the two share those modules without either naming the other, and a driver that
forgot one could not silently write another driver's names on disk.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.devicekind import AnyKind, KindContext


@dataclass(frozen=True, slots=True)
class ConfigRules:
    """How a driver's opaque configs are read (``kubeletplugin.claims.plan_claim``): the
    decoder and validator of its config models (shape, then what applies to a device), the
    default for a device no config names, and the kinds it takes (a config of one of them
    addressed to another driver is a typo of the driver name, refused). A config model
    records what a prepared device keeps of it through ``sharing_settings()``."""

    kinds: tuple[str, ...]
    decode: Callable[[Mapping[str, Any] | None, str], Any]
    validate: Callable[[Any, str], Any]
    default: Callable[[], Any]


def _as_given(context: KindContext) -> KindContext:
    return context


@dataclass(frozen=True, slots=True)
class Flavor:
    # CDI vendor: spec files ``<vendor>-claim_<uid>.json``, kind ``<vendor>/claim``.
    cdi_vendor: str
    # The ``kind`` of its per-claim side-effect records (``claims/<uid>.json``).
    record_kind: str
    # Its device kinds by name: the one table of them, made for this claim state (the
    # same kinds the driver's published devices come from).
    kinds: Mapping[str, AnyKind]
    # Its opaque configs.
    configs: ConfigRules
    # A device another claim holds: permanent for the GPU driver (the scheduler never
    # allocates it twice), retryable where the driver expects the holder to go (NVIDIA's
    # ComputeDomain channel 0, held by the node's previous workload until its unprepare).
    device_taken_is_retryable: bool = False
    # The kinds whose claims' specs start from the host container toolkit's edits (the
    # driver's libraries, binaries and hooks); None: every kind. A GPU's claims need them; of
    # the ComputeDomain kinds, the daemon's (nvidia-imex and nvidia-imex-ctl come from the
    # host's driver, as in NVIDIA's daemon spec), not a channel's.
    toolkit_kinds: frozenset[str] | None = None
    # Kinds of specs that, without our owner marker, are another driver's (NVIDIA's).
    foreign_kinds: tuple[str, ...] = ()
    # What each kind is attached with, from what the claim state made for it (its directory,
    # the boot): the driver's own context where its kinds need more of the node.
    kind_context: Callable[[KindContext], Any] = _as_given

    def starts_from_toolkit(self, kinds: Iterable[str]) -> bool:
        """Whether a spec of devices of ``kinds`` starts from the toolkit's edits."""
        return self.toolkit_kinds is None or not self.toolkit_kinds.isdisjoint(kinds)

    @property
    def cdi_kind(self) -> str:
        return f"{self.cdi_vendor}/claim"

    @property
    def file_prefix(self) -> str:
        return f"{self.cdi_vendor}-"
