"""The names, labels and classes of NVIDIA's ComputeDomain driver, spelled once.

Users' manifests and NVIDIA's own tooling find the objects by these strings (a DeviceClass
name in a claim, the label a cleanup selects on, the daemon RCT the DaemonSet names), so each
is NVIDIA's exactly: ``cmd/compute-domain-controller/computedomain.go``, its ``templates/``,
``cmd/compute-domain-daemon/{cdclique,dnsnames}.go``, ``deviceinfo.go`` and the chart's
DeviceClass templates (kubernetes-sigs/dra-driver-nvidia-gpu at 95932046, v0.5.0).
"""

from typing import Final

# Re-exported, so that the controller and the node code import every name from here.
from api.names import ALLOCATION_ALL as ALLOCATION_ALL
from api.names import ALLOCATION_MODES as ALLOCATION_MODES
from api.names import ALLOCATION_SINGLE as ALLOCATION_SINGLE
from api.names import API_GROUP, COMPUTE_DOMAIN_DRIVER
from api.names import API_VERSION as API_VERSION
from api.names import CHANNEL_CONFIG_KIND as CHANNEL_CONFIG_KIND
from api.names import DAEMON_CONFIG_KIND as DAEMON_CONFIG_KIND
from driver.kube.resources import Resource

# The DRA driver: the driver of its ResourceSlices and opaque configs, and its plugin's name.
DRIVER_NAME: Final = COMPUTE_DOMAIN_DRIVER

# The custom resources (resource.nvidia.com/v1beta1, charts/gpu-dra-driver/crds/).
GROUP: Final = API_GROUP
VERSION: Final = API_VERSION.rpartition("/")[2]
COMPUTE_DOMAIN_KIND: Final = "ComputeDomain"
COMPUTE_DOMAINS: Final = "computedomains"  # the plural, the resource RBAC and URLs name
CLIQUE_KIND: Final = "ComputeDomainClique"
CLIQUES: Final = "computedomaincliques"
COMPUTE_DOMAINS_API: Final = Resource(GROUP, VERSION, COMPUTE_DOMAINS, namespaced=True)
CLIQUES_API: Final = Resource(GROUP, VERSION, CLIQUES, namespaced=True)

# status.status and status.nodes[].status (the CRD's enum; NotReady is the default).
READY: Final = "Ready"
NOT_READY: Final = "NotReady"
STATUSES: Final = (READY, NOT_READY)

# DeviceClasses. The chart renders the first two; NVIDIA defines the third as a constant only
# (no template of theirs creates it), so it is kept here for recognition, not rendered.
DAEMON_CLASS: Final = "compute-domain-daemon.nvidia.com"
DEFAULT_CHANNEL_CLASS: Final = "compute-domain-default-channel.nvidia.com"
CHANNEL_CLASS: Final = "compute-domain-channel.nvidia.com"
# Their selectors, as NVIDIA's chart writes them (the chart test holds the render to these).
DAEMON_CLASS_SELECTOR: Final = (
    f"device.driver == '{DRIVER_NAME}' && device.attributes['{DRIVER_NAME}'].type == 'daemon'"
)
DEFAULT_CHANNEL_CLASS_SELECTOR: Final = (
    f"device.driver == '{DRIVER_NAME}' && device.attributes['{DRIVER_NAME}'].type == 'channel'"
    f" && device.attributes['{DRIVER_NAME}'].id == 0"
)

# Label keys. The domain label doubles as the finalizer (NVIDIA uses the one string for both):
# on the driver-made objects, the daemon pods, and the Nodes a domain's daemons run on.
COMPUTE_DOMAIN_LABEL: Final = "resource.nvidia.com/computeDomain"
FINALIZER: Final = COMPUTE_DOMAIN_LABEL
CLIQUE_LABEL: Final = "resource.nvidia.com/computeDomain.cliqueID"
# On the two ResourceClaimTemplates the controller makes: which of them a template is.
TARGET_LABEL: Final = "resource.nvidia.com/computeDomainTarget"
TARGET_DAEMON: Final = "Daemon"
TARGET_WORKLOAD: Final = "Workload"
# The node's NVLink clique, as GPU Feature Discovery sets it and NVIDIA's plugin does with
# --gpu-clique-label-enabled: what workloads' pod affinity keys on.
GPU_CLIQUE_NODE_LABEL: Final = "nvidia.com/gpu.clique"

# Published devices and their attributes (unqualified: in the driver's domain).
CHANNEL_DEVICE: Final = "channel-0"
DAEMON_DEVICE: Final = "daemon-0"
TYPE_ATTRIBUTE: Final = "type"  # string: the device type below
ID_ATTRIBUTE: Final = "id"  # int: the channel or daemon number
CHANNEL_TYPE: Final = "channel"
DAEMON_TYPE: Final = "daemon"
# The opaque config kind each device type takes; another is refused at prepare.
CONFIG_KIND_OF_TYPE: Final = {CHANNEL_TYPE: CHANNEL_CONFIG_KIND, DAEMON_TYPE: DAEMON_CONFIG_KIND}
# IMEX channels per node (NVIDIA hard-codes 2048: getImexChannelCount); allocationMode All
# gives a workload every one of them.
IMEX_CHANNEL_COUNT: Final = 2048

# Request names inside the two ResourceClaimTemplates, and the daemon pod's claim name.
CHANNEL_REQUEST: Final = "channel"
DAEMON_REQUEST: Final = "daemon"
DAEMON_POD_CLAIM: Final = "compute-domain-daemon"
DAEMON_CONTAINER: Final = "compute-domain-daemon"
DAEMON_SERVICE_ACCOUNT: Final = "compute-domain-daemon-service-account"

# IMEX domain size: the daemon's DNS-name index stays below it (MAX_NODES_PER_IMEX_DOMAIN).
DEFAULT_MAX_NODES_PER_IMEX_DOMAIN: Final = 18
DAEMON_DNS_PREFIX: Final = "compute-domain-daemon-"


def daemon_name(cd_uid: str) -> str:
    """The per-domain DaemonSet and its daemon ResourceClaimTemplate (the same name, both in
    the driver's namespace): ``computedomain-daemon-<cdUID>``."""
    return f"computedomain-daemon-{cd_uid}"


def clique_name(cd_uid: str, clique_id: str) -> str:
    """A ComputeDomainClique: ``<cdUID>.<cliqueID>``, where the clique ID is itself
    ``<clusterUUID>.<cliqueId>``."""
    return f"{cd_uid}.{clique_id}"


def daemon_dns_name(index: int) -> str:
    """The name a daemon's peers know it by in ``nodes.cfg`` and ``/etc/hosts``:
    ``compute-domain-daemon-0003``."""
    return f"{DAEMON_DNS_PREFIX}{index:04d}"
