"""NVIDIA's ComputeDomain strings the controller needs, until ``driver/computedomain/names.py``
(branch ``cd-api``) lands; then every import of this module becomes an import of that one and
this file goes. The constant names are that module's, so the swap is one line per importer.

Each value is NVIDIA's exactly (``cmd/compute-domain-controller/computedomain.go`` and its
``templates/``, kubernetes-sigs/dra-driver-nvidia-gpu v0.5.0): users' manifests and NVIDIA's own
tooling find the objects by them.
"""

from typing import Final

DRIVER_NAME: Final = "compute-domain.nvidia.com"

GROUP: Final = "resource.nvidia.com"
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
COMPUTE_DOMAIN_KIND: Final = "ComputeDomain"
COMPUTE_DOMAINS: Final = "computedomains"
CLIQUE_KIND: Final = "ComputeDomainClique"
CLIQUES: Final = "computedomaincliques"
CHANNEL_CONFIG_KIND: Final = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND: Final = "ComputeDomainDaemonConfig"

READY: Final = "Ready"
NOT_READY: Final = "NotReady"
STATUSES: Final = (READY, NOT_READY)
ALLOCATION_SINGLE: Final = "Single"

DAEMON_CLASS: Final = "compute-domain-daemon.nvidia.com"
DEFAULT_CHANNEL_CLASS: Final = "compute-domain-default-channel.nvidia.com"

# NVIDIA uses the one string as the domain label and the finalizer.
COMPUTE_DOMAIN_LABEL: Final = "resource.nvidia.com/computeDomain"
FINALIZER: Final = COMPUTE_DOMAIN_LABEL
CLIQUE_LABEL: Final = "resource.nvidia.com/computeDomain.cliqueID"
TARGET_LABEL: Final = "resource.nvidia.com/computeDomainTarget"
TARGET_DAEMON: Final = "Daemon"
TARGET_WORKLOAD: Final = "Workload"

CHANNEL_REQUEST: Final = "channel"
DAEMON_REQUEST: Final = "daemon"
DAEMON_POD_CLAIM: Final = "compute-domain-daemon"
DAEMON_CONTAINER: Final = "compute-domain-daemon"
DAEMON_SERVICE_ACCOUNT: Final = "compute-domain-daemon-service-account"
DEFAULT_MAX_NODES_PER_IMEX_DOMAIN: Final = 18


def daemon_name(cd_uid: str) -> str:
    """The per-domain DaemonSet and its daemon ResourceClaimTemplate (one name, both in the
    driver's namespace)."""
    return f"computedomain-daemon-{cd_uid}"
