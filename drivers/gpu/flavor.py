"""The GPU driver's flavor: its CDI vendor, record kind, kinds and configs.

The names on disk are release 0.1.0's and never change (tests/test_records_upgrade.py reads
them). The node process makes one per claim state, with its table of kinds and what they are
attached with (:func:`gpu`); :data:`GPU` has a table of its own with the defaults, for what
reads only the names (tests, tools).
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from api.config import GPU_CONFIG_KIND, GpuConfig, decode_gpu_config, validate_gpu_config
from drivers.gpu.kinds import GpuNode, KindTable, gpu_kinds
from drivers.gpu.kinds.gpu import own_node
from kubeletplugin.containertoolkit import Toolkit
from kubeletplugin.flavor import ConfigRules, Flavor


def _decode(parameters: Mapping[str, Any] | None, source: str) -> GpuConfig:
    return decode_gpu_config(parameters, source=source)


def _validate(config: GpuConfig, source: str) -> GpuConfig:
    return validate_gpu_config(config, source=source)


GPU_CONFIGS = ConfigRules(
    kinds=(GPU_CONFIG_KIND,), decode=_decode, validate=_validate, default=GpuConfig.default
)


def gpu(node: GpuNode | None = None, kinds: KindTable | None = None) -> Flavor:
    """The GPU driver's flavor: ``kinds`` (a new table for ``node`` when None), attached
    with ``node`` (the node wiring's driver roots, tools, NVML and MPS pods; the defaults
    when None)."""
    node = node or GpuNode()
    return Flavor(
        cdi_vendor="k8s.gpu.nvidia.com",
        record_kind="GpuDraClaimRecord",
        kinds=gpu_kinds(node) if kinds is None else kinds,
        configs=GPU_CONFIGS,
        foreign_kinds=("k8s.gpu.nvidia.com/", "nvidia.com/gpu"),
        kind_context=node.context,
    )


GPU = gpu()


def toolkit(container_root: Path, host_root: Path, *, simulated: bool) -> Toolkit:
    """The host's driver install as GPU claim specs reach it (``StateConfig.host``): the
    toolkit's edits without the device nodes each GPU claim's spec adds itself."""
    return Toolkit(container_root, host_root, own_node, simulated=simulated)
