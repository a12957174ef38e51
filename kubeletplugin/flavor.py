"""What makes one node driver itself to the shared framework: its CDI vendor, the kind of
its side-effect records, its table of device kinds and what they are attached with.

Records, recovery, the CDI writer and the claim state take a :class:`Flavor`; each node
driver (``drivers/gpu/``, ``drivers/computedomain/``) passes its own, so the two
share those modules without either naming the other. :data:`GPU` is the default wherever a
flavor is optional: the GPU driver's names on disk are release 0.1.0's and never change
(upgrade tests read them). The GPU node process attaches its kinds with what it knows of
the node (:func:`gpu`); the default gives them the defaults, as tests want.
"""

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from api.config import GPU_CONFIG_KIND, GpuConfig, decode_gpu_config, validate_gpu_config
from driver.devicekind import AnyKind, KindContext
from drivers.gpu.kinds import GpuNode, by_name


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


def _gpu_decode(parameters: Mapping[str, Any] | None, source: str) -> GpuConfig:
    return decode_gpu_config(parameters, source=source)


def _gpu_validate(config: GpuConfig, source: str) -> GpuConfig:
    return validate_gpu_config(config, source=source)


GPU_CONFIGS = ConfigRules(
    kinds=(GPU_CONFIG_KIND,), decode=_gpu_decode, validate=_gpu_validate, default=GpuConfig.default
)


def _as_given(context: KindContext) -> KindContext:
    return context


@dataclass(frozen=True, slots=True)
class Flavor:
    # CDI vendor: spec files ``<vendor>-claim_<uid>.json``, kind ``<vendor>/claim``.
    cdi_vendor: str
    # The ``kind`` of its per-claim side-effect records (``claims/<uid>.json``).
    record_kind: str
    # Its device kinds by name; a function, so a test that swaps the GPU table is seen.
    kinds: Callable[[], Mapping[str, AnyKind]]
    # Its opaque configs.
    configs: ConfigRules = GPU_CONFIGS
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


GPU = Flavor(
    cdi_vendor="k8s.gpu.nvidia.com",
    record_kind="GpuDraClaimRecord",
    kinds=by_name,
    foreign_kinds=("k8s.gpu.nvidia.com/", "nvidia.com/gpu"),
    kind_context=GpuNode().context,
)


def gpu(node: GpuNode) -> Flavor:
    """The GPU driver's flavor, its kinds given ``node`` (the node wiring's driver roots,
    tools, NVML and MPS pods) instead of the defaults."""
    return dataclasses.replace(GPU, kind_context=node.context)
