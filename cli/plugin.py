"""``gpu-dra kubelet-plugin``: the per-node daemon (kubelet plugin plus slice controller)."""

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from cli._nvmlargs import CONSUMABLE_CAPACITY_HELP, DYNAMIC_MIG_HELP
from driver import DEFAULT_DRIVER_NAME

# flag -> (environment variable, default, help). Each variable is GPU_DRA_<FLAG>; the
# three with a conventional name of their own (the downward API's, kubectl's) also take it.
_FLAGS: dict[str, tuple[str, str | None, str]] = {
    "--node-name": ("GPU_DRA_NODE_NAME", None, "name of this Node object (required)"),
    "--driver-name": ("GPU_DRA_DRIVER_NAME", DEFAULT_DRIVER_NAME, "DRA driver name"),
    "--kubeconfig": (
        "GPU_DRA_KUBECONFIG",
        None,
        "kubeconfig file; without it, the in-cluster service account is used",
    ),
    "--kubelet-registrar-directory-path": (
        "GPU_DRA_KUBELET_REGISTRAR_DIRECTORY_PATH",
        "/var/lib/kubelet/plugins_registry",
        "directory the kubelet watches for registration sockets",
    ),
    "--kubelet-plugins-directory-path": (
        "GPU_DRA_KUBELET_PLUGINS_DIRECTORY_PATH",
        "/var/lib/kubelet/plugins",
        "kubelet plugins directory; the DRA socket and the claim records go to <this>/<driver>",
    ),
    "--cdi-root": (
        "GPU_DRA_CDI_ROOT",
        "/var/run/cdi",
        "directory for the CDI specs of prepared claims",
    ),
    "--nvidia-driver-root": (
        "GPU_DRA_NVIDIA_DRIVER_ROOT",
        "/",
        "root of the NVIDIA driver installation on the host",
    ),
    "--container-driver-root": (
        "GPU_DRA_CONTAINER_DRIVER_ROOT",
        "/driver-root",
        "where the host's driver root is mounted in this container",
    ),
    "--nvidia-smi": (
        "GPU_DRA_NVIDIA_SMI",
        None,
        "nvidia-smi binary, for settings NVML cannot make (time-slicing); "
        "default <container-driver-root>/usr/bin/nvidia-smi",
    ),
    "--mps-control": (
        "GPU_DRA_MPS_CONTROL",
        None,
        "nvidia-cuda-mps-control binary, the MPS control daemon of GPUs shared by MPS; "
        "default <container-driver-root>/usr/bin/nvidia-cuda-mps-control",
    ),
    "--consumable-capacity": (
        "GPU_DRA_CONSUMABLE_CAPACITY",
        "false",
        "true: " + CONSUMABLE_CAPACITY_HELP,
    ),
    "--dynamic-mig": (
        "GPU_DRA_DYNAMIC_MIG",
        "false",
        "true: " + DYNAMIC_MIG_HELP,
    ),
    "--pod-uid": (
        "GPU_DRA_POD_UID",
        None,
        "UID of this plugin pod (downward API): enables side-by-side sockets for surge upgrades",
    ),
    "--nvml": ("GPU_DRA_NVML", "system", "NVML backend: system (libnvidia-ml) or simulated"),
    "--profile": (
        "GPU_DRA_PROFILE",
        None,
        "instance profile of the simulated NVML, e.g. p5.48xlarge (only with --nvml simulated)",
    ),
    "--sim-state": (
        "GPU_DRA_SIM_STATE",
        None,
        "state file of the simulated NVML (only with --nvml simulated)",
    ),
    "--feature-gates": (
        "GPU_DRA_FEATURE_GATES",
        None,
        "the cluster's Kubernetes feature gates the driver relies on, Name=true|false,... "
        "(the chart's featureGates value); checked, and logged at start",
    ),
    "--additional-xids-to-ignore": (
        "GPU_DRA_ADDITIONAL_XIDS_TO_IGNORE",
        None,
        "XIDs that taint a GPU with effect None (informational) rather than NoSchedule, "
        "comma-separated, on top of NVIDIA's application errors 13,31,43,45,68,109",
    ),
    "--auto-recover-probes": (
        "GPU_DRA_AUTO_RECOVER_PROBES",
        "0",
        "clear a device tainted only for a recoverable XID (--recoverable-xids) after this "
        "many consecutive healthy NVML probes (--auto-recover-period apart) with no new "
        "event; 0: off",
    ),
    "--auto-recover-period": (
        "GPU_DRA_AUTO_RECOVER_PERIOD",
        "10",
        "seconds between two recovery probes (with --auto-recover-probes)",
    ),
    "--recoverable-xids": (
        "GPU_DRA_RECOVERABLE_XIDS",
        "8,11",
        "XIDs that --auto-recover-probes may clear, comma-separated (never 48 or 79, "
        "nor a lost GPU)",
    ),
    "--metrics-port": (
        "GPU_DRA_METRICS_PORT",
        None,
        "TCP port of the Prometheus metrics (GET /metrics); 0 picks a free port; unset: off",
    ),
    "--metrics-address": (
        "GPU_DRA_METRICS_ADDRESS",
        "127.0.0.1",
        "IP address the metrics are served on (the chart gives the pod's IP, status.podIP); "
        "0.0.0.0: every interface",
    ),
    "--healthcheck-port": (
        "GPU_DRA_HEALTHCHECK_PORT",
        "51515",
        "TCP port of the grpc.health.v1 service; 0 picks a free port",
    ),
}


_CONVENTIONAL = {
    "GPU_DRA_NODE_NAME": "NODE_NAME",
    "GPU_DRA_POD_UID": "POD_UID",
    "GPU_DRA_KUBECONFIG": "KUBECONFIG",
}


class _ArgumentOptions(TypedDict, total=False):
    """The keyword arguments of ``add_argument`` that the flags above use."""

    default: str | None
    help: str
    choices: tuple[str, ...]
    type: Callable[[str], object]


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "kubelet-plugin",
        help="run the node daemon: kubelet DRA plugin and ResourceSlice publisher",
        description=(
            "Serve the kubelet's plugin registration and DRA (v1, v1beta1) gRPC services on "
            "unix sockets, prepare and unprepare claims (CDI specs, reservations), publish this "
            "node's ResourceSlices, and answer grpc.health.v1 probes. Every flag can also be "
            "set through the environment variable named in its help. SIGTERM shuts down "
            "cleanly: own sockets removed, slices left for the next instance."
        ),
    )
    for flag, (env, default, text) in _FLAGS.items():
        other = _CONVENTIONAL.get(env)
        value = os.environ.get(env) or (os.environ.get(other) if other else None) or default
        names = env + (f" or {other}" if other else "")
        suffix = f" [env {names}" + (f", default {default}]" if default is not None else "]")
        kwargs: _ArgumentOptions = {"default": value, "help": text + suffix}
        if flag == "--nvml":
            kwargs["choices"] = ("system", "simulated")
        if flag in ("--healthcheck-port", "--metrics-port"):
            kwargs["type"] = int
        if flag == "--auto-recover-probes":
            kwargs["type"] = _probes
        if flag == "--auto-recover-period":
            kwargs["type"] = _seconds
        if flag == "--recoverable-xids":
            kwargs["type"] = _recoverable_xids
        if flag == "--feature-gates":
            kwargs["type"] = parse_feature_gates
        if flag == "--additional-xids-to-ignore":
            kwargs["type"] = _xids
        if flag in ("--consumable-capacity", "--dynamic-mig"):
            kwargs["type"] = _boolean
        parser.add_argument(flag, **kwargs)
    parser.set_defaults(func=_run)


_GATE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)=(true|false)$")


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``A=true,B=false`` as Kubernetes components take it; ArgumentTypeError otherwise."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _GATE.match(item)
        if match is None:
            raise argparse.ArgumentTypeError(f"{item!r}: expected Name=true or Name=false")
        gates[match[1]] = match[2] == "true"
    return gates


def _xids(text: str) -> frozenset[int]:
    from driver.gpu.devicehealth import parse_xids

    try:
        return parse_xids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _recoverable_xids(text: str) -> frozenset[int]:
    from driver.gpu.devicehealth import parse_recoverable_xids

    try:
        return parse_recoverable_xids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _probes(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of probes, 0 for off")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds, more than 0")
    return value


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1"):
        return True
    if text.lower() in ("false", "0", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from driver.gpu.devicehealth import DEFAULT_IGNORED_XIDS
    from kubeletplugin.gpu import node

    if not args.node_name:
        print(
            "gpu-dra kubelet-plugin: --node-name (or GPU_DRA_NODE_NAME) is required",
            file=sys.stderr,
        )
        return 2
    if args.nvml == "simulated" and not args.profile:
        print("gpu-dra kubelet-plugin: --nvml simulated needs --profile", file=sys.stderr)
        return 2
    config = node.NodeConfig(
        node_name=args.node_name,
        driver_name=args.driver_name,
        kubeconfig=_path(args.kubeconfig),
        registrar_dir=Path(args.kubelet_registrar_directory_path),
        plugins_dir=Path(args.kubelet_plugins_directory_path),
        cdi_root=Path(args.cdi_root),
        nvidia_driver_root=Path(args.nvidia_driver_root),
        container_driver_root=Path(args.container_driver_root),
        nvidia_smi=_path(args.nvidia_smi),
        mps_control=_path(args.mps_control),
        consumable_capacity=bool(args.consumable_capacity),
        dynamic_mig=bool(args.dynamic_mig),
        pod_uid=args.pod_uid or None,
        nvml=args.nvml,
        profile=args.profile,
        sim_state=_path(args.sim_state),
        healthcheck_port=args.healthcheck_port,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        ignored_xids=DEFAULT_IGNORED_XIDS | (args.additional_xids_to_ignore or frozenset()),
        recovery_probes=args.auto_recover_probes,
        recoverable_xids=args.recoverable_xids,
        recovery_period=args.auto_recover_period,
    )
    if args.feature_gates:
        import logging

        logging.getLogger(__name__).info(
            "feature gates",
            extra={"feature_gates": ",".join(f"{k}={v}" for k, v in args.feature_gates.items())},
        )
    if args.nvml not in ("system", "simulated"):
        print(
            f"gpu-dra kubelet-plugin: GPU_DRA_NVML={args.nvml!r}: choose system or simulated",
            file=sys.stderr,
        )
        return 2
    node.limit_malloc_arenas()
    return asyncio.run(node.main(config))
