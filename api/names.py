"""The opaque config API's names: group, version, kinds, and the allocation modes a channel
config takes. Apart from the models (``config.py``, ``computedomain.py``) so that code that
only names them (the ComputeDomain names, ``gpu-dra validate`` and ``explain``) loads no
pydantic."""

from typing import Final

API_GROUP: Final = "resource.nvidia.com"
API_VERSION: Final = f"{API_GROUP}/v1beta1"
GPU_CONFIG_KIND: Final = "GpuConfig"
CHANNEL_CONFIG_KIND: Final = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND: Final = "ComputeDomainDaemonConfig"

# spec.channel.allocationMode of a ComputeDomain, copied into its channel config: one IMEX
# channel per claim, or every channel of the node.
ALLOCATION_ALL: Final = "All"
ALLOCATION_SINGLE: Final = "Single"
ALLOCATION_MODES: Final = (ALLOCATION_ALL, ALLOCATION_SINGLE)

# The ComputeDomain driver, whose configs these two kinds are (drivers/computedomain/names.py).
COMPUTE_DOMAIN_DRIVER: Final = "compute-domain.nvidia.com"
