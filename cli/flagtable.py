"""Every flag of the node-side subcommands and the global options: the one table.

Each subcommand names the flags it takes (``FLAG_NAMES`` in its module); help, value parser
and default come from here. ``docs/reference.md`` is generated from this table.
"""

from cli import flagvalues
from cli.flags import Flag
from driver import DEFAULT_DRIVER_NAME

# Kept here (not imported from driver.common.logs) so that `gpu-dra --help` imports nothing heavy.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("kv", "json")

_CONSUMABLE_CAPACITY = (
    "publish every GPU for consumable capacity (allowMultipleAllocations, a request policy "
    "on its memory): several claims then share one GPU, each taking the memory it requests "
    "(Kubernetes 1.36, or 1.34/1.35 with the DRAConsumableCapacity gate on)"
)
_DYNAMIC_MIG = (
    "publish each GPU in MIG mode as partitionable devices (shared counters and one device "
    "per profile and placement) and create the MIG device a claim gets at prepare "
    "(Kubernetes 1.36, or 1.34/1.35 with the DRAPartitionableDevices gate on)"
)

FLAGS: tuple[Flag, ...] = (
    # The global options, accepted before and after every subcommand.
    Flag(
        "--log-level",
        "least severe log records to print (case-insensitive)",
        type=str.upper,
        default="INFO",
        choices=LOG_LEVELS,
    ),
    Flag(
        "--log-format",
        "kv: key=value pairs; json: one JSON object a line",
        default="kv",
        choices=LOG_FORMATS,
    ),
    # Which node, which driver, which API server.
    Flag(
        "--node-name",
        "name of this Node object, as the API server names it (the kubelet plugin requires "
        "it; discover and controller fall back to $NODE_NAME, else the host name; discover "
        "of simulated hardware to sim-<profile>)",
        metavar="NAME",
        also_env="NODE_NAME",
    ),
    Flag("--driver-name", "DRA driver name", default=DEFAULT_DRIVER_NAME, metavar="NAME"),
    Flag(
        "--kubeconfig",
        "kubeconfig file; without it, $KUBECONFIG, else the in-cluster service account",
        metavar="FILE",
        also_env="KUBECONFIG",
    ),
    Flag(
        "--namespace",
        "namespace of the per-node publisher Lease; default: $POD_NAMESPACE, else 'default'",
        metavar="NAMESPACE",
    ),
    Flag(
        "--pod-uid",
        "UID of this pod (downward API): the kubelet plugin's side-by-side sockets in a surge "
        "upgrade; the IMEX daemon's owner reference on its ComputeDomainClique",
        also_env="POD_UID",
        metavar="UID",
    ),
    # Where things are on the node.
    Flag(
        "--kubelet-registrar-directory-path",
        "directory the kubelet watches for registration sockets",
        default="/var/lib/kubelet/plugins_registry",
        metavar="DIR",
    ),
    Flag(
        "--kubelet-plugins-directory-path",
        "kubelet plugins directory; the DRA socket and the claim records go to <this>/<driver>",
        default="/var/lib/kubelet/plugins",
        metavar="DIR",
    ),
    Flag(
        "--cdi-root",
        "directory for the CDI specs of prepared claims",
        default="/var/run/cdi",
        metavar="DIR",
    ),
    Flag(
        "--nvidia-driver-root",
        "root of the NVIDIA driver installation on the host",
        default="/",
        metavar="DIR",
    ),
    Flag(
        "--container-driver-root",
        "where the host's NVIDIA driver root is (mounted) here; libnvidia-ml.so.1 is looked "
        "for in its library directories, then on the default library path (inside the "
        "chart's plugin pod: /driver-root)",
        default="/",
        metavar="DIR",
        # The plugin runs in the chart's pod, which mounts the host's driver root at
        # /driver-root; discover and controller run on the host itself or a laptop.
        default_by_command={"kubelet-plugin": "/driver-root"},
    ),
    Flag(
        "--sysfs-root",
        "directory holding sys/ (PCIe root and NUMA) and the driver's proc files (MIG "
        "capability minors): the host's in every container (simulated hardware brings its own)",
        default="/",
        metavar="DIR",
    ),
    Flag(
        "--nvidia-smi",
        "nvidia-smi binary, for settings NVML cannot make (time-slicing); "
        "default <container-driver-root>/usr/bin/nvidia-smi",
        metavar="FILE",
    ),
    Flag(
        "--mps-control",
        "nvidia-cuda-mps-control binary, the MPS control daemon of GPUs shared by MPS; "
        "default <container-driver-root>/usr/bin/nvidia-cuda-mps-control",
        metavar="FILE",
    ),
    Flag(
        "--mps-daemon",
        "where each GPU's MPS control daemon runs: pod, a pod of its own in the plugin's "
        "namespace ($POD_NAMESPACE), pinned to the node, from --image (it outlives the "
        "plugin's pod: an upgrade keeps its clients served); process, a process of the "
        "plugin (a plugin run on the host)",
        default="process",
        choices=("process", "pod"),
    ),
    # Which NVML.
    Flag(
        "--nvml",
        "NVML to use: system, the node's driver library; simulated, simulated hardware",
        default="system",
        choices=("system", "simulated"),
    ),
    Flag(
        "--profile",
        "simulated hardware profile, by name (e.g. p5.48xlarge) or path to a profile YAML "
        "file; required with --nvml simulated (gpu-dra discover --list-profiles lists the names)",
        metavar="NAME",
    ),
    Flag(
        "--sim-state",
        "simulated NVML fault file (YAML), re-read at every NVML init; unset: "
        "$GPU_DRA_SIM_STATE (only with --nvml simulated)",
        metavar="FILE",
    ),
    # What is published.
    Flag(
        "--consumable-capacity",
        _CONSUMABLE_CAPACITY,
        type=flagvalues.boolean,
        default="false",
        switch=True,
    ),
    Flag("--dynamic-mig", _DYNAMIC_MIG, type=flagvalues.boolean, default="false", switch=True),
    Flag(
        "--compute-domains",
        "also serve the ComputeDomain driver (compute-domain.nvidia.com: IMEX channels and "
        "daemons, multi-node NVLink) from this process, on the same NVML and inventory, with "
        "its own sockets; refused in one line on an NVIDIA driver older than 570.158.01",
        type=flagvalues.boolean,
        default="false",
        switch=True,
    ),
    Flag(
        "--feature-gates",
        "the cluster's Kubernetes feature gates, Name=true|false,... (the chart's featureGates "
        "value); the syntax is checked and the gates are logged at start, nothing more: what "
        "the API server keeps is learned by probing it",
        type=flagvalues.feature_gates,
        metavar="GATES",
    ),
    # Device health.
    Flag(
        "--additional-xids-to-ignore",
        "XIDs that taint a GPU with effect None (informational) rather than NoSchedule, "
        "comma-separated, on top of NVIDIA's application errors 13,31,43,45,68,109",
        type=flagvalues.xids,
        metavar="XIDS",
    ),
    Flag(
        "--auto-recover-probes",
        "clear a device tainted only for a recoverable XID (--recoverable-xids) after this "
        "many consecutive healthy NVML probes (--auto-recover-period apart) with no new "
        "event; 0: off",
        type=flagvalues.probes,
        default="0",
        metavar="N",
    ),
    Flag(
        "--auto-recover-period",
        "seconds between two recovery probes (with --auto-recover-probes)",
        type=flagvalues.seconds,
        default="10",
        metavar="SECONDS",
    ),
    Flag(
        "--recoverable-xids",
        "XIDs that --auto-recover-probes may clear, comma-separated (never 48 or 79, "
        "nor a lost GPU)",
        type=flagvalues.recoverable_xids,
        default="8,11",
        metavar="XIDS",
    ),
    # Ports.
    Flag(
        "--metrics-port",
        "TCP port of the Prometheus metrics (GET /metrics); 0 picks a free port; unset: off",
        type=int,
        metavar="PORT",
    ),
    Flag(
        "--metrics-address",
        "IP address the metrics are served on (the chart gives the pod's IP, status.podIP); "
        "0.0.0.0: every interface",
        default="127.0.0.1",
        metavar="IP",
    ),
    Flag(
        "--healthcheck-port",
        "TCP port of the grpc.health.v1 service; 0 picks a free port",
        type=int,
        default="51515",
        metavar="PORT",
    ),
    # The IMEX daemon of a ComputeDomain (compute-domain-daemon); the variables after ours are
    # those NVIDIA's DaemonSet and the node driver's CDI edits set.
    Flag(
        "--clique-id",
        "NVLink clique of this node's GPUs, <cluster UUID>.<clique ID>; empty: no clique "
        "(IMEX is not started, the check succeeds)",
        also_env="CLIQUE_ID",
        metavar="ID",
    ),
    Flag(
        "--compute-domain-uuid",
        "UID of the ComputeDomain this daemon serves (set by the daemon claim's CDI edits; "
        "required by run)",
        also_env="COMPUTE_DOMAIN_UUID",
        metavar="UID",
    ),
    Flag(
        "--pod-ip",
        "this pod's IP address (downward API, status.podIP): where IMEX's command service listens",
        also_env="POD_IP",
        metavar="IP",
    ),
    # The ComputeDomain controller (compute-domain-controller); the variables after ours are
    # those NVIDIA's controller Deployment sets.
    Flag(
        "--driver-namespace",
        "namespace of the driver: the ComputeDomain DaemonSets, their claim templates and "
        "cliques, and the controller's leader Lease (downward API, metadata.namespace)",
        also_env="POD_NAMESPACE",
        metavar="NAMESPACE",
    ),
    Flag(
        "--pod-name",
        "name of this pod (downward API): the controller's identity in its leader Lease, with "
        "a random suffix (default: the host name); the pod the IMEX daemon labels with its "
        "clique",
        also_env="POD_NAME",
        metavar="NAME",
    ),
    Flag(
        "--image",
        "image of the daemon pods the command deploys (the controller's IMEX daemons, the "
        "kubelet plugin's MPS control daemons): the command's own",
        also_env="IMAGE_NAME",
        metavar="IMAGE",
    ),
    Flag(
        "--image-pull-policy",
        "image pull policy of the daemon pods (IMEX, MPS); empty: the cluster's default",
        default="",
        choices=("", "Always", "IfNotPresent", "Never"),
    ),
    Flag(
        "--image-pull-secrets",
        "secrets in the driver's namespace for pulling the daemon image, comma-separated",
        type=flagvalues.names_list,
        default="",
        also_env="CD_DAEMON_IMAGE_PULL_SECRET_NAMES",
        metavar="NAMES",
    ),
    # Both: the controller hands it to the daemons it deploys.
    Flag(
        "--max-nodes-per-imex-domain",
        "most daemons one clique can hold: the names compute-domain-daemon-0000 and up "
        "written to nodes.cfg (the controller hands it to the daemons it deploys)",
        type=flagvalues.max_nodes,
        default="18",
        also_env="MAX_NODES_PER_IMEX_DOMAIN",
        metavar="N",
    ),
    Flag(
        "--imex-config-dir",
        "directory of the IMEX config (imexd.cfg) and nodes.cfg: the domain's directory the "
        "daemon claim mounts",
        default="/imexd",
        metavar="DIR",
    ),
    Flag(
        "--hosts-file",
        "hosts file that maps the peers' addresses to their names (one block of it is ours; "
        "every other line is kept)",
        default="/etc/hosts",
        metavar="FILE",
    ),
    Flag(
        "--nvidia-imex",
        "nvidia-imex binary, run as <this> -c <imex-config-dir>/imexd.cfg; a bare name is "
        "looked up on PATH",
        default="nvidia-imex",
        metavar="FILE",
    ),
    Flag(
        "--nvidia-imex-ctl",
        "nvidia-imex-ctl binary, which the check runs with -q; a bare name is looked up on PATH",
        default="nvidia-imex-ctl",
        metavar="FILE",
    ),
    Flag(
        "--peers-file",
        "a ComputeDomainClique object (YAML or JSON) to take the domain's daemons from, "
        "re-read when it changes, instead of the API server",
        metavar="FILE",
    ),
    Flag(
        "--daemon-log-level",
        "log level of the IMEX daemon pods",
        type=str.upper,
        default="INFO",
        choices=LOG_LEVELS,
    ),
    Flag(
        "--leader-elect",
        "lead by a Lease in the driver's namespace, so that one of several replicas works",
        type=flagvalues.boolean,
        default="true",
        switch=True,
    ),
    Flag(
        "--leader-elect-lease-duration",
        "seconds a standby waits after the leader's last renewal before it takes over",
        type=flagvalues.seconds,
        default="15",
        metavar="SECONDS",
    ),
    Flag(
        "--leader-elect-renew-deadline",
        "seconds the leader keeps working without a renewal before it stands down (less "
        "than the lease duration)",
        type=flagvalues.seconds,
        default="10",
        metavar="SECONDS",
    ),
    Flag(
        "--leader-elect-retry-period",
        "seconds between two looks at the Lease (renewals, and a standby's looks)",
        type=flagvalues.seconds,
        default="2",
        metavar="SECONDS",
    ),
    # The one-shot and standalone commands' own.
    Flag(
        "--list-profiles",
        "list the simulated hardware profiles and exit",
        type=flagvalues.boolean,
        default="false",
        switch=True,
    ),
    Flag(
        "--output",
        "discover: yaml or json, the ResourceSlice objects; table, one row per device. "
        "doctor: table, one line per check; yaml or json, the checks as objects",
        short="-o",
        default="yaml",
        choices=("yaml", "json", "table"),
        # A person reads doctor's answer; a program reads discover's.
        default_by_command={"doctor": "table"},
    ),
    Flag(
        "--containerd-config",
        "containerd's configuration, read for its CDI settings (looked for under "
        "--container-driver-root too: the plugin's pod sees the host there)",
        default="/etc/containerd/config.toml",
        metavar="FILE",
    ),
    Flag(
        "--resync-period",
        "rediscover the GPUs this often, in seconds",
        type=float,
        default="60",
        metavar="SECONDS",
    ),
)

BY_NAME = {flag.name: flag for flag in FLAGS}
GLOBAL = ("--log-level", "--log-format")


def pick(*names: str) -> tuple[Flag, ...]:
    """The table's flags by name, in the order given (the order of --help)."""
    return tuple(BY_NAME[name] for name in names)
